use super::*;

#[test]
fn runs_do_not_overlap_and_hold_their_bytes() {
    let mut set = ArenaSet::new(0, true);
    let mut runs: Vec<PageRun> = (0..40)
        .map(|i| set.alloc_run(1 + i % 8, Placement::Any).unwrap())
        .collect();
    for (i, r) in runs.iter_mut().enumerate() {
        r.bytes_mut().fill(i as u8);
    }
    for (i, r) in runs.iter().enumerate() {
        assert!(r.bytes().iter().all(|&b| b == i as u8));
    }
    set.check().unwrap();
    for r in runs {
        set.free_run(r);
    }
    assert_eq!(set.used_pages(), 0);
    assert_eq!(
        set.mapped_arenas(),
        0,
        "empty arenas beyond the reserve are unmapped"
    );
    set.check().unwrap();
}

#[test]
fn reserve_keeps_one_empty_arena() {
    let mut set = ArenaSet::new(1, true);
    let r = set.alloc_run(4, Placement::Any).unwrap();
    assert_eq!(set.free_run(r), 0);
    assert_eq!(set.mapped_arenas(), 1);
}

#[test]
fn exclude_and_no_map_report_no_room() {
    let mut set = ArenaSet::new(0, true);
    let r = set.alloc_run(8, Placement::Any).unwrap();
    assert_eq!(
        set.alloc_run(8, Placement::AwayFrom(r.arena()))
            .unwrap_err(),
        MapError::NoRoom
    );
    let r2 = set.alloc_run(8, Placement::Any).unwrap();
    assert_eq!(r2.arena(), r.arena());
    set.free_run(r);
    set.free_run(r2);
}

#[test]
fn allocation_prefers_the_fullest_arena() {
    let mut set = ArenaSet::new(2, true);
    let a: Vec<PageRun> = (0..ARENA_PAGES)
        .map(|_| set.alloc_run(1, Placement::Any).unwrap())
        .collect();
    let b: Vec<PageRun> = (0..ARENA_PAGES)
        .map(|_| set.alloc_run(1, Placement::Any).unwrap())
        .collect();
    assert_ne!(a[0].arena(), b[0].arena());
    let (a_id, b_id) = (a[0].arena(), b[0].arena());
    // Free 20 pages in a, 500 in b: the next allocation after a miss goes to a (fuller), and b
    // is the arena to empty.
    let mut a = a;
    let mut b = b;
    for r in a.drain(..20) {
        set.free_run(r);
    }
    for r in b.drain(..500) {
        set.free_run(r);
    }
    let r = set.alloc_run(1, Placement::AwayFrom(b_id)).unwrap();
    assert_eq!(r.arena(), a_id);
    assert_eq!(set.sparsest(), Some(b_id));
    for r in a.into_iter().chain(b).chain([r]) {
        set.free_run(r);
    }
}
