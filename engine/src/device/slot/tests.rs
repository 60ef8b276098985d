use super::table::{Leaf, LEAF_SLOTS};
use super::*;
use std::sync::Arc;
use std::sync::OnceLock;
use uzram_allocator::Region;

#[test]
fn every_set_moves_the_generation_and_leaves_the_state_alone() {
    let slot = Slot::default();
    let state = SlotState {
        word: 7,
        flags: SlotFlags::STORED | SlotFlags::HUGE,
        prio: 1,
        size: 4096,
        atime: u32::MAX,
    };
    let mut g = slot.lock();
    let first = g.generation();
    for i in 1..=300u32 {
        g.set(state);
        assert_eq!(g.get(), state, "set {i}");
        assert_eq!(g.generation(), first.wrapping_add(i as u8), "set {i}");
    }
    drop(g);
    assert_eq!(slot.peek(), state);
    assert!(slot.try_lock().is_some(), "the lock bits survive");
}

#[test]
fn state_round_trips_through_the_packed_words() {
    let slot = Slot::default();
    let state = SlotState {
        word: 0xdead_beef_0000_0001,
        flags: SlotFlags::STORED | SlotFlags::HUGE | SlotFlags::IDLE,
        prio: 3,
        size: 4096,
        atime: u32::MAX,
    };
    let mut g = slot.lock();
    assert!(g.get().is_empty());
    g.set(state);
    assert_eq!(g.get(), state);
    drop(g);
    assert_eq!(slot.peek(), state);
    assert_eq!(slot.meta.load(Ordering::Relaxed) & (LOCK | WAITERS), 0);
}

/// A table of 3 leaves and a bit, against a model of which slots hold what: slots come
/// into being as they are first asked for by a write, reads of the others see empty slots
/// and allocate nothing, iteration visits exactly the slots of the leaves there, and the
/// bytes counted are the directory plus the leaves.
#[test]
fn table_allocates_leaves_as_written_against_a_model() {
    let pages = 3 * LEAF_SLOTS as u64 + 10;
    let table = SlotTable::new(pages).unwrap();
    let directory = 4 * std::mem::size_of::<OnceLock<Box<Leaf>>>() as u64;
    assert_eq!(table.len(), pages);
    assert_eq!(table.bytes(), directory);
    let mut model = std::collections::HashMap::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for step in 0..4000u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let index = rng % (pages + 3);
        if rng & 0x100 == 0 {
            // A write: allocates the leaf; refused only beyond the table.
            match table.get_or_alloc(index) {
                Some(slot) => {
                    assert!(index < pages, "step {step}: slot {index} beyond {pages}");
                    let state = SlotState {
                        word: step + 1,
                        flags: SlotFlags::STORED,
                        ..SlotState::default()
                    };
                    slot.lock().set(state);
                    model.insert(index, state);
                }
                None => assert!(index >= pages, "step {step}: slot {index} refused"),
            }
        } else {
            let want = model.get(&index).copied().unwrap_or_default();
            assert_eq!(table.peek(index), want, "step {step}: slot {index}");
        }
        let leaves: std::collections::HashSet<u64> =
            model.keys().map(|i| i / LEAF_SLOTS as u64).collect();
        assert_eq!(
            table.bytes(),
            directory + leaves.len() as u64 * 4096,
            "step {step}"
        );
    }
    // Leaves 0..=3 all written by now; the last holds only 10 slots of the device.
    let seen: Vec<(u64, SlotState)> = table.iter().map(|(i, s)| (i, s.peek())).collect();
    assert_eq!(seen.len() as u64, pages);
    assert!(seen.iter().enumerate().all(|(n, &(i, _))| n as u64 == i));
    for (i, state) in seen {
        assert_eq!(
            state,
            model.get(&i).copied().unwrap_or_default(),
            "slot {i}"
        );
    }
}

fn region_for(pages: u64) -> Region {
    Region::create(
        "uzram-slot-test",
        uzram_allocator::RegionSize {
            arenas: 1,
            meta_bytes: 64 << 10,
            table_bytes: SlotTable::region_bytes(pages).unwrap(),
        },
    )
    .unwrap()
}

/// A new table in a region has its whole directory resident (every request reads its leaf's
/// entry), and a successor's adoption faults nothing more in; prefaulting leaves does not touch
/// the directory again.
#[test]
#[cfg_attr(miri, ignore = "a region is a memfd, which Miri cannot make")]
fn a_new_table_has_its_directory_resident_and_adopting_it_faults_nothing_in() {
    // 4096 leaves: 32 KiB of directory, 8 pages.
    let pages = 4096 * LEAF_SLOTS as u64;
    let region = region_for(pages);
    let before = region.resident_bytes().unwrap();
    let table = SlotTable::in_region(pages, region.clone()).unwrap();
    let made = region.resident_bytes().unwrap();
    assert!(
        made >= before + 8 * 4096,
        "{before} -> {made} bytes resident"
    );
    assert_eq!(table.prefault(2), 2);
    let leaves = region.resident_bytes().unwrap();
    assert_eq!(leaves, made + 2 * 4096, "two leaf pages, nothing else");
    drop(table);
    let again = Region::adopt(region.fd().try_clone_to_owned().unwrap()).unwrap();
    let (adopted, undone) = SlotTable::adopt(pages, again).unwrap();
    assert_eq!(undone, 0);
    assert_eq!(
        region.resident_bytes().unwrap(),
        leaves,
        "adopt faulted pages in"
    );
    drop(adopted);
}

/// The whole table is made resident in steps, beyond the margin made ready ahead, up to its
/// last leaf, and no further.
#[test]
#[cfg_attr(miri, ignore = "a region is a memfd, which Miri cannot make")]
fn the_whole_table_is_made_resident_in_steps() {
    let pages = 3000 * LEAF_SLOTS as u64;
    let region = region_for(pages);
    let table = SlotTable::in_region(pages, region.clone()).unwrap();
    table.get_or_alloc(5 * LEAF_SLOTS as u64).unwrap();
    assert_eq!(
        table.prefault(256),
        256,
        "the margin ahead of the leaf handed out"
    );
    assert_eq!(table.leaves_not_ready(), 3000 - 257);
    let before = region.resident_bytes().unwrap();
    let mut steps = Vec::new();
    loop {
        match table.prefault_more(1024) {
            0 => break,
            n => steps.push(n),
        }
    }
    assert_eq!(steps, [1024, 1024, 3000 - 257 - 2048]);
    assert_eq!(table.leaves_not_ready(), 0);
    let after = region.resident_bytes().unwrap();
    assert_eq!(after - before, (3000 - 257) * 4096, "every leaf page, once");
}

/// A table in a region, against a model: a successor finds every slot written (leaves
/// taken out of order), and refuses a directory that gives one page to two leaves.
#[test]
#[cfg_attr(miri, ignore = "a region is a memfd, which Miri cannot make")]
fn a_table_in_a_region_is_adopted_against_a_model() {
    let pages = 4 * LEAF_SLOTS as u64;
    let region = region_for(pages);
    let table = SlotTable::in_region(pages, region.clone()).unwrap();
    let mut model = std::collections::HashMap::new();
    for (step, index) in [700u64, 3, 900, 260, 701, 1023].into_iter().enumerate() {
        let state = SlotState {
            word: step as u64 + 1,
            flags: SlotFlags::SAME,
            ..SlotState::default()
        };
        table.get_or_alloc(index).unwrap().lock().set(state);
        model.insert(index, state);
    }
    assert_eq!(table.bytes(), 4 * 8 + 4 * 4096);
    drop(table);
    let again = |r: &Region| Region::adopt(r.fd().try_clone_to_owned().unwrap()).unwrap();
    let (adopted, undone) = SlotTable::adopt(pages, again(&region)).unwrap();
    assert_eq!(undone, 0);
    for i in 0..pages {
        assert_eq!(
            adopted.peek(i),
            model.get(&i).copied().unwrap_or_default(),
            "slot {i}"
        );
    }
    assert_eq!(
        adopted.iter().count() as u64,
        pages,
        "all four leaves are there"
    );
    // Leaf 1's directory word now names leaf 0's page.
    let first = region.table()[0].load(Ordering::Relaxed);
    region.table()[1].store(first, Ordering::Relaxed);
    drop(adopted);
    let err = SlotTable::adopt(pages, again(&region)).err().unwrap();
    assert!(err.contains("another leaf's"), "{err}");
}

#[test]
fn iteration_skips_leaves_never_written() {
    let table = SlotTable::new(4 * LEAF_SLOTS as u64).unwrap();
    assert_eq!(table.iter().count(), 0);
    assert!(table.get(600).is_none());
    table.get_or_alloc(600).unwrap();
    let visited: Vec<u64> = table.iter().map(|(i, _)| i).collect();
    assert_eq!(visited, (512..768).collect::<Vec<_>>());
    assert!(table.get(600).is_some() && table.get(300).is_none());
}

/// Threads racing to write into one missing leaf all get the same slots, and one leaf is
/// allocated and counted.
#[test]
fn racing_writers_share_one_leaf() {
    let table = Arc::new(SlotTable::new(LEAF_SLOTS as u64).unwrap());
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (table, barrier) = (Arc::clone(&table), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let slot = table.get_or_alloc(t).unwrap();
                slot.lock().set(SlotState {
                    word: t + 1,
                    ..SlotState::default()
                });
                std::ptr::from_ref(table.get_or_alloc(0).unwrap().slot()) as usize
            })
        })
        .collect();
    let firsts: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(firsts.windows(2).all(|w| w[0] == w[1]));
    let directory = std::mem::size_of::<OnceLock<Box<Leaf>>>() as u64;
    assert_eq!(table.bytes(), directory + 4096);
    for t in 0..4 {
        assert_eq!(table.peek(t).word, t + 1, "thread {t}'s write was lost");
    }
}

#[test]
fn lock_excludes_other_threads() {
    // Under Miri (the parking calls' unsafe code) fewer rounds: it runs about 1000x slower.
    let rounds = if cfg!(miri) { 300 } else { 20_000 };
    let slot = Arc::new(Slot::default());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let mut g = slot.lock();
                    let mut s = g.get();
                    // A non-atomic read-modify-write: lost updates if the lock leaked.
                    s.word += 1;
                    std::hint::black_box(&s);
                    g.set(s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(slot.peek().word, 4 * rounds);
}
