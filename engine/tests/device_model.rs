//! The device against a model: proptest sequences of operations (partial pages, discards,
//! write-zeroes, compaction, memory limits, bad ranges), the fuzz corpus, and the memory limit.

use std::collections::HashMap;
use std::path::PathBuf;

use proptest::prelude::*;
use uzram_codecs::Algorithm;
use uzram_engine::testing::fuzzing::{
    decode, encode, run_ops, seeds, DeviceOp, PageKind, Tally, WildOp, MAX_SECTORS, SECTOR_SPAN,
};
use uzram_engine::{Device, DeviceConfig, IoContext, IoError, PageIndex, PAGE_SIZE};

/// A request's span as (first sector, sectors), before the harness's modulo.
fn span() -> impl Strategy<Value = (u16, u8)> {
    prop_oneof![
        // Whole pages.
        3 => (0u16..64, 1u8..=8).prop_map(|(page, pages)| (page * 8, pages * 8)),
        // Any sector, up to three pages: partial pages at one or both ends.
        4 => (0u16..512, 1u8..=24),
        // Inside one page.
        2 => (0u16..64, 0u8..8, 1u8..8)
            .prop_map(|(page, first, n)| (page * 8 + u16::from(first), n.min(8 - first))),
        // Near and past the end; empty requests.
        1 => (480u16..SECTOR_SPAN, 0u8..=MAX_SECTORS),
    ]
}

fn op() -> impl Strategy<Value = DeviceOp> {
    let kind = proptest::sample::select(PageKind::ALL.to_vec());
    let wild = proptest::sample::select(vec![
        WildOp::Read,
        WildOp::Write,
        WildOp::Discard,
        WildOp::WriteZeroes,
    ]);
    prop_oneof![
        8 => (span(), kind, any::<u8>()).prop_map(|((sector, sectors), kind, seed)| {
            DeviceOp::Write { sector, sectors, kind, seed }
        }),
        4 => span().prop_map(|(sector, sectors)| DeviceOp::Read { sector, sectors }),
        3 => span().prop_map(|(sector, sectors)| DeviceOp::Discard { sector, sectors }),
        2 => span().prop_map(|(sector, sectors)| DeviceOp::WriteZeroes { sector, sectors }),
        1 => Just(DeviceOp::Compact),
        1 => proptest::option::of(0u8..40).prop_map(|pages| DeviceOp::SetMemLimit { pages }),
        1 => Just(DeviceOp::ResetMemUsedMax),
        1 => any::<bool>().prop_map(|foreign| DeviceOp::SwitchContext { foreign }),
        1 => any::<bool>().prop_map(|all| DeviceOp::MarkIdle { all }),
        1 => any::<bool>().prop_map(|huge_only| DeviceOp::Recompress { huge_only }),
        1 => (any::<u8>(), 0u8..32, proptest::bool::weighted(0.2))
            .prop_map(|(page, pages, fail)| DeviceOp::Writeback { page, pages, fail }),
        1 => (wild, prop_oneof![any::<u64>(), 0u64..300_000], any::<u16>())
            .prop_map(|(op, offset, len_bytes)| DeviceOp::Wild { op, offset, len_bytes }),
        1 => Just(DeviceOp::Restart),
        1 => (any::<u8>(), proptest::bool::weighted(0.3))
            .prop_map(|(max, split)| DeviceOp::Group { max, split }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn lz4_device_matches_model(ops in proptest::collection::vec(op(), 1..250)) {
        run_ops(&ops, Algorithm::Lz4);
    }

    #[test]
    fn zstd_device_matches_model(ops in proptest::collection::vec(op(), 1..250)) {
        run_ops(&ops, Algorithm::Zstd);
    }
}

/// A write into a page whose slot took over a record kept on the backing store, with the pool
/// at its limit: it needs memory, fails, and the slot keeps the record (a failed write leaves
/// its slot as it was, so the slot's record says nothing of that write).
#[test]
fn a_failed_write_over_a_taken_over_record_leaves_the_record() {
    let ops = vec![
        DeviceOp::Write {
            sector: 360,
            sectors: 56,
            kind: PageKind::Mixed,
            seed: 91,
        },
        DeviceOp::Writeback {
            page: 108,
            pages: 20,
            fail: false,
        },
        DeviceOp::SetMemLimit { pages: Some(2) },
        DeviceOp::Discard {
            sector: 344,
            sectors: 56,
        },
        // Pages 60-63 again, as pages 45-51 were: they take over the records kept for them.
        DeviceOp::Write {
            sector: 480,
            sectors: 32,
            kind: PageKind::Mixed,
            seed: 91,
        },
        DeviceOp::Write {
            sector: 299,
            sectors: 2,
            kind: PageKind::Mixed,
            seed: 119,
        },
        // Part of page 61: new bytes, which the full pool cannot take.
        DeviceOp::Write {
            sector: 492,
            sectors: 7,
            kind: PageKind::Text,
            seed: 158,
        },
    ];
    run_ops(&ops, Algorithm::Zstd);
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/device_ops")
}

#[test]
fn fuzz_corpus_replays() {
    let mut files = 0;
    let mut tally = Tally::default();
    for entry in std::fs::read_dir(corpus_dir()).expect("corpus dir") {
        let path = entry.unwrap().path();
        let (algorithm, ops) = decode(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|| panic!("{} does not decode", path.display()));
        tally += run_ops(&ops, algorithm);
        files += 1;
    }
    assert!(
        files >= 8,
        "{files} corpus files in {}",
        corpus_dir().display()
    );
    // The seeds reach every path they were written for.
    let t = tally;
    for (what, n) in [
        ("refused requests", t.refused),
        ("MemLimit on a first page", t.mem_limit_first),
        ("MemLimit part way", t.mem_limit_later),
        ("partial pages", t.partial_pages),
        ("same-filled pages", t.same_pages),
        ("huge pages", t.huge_pages),
        ("freed pages", t.freed_pages),
        ("compacted pages", t.compacted_pages),
        ("recompressed pages", t.recompressed_pages),
        ("written-back pages", t.written_back_pages),
        ("pages freed by their marks", t.notice_freed_pages),
        ("restarts", t.restarts),
        ("promoted pages", t.promoted_pages),
        ("grouped pages", t.grouped_pages),
        ("pages split out of groups", t.split_pages),
        ("grouped pages written back", t.grouped_written_back),
    ] {
        assert!(n > 0, "the corpus has no {what}: {t:?}");
    }
}

#[test]
fn seed_corpus_files_are_current() {
    for (name, algorithm, ops) in seeds() {
        let path = corpus_dir().join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            bytes == encode(algorithm, &ops),
            "{name} is stale: cargo test -p uzram --test device_model -- --ignored write_seed_corpus"
        );
    }
}

/// Regenerates the seeds of `fuzz/corpus/device_ops/` from `uzram_engine::testing::fuzzing::seeds()`.
#[test]
#[ignore = "writes fuzz/corpus/device_ops; run after changing fuzzing::seeds"]
fn write_seed_corpus() {
    std::fs::create_dir_all(corpus_dir()).unwrap();
    for (name, algorithm, ops) in seeds() {
        std::fs::write(corpus_dir().join(name), encode(algorithm, &ops)).unwrap();
    }
}

// The memory limit, step by step.

const PAGE: u64 = PAGE_SIZE as u64;

fn device(algorithm: Algorithm, pages: u64) -> (Device, IoContext) {
    let config = DeviceConfig {
        algorithm,
        ..DeviceConfig::default()
    };
    let d = Device::new(config, pages * PAGE).unwrap();
    let ctx = d.context().unwrap();
    (d, ctx)
}

fn page_of(kind: PageKind, seed: u8) -> Vec<u8> {
    kind.content(seed, PAGE_SIZE)
}

/// The pages written so far; a missing page reads as zeros.
#[derive(Default)]
struct Model(HashMap<u64, Vec<u8>>);

impl Model {
    fn write(
        &mut self,
        d: &Device,
        ctx: &mut IoContext,
        page: u64,
        data: &[u8],
    ) -> Result<(), IoError> {
        let r = d.write(ctx, page * PAGE, data);
        if r.is_ok() {
            for (i, p) in data.chunks(PAGE_SIZE).enumerate() {
                self.0.insert(page + i as u64, p.to_vec());
            }
        }
        r
    }

    fn discard(&mut self, d: &Device, page: u64, pages: u64) {
        d.discard(page * PAGE, pages * PAGE).unwrap();
        for p in page..page + pages {
            self.0.remove(&p);
        }
    }

    fn verify(&self, d: &Device, ctx: &mut IoContext) {
        let mut buf = vec![0u8; PAGE_SIZE];
        for p in 0..d.pages() {
            d.read(ctx, p * PAGE, &mut buf).unwrap();
            let want = self.0.get(&p).map_or(&[0u8; PAGE_SIZE][..], |v| &v[..]);
            assert!(buf == want, "page {p} differs from the model");
            let empty = d.slot_state(PageIndex(p)).unwrap().is_empty();
            assert_eq!(empty, !self.0.contains_key(&p), "page {p}: slot presence");
        }
        let mm = d.stats().mm;
        assert_eq!(mm.orig_data_size, self.0.len() as u64 * PAGE);
        d.check_invariants().unwrap();
    }
}

fn assert_mem_limit(r: Result<(), IoError>, limit_pages: u64) {
    assert!(
        matches!(r, Err(IoError::MemLimit { limit_bytes, .. }) if limit_bytes == limit_pages * PAGE),
        "want MemLimit of {limit_pages} pages, got {r:?}"
    );
}

#[test]
fn writes_past_the_limit_fail_and_old_contents_survive() {
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let (d, mut ctx) = device(algorithm, 128);
        let mut m = Model::default();
        d.set_mem_limit(Some(16 * PAGE));
        // Noise is stored raw: one pool page each, so exactly 16 fit.
        for i in 0..16 {
            m.write(&d, &mut ctx, i, &page_of(PageKind::Noise, i as u8))
                .unwrap();
        }
        assert_mem_limit(m.write(&d, &mut ctx, 16, &page_of(PageKind::Noise, 16)), 16);
        // Overwriting needs the new page before the old one is freed: refused, old page kept.
        assert_mem_limit(m.write(&d, &mut ctx, 3, &page_of(PageKind::Noise, 99)), 16);
        // Same-filled pages cost no pool memory.
        m.write(&d, &mut ctx, 40, &page_of(PageKind::Same, 1))
            .unwrap();
        m.write(&d, &mut ctx, 41, &page_of(PageKind::Zeros, 0))
            .unwrap();
        m.write(&d, &mut ctx, 21, &page_of(PageKind::Same, 2))
            .unwrap();
        m.verify(&d, &mut ctx);

        // A request goes page by page and stops at the first that fails: with room for one
        // page, page 20 is written, 21 fails and keeps its old page, 22 and 23 are not reached
        // (though 23, same-filled, would fit).
        m.discard(&d, 15, 1);
        let request = [
            page_of(PageKind::Noise, 20),
            page_of(PageKind::Noise, 21),
            page_of(PageKind::Noise, 22),
            page_of(PageKind::Same, 23),
        ]
        .concat();
        assert_mem_limit(d.write(&mut ctx, 20 * PAGE, &request), 16);
        m.0.insert(20, page_of(PageKind::Noise, 20));
        m.verify(&d, &mut ctx);

        let s = d.stats();
        assert_eq!(s.mm.mem_used_total, 16 * PAGE);
        assert!(s.mm.mem_used_max <= s.mm.mem_limit);
        assert_eq!(s.mm.mem_limit, 16 * PAGE);
        assert_eq!((s.mm.huge_pages, s.mm.same_pages), (16, 3));
        assert_eq!(s.io.failed_writes, 3);

        // Freeing makes room again, exactly as much as was freed.
        m.discard(&d, 0, 8);
        for i in 0..8 {
            m.write(
                &d,
                &mut ctx,
                48 + i,
                &page_of(PageKind::Noise, 100 + i as u8),
            )
            .unwrap();
        }
        assert_mem_limit(m.write(&d, &mut ctx, 56, &page_of(PageKind::Noise, 56)), 16);
        m.verify(&d, &mut ctx);
        assert_eq!(d.stats().mm.mem_used_total, 16 * PAGE);

        // And clearing the limit lifts it.
        d.set_mem_limit(None);
        m.write(&d, &mut ctx, 56, &page_of(PageKind::Noise, 56))
            .unwrap();
        assert_eq!(d.stats().mm.mem_limit, 0);
        m.verify(&d, &mut ctx);
    }
}

#[test]
fn lowering_the_limit_below_use_keeps_pages_and_stops_growth() {
    let (d, mut ctx) = device(Algorithm::Lz4, 64);
    let mut m = Model::default();
    for i in 0..32 {
        m.write(&d, &mut ctx, i, &page_of(PageKind::Noise, i as u8))
            .unwrap();
    }
    d.set_mem_limit(Some(8 * PAGE));
    let mm = d.stats().mm;
    assert_eq!((mm.mem_used_total, mm.mem_limit), (32 * PAGE, 8 * PAGE));
    assert_mem_limit(m.write(&d, &mut ctx, 40, &page_of(PageKind::Noise, 40)), 8);
    assert_mem_limit(m.write(&d, &mut ctx, 0, &page_of(PageKind::Noise, 77)), 8);
    m.verify(&d, &mut ctx);
    // Down to 2 pages used: 6 more fit, the 7th does not.
    m.discard(&d, 0, 30);
    for i in 0..6 {
        m.write(&d, &mut ctx, 40 + i, &page_of(PageKind::Noise, i as u8))
            .unwrap();
    }
    assert_mem_limit(m.write(&d, &mut ctx, 46, &page_of(PageKind::Noise, 46)), 8);
    assert_eq!(d.stats().mm.mem_used_total, 8 * PAGE);
    m.verify(&d, &mut ctx);
}

#[test]
fn partial_write_zeroes_stores_the_page_again_and_can_hit_the_limit() {
    let (d, mut ctx) = device(Algorithm::Lz4, 8);
    let mut m = Model::default();
    m.write(&d, &mut ctx, 0, &page_of(PageKind::Noise, 1))
        .unwrap();
    m.write(&d, &mut ctx, 1, &page_of(PageKind::Noise, 2))
        .unwrap();
    d.set_mem_limit(Some(2 * PAGE));
    // Zeroing a sector stores page 0 anew (3.5 KiB of noise no longer huge: a zspage of several
    // pages), which the full limit refuses; the page keeps its contents.
    assert_mem_limit(d.write_zeroes(&mut ctx, 512, 512), 2);
    m.verify(&d, &mut ctx);
    assert_eq!(d.stats().io.failed_writes, 1);
    // Zeroing a whole page frees it: that never needs memory.
    d.write_zeroes(&mut ctx, PAGE, PAGE).unwrap();
    m.0.remove(&1);
    m.verify(&d, &mut ctx);
    d.set_mem_limit(None);
    d.write_zeroes(&mut ctx, 512, 512).unwrap();
    m.0.get_mut(&0).unwrap()[512..1024].fill(0);
    m.verify(&d, &mut ctx);
    let s = d.stats();
    assert_eq!((s.io.failed_writes, s.io.notify_free), (1, 1));
}
