//! The page a stream compresses or decompresses once when it is made, so that zstd's contexts
//! are allocated and their tables written before the first real page: a stream whose first
//! page comes on an I/O thread, under memory pressure, must not fault on them then.
//!
//! It must make zstd use what real pages use: literals compressed with a Huffman table of
//! their own, and sequences (literal lengths, offsets, match lengths) coded with FSE tables of
//! their own. A page of one short pattern repeated does neither (its literals are stored raw
//! and its three sequences use zstd's predefined tables), and its decompression writes none of
//! the decompression context's entropy tables. So the page is words of a small vocabulary and
//! five-digit numbers, drawn by a fixed generator, with punctuation between them.

use crate::PAGE_SIZE;

/// The warm-up page.
pub(crate) static WARM_PAGE: [u8; PAGE_SIZE] = warm_page();

/// [`WARM_PAGE`] compressed by zstd at level 3, as a frame any zstd decompression context
/// decodes (made once, checked by the tests below): a stream's decompression context is
/// written by decoding it, with no compression context made for it.
pub(crate) static WARM_FRAME: &[u8] = include_bytes!("warm_page.zst");

const WORDS: [&[u8]; 16] = [
    b"alpha",
    b"bravo",
    b"charlie",
    b"delta",
    b"echo",
    b"foxtrot",
    b"golf",
    b"hotel",
    b"india",
    b"juliett",
    b"kilo",
    b"lima",
    b"mike",
    b"november",
    b"oscar",
    b"papa",
];
const SEPARATORS: [u8; 8] = [b' ', b',', b'.', b'\n', b';', b':', b'-', b'='];

const fn warm_page() -> [u8; PAGE_SIZE] {
    let mut page = [0u8; PAGE_SIZE];
    let mut x: u32 = 0x1234_5678;
    let mut i = 0;
    while i < PAGE_SIZE {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let r = x >> 16;
        if r % 5 == 0 {
            let mut n = (r * 7919) % 100_000;
            let mut k = 0;
            while k < 5 && i < PAGE_SIZE {
                page[i] = b'0' + (n % 10) as u8;
                n /= 10;
                i += 1;
                k += 1;
            }
        } else {
            let word = WORDS[(r % 16) as usize];
            let mut k = 0;
            while k < word.len() && i < PAGE_SIZE {
                page[i] = word[k];
                i += 1;
                k += 1;
            }
        }
        if i < PAGE_SIZE {
            page[i] = SEPARATORS[((r >> 5) % 8) as usize];
            i += 1;
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first block of a zstd frame: its literals' type (0 raw, 1 RLE, 2 Huffman with its
    /// own table, 3 the previous table) and its sequences' three modes (literal lengths,
    /// offsets, match lengths: 0 predefined, 1 RLE, 2 FSE with its own table, 3 repeat), from
    /// the format's headers (RFC 8878, 3.1.1).
    fn first_block(f: &[u8]) -> (u8, [u8; 3]) {
        let fhd = f[4];
        let single = fhd & 0x20 != 0;
        let fcs = [usize::from(single), 2, 4, 8][usize::from(fhd >> 6)];
        let did = [0, 1, 2, 4][usize::from(fhd & 3)];
        let mut p = 5 + usize::from(!single) + did + fcs;
        assert_eq!((f[p] >> 1) & 3, 2, "a compressed block");
        p += 3;
        let b = |k: usize| usize::from(f[p + k]);
        let literals = f[p] & 3;
        let size_format = (f[p] >> 2) & 3;
        let (header, len) = match (literals, size_format) {
            (0 | 1, 0 | 2) => (1, b(0) >> 3),
            (0 | 1, 1) => (2, (b(0) >> 4) + (b(1) << 4)),
            (0 | 1, _) => (3, (b(0) >> 4) + (b(1) << 4) + (b(2) << 12)),
            (_, 0 | 1) => (3, (b(1) >> 6) + (b(2) << 2)),
            (_, 2) => (4, (b(2) >> 2) + (b(3) << 6)),
            _ => (5, (b(2) >> 6) + (b(3) << 2) + (b(4) << 10)),
        };
        p += header + if literals == 1 { 1 } else { len };
        let count = f[p];
        p += match count {
            0 => return (literals, [0; 3]),
            1..=127 => 1,
            128..=254 => 2,
            255 => 3,
        };
        let modes = f[p];
        (literals, [modes >> 6, (modes >> 4) & 3, (modes >> 2) & 3])
    }

    #[test]
    fn the_warm_frame_is_the_warm_page_with_its_own_tables() {
        assert_eq!(zstd::decode_all(WARM_FRAME).unwrap(), WARM_PAGE);
        assert_eq!(first_block(WARM_FRAME), (2, [2, 2, 2]));
    }

    #[test]
    fn the_warm_page_makes_zstd_use_its_entropy_tables() {
        let mut cctx = zstd::zstd_safe::CCtx::create();
        let mut frame = vec![0u8; 2 * PAGE_SIZE];
        for level in [1, 3, 9, 19] {
            let n = cctx
                .compress(&mut frame[..], &WARM_PAGE[..], level)
                .unwrap();
            assert_eq!(
                first_block(&frame[..n]),
                (2, [2, 2, 2]),
                "level {level}: Huffman literals and three FSE tables of its own"
            );
        }
        // What the parser says of a page of one pattern repeated (the warm-up page before).
        let pattern: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251 / 3) as u8).collect();
        let n = cctx.compress(&mut frame[..], &pattern, 3).unwrap();
        assert_eq!(first_block(&frame[..n]), (0, [0, 0, 0]));
    }
}
