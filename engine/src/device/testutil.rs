//! What the engine's unit tests share: the page generators (one copy, in
//! `crate::testing::pages`) and scratch directories.

use std::path::PathBuf;

pub(super) use crate::testing::pages::{noise_page, text_page};

/// A fresh directory under the system's temporary one, for this process and `tag`.
pub(super) fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uzram-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
