//! Spill's ceiling: writes faster than the policy thread do not grow the pool past its share,
//! and while spill is on host pressure writes back only what is past the ceiling.

use super::super::tests::{check_all, device, full_of_noise, short_of_memory};
use super::super::*;
use crate::device::testutil::{noise_page, tempdir, text_page};

/// Writes noise pages `range` (each a huge page: a whole pool page) without a tick between.
fn write_noise(
    d: &Device,
    ctx: &mut IoContext,
    model: &mut Vec<(u64, [u8; PAGE_SIZE])>,
    range: std::ops::Range<u64>,
) {
    for i in range {
        let p = noise_page(i + 10_000);
        d.write(ctx, i * PAGE_SIZE as u64, &p).unwrap();
        model.push((i, p));
    }
}

#[test]
fn under_pressure_a_write_past_the_ceiling_makes_room_first() {
    let dir = tempdir("policy-ceiling");
    let (d, mut ctx, mut model) = full_of_noise(&dir);
    d.advance_clock(20);
    let mut policy = Policy::new();
    // A 30 MiB host: the share is 6.0 MiB and the ceiling a sixteenth more, 1632 pages; the
    // pool (1500 pages) is within both and young, so the tick writes nothing back.
    let r = policy.tick(&d, &mut ctx, &short_of_memory(30)).unwrap();
    assert_eq!(r.written_back, 0, "{r:?}");
    let ceiling = (30u64 << 20) / 100 * 20 * 17 / 16 / PAGE_SIZE as u64;
    // 500 pages more, faster than any tick: the pool stops at the ceiling (one eviction's
    // batch below it at most), the rest goes to the backing store.
    write_noise(&d, &mut ctx, &mut model, 1500..2000);
    let used = d.pool.pages_used();
    assert!(
        (ceiling - EVICT_BATCH as u64..=ceiling + 1).contains(&used),
        "pool {used} pages, ceiling {ceiling}"
    );
    let s = d.policy_stats();
    assert!(s.evicted_pages >= 2000 - 1 - ceiling, "{s:?}");
    assert_eq!(d.backing().unwrap().pages(), s.evicted_pages);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_pressure_or_with_spill_off_there_is_no_ceiling() {
    let dir = tempdir("policy-ceiling-off");
    let (d, mut ctx, mut model) = full_of_noise(&dir);
    d.advance_clock(20);
    let mut policy = Policy::new();
    let short = short_of_memory(30);
    // Spill off: the pool grows past the share (the tick's writeback follows later).
    d.set_policy("spill=0").unwrap();
    policy.tick(&d, &mut ctx, &short).unwrap();
    write_noise(&d, &mut ctx, &mut model, 1500..1800);
    assert!(d.pool.pages_used() >= 1800, "{}", d.pool.pages_used());
    // Eviction off: no ceiling (a write could not make room); on, the ceiling is back.
    let ceiling = |d: &Device| {
        d.tiering()
            .policy
            .spill
            .ceiling_pages
            .load(Ordering::Relaxed)
    };
    d.set_policy("spill=1 evict=0").unwrap();
    policy.tick(&d, &mut ctx, &short).unwrap();
    assert_eq!(ceiling(&d), 0);
    d.set_policy("evict=1").unwrap();
    policy.tick(&d, &mut ctx, &short).unwrap();
    assert_eq!(
        ceiling(&d),
        (30u64 << 20) / 100 * 20 * 17 / 16 / PAGE_SIZE as u64
    );
    // No pressure: no ceiling either.
    let calm = Pressure {
        mem_available: 20 << 20,
        ..short
    };
    policy.tick(&d, &mut ctx, &calm).unwrap();
    assert_eq!(ceiling(&d), 0);
    let before = d.pool.pages_used();
    write_noise(&d, &mut ctx, &mut model, 1800..1900);
    assert_eq!(d.pool.pages_used(), before + 100);
    assert_eq!(d.policy_stats().evicted_pages, 0);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn past_the_ceiling_compressible_pages_make_room_only_when_their_class_has_none() {
    let dir = tempdir("policy-ceiling-text");
    let d = device(
        &dir,
        2048,
        "recompress_after=off writeback_after=off pool_share=20",
    );
    let mut ctx = d.context().unwrap();
    let mut policy = Policy::new();
    // A 2 MiB host: the share is 0.4 MiB, the ceiling 108 pool pages.
    policy.tick(&d, &mut ctx, &short_of_memory(2)).unwrap();
    let mut model = Vec::new();
    for i in 0..1500u64 {
        let p = text_page(i);
        d.write(&mut ctx, i * PAGE_SIZE as u64, &p).unwrap();
        model.push((i, p));
    }
    // Stored alone they would take about 550 pool pages; the ceiling holds the pool near its
    // 108 (a zspage a class past it at most), and what stays is packed: a write past the
    // ceiling evicts only when its class has no free slot, so the pool is not emptied of
    // objects while its page count stands still.
    let used = d.pool.pages_used();
    let mm = d.stats().mm;
    assert!(used <= 2 * 108, "pool {used} pages");
    assert!(
        mm.compr_data_size * 2 >= used * PAGE_SIZE as u64,
        "{} bytes of objects in {used} pool pages",
        mm.compr_data_size
    );
    let s = d.policy_stats();
    assert!(s.evicted_pages > 0 && s.evicted_pages < 1500, "{s:?}");
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn above_its_share_with_spill_on_only_what_is_past_the_ceiling_leaves() {
    let dir = tempdir("policy-above-spill");
    let (d, mut ctx, model) = full_of_noise(&dir);
    let mut policy = Policy::new();
    let used = |d: &Device| d.pool.pages_used() * PAGE_SIZE as u64;
    // A 28 MiB host: the share is 5.6 MiB, the ceiling 5.95 MiB; the pool (5.9 MiB, 1500
    // pages) is between them: spill is on, and the pool's own pages stay.
    let share = (28u64 << 20) / 100 * 20;
    assert!(used(&d) > share && used(&d) < share + share / 16);
    for _ in 0..3 {
        let r = policy.tick(&d, &mut ctx, &short_of_memory(28)).unwrap();
        assert_eq!(r.written_back, 0, "{r:?}");
    }
    assert!(d.tiering().policy.spill.is_on());
    assert_eq!(d.policy_stats().host_wb_pages, 0);
    // A 20 MiB host: the share is 4 MiB, the ceiling 4.25 MiB, the pool far past both (it
    // grew before the pressure came): what is past the ceiling goes, no more.
    let share = (20u64 << 20) / 100 * 20;
    let ceiling = share + share / 16;
    let r = policy.tick(&d, &mut ctx, &short_of_memory(20)).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    assert!(
        used(&d) <= ceiling && used(&d) + (8 * PAGE_SIZE) as u64 > ceiling,
        "pool {} after a tick, ceiling {ceiling}",
        used(&d)
    );
    assert_eq!(d.policy_stats().host_wb_pages, r.written_back);
    assert_eq!(
        policy
            .tick(&d, &mut ctx, &short_of_memory(20))
            .unwrap()
            .written_back,
        0
    );
    // Within the ceiling, pages idle for the cold age still go, down to the share's floor.
    d.advance_clock(COLD_AGE_START + 1);
    let r = policy.tick(&d, &mut ctx, &short_of_memory(20)).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    assert!(used(&d) + PAGE_SIZE as u64 >= share / 2, "{}", used(&d));
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}
