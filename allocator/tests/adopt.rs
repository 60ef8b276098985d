//! A pool in a memfd region, adopted by a successor after its process "dies". Death is either a
//! leak (nothing of the pool is dropped or unmapped, as when a process is killed) or
//! [`Pool::leave`] (process memory goes, the region stays whole). The model is the list of live
//! objects with their bytes; every one must read back the same after adoption.

use std::os::fd::OwnedFd;
use std::time::Duration;

use uzram_allocator::fuzzing::pattern;
use uzram_allocator::{Error, Growth, Handle, Pool, PoolConfig, Region, RegionSize, CHUNK_WORDS};

fn region(arenas: u32) -> Region {
    Region::create(
        "uzram-adopt-test",
        RegionSize {
            arenas,
            meta_bytes: 4 << 20,
            table_bytes: 0,
        },
    )
    .unwrap()
}

fn config(region: &Region) -> PoolConfig {
    PoolConfig {
        region: Some(region.clone()),
        auto_compact: false,
        ..PoolConfig::default()
    }
}

/// The predecessor dies holding `pool`; returns a descriptor of its region, as a holder keeps.
fn die(pool: Pool) -> OwnedFd {
    let fd = pool.region().unwrap().fd().try_clone_to_owned().unwrap();
    std::mem::forget(pool);
    fd
}

/// The predecessor hands `pool` over.
fn leave(pool: Pool) -> OwnedFd {
    let fd = pool.region().unwrap().fd().try_clone_to_owned().unwrap();
    pool.leave();
    fd
}

fn check(pool: &Pool, live: &[(Handle, Vec<u8>)]) {
    pool.check_invariants().unwrap();
    for (h, d) in live {
        let got = pool.read(*h, |o| o.to_vec()).unwrap();
        assert!(got == *d, "{h:?}: {} bytes read back differ", d.len());
    }
    let s = pool.stats();
    assert_eq!(s.objects, live.len() as u64);
    assert_eq!(
        s.object_bytes,
        live.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
}

#[test]
fn a_successor_reads_every_object_after_frees_compaction_and_arena_moves() {
    let r = region(256);
    let pool = Pool::new(config(&r)).unwrap();
    let mut live: Vec<(Handle, Vec<u8>)> = (0..20_000u32)
        .map(|i| {
            let d = pattern(i as u8, 1 + (i as usize * 37) % 4096);
            (pool.store(&d).unwrap(), d)
        })
        .collect();
    // Holes everywhere, then compaction: objects move within classes and zspages move between
    // arenas (whose emptied places are punched out of the region).
    let mut kept = Vec::new();
    for (i, x) in live.drain(..).enumerate() {
        if i % 3 != 0 {
            pool.free(x.0).unwrap();
        } else {
            kept.push(x);
        }
    }
    let c = pool.compact();
    assert!(c.pages_freed > 0 && c.pages_released > 0, "{c:?}");
    // A few rewrites after the moves.
    for (i, (h, d)) in kept.iter_mut().enumerate().step_by(97) {
        *d = pattern(i as u8 ^ 0x5a, d.len());
        pool.write(*h, d).unwrap();
    }
    check(&pool, &kept);
    let before = pool.stats();
    drop(r);
    let fd = die(pool);

    let r = Region::adopt(fd).unwrap();
    let pool = Pool::adopt(config(&r)).unwrap();
    check(&pool, &kept);
    let after = pool.stats();
    assert_eq!(after.pages_used, before.pages_used);
    // It goes on: frees, new objects in the freed slots, another adoption.
    for x in kept.drain(..kept.len() / 2) {
        pool.free(x.0).unwrap();
    }
    for i in 0..3000u32 {
        let d = pattern(i as u8, 100 + i as usize % 3000);
        let h = pool.store(&d).unwrap();
        assert!(kept.iter().all(|(k, _)| *k != h), "handle given twice");
        kept.push((h, d));
    }
    pool.compact();
    check(&pool, &kept);
    drop(r);
    let fd = leave(pool);
    let r = Region::adopt(fd).unwrap();
    let pool = Pool::adopt(config(&r)).unwrap();
    check(&pool, &kept);
    // A clean end gives everything back: only the header and the metadata chunks stay.
    for (h, _) in kept.drain(..) {
        pool.free(h).unwrap();
    }
    pool.compact();
    drop(pool);
    let left = r.resident_bytes().unwrap();
    assert!(left < 1 << 20, "{left} bytes left in the region");
}

#[test]
fn a_reserve_mode_pool_is_adopted_with_its_reserve() {
    let r = region(64);
    let cfg = PoolConfig {
        growth: Growth::Reserve {
            wait: Duration::from_secs(1),
        },
        reserve_arenas: 2,
        reserve_min_arenas: 2,
        ..config(&r)
    };
    let pool = Pool::new(cfg.clone()).unwrap();
    let mut live = Vec::new();
    for i in 0..2000u32 {
        let d = pattern(i as u8, 1000 + i as usize % 2000);
        match pool.store(&d) {
            Ok(h) => live.push((h, d)),
            Err(Error::ReserveExhausted { .. }) => {
                pool.maintain().unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        if i % 100 == 0 {
            pool.maintain().unwrap();
        }
    }
    drop(r);
    let fd = die(pool);
    let r = Region::adopt(fd).unwrap();
    let pool = Pool::adopt(PoolConfig {
        region: Some(r.clone()),
        ..cfg
    })
    .unwrap();
    check(&pool, &live);
    assert_eq!(
        pool.stats().pages_reserved,
        2 * 512,
        "the reserve is mapped again"
    );
}

/// Writes word `i` of the chunks tagged for class 0's handle table, through a third view of the
/// region (what a stray write in the dead process or a bit flip would do).
fn poke_handles(fd: &OwnedFd, class_tag: u64, i: usize, f: impl FnOnce(u64) -> u64) {
    let view = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let mut chunks = view.take_adopted_chunks(|_| true);
    let (_, chunk) = chunks
        .iter_mut()
        .filter(|(t, _)| *t == class_tag)
        .nth(i / CHUNK_WORDS)
        .expect("chunk");
    let w = &mut chunk[i % CHUNK_WORDS];
    *w = f(*w);
}

#[test]
fn a_corrupted_table_is_refused_and_nothing_is_destroyed() {
    let r = region(16);
    let pool = Pool::new(config(&r)).unwrap();
    // Class 0 holds objects of up to 32 bytes.
    let live: Vec<_> = (0..200u8)
        .map(|i| {
            let d = pattern(i, 20);
            (pool.store(&d).unwrap(), d)
        })
        .collect();
    let held = r.resident_bytes().unwrap();
    drop(r);
    let fd = die(pool);
    // Handle 1 now names handle 0's slot.
    let handles_of_class_0 = 0u64;
    let first = {
        let view = Region::adopt(fd.try_clone().unwrap()).unwrap();
        let chunks = view.take_adopted_chunks(|_| true);
        let (_, c) = chunks
            .iter()
            .find(|(t, _)| *t == handles_of_class_0)
            .unwrap();
        c[0]
    };
    poke_handles(&fd, handles_of_class_0, 1, |_| first);
    let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let err = Pool::adopt(config(&r)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::RegionRefused { .. }) && msg.contains("both name slot"),
        "{msg}"
    );
    assert_eq!(r.resident_bytes().unwrap(), held, "a refusal freed memory");
    drop(r);
    // Free the word instead (handle 1 was the second object stored): the region adopts, with
    // every other object whole.
    poke_handles(&fd, handles_of_class_0, 1, |_| 0);
    let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let pool = Pool::adopt(config(&r)).unwrap();
    let mut kept = live;
    kept.remove(1);
    check(&pool, &kept);
    assert!(pool.read(live_handle(1), |_| ()).is_err());
}

fn live_handle(local: u32) -> Handle {
    Handle::from_raw(u64::from(local) + 1).unwrap()
}

/// A crash inside an allocation, between the zspage's location and the handle that names its
/// first object, leaves a zspage with no object: adoption gives its pages back, and the arena
/// it shares with another class's zspage stays.
#[test]
fn a_zspage_left_without_objects_is_freed_and_its_arena_kept() {
    let r = region(16);
    // No reserve: an arena that looks empty for a moment is given back at once.
    let cfg = PoolConfig {
        reserve_arenas: 0,
        ..config(&r)
    };
    let pool = Pool::new(cfg.clone()).unwrap();
    let small = pattern(1, 20);
    let big = pattern(2, 3000);
    let _hs = pool.store(&small).unwrap();
    let hb = pool.store(&big).unwrap();
    drop(r);
    let fd = die(pool);
    // Class 0's first handle was never written, as far as the region can tell.
    poke_handles(&fd, 0, 0, |_| 0);
    let r = Region::adopt(fd).unwrap();
    let pool = Pool::adopt(PoolConfig {
        region: Some(r.clone()),
        ..cfg
    })
    .unwrap();
    check(&pool, &[(hb, big)]);
    assert_eq!(
        pool.class_stats()[0].obj_allocated,
        0,
        "the empty zspage was freed"
    );
}

#[test]
fn a_dropped_pool_cannot_be_adopted() {
    let r = region(4);
    let pool = Pool::new(config(&r)).unwrap();
    pool.store(&pattern(3, 500)).unwrap();
    let fd = r.fd().try_clone_to_owned().unwrap();
    drop(pool);
    drop(r);
    let err = Region::adopt(fd).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
}

/// A refused adoption leaves the region as it was: adopting it again (after the cause is gone)
/// finds every object.
#[test]
fn a_refusal_in_a_later_class_leaves_the_earlier_ones_whole() {
    let r = region(16);
    let pool = Pool::new(config(&r)).unwrap();
    let live: Vec<_> = (0..300u32)
        .map(|i| {
            let d = pattern(i as u8, 1 + (i as usize * 13) % 4000);
            (pool.store(&d).unwrap(), d)
        })
        .collect();
    drop(r);
    let fd = die(pool);
    // The last class's first handle entry gets a stray bit.
    let last = (0..120u64)
        .rev()
        .find(|&c| {
            let view = Region::adopt(fd.try_clone().unwrap()).unwrap();
            let found = view.take_adopted_chunks(|t| t == c << 32).len();
            found > 0
        })
        .unwrap();
    poke_handles(&fd, last << 32, 0, |w| w | 1 << 60);
    let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let err = Pool::adopt(config(&r)).unwrap_err().to_string();
    assert!(err.contains(&format!("class {last}")), "{err}");
    drop(r);
    poke_handles(&fd, last << 32, 0, |w| w & !(1 << 60));
    let r = Region::adopt(fd).unwrap();
    let pool = Pool::adopt(config(&r)).unwrap();
    check(&pool, &live);
}

#[test]
fn a_pool_needs_a_region_to_adopt() {
    assert!(matches!(
        Pool::adopt(PoolConfig::default()),
        Err(Error::InvalidConfig { what: "region", .. })
    ));
}
