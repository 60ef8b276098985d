//! The `uzram` binary's parts, as a library for its tests: the daemon (`uzram serve`), the
//! command line (zramctl's listing, attributes, setup) and the tools (`bench`, `dump-pages`).
//! The engine itself is the `uzram-engine` crate; embed that, not this.
//!
//! - [`daemon`]: serves a device through ublk; imports nothing of [`cli`].
//! - [`cli`]: talks to daemons (their control sockets) and starts them.
//! - [`common`]: what both need: device names, swap and mount checks, the control protocol, the
//!   one definition of a device's options.
//! - [`tools`]: `uzram bench`, page corpora, `uzram dump-pages`.
//! - `sys`: every libc call that needs `unsafe`.

#![deny(unsafe_code)]

pub mod cli;
pub mod common;
pub mod daemon;
#[allow(unsafe_code)] // every libc call of the binary, each with its SAFETY reason
pub mod sys;
pub mod tools;
