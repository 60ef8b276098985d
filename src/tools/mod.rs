//! The tools: `uzram bench` (the engine against the raw codec), page corpora (files of 4 KiB
//! pages for benches and tests) and `uzram dump-pages` (a process's anonymous memory as such a
//! file).

pub mod bench;
pub mod corpus;
pub mod pagedump;
