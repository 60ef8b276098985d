//! Pages and directories the engine's unit tests share.

use std::path::PathBuf;

use super::PAGE_SIZE;

/// A compressible page of text, different for each `i`, with a `secret-` marker the
/// writeback tests look for in the backing file.
pub(super) fn text_page(i: u64) -> Vec<u8> {
    let mut page = Vec::with_capacity(PAGE_SIZE);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while page.len() < PAGE_SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        page.extend_from_slice(format!("secret-{} token {} ", i, x % 977).as_bytes());
    }
    page.truncate(PAGE_SIZE);
    page
}

/// An incompressible page (xorshift bytes), different for each `i`: stored raw, one pool page.
pub(super) fn noise_page(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..PAGE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A fresh directory under the system's temporary one, for this process and `tag`.
pub(super) fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uzram-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
