//! The pool against a model: proptest sequences, the memory limit, compaction, and the fuzz corpus.

use proptest::prelude::*;
use uzram_allocator::fuzzing::{pattern, run_ops, PoolOp};
use uzram_allocator::{Error, Pool, PoolConfig, PAGE_SIZE};

fn op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        6 => (any::<u16>(), any::<u8>()).prop_map(|(size, seed)| PoolOp::Store { size, seed }),
        // Realistic compressed sizes dominate: 800..3000 bytes.
        4 => (800u16..3000, any::<u8>()).prop_map(|(size, seed)| PoolOp::Store { size, seed }),
        4 => any::<u16>().prop_map(|idx| PoolOp::Free { idx }),
        2 => (any::<u16>(), any::<u8>()).prop_map(|(idx, seed)| PoolOp::Rewrite { idx, seed }),
        2 => any::<u16>().prop_map(|idx| PoolOp::Read { idx }),
        1 => Just(PoolOp::Compact),
        1 => proptest::option::of(any::<u8>()).prop_map(|pages| PoolOp::SetLimit { pages }),
        1 => any::<u64>().prop_map(|raw| PoolOp::Bogus { raw }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(ops in proptest::collection::vec(op(), 1..600), chain in 1usize..=16) {
        run_ops(&ops, chain);
    }
}

#[test]
fn limit_refuses_growth_and_keeps_existing_objects() {
    let pool = Pool::new(PoolConfig {
        limit_bytes: Some(16 * PAGE_SIZE as u64),
        ..Default::default()
    })
    .unwrap();
    let mut live = Vec::new();
    let err = loop {
        let data = pattern(live.len() as u8, 2000);
        match pool.store(&data) {
            Ok(h) => live.push((h, data)),
            Err(e) => break e,
        }
        assert!(live.len() < 1000, "limit never hit");
    };
    assert!(matches!(err, Error::LimitExceeded { limit_bytes, .. } if limit_bytes == 16 * 4096));
    assert!(pool.stats().pages_used <= 16);
    // Objects of a class with a free slot still fit; everything stored is intact.
    for (h, data) in &live {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), data);
    }
    // Raising the limit lets the same store through.
    pool.set_limit(None);
    pool.store(&pattern(1, 2000)).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn compaction_frees_pages_after_random_frees() {
    let pool = Pool::new(PoolConfig {
        auto_compact: false,
        ..Default::default()
    })
    .unwrap();
    let mut live: Vec<_> = (0..20_000u32)
        .map(|i| {
            let data = pattern(i as u8, 500 + (i as usize * 37) % 2500);
            (pool.store(&data).unwrap(), data)
        })
        .collect();
    let full = pool.stats();
    // Free every other object: half the pool becomes holes.
    let mut kept = Vec::new();
    for (i, (h, d)) in live.drain(..).enumerate() {
        if i % 2 == 0 {
            pool.free(h).unwrap();
        } else {
            kept.push((h, d));
        }
    }
    let holey = pool.stats();
    assert!(
        holey.pages_used > full.pages_used * 9 / 10,
        "holes do not free zspages by themselves"
    );
    let c = pool.compact();
    let after = pool.stats();
    assert!(
        c.pages_freed > 0 && after.pages_used < holey.pages_used * 6 / 10,
        "{c:?} {after:?}"
    );
    assert_eq!(after.pages_compacted, c.pages_freed);
    assert!(
        after.pages_mapped < holey.pages_mapped,
        "compaction gave no arena back: {after:?}"
    );
    pool.check_invariants().unwrap();
    for (h, d) in &kept {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), d);
    }
}

#[test]
fn auto_compaction_keeps_fragmentation_bounded() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let live: Vec<_> = (0..20_000u32)
        .map(|i| pool.store(&pattern(i as u8, 1500)).unwrap())
        .collect();
    let full = pool.stats().pages_used;
    for (i, h) in live.iter().enumerate() {
        if i % 2 == 0 {
            pool.free(*h).unwrap();
        }
    }
    let used = pool.stats().pages_used;
    assert!(
        used * 100 <= full * 65,
        "auto compaction left {used} of {full} pages"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn bad_sizes_and_handles_are_errors() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    assert!(matches!(
        pool.alloc(0),
        Err(Error::InvalidSize { size: 0, .. })
    ));
    assert!(matches!(
        pool.alloc(4097),
        Err(Error::InvalidSize { size: 4097, .. })
    ));
    let h = pool.store(&[7; 100]).unwrap();
    assert!(matches!(
        pool.write(h, &[1; 101]),
        Err(Error::WriteTooLong {
            len: 101,
            size: 100
        })
    ));
    let mut small = [0u8; 10];
    assert!(matches!(
        pool.read_into(h, &mut small),
        Err(Error::BufferTooSmall { .. })
    ));
    pool.free(h).unwrap();
    assert!(matches!(
        pool.read(h, |_| ()),
        Err(Error::InvalidHandle { .. })
    ));
    assert!(Pool::new(PoolConfig {
        max_pages_per_zspage: 0,
        ..Default::default()
    })
    .is_err());
}

#[test]
fn fuzz_corpus_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/pool_ops");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus dir") {
        let path = entry.unwrap().path();
        uzram_allocator::fuzzing::pool_ops(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "no corpus files in {}", dir.display());
}
