//! Page generators for tests, benches, fuzz targets and examples (feature `testing`): one copy
//! of each, deterministic from a seed. The engine re-exports them as
//! `uzram_engine::testing::pages`.

use crate::PAGE_SIZE;

/// A small, fast mixing function (splitmix64's finaliser): content generators and stamps.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[rustfmt::skip]
const WORDS: [&str; 48] = [
    "the", "page", "swap", "out", "kernel", "memory", "of", "and", "a", "to", "in", "is", "zram",
    "compressed", "block", "device", "read", "write", "free", "slot", "handle", "class", "pool",
    "zspage", "fn", "let", "mut", "return", "struct", "impl", "error", "ok", "if", "else", "for",
    "while", "self", "u64", "usize", "buffer", "offset", "length", "sector", "thread", "lock",
    "queue", "io_uring", "ublk",
];

/// Fills `out` with words from a vocabulary of 4 to 47 (by `seed`): text of any length, from
/// highly to moderately compressible.
pub fn fill_text(out: &mut [u8], seed: u64) {
    let vocabulary = 4 + (seed % 44) as usize;
    let mut pos = 0;
    let mut i = 0u64;
    while pos < out.len() {
        let word = WORDS[(mix(seed << 20 | i) % vocabulary as u64) as usize].as_bytes();
        for &b in word.iter().chain(b" ") {
            if pos == out.len() {
                break;
            }
            out[pos] = b;
            pos += 1;
        }
        i += 1;
    }
}

/// Fills `out` with xorshift noise from `seed`: incompressible, deterministic.
pub fn fill_noise(out: &mut [u8], seed: u64) {
    let mut state = seed | 1;
    for chunk in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

/// A page of log-like lines from `seed`: lz4 compresses it about 3 times; pages of different
/// seeds share phrases but not lines.
pub fn text_page(seed: u64) -> [u8; PAGE_SIZE] {
    const PHRASES: &[&str] = &[
        "slot",
        "page",
        "handle",
        "zspage",
        "class",
        "free",
        "idle",
        "huge",
        "write back",
        "compressed",
        "same filled",
        "level",
        "error",
        "queue depth",
        "sector",
        "pool",
    ];
    let mut noise = [0u8; 1024];
    fill_noise(&mut noise, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut page = [0u8; PAGE_SIZE];
    let mut at = 0;
    let mut r = noise.chunks(4).cycle();
    while at < PAGE_SIZE {
        let c = r.next().unwrap_or(&[0; 4]);
        let line = format!(
            "uzram: {} {} of {} at {}\n",
            PHRASES[usize::from(c[0] % 16)],
            u16::from(c[1]) * 4,
            PHRASES[usize::from(c[2] % 16)],
            c[3] % 16,
        );
        let end = (at + line.len()).min(PAGE_SIZE);
        page[at..end].copy_from_slice(&line.as_bytes()[..end - at]);
        at = end;
    }
    page
}

/// An incompressible page from `seed` ([`fill_noise`]): stored raw, one pool page.
pub fn noise_page(seed: u64) -> [u8; PAGE_SIZE] {
    let mut page = [0u8; PAGE_SIZE];
    fill_noise(&mut page, seed);
    page
}

/// The fill word if `page` is one 8-byte word repeated (zeros included).
pub fn same_word(page: &[u8]) -> Option<u64> {
    let first = &page[..8];
    page.chunks_exact(8)
        .all(|w| w == first)
        .then(|| u64::from_ne_bytes(first.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_pages_compress_like_text() {
        let page = text_page(1);
        assert!(page.iter().all(|b| b.is_ascii()));
        let compressed = lz4_flex::block::compress(&page);
        assert!(compressed.len() < PAGE_SIZE / 2, "{}", compressed.len());
        assert_ne!(text_page(1), text_page(2));
        let mut words = [0u8; PAGE_SIZE];
        fill_text(&mut words, 5);
        assert!(lz4_flex::block::compress(&words).len() < PAGE_SIZE / 2);
    }

    #[test]
    fn noise_does_not_compress() {
        assert!(lz4_flex::block::compress(&noise_page(3)).len() > PAGE_SIZE);
        assert_ne!(noise_page(3), noise_page(4));
    }

    #[test]
    fn same_word_finds_a_repeated_word_only() {
        assert_eq!(same_word(&[0u8; PAGE_SIZE]), Some(0));
        let mut p = [7u8; PAGE_SIZE];
        assert_eq!(same_word(&p), Some(u64::from_ne_bytes([7; 8])));
        p[4095] = 0;
        assert_eq!(same_word(&p), None);
    }
}
