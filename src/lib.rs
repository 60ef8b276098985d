//! uzram: a compressed RAM block device engine.
