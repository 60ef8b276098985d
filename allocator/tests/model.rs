//! The pool against a model: proptest sequences, the memory limit, compaction, and the fuzz corpus.

use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use uzram_allocator::fuzzing::{pattern, run_ops, PoolOp};

use uzram_allocator::{Error, Growth, Pool, PoolConfig, ARENA_PAGES, PAGE_SIZE};

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
        1 => Just(PoolOp::Maintain),
        1 => Just(PoolOp::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(
        ops in proptest::collection::vec(op(), 1..600),
        chain in 1usize..=16,
        reserve in any::<bool>(),
        shared in any::<bool>(),
    ) {
        run_ops(&ops, chain, reserve, shared);
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

/// Inputs in `dir` that restart a pool in a region after storing objects.
fn restarting_seeds(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("corpus dir") {
        let path = entry.unwrap().path();
        let Some((_, _, true, ops)) =
            uzram_allocator::fuzzing::decode(&std::fs::read(&path).unwrap())
        else {
            continue;
        };
        let stores = ops.iter().position(|o| matches!(o, PoolOp::Restart));
        let stored = stores.map_or(0, |at| {
            ops[..at]
                .iter()
                .filter(|o| matches!(o, PoolOp::Store { .. }))
                .count()
        });
        if stored >= 8 {
            found.push(path);
        }
    }
    found.sort();
    found
}

#[test]
fn fuzz_corpus_restarts_a_pool_in_a_region() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/pool_ops");
    // UZRAM_PICK_SEEDS=DIR lists such inputs of a fuzzing run's corpus, to add here.
    if let Ok(pick) = std::env::var("UZRAM_PICK_SEEDS") {
        for p in restarting_seeds(std::path::Path::new(&pick)) {
            println!(
                "seed: {} ({} bytes)",
                p.display(),
                std::fs::metadata(&p).unwrap().len()
            );
        }
    }
    let found = restarting_seeds(&dir);
    assert!(
        !found.is_empty(),
        "no seed in {} restarts a pool in a region after 8 stores",
        dir.display()
    );
}

/// Reserve mode: writers on several threads never map memory themselves; a maintenance thread
/// maps every arena they use, and gives back what frees leave empty. Counted exactly: every
/// arena mapped is the initial reserve or one `maintain` mapped.
#[test]
fn reserve_mode_maps_only_in_maintenance() {
    const RESERVE: usize = 4;
    let pool = Pool::new(PoolConfig {
        reserve_arenas: RESERVE,
        reserve_min_arenas: RESERVE,
        growth: Growth::Reserve {
            wait: Duration::from_secs(10),
        },
        ..Default::default()
    })
    .unwrap();
    assert_eq!(pool.stats().pages_mapped, (RESERVE * ARENA_PAGES) as u64);
    let stop = AtomicBool::new(false);
    let (mapped, unmapped, live) = std::thread::scope(|s| {
        let maintenance = s.spawn(|| {
            let (mut mapped, mut unmapped) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                pool.wait_for_maintenance(Duration::from_millis(5));
                let done = pool.maintain().unwrap();
                mapped += done.arenas_mapped;
                unmapped += done.arenas_unmapped;
            }
            (mapped, unmapped)
        });
        let writers: Vec<_> = (0..3u8)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    (0..6000u32)
                        .map(|i| {
                            let data = pattern(
                                t.wrapping_mul(31).wrapping_add(i as u8),
                                1500 + (i as usize * 53) % 2500,
                            );
                            (
                                pool.store(&data).expect("store waits for the reserve"),
                                data,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let live: Vec<_> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        stop.store(true, Ordering::Relaxed);
        let (mapped, unmapped) = maintenance.join().unwrap();
        (mapped, unmapped, live)
    });
    let s = pool.stats();
    assert!(
        mapped >= 10,
        "the writers' ~40 MiB came from maintenance: {mapped} arenas"
    );
    assert_eq!(
        s.pages_mapped,
        ((RESERVE + mapped - unmapped) * ARENA_PAGES) as u64,
        "an arena was mapped outside maintenance"
    );
    for (h, data) in &live {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), data);
    }
    pool.check_invariants().unwrap();
    // Frees leave arenas mapped; maintenance unmaps beyond twice the reserve, compaction down to it.
    for (h, _) in live {
        pool.free(h).unwrap();
    }
    let before = pool.stats().pages_mapped;
    let done = pool.maintain().unwrap();
    assert_eq!(
        pool.stats().pages_mapped,
        (2 * RESERVE * ARENA_PAGES) as u64,
        "{done:?}, {before} pages mapped before"
    );
    pool.compact();
    assert_eq!(pool.stats().pages_mapped, (RESERVE * ARENA_PAGES) as u64);
    pool.check_invariants().unwrap();
}

/// Reserve mode with nobody maintaining: a store waits its bounded time, then fails cleanly.
#[test]
fn reserve_mode_fails_after_its_wait_and_keeps_everything() {
    // Long enough that a test thread preempted on a busy machine still tells "failed at once"
    // from "waited again".
    const WAIT: Duration = Duration::from_millis(500);
    let pool = Pool::new(PoolConfig {
        reserve_arenas: 1,
        growth: Growth::Reserve { wait: WAIT },
        ..Default::default()
    })
    .unwrap();
    let mut live = Vec::new();
    let t0 = Instant::now();
    let err = loop {
        let data = pattern(live.len() as u8, 3000);
        match pool.store(&data) {
            Ok(h) => live.push((h, data)),
            Err(e) => break e,
        }
        assert!(live.len() < 10_000, "never ran out");
    };
    match err {
        Error::ReserveExhausted { waited_ms } => assert!(
            waited_ms >= WAIT.as_millis() as u64,
            "waited {waited_ms} ms"
        ),
        e => panic!("{e}"),
    }
    assert!(t0.elapsed() >= WAIT);
    // Until a refill comes, the next store that finds no room fails without waiting again.
    let t1 = Instant::now();
    assert!(matches!(
        pool.store(&pattern(1, 3000)),
        Err(Error::ReserveExhausted { .. })
    ));
    assert!(t1.elapsed() < WAIT / 2, "waited again: {:?}", t1.elapsed());
    // One arena of 2 MiB holds 3000-byte objects at about 1.36 per page.
    assert!(live.len() > 600, "{} objects in one arena", live.len());
    assert_eq!(pool.stats().pages_mapped, ARENA_PAGES as u64);
    for (h, data) in &live {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), data);
    }
    // After maintenance the same store goes through.
    pool.maintain().unwrap();
    pool.store(&pattern(0, 3000)).unwrap();
    pool.check_invariants().unwrap();
}
