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

/// Tells of progress every 50 ms while `going()`, as a slow refill does (or a maintenance
/// thread faulting in memory of its own between arenas).
fn slow_refill(pool: &Pool, going: impl Fn() -> bool) {
    while going() {
        pool.note_progress(32);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `store` while a refill makes progress and never lands: its result and how long it took.
fn beside_an_endless_refill(
    pool: &Pool,
    store: impl FnOnce() -> Result<Handle, Error>,
) -> (Result<Handle, Error>, Duration) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| slow_refill(pool, || !stop.load(Ordering::Relaxed)));
        let t = Instant::now();
        let stored = store();
        stop.store(true, Ordering::Relaxed);
        (stored, t.elapsed())
    })
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
    // That wait ran out for want of progress: once the maintenance thread moves again (one
    // slow fault over), the next store waits for it again rather than fail at once.
    pool.note_progress(1);
    let t = Instant::now();
    assert!(matches!(
        pool.store(&[7u8; 3000]),
        Err(Error::ReserveExhausted { .. })
    ));
    assert!(t.elapsed() >= WAIT, "{:?}", t.elapsed());
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
    let (stored, waited) = beside_an_endless_refill(&pool, || pool.store(&[11u8; 3000]));
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
    // A refill that slow is not waited for again, progress or not, until it lands.
    pool.note_progress(32);
    let t = Instant::now();
    assert!(matches!(
        pool.store(&[12u8; 3000]),
        Err(Error::ReserveExhausted { .. })
    ));
    assert!(t.elapsed() < WAIT / 2, "{:?}", t.elapsed());
    pool.maintain().unwrap();
    pool.store(&[12u8; 3000]).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn a_store_within_a_shorter_wait_gives_up_sooner_and_takes_a_refill_alike() {
    let (pool, live) = full_pool();
    let short = WAIT / 3;
    // A slow refill: progress for 2 WAITs, then an arena. The pool's own wait follows it; a
    // store within the short wait sees the same progress and follows it too, up to its cap
    // (8 short waits, longer than the refill): both get the arena.
    let t = Instant::now();
    pool.note_progress(1);
    std::thread::scope(|s| {
        s.spawn(|| {
            slow_refill(&pool, || t.elapsed() < WAIT);
            pool.maintain().unwrap();
        });
        let h = pool.store_within(&[9u8; 3000], short).unwrap();
        assert_eq!(pool.read(h, |o| o[0]).unwrap(), 9);
    });
    assert!(t.elapsed() >= WAIT, "{:?}", t.elapsed());
    // The refill may have mapped a second arena (see above): fill what there is.
    let spare = pool.stats().pages_reserved as usize / ARENA_PAGES;
    for _ in 1..live.len() * (1 + spare) {
        pool.store(&[9u8; 3000]).unwrap();
    }
    // Full again, and a refill that never ends: the short store gives up at its own cap, far
    // sooner than the pool's would.
    pool.note_progress(1);
    let (stored, waited) =
        beside_an_endless_refill(&pool, || pool.store_within(&[11u8; 3000], short));
    assert!(
        matches!(stored, Err(Error::ReserveExhausted { .. })),
        "{stored:?}"
    );
    assert!(
        waited >= short * RESERVE_WAIT_CAP && waited < WAIT * RESERVE_WAIT_CAP / 2,
        "waited {waited:?}"
    );
    // That running out holds for short waits (they fail at once), not for the pool's own
    // longer one, which waits its own time.
    let t = Instant::now();
    assert!(pool.store_within(&[11u8; 3000], short).is_err());
    assert!(t.elapsed() < short / 2, "{:?}", t.elapsed());
    let t = Instant::now();
    assert!(pool.store(&[11u8; 3000]).is_err());
    assert!(t.elapsed() >= WAIT, "{:?}", t.elapsed());
    // Once a refill lands, the next store that finds no room waits again; for a stuck
    // refill (no progress) the short store gives up after one short wait.
    pool.maintain().unwrap();
    let spare = pool.stats().pages_reserved as usize / ARENA_PAGES;
    for _ in 0..live.len() * spare {
        pool.store_within(&[12u8; 3000], short).unwrap();
    }
    let t = Instant::now();
    assert!(pool.store_within(&[13u8; 3000], short).is_err());
    let waited = t.elapsed();
    assert!(waited >= short && waited < WAIT, "waited {waited:?}");
    pool.check_invariants().unwrap();
}

#[test]
fn rounds_that_fail_to_map_do_not_grow_the_reserve() {
    let mut d = reserve::Demand::default();
    let t0 = Instant::now();
    // A filled round, then a draw 0.5 s after its end: a burst.
    d.filled(t0);
    assert_eq!(
        d.next_target(1, true, false, 1, 8, t0 + Duration::from_millis(500)),
        2
    );
    // That round fails to map (no `filled`); its retries 20 ms apart still see the reserve
    // drawn down, and must not double it again.
    for i in 1..10u64 {
        let at = t0 + Duration::from_millis(500 + 20 * i);
        assert_eq!(d.next_target(2, true, false, 1, 8, at), 2);
    }
    // A round that took 3 s to fill, then a draw 0.2 s after it ended: a burst all the same.
    d.filled(t0 + Duration::from_secs(4));
    assert_eq!(
        d.next_target(2, true, false, 1, 8, t0 + Duration::from_millis(4200)),
        4
    );
}

/// A reserve-mode pool whose reserve follows demand between one arena and four.
fn demand_sized_pool() -> Pool {
    Pool::new(PoolConfig {
        reserve_arenas: 4,
        reserve_min_arenas: 1,
        growth: Growth::Reserve { wait: WAIT },
        ..Default::default()
    })
    .unwrap()
}

/// A reserve kept at 0 maps nothing until an allocation finds no room: that allocation waits
/// for the maintenance thread, which maps an arena and keeps the reserve at one from then on,
/// until quiet rounds take it back to 0 and the empty arenas are unmapped.
#[test]
fn a_reserve_kept_at_zero_maps_on_the_first_allocation_and_gives_it_back() {
    let pool = Pool::new(PoolConfig {
        reserve_arenas: 4,
        reserve_min_arenas: 0,
        growth: Growth::Reserve { wait: WAIT },
        ..Default::default()
    })
    .unwrap();
    let stats = pool.stats();
    assert_eq!((stats.pages_mapped, stats.pages_reserve_target), (0, 0));
    let t0 = Instant::now();
    // A quiet round keeps it at 0.
    assert_eq!(pool.maintain_at(t0, &mut || {}).unwrap().arenas_mapped, 0);
    let h = std::thread::scope(|s| {
        let writer = s.spawn(|| pool.store(&[5u8; 1000]));
        // The writer finds no room and asks; one round maps the arena it waits for.
        assert!(pool.wait_for_maintenance(Duration::from_secs(10)));
        let m = pool
            .maintain_at(t0 + Duration::from_secs(1), &mut || {})
            .unwrap();
        // One arena, or two if the writer took the first before the round ended (the round
        // keeps one empty).
        assert_eq!(m.reserve_target, 1, "a dry reserve of 0 holds one arena");
        assert!((1..=2).contains(&m.arenas_mapped), "{m:?}");
        writer.join().unwrap()
    })
    .expect("the writer's wait ends with the arena mapped");
    let mapped = pool.stats().pages_mapped / ARENA_PAGES as u64;
    assert!((1..=2).contains(&mapped));
    // A quiet round halves it back to 0; freeing the object empties its arena: all go.
    pool.free(h).unwrap();
    let m = pool
        .maintain_at(
            t0 + Duration::from_secs(1) + reserve::IDLE_DECAY,
            &mut || {},
        )
        .unwrap();
    assert_eq!((m.reserve_target, m.arenas_unmapped as u64), (0, mapped));
    assert_eq!(pool.stats().pages_mapped, 0);
    pool.check_invariants().unwrap();
}

#[test]
fn the_reserve_follows_demand_between_its_least_and_its_most() {
    let pool = demand_sized_pool();
    let arena = ARENA_PAGES as u64;
    let stats = pool.stats();
    assert_eq!(
        (stats.pages_mapped, stats.pages_reserve_target),
        (arena, arena)
    );
    // One arena's worth of one-page objects takes the reserve's only arena.
    let mut live = Vec::new();
    let mut draw = |pool: &Pool| {
        for _ in 0..ARENA_PAGES {
            live.push(pool.store(&[3u8; 4096]).unwrap());
        }
        assert_eq!(pool.arenas.lock().empty_arenas(), 0);
    };
    let t0 = Instant::now();
    draw(&pool);
    // A first draw refills but does not grow the reserve.
    assert_eq!(pool.maintain_at(t0, &mut || {}).unwrap().reserve_target, 1);
    // A second within a second is a burst: the reserve doubles, and is filled at once.
    draw(&pool);
    // Each arena comes before the call after it: the first one is there (for the
    // allocations that may be waiting) before the caller's own top-up runs.
    let mut calls = 0;
    let m = pool
        .maintain_at(t0 + Duration::from_millis(500), &mut || {
            calls += 1;
            assert_eq!(pool.arenas.lock().empty_arenas(), calls, "call {calls}");
        })
        .unwrap();
    assert_eq!((m.reserve_target, m.arenas_mapped, calls), (2, 2, 2));
    assert_eq!(pool.arenas.lock().empty_arenas(), 2);
    // A draw long after the last filled round is no burst, however slow that round was.
    // Quiet rounds keep it.
    let m = pool
        .maintain_at(t0 + Duration::from_secs(10), &mut || {})
        .unwrap();
    assert_eq!(
        (m.reserve_target, m.arenas_mapped, m.arenas_unmapped),
        (2, 0, 0)
    );
    // More bursts grow it to its most and no further.
    for i in 1..=4u64 {
        // Taking both empty arenas: the fullest arena with room is used first.
        for _ in 0..2 * ARENA_PAGES {
            live.push(pool.store(&[3u8; 4096]).unwrap());
        }
        let m = pool.maintain_at(
            t0 + Duration::from_secs(10) + Duration::from_millis(200 * i),
            &mut || {},
        );
        assert!(m.unwrap().reserve_target <= 4);
    }
    assert_eq!(pool.stats().pages_reserve_target, 4 * arena);
    assert_eq!(pool.arenas.lock().empty_arenas(), 4);
    // Idle for IDLE_DECAY: halved, and what is beyond it unmapped at once; then down to the
    // least, never below.
    let quiet = t0 + Duration::from_secs(11) + reserve::IDLE_DECAY;
    let m = pool.maintain_at(quiet, &mut || {}).unwrap();
    assert_eq!((m.reserve_target, m.arenas_unmapped), (2, 2));
    assert_eq!(
        pool.maintain_at(quiet + Duration::from_secs(1), &mut || {})
            .unwrap()
            .reserve_target,
        2
    );
    let m = pool
        .maintain_at(quiet + reserve::IDLE_DECAY, &mut || {})
        .unwrap();
    assert_eq!((m.reserve_target, m.arenas_unmapped), (1, 1));
    let m = pool
        .maintain_at(quiet + 4 * reserve::IDLE_DECAY, &mut || {})
        .unwrap();
    assert_eq!(m.reserve_target, 1);
    let stats = pool.stats();
    assert_eq!(stats.pages_mapped - stats.pages_used, arena);
    for h in live {
        pool.free(h).unwrap();
    }
    pool.check_invariants().unwrap();
}

#[test]
fn short_memory_keeps_the_reserve_at_its_most_until_it_has_been_over_for_a_while() {
    let pool = demand_sized_pool();
    let t0 = Instant::now();
    // Not short: a quiet round keeps the least.
    assert_eq!(pool.maintain_at(t0, &mut || {}).unwrap().reserve_target, 1);
    // Short: a round is asked for at once, and it maps the whole reserve without any draw.
    pool.set_memory_short(true);
    assert!(pool.wait_for_maintenance(Duration::ZERO));
    let m = pool
        .maintain_at(t0 + Duration::from_millis(100), &mut || {})
        .unwrap();
    assert_eq!((m.reserve_target, m.arenas_mapped), (4, 3));
    assert_eq!(pool.arenas.lock().empty_arenas(), 4);
    // Staying short asks nothing more; long quiet rounds while short keep it all.
    pool.set_memory_short(true);
    assert!(!pool.wait_for_maintenance(Duration::ZERO));
    let short_end = t0 + 3 * reserve::IDLE_DECAY;
    for at in [t0 + reserve::IDLE_DECAY * 2, short_end] {
        let m = pool.maintain_at(at, &mut || {}).unwrap();
        assert_eq!((m.reserve_target, m.arenas_unmapped), (4, 0));
    }
    // Memory no longer short: kept until IDLE_DECAY after the last short round, then halved.
    pool.set_memory_short(false);
    let almost = short_end + reserve::IDLE_DECAY - Duration::from_millis(1);
    assert_eq!(
        pool.maintain_at(almost, &mut || {}).unwrap().reserve_target,
        4
    );
    let m = pool
        .maintain_at(short_end + reserve::IDLE_DECAY, &mut || {})
        .unwrap();
    assert_eq!((m.reserve_target, m.arenas_unmapped), (2, 2));
    pool.check_invariants().unwrap();
}

#[test]
fn an_on_demand_pool_ignores_short_memory() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    pool.set_memory_short(true);
    assert!(!pool.wait_for_maintenance(Duration::ZERO));
    assert_eq!(pool.maintain().unwrap().arenas_mapped, 0);
}

#[test]
fn has_room_for_says_whether_a_store_would_take_a_new_zspage() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    // Nothing of the class yet: a store would make a zspage.
    assert!(!pool.has_room_for(1000));
    let first = pool.store(&[1u8; 1000]).unwrap();
    let per_zspage = {
        let class = pool.class_size(1000).unwrap();
        let spec = pool.classes().iter().find(|c| c.size == class).unwrap();
        spec.objs_per_zspage
    };
    assert!(per_zspage > 1);
    // Room in that zspage until it is full; then none, whatever the other classes have.
    let mut live = vec![first];
    for _ in 1..per_zspage {
        assert!(pool.has_room_for(1000));
        live.push(pool.store(&[1u8; 1000]).unwrap());
    }
    assert!(!pool.has_room_for(1000));
    assert!(!pool.has_room_for(3000));
    // A freed object leaves a slot.
    pool.free(live.pop().unwrap()).unwrap();
    assert!(pool.has_room_for(1000));
    // A size no class takes has no room.
    assert!(!pool.has_room_for(PAGE_SIZE + 1));
}
