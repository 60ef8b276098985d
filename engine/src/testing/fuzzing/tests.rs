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

/// Where a `device_ops` input's time goes (setup against operations), in a release build:
/// `cargo test --release -p uzram-engine --lib fuzzing::tests::where_the_time_goes -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn where_the_time_goes() {
    use std::time::Instant;
    let seeds = seeds();
    let t = Instant::now();
    for _ in 0..20 {
        drop(harness::Harness::new(Algorithm::Lz4));
    }
    let setup = t.elapsed() / 20;
    let h = harness::Harness::new(Algorithm::Lz4);
    let t = Instant::now();
    for _ in 0..100 {
        h.device.check_invariants().unwrap();
    }
    eprintln!(
        "check_invariants of an empty device: {:?}",
        t.elapsed() / 100
    );
    let t = Instant::now();
    for _ in 0..100 {
        let _ = h.device.stats();
    }
    eprintln!("stats: {:?}", t.elapsed() / 100);
    let t = Instant::now();
    for _ in 0..100 {
        let _ = h.device.compact();
    }
    eprintln!("compact of an empty device: {:?}", t.elapsed() / 100);
    drop(h);
    let t = Instant::now();
    let mut n = 0;
    for (_, algorithm, ops) in &seeds {
        run_ops(ops, *algorithm);
        n += 1;
    }
    let per_input = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..5 {
        for (_, algorithm, ops) in &seeds {
            device_ops(&encode(*algorithm, ops));
        }
    }
    eprintln!(
        "device_ops (a kept harness): {:?} per seed input",
        t.elapsed() / (5 * n)
    );
    let (mut apply, mut stats, mut all, mut ops_n) = Default::default();
    let mut by_kind: std::collections::BTreeMap<String, (u32, std::time::Duration)> =
        Default::default();
    for (_, algorithm, ops) in &seeds {
        let mut h = harness::Harness::new(*algorithm);
        for (step, op) in ops.iter().enumerate() {
            h.step = step;
            let t = Instant::now();
            h.apply(*op);
            apply += t.elapsed();
            let kind = format!("{op:?}");
            let kind = kind
                .split([' ', '{'])
                .next()
                .unwrap_or_default()
                .to_string();
            let e = by_kind.entry(kind).or_default();
            e.0 += 1;
            e.1 += t.elapsed();
            let t = Instant::now();
            h.check_stats();
            stats += t.elapsed();
            if step % CHECK_EVERY == CHECK_EVERY - 1 {
                let t = Instant::now();
                h.check_all();
                all += t.elapsed();
            }
            ops_n += 1;
        }
    }
    let _: (
        std::time::Duration,
        std::time::Duration,
        std::time::Duration,
        u32,
    ) = (apply, stats, all, ops_n);
    eprintln!(
        "setup {setup:?} per harness; {per_input:?} per seed input ({n} seeds, {ops_n} ops): apply {apply:?}, check_stats {stats:?}, check_all {all:?} in all; by operation {by_kind:?}"
    );
}
