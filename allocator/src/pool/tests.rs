use super::*;

const WAIT: Duration = Duration::from_millis(300);

/// A reserve-mode pool of one arena, filled with 3000-byte objects until a store finds no
/// room. Returns the pool and the objects it holds.
fn full_pool() -> (Pool, Vec<Handle>) {
    let pool = Pool::new(PoolConfig {
        reserve_arenas: 1,
        growth: Growth::Reserve { wait: WAIT },
        ..Default::default()
    })
    .unwrap();
    let mut live = Vec::new();
    // Fill without waiting: maintenance would refill; here nobody maintains, so the first
    // store that fails has waited WAIT, and the pool is now starved.
    while let Ok(h) = pool.store(&[7u8; 3000]) {
        live.push(h);
    }
    (pool, live)
}

/// Bumps the maintenance progress counter every 50 ms while `going()`, as a slow refill
/// does.
fn slow_refill(pool: &Pool, going: impl Fn() -> bool) {
    while going() {
        pool.signal.touched.fetch_add(32, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_store_waits_for_a_slow_refill_and_gives_up_on_a_stuck_one() {
    let (pool, live) = full_pool();
    // Objects of one size: each arena holds as many.
    let per_arena = live.len();
    assert!(per_arena > 600, "{per_arena}");
    // Starved: the next store fails at once until a refill lands.
    let t = Instant::now();
    assert!(matches!(
        pool.store(&[7u8; 3000]),
        Err(Error::ReserveExhausted { .. })
    ));
    assert!(t.elapsed() < WAIT / 2, "{:?}", t.elapsed());
    pool.maintain().unwrap();
    for _ in 0..per_arena {
        pool.store(&[8u8; 3000]).unwrap();
    }

    // The second arena is full. A refill that makes progress for 3 waits, then lands, is
    // waited for.
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            slow_refill(&pool, || t.elapsed() < WAIT * 3);
            pool.maintain().unwrap();
        });
        let h = pool.store(&[10u8; 3000]).unwrap();
        assert_eq!(pool.read(h, |o| o[0]).unwrap(), 10);
    });
    assert!(t.elapsed() >= WAIT * 3, "waited {:?}", t.elapsed());
    // The refill may have mapped a second arena: it keeps one empty, and the store may have
    // taken the first before it looked again. Fill what there is.
    let spare = pool.stats().pages_reserved as usize / ARENA_PAGES;
    assert!(spare <= 1, "{spare} spare arenas");
    for _ in 1..per_arena * (1 + spare) {
        pool.store(&[10u8; 3000]).unwrap();
    }

    // The third is full. A refill that never ends: progress all along, but the store
    // gives up at the cap.
    let stop = AtomicBool::new(false);
    let (stored, waited) = std::thread::scope(|s| {
        s.spawn(|| slow_refill(&pool, || !stop.load(Ordering::Relaxed)));
        let t = Instant::now();
        let stored = pool.store(&[11u8; 3000]);
        stop.store(true, Ordering::Relaxed);
        (stored, t.elapsed())
    });
    assert!(
        matches!(stored, Err(Error::ReserveExhausted { .. })),
        "{stored:?}"
    );
    assert!(
        waited >= WAIT * RESERVE_WAIT_CAP && waited < WAIT * RESERVE_WAIT_CAP * 2,
        "waited {waited:?}"
    );
    assert_eq!(
        pool.stats().pages_mapped,
        (3 + spare) as u64 * ARENA_PAGES as u64
    );
    pool.check_invariants().unwrap();
}
