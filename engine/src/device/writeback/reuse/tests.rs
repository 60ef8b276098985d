use std::collections::HashMap;
use std::path::Path;

use super::*;
use crate::device::testutil::{noise_page, tempdir, text_page};
use crate::device::writeback::WritebackRequest;
use crate::{Device, DeviceSetup, IoContext};

fn setup(dir: &Path, disksize: u64) -> Device {
    let mut setup = DeviceSetup::new();
    setup.set_backing_dev(&dir.join("backing"));
    setup.init(disksize).unwrap()
}

fn write(d: &Device, ctx: &mut IoContext, index: u64, page: &[u8; PAGE_SIZE]) {
    d.write(ctx, index * PAGE_SIZE as u64, page).unwrap();
}

fn read(d: &Device, ctx: &mut IoContext, index: u64) -> Vec<u8> {
    let mut buf = vec![0u8; PAGE_SIZE];
    d.read(ctx, index * PAGE_SIZE as u64, &mut buf).unwrap();
    buf
}

fn discard(d: &Device, index: u64) {
    d.discard(index * PAGE_SIZE as u64, PAGE_SIZE as u64)
        .unwrap();
}

fn state(d: &Device, index: u64) -> SlotState {
    d.slot_state(PageIndex(index)).unwrap()
}

/// bd_stat's figures: pages on the store, pages read, pages written.
fn bd(d: &Device) -> [u64; 3] {
    let text = d.backing().unwrap().bd_stat();
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    [v[0], v[1], v[2]]
}

/// What the records the slots name and the kept ones take must be what the store has in use.
fn check_space(d: &Device) {
    let b = d.backing().unwrap();
    let mut named = 0;
    for i in 0..d.pages() {
        let s = state(d, i);
        if s.flags.contains(SlotFlags::WB) {
            named += BackingStore::sectors_for(usize::from(s.size)) * super::super::SECTOR;
        }
    }
    let used: u64 = b.files().iter().map(|f| f.used_bytes).sum();
    assert_eq!(
        used,
        named + b.kept().1,
        "used bytes: records named and kept"
    );
    assert_eq!(bd(d)[0], b.pages());
}

#[test]
fn a_page_read_back_freed_and_swapped_out_again_unchanged_is_written_once() {
    let dir = tempdir("reuse-once");
    let d = setup(&dir, 4 << 20);
    let mut ctx = d.context().unwrap();
    let free0 = d.backing().unwrap().free_bytes();
    for i in 0..200 {
        write(&d, &mut ctx, i, &text_page(i));
    }
    d.mark_idle(None);
    let wb = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    assert_eq!(wb.written, 200, "{wb:?}");
    assert_eq!(bd(&d), [200, 0, 200]);
    // Swap in (a read of the record), the slot freed, the page swapped out again elsewhere.
    for i in 0..200 {
        assert_eq!(read(&d, &mut ctx, i), text_page(i), "page {i}");
        discard(&d, i);
        assert_eq!(d.backing().unwrap().kept().0, 1);
        write(&d, &mut ctx, 500 + i, &text_page(i));
        let s = state(&d, 500 + i);
        assert!(
            s.flags.contains(SlotFlags::WB | SlotFlags::ADOPTED),
            "page {}: {s:?}",
            500 + i
        );
    }
    // Not one more page written, and every page reads back.
    assert_eq!(bd(&d), [200, 200, 200]);
    let p = d.policy_stats();
    assert_eq!(
        (p.kept_pages, p.reused_pages, p.kept_dropped),
        (200, 200, 0)
    );
    assert_eq!(d.stats().mm.compr_data_size, 0);
    for i in 0..200 {
        assert_eq!(
            read(&d, &mut ctx, 500 + i),
            text_page(i),
            "page {}",
            500 + i
        );
    }
    check_space(&d);

    // Read, freed, and its next write changed: a new page, and the kept record waits unused.
    discard(&d, 500);
    write(&d, &mut ctx, 700, &text_page(999));
    assert!(state(&d, 700).flags.contains(SlotFlags::STORED));
    assert_eq!(d.backing().unwrap().kept().0, 1);
    check_space(&d);
    // An adopted record taken over again (it keeps the index it was sealed for).
    discard(&d, 501);
    write(&d, &mut ctx, 800, &text_page(1));
    assert!(state(&d, 800)
        .flags
        .contains(SlotFlags::WB | SlotFlags::ADOPTED));
    assert_eq!(read(&d, &mut ctx, 800), text_page(1));
    // A page freed without a read since its writeback: its record is freed, not kept.
    write(&d, &mut ctx, 900, &text_page(900));
    d.mark_idle(None);
    d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    assert!(state(&d, 900).flags.contains(SlotFlags::WB));
    discard(&d, 900);
    assert_eq!(d.backing().unwrap().kept().0, 1);
    // Turning reuse off drops what is kept.
    d.set_policy("reuse=0").unwrap();
    assert_eq!(d.backing().unwrap().kept(), (0, 0));
    assert_eq!(d.policy_stats().kept_dropped, 1);
    for i in (502..700).chain([700, 800]) {
        discard(&d, i);
    }
    assert_eq!(d.backing().unwrap().free_bytes(), free0);
    check_space(&d);
    d.check_invariants().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_reuse_off_a_freed_record_is_freed() {
    let dir = tempdir("reuse-off");
    let d = setup(&dir, 4 << 20);
    d.set_policy("reuse=0").unwrap();
    let mut ctx = d.context().unwrap();
    write(&d, &mut ctx, 0, &text_page(0));
    d.mark_idle(None);
    d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    read(&d, &mut ctx, 0);
    discard(&d, 0);
    write(&d, &mut ctx, 1, &text_page(0));
    assert!(state(&d, 1).flags.contains(SlotFlags::STORED));
    assert_eq!(d.backing().unwrap().kept(), (0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kept_records_give_their_room_up_to_a_batch() {
    let dir = tempdir("reuse-room");
    // A 1 MiB store: about 220 raw pages.
    let d = setup(&dir, 1 << 20);
    let mut ctx = d.context().unwrap();
    for i in 0..150 {
        write(&d, &mut ctx, i, &noise_page(i));
    }
    d.mark_idle(None);
    let wb = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    assert_eq!(wb.written, 150, "{wb:?}");
    for i in 0..150 {
        if state(&d, i).flags.contains(SlotFlags::WB) {
            read(&d, &mut ctx, i);
        }
        discard(&d, i);
    }
    assert_eq!(d.backing().unwrap().kept().0, wb.written);
    // Other pages: the store is full of kept records, which go for them.
    for i in 0..100 {
        write(&d, &mut ctx, i, &noise_page(1000 + i));
    }
    d.mark_idle(None);
    let again = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    assert_eq!(again.written, 100, "{again:?}");
    assert_eq!(d.backing().unwrap().kept(), (0, 0));
    assert_eq!(d.policy_stats().kept_dropped, wb.written);
    for i in 0..100 {
        assert_eq!(read(&d, &mut ctx, i), noise_page(1000 + i));
    }
    check_space(&d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Random swap-like traffic over a few contents: every page against a model, and the store's
/// space against the records the slots name plus the kept ones, after every step.
#[test]
fn random_traffic_keeps_pages_and_space_right() {
    use rand::{Rng, SeedableRng};
    let dir = tempdir("reuse-model");
    let d = setup(&dir, 1 << 20);
    let mut ctx = d.context().unwrap();
    let contents: Vec<[u8; PAGE_SIZE]> = (0..12)
        .map(|k| {
            if k % 4 == 3 {
                noise_page(k)
            } else {
                text_page(k)
            }
        })
        .collect();
    for seed in 0..4u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut model: HashMap<u64, usize> = HashMap::new();
        for step in 0..3000 {
            let i = rng.gen_range(0..64u64);
            match rng.gen_range(0..10) {
                0..=3 => {
                    let k = rng.gen_range(0..contents.len());
                    write(&d, &mut ctx, i, &contents[k]);
                    model.insert(i, k);
                }
                4..=6 => {
                    let want = model.get(&i).map_or([0; PAGE_SIZE], |&k| contents[k]);
                    assert_eq!(
                        read(&d, &mut ctx, i),
                        want,
                        "seed {seed} step {step} page {i}"
                    );
                }
                7 | 8 => {
                    discard(&d, i);
                    model.remove(&i);
                }
                _ => {
                    d.mark_idle(None);
                    d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
                }
            }
            check_space(&d);
        }
        for (&i, &k) in &model {
            assert_eq!(read(&d, &mut ctx, i), contents[k], "seed {seed}: page {i}");
        }
        d.check_invariants().unwrap();
        let p = d.policy_stats();
        assert!(
            p.reused_pages > 0,
            "seed {seed}: no record was taken over: {p:?}"
        );
        for i in 0..64 {
            discard(&d, i);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_adopted_word_gives_back_its_location_and_index() {
    let location = BackingStore::location(3, (1 << SECTOR_BITS) - 1);
    let word = pack(location, PageIndex(u64::from(u32::MAX))).unwrap();
    let s = SlotState {
        word,
        flags: SlotFlags::WB | SlotFlags::ADOPTED,
        ..SlotState::default()
    };
    assert_eq!(
        record_of(PageIndex(7), &s),
        (PageIndex(u64::from(u32::MAX)), location)
    );
    let plain = SlotState {
        word: location,
        flags: SlotFlags::WB,
        ..SlotState::default()
    };
    assert_eq!(record_of(PageIndex(7), &plain), (PageIndex(7), location));
    assert_eq!(pack(BackingStore::location(16, 9), PageIndex(1)), None);
    assert_eq!(
        pack(BackingStore::location(0, 1 << SECTOR_BITS), PageIndex(1)),
        None
    );
    assert_eq!(pack(BackingStore::location(0, 9), PageIndex(1 << 32)), None);
}

#[test]
fn a_note_of_a_read_never_outlives_its_record() {
    let dir = tempdir("reuse-stale");
    let d = setup(&dir, 1 << 20);
    let mut ctx = d.context().unwrap();
    // Page 0 read back (its digest noted), then reuse off: the record is freed, the note gone.
    write(&d, &mut ctx, 0, &text_page(1));
    d.mark_idle(None);
    d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    let first = state(&d, 0).word;
    read(&d, &mut ctx, 0);
    d.set_policy("reuse=0").unwrap();
    discard(&d, 0);
    d.set_policy("reuse=1").unwrap();
    // Other content at the same page, written back until it lands in the same place (the
    // space map's cursor comes round), freed unread.
    let mut rounds = 0;
    loop {
        write(&d, &mut ctx, 0, &text_page(2));
        d.mark_idle(None);
        d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
        rounds += 1;
        if state(&d, 0).word == first {
            break;
        }
        assert!(rounds < 2000, "never back at the first place");
        discard(&d, 0);
    }
    discard(&d, 0);
    assert_eq!(d.backing().unwrap().kept(), (0, 0));
    // The first content written again is a new page, not the second's record.
    write(&d, &mut ctx, 5, &text_page(1));
    assert!(state(&d, 5).flags.contains(SlotFlags::STORED));
    assert_eq!(read(&d, &mut ctx, 5), text_page(1));
    check_space(&d);
    let _ = std::fs::remove_dir_all(&dir);
}
