//! uzram: a compressed RAM block device engine.

pub mod corpus;
pub mod pagedump;
