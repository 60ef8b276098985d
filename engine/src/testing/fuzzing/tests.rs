use uzram_codecs::{Codec, CodecParams, MAX_COMPRESSED_LEN};

use super::harness::{Span, Stored};
use super::*;
use crate::PageIndex;

#[test]
fn encode_round_trips_through_arbitrary() {
    for (name, algorithm, ops) in seeds() {
        let decoded = decode(&encode(algorithm, &ops)).expect("decodes");
        assert_eq!(decoded, (algorithm, ops), "{name}");
    }
}

#[test]
fn kinds_make_the_pages_they_promise() {
    let page = |k: PageKind| k.content(7, PAGE_SIZE);
    assert_eq!(same_word(&page(PageKind::Zeros)), Some(0));
    assert!(same_word(&page(PageKind::Same)).is_some_and(|w| w != 0));
    for k in [
        PageKind::Text,
        PageKind::Pointers,
        PageKind::Noise,
        PageKind::Sparse,
    ] {
        assert_eq!(same_word(&page(k)), None, "{k:?}");
    }
    let codec = Codec::new(Algorithm::Lz4, CodecParams::default()).unwrap();
    let mut stream = codec.stream().unwrap();
    let mut buf = vec![0; MAX_COMPRESSED_LEN];
    let mut size = |k: PageKind, seed: u8| {
        let p: [u8; PAGE_SIZE] = k.content(seed, PAGE_SIZE).try_into().unwrap();
        stream.compress(&p, &mut buf).unwrap()
    };
    assert!(
        size(PageKind::Noise, 1) > PAGE_SIZE,
        "noise is incompressible"
    );
    assert!(size(PageKind::Text, 1) < PAGE_SIZE / 2, "text compresses");
    assert!(
        size(PageKind::Sparse, 1) < PAGE_SIZE / 8,
        "sparse compresses well"
    );
    let mixed: Vec<usize> = (0..32).map(|s| size(PageKind::Mixed, s)).collect();
    let (lo, hi) = (mixed.iter().min().unwrap(), mixed.iter().max().unwrap());
    assert!(
        *lo < 1500 && *hi > 2500,
        "mixed spans the classes: {lo}..{hi}"
    );
}

#[test]
fn ranges_split_into_page_pieces() {
    let r = Span {
        offset: 3584,
        len_bytes: 5120,
    };
    assert_eq!(
        r.pieces(),
        vec![
            (PageIndex(0), 3584, 512),
            (PageIndex(1), 0, 4096),
            (PageIndex(2), 0, 512)
        ]
    );
    assert_eq!(
        Span::sectors(SECTOR_SPAN + 3, MAX_SECTORS + 2).offset,
        3 * 512
    );
    assert_eq!(Span::sectors(0, MAX_SECTORS + 2).len_bytes, 512);
}

/// A harness with a few pages of each kind written, half of page 1 discarded around.
fn written() -> Harness {
    let mut h = Harness::new(Algorithm::Lz4);
    for (page, kind) in [
        PageKind::Text,
        PageKind::Noise,
        PageKind::Same,
        PageKind::Mixed,
    ]
    .into_iter()
    .enumerate()
    {
        h.apply(DeviceOp::Write {
            sector: page as u16 * 8,
            sectors: 8,
            kind,
            seed: 3,
        });
    }
    h.apply(DeviceOp::Discard {
        sector: 4,
        sectors: 8,
    });
    h.check_stats();
    h.check_all();
    h
}

/// The checks fail when the model and the device disagree, whichever side is wrong.
#[test]
fn the_harness_notices_a_wrong_model() {
    type Tamper = fn(&mut Harness);
    let cases: [(&str, Tamper); 5] = [
        ("a flipped byte", |h| {
            h.pages.get_mut(&PageIndex(0)).unwrap().data[100] ^= 1;
        }),
        ("a partial discard modelled as a free", |h| {
            h.pages.remove(&PageIndex(1));
        }),
        ("a compressed size off by one", |h| {
            let p = h.pages.get_mut(&PageIndex(0)).unwrap();
            let Stored::Compressed(n) = p.stored else {
                panic!("text compresses")
            };
            p.stored = Stored::Compressed(n + 1);
        }),
        ("a free that was not counted", |h| h.io.notify_free += 1),
        ("a huge page not counted since", |h| h.huge_pages_since -= 1),
    ];
    for (what, tamper) in cases {
        let mut h = written();
        tamper(&mut h);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.check_stats();
            h.check_all();
        }));
        assert!(caught.is_err(), "{what} went unnoticed");
    }
}
