//! The `pool_ops` fuzz harness: random pool operations checked against a model (a list of live
//! objects with their contents). Shared by the cargo-fuzz target, the corpus replay test and the
//! proptest.

use arbitrary::{Arbitrary, Unstructured};

use std::time::Duration;

use crate::{
    Error, Growth, Handle, Pool, PoolConfig, Region, RegionSize, ARENA_PAGES, MAX_OBJECT, PAGE_SIZE,
};

/// One pool operation. Indexes pick a live object modulo the number of live objects.
#[derive(Debug, Clone, Arbitrary)]
pub enum PoolOp {
    /// Store an object of `size % 4096 + 1` bytes with a pattern from `seed`.
    Store {
        /// Size selector.
        size: u16,
        /// Pattern seed.
        seed: u8,
    },
    /// Free a live object.
    Free {
        /// Object selector.
        idx: u16,
    },
    /// Overwrite a live object with a new pattern.
    Rewrite {
        /// Object selector.
        idx: u16,
        /// Pattern seed.
        seed: u8,
    },
    /// Read a live object and compare it with the model.
    Read {
        /// Object selector.
        idx: u16,
    },
    /// Compact the pool.
    Compact,
    /// Set the memory limit to `pages` pages, or none.
    SetLimit {
        /// Limit in pages.
        pages: Option<u8>,
    },
    /// Use a handle that names nothing.
    Bogus {
        /// The handle's word.
        raw: u64,
    },
    /// What the maintenance thread does in reserve mode: [`Pool::maintain`].
    Maintain,
    /// For a pool in a [`Region`]: the pool is handed over ([`Pool::leave`]: the region keeps
    /// every byte, as when its process dies) and a successor adopts the region
    /// ([`Pool::adopt`]). Every object must read back as before.
    Restart,
}

/// Arenas the reserve-mode runs keep mapped.
const RESERVE: usize = 2;

/// The pattern an object of `len` bytes holds for `seed`: compressible-looking runs, distinct per seed.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 7) as u8).wrapping_mul(seed | 1))
        .collect()
}

/// Arenas a shared run's region holds.
const REGION_ARENAS: u32 = 64;

/// Runs `ops` on a fresh pool and checks every result against the model. Panics on a mismatch.
/// With `reserve`, the pool runs in [`Growth::Reserve`] mode with no waiting: stores fail with
/// [`Error::ReserveExhausted`] until a [`PoolOp::Maintain`] refills it. With `shared`, its
/// arenas and tables are in a [`Region`], and [`PoolOp::Restart`] has a successor adopt it.
pub fn run_ops(ops: &[PoolOp], max_pages_per_zspage: usize, reserve: bool, shared: bool) {
    let region = shared.then(|| {
        Region::create(
            "uzram-pool-ops",
            RegionSize {
                arenas: REGION_ARENAS,
                meta_bytes: 1 << 20,
                table_bytes: 0,
            },
        )
        .expect("memfd region")
    });
    let mut config = PoolConfig {
        max_pages_per_zspage,
        auto_compact: true,
        reserve_arenas: if reserve { RESERVE } else { 1 },
        // A fixed reserve (least = most): the model checks its bounds; demand sizing has its
        // own test.
        reserve_min_arenas: if reserve { RESERVE } else { 1 },
        growth: if reserve {
            Growth::Reserve {
                wait: Duration::ZERO,
            }
        } else {
            Growth::OnDemand
        },
        region,
        ..PoolConfig::default()
    };
    let mut pool = Pool::new(config.clone()).expect("valid config");
    let mut limit = None;
    let mut model: Vec<(Handle, Vec<u8>)> = Vec::new();
    for (n, op) in ops.iter().enumerate() {
        match *op {
            PoolOp::Store { size, seed } => store(&pool, &mut model, size, seed, reserve),
            PoolOp::Free { idx } if !model.is_empty() => {
                let (h, _) = model.swap_remove(usize::from(idx) % model.len());
                pool.free(h).expect("free of a live handle");
                let again = pool.free(h);
                assert!(
                    matches!(again, Err(Error::InvalidHandle { .. })),
                    "double free: {again:?}"
                );
            }
            PoolOp::Rewrite { idx, seed } if !model.is_empty() => {
                let i = usize::from(idx) % model.len();
                let data = pattern(seed, model[i].1.len());
                pool.write(model[i].0, &data)
                    .expect("write of a live handle");
                model[i].1 = data;
            }
            PoolOp::Read { idx } if !model.is_empty() => {
                let (h, data) = &model[usize::from(idx) % model.len()];
                assert_eq!(pool.read(*h, |o| o.to_vec()).expect("read"), *data);
            }
            PoolOp::Compact => {
                pool.compact();
                for s in pool.class_stats() {
                    assert_eq!(
                        s.freeable, 0,
                        "class {} still freeable after compaction",
                        s.size
                    );
                }
                check_all(&pool, &model);
            }
            PoolOp::SetLimit { pages } => {
                limit = pages.map(|p| u64::from(p) * PAGE_SIZE as u64);
                pool.set_limit(limit);
            }
            PoolOp::Restart if shared => {
                pool = restart(pool, &mut config, limit);
                check_all(&pool, &model);
            }
            PoolOp::Maintain => maintain(&pool, reserve),
            PoolOp::Bogus { raw } => {
                if let Some(h) = Handle::from_raw(raw) {
                    if !model.iter().any(|(m, _)| *m == h) {
                        assert!(pool.read(h, |_| ()).is_err(), "bogus handle {raw:#x} read");
                    }
                }
            }
            _ => {}
        }
        if n % 64 == 63 {
            pool.check_invariants().expect("invariants");
        }
    }
    check_all(&pool, &model);
    for (h, _) in model.drain(..) {
        pool.free(h).expect("free");
    }
    let s = pool.stats();
    assert_eq!(
        (s.objects, s.pages_used, s.object_bytes),
        (0, 0, 0),
        "empty pool holds memory"
    );
    pool.check_invariants()
        .expect("invariants after freeing all");
}

/// A store against the model: a new handle never given before, or a refusal that the limit
/// (or, with `reserve`, an empty reserve) explains and that changed nothing.
fn store(pool: &Pool, model: &mut Vec<(Handle, Vec<u8>)>, size: u16, seed: u8, reserve: bool) {
    let data = pattern(seed, usize::from(size) % MAX_OBJECT + 1);
    let before = pool.stats();
    match pool.store(&data) {
        Ok(h) => {
            assert!(
                model.iter().all(|(m, _)| *m != h),
                "handle {h:?} given twice"
            );
            model.push((h, data));
        }
        Err(Error::LimitExceeded { .. }) => {
            let after = pool.stats();
            assert_eq!(before.objects, after.objects, "failed store left an object");
            assert_eq!(
                before.pages_used, after.pages_used,
                "failed store kept pages"
            );
            let spec = pool.classes()[class_index(pool, data.len())];
            assert!(
                after.pages_used + spec.pages_per_zspage as u64 > after.limit_pages,
                "limit refused a store that fits"
            );
        }
        Err(Error::RegionFull { .. }) if pool_in_region(pool) => {
            assert_eq!(
                before.objects,
                pool.stats().objects,
                "failed store left an object"
            );
        }
        Err(Error::OutOfMemory { errno, .. }) if errno == libc::ENOSPC && pool_in_region(pool) => {
            assert_eq!(
                before.objects,
                pool.stats().objects,
                "failed store left an object"
            );
        }
        Err(Error::ReserveExhausted { .. }) if reserve => {
            let after = pool.stats();
            assert_eq!(before.objects, after.objects, "failed store left an object");
            assert_eq!(
                before.pages_used, after.pages_used,
                "failed store kept pages"
            );
            assert_eq!(after.pages_reserved, 0, "refused with an empty arena left");
        }
        Err(e) => panic!("store of {} bytes failed: {e}", data.len()),
    }
}

/// Maintenance: in reserve mode it leaves between one and two reserves of empty arenas; an
/// on-demand pool needs none.
fn maintain(pool: &Pool, reserve: bool) {
    let done = pool.maintain().expect("maintain");
    let s = pool.stats();
    if reserve {
        let reserved = s.pages_reserved as usize / ARENA_PAGES;
        assert!(
            (RESERVE..=2 * RESERVE).contains(&reserved),
            "{reserved} empty arenas after maintenance ({done:?})"
        );
    } else {
        assert_eq!(
            (done.arenas_mapped, done.arenas_unmapped),
            (0, 0),
            "on-demand pools need no maintenance"
        );
    }
}

fn pool_in_region(pool: &Pool) -> bool {
    pool.region().is_some()
}

/// The predecessor leaves `pool` ([`Pool::leave`]: its process memory goes, the region keeps
/// every byte, as when a process is killed), and a successor adopts its region through a
/// duplicate of its descriptor.
fn restart(pool: Pool, config: &mut PoolConfig, limit: Option<u64>) -> Pool {
    let fd = pool
        .region()
        .expect("a shared pool")
        .fd()
        .try_clone_to_owned()
        .expect("dup");
    let before = pool.stats();
    pool.leave();
    config.region = Some(Region::adopt(fd).expect("the predecessor's region"));
    let pool = Pool::adopt(config.clone()).expect("adoption");
    pool.set_limit(limit);
    let after = pool.stats();
    assert_eq!(
        (after.objects, after.object_bytes),
        (before.objects, before.object_bytes)
    );
    assert!(
        after.pages_used <= before.pages_used,
        "adoption grew the pool"
    );
    pool
}

fn class_index(pool: &Pool, size: usize) -> usize {
    pool.classes()
        .iter()
        .position(|c| c.size >= size)
        .expect("a class holds every size")
}

fn check_all(pool: &Pool, model: &[(Handle, Vec<u8>)]) {
    pool.check_invariants().expect("invariants");
    for (h, data) in model {
        assert_eq!(pool.read(*h, |o| o.to_vec()).expect("read"), *data);
    }
    let s = pool.stats();
    assert_eq!(s.objects, model.len() as u64);
    assert_eq!(
        s.object_bytes,
        model.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
}

/// What a fuzz input asks for: a chain size, reserve mode, a pool in a region, the operations.
pub type Decoded = (usize, bool, bool, Vec<PoolOp>);

/// Decodes a fuzz input as [`pool_ops`] does; `None` when it is too short to say.
pub fn decode(data: &[u8]) -> Option<Decoded> {
    let mut u = Unstructured::new(data);
    let chain = u.int_in_range(1..=crate::MAX_PAGES_PER_ZSPAGE).ok()?;
    let reserve = u.arbitrary::<bool>().ok()?;
    let shared = u.arbitrary::<bool>().ok()?;
    let ops = u
        .arbitrary_iter::<PoolOp>()
        .and_then(|it| it.take(4096).collect::<Result<Vec<_>, _>>())
        .ok()?;
    Some((chain, reserve, shared, ops))
}

/// The cargo-fuzz entry: decodes a chain size, the modes and a list of operations from `data`
/// and runs them.
pub fn pool_ops(data: &[u8]) {
    if let Some((chain, reserve, shared, ops)) = decode(data) {
        run_ops(&ops, chain, reserve, shared);
    }
}
