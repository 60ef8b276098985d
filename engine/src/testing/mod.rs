//! What tests, benches and fuzz targets share (feature `testing`): the `device_ops` model
//! harness and the page generators.

pub mod fuzzing;
pub use uzram_codecs::pages;
