//! Reads of written-back pages: early reads judge the policy, second reads promote, and first
//! reads too while promotions pay.

use super::super::testutil::tempdir;
use super::super::writeback::WritebackRequest;
use super::tests::{check_all, full_of_noise, short_of_memory};
use super::*;

/// Writes pages 0..100 of a [`full_of_noise`] device back by hand, 5 s after they were written.
fn hundred_written_back(d: &Device, ctx: &mut IoContext) {
    d.advance_clock(5);
    let s = d
        .writeback(ctx, WritebackRequest::Pages { first: 0, last: 99 })
        .unwrap();
    assert_eq!(s.written, 100, "{s:?}");
}

fn on_store(d: &Device) -> u64 {
    d.backing().unwrap().pages()
}

/// Writes pages `first..last` back by hand and reads them twice, 30 s apart: the second read
/// promotes them (within the promote age, 60 s before any round for room).
fn promoted_by_two_reads(
    d: &Device,
    ctx: &mut IoContext,
    model: &[(u64, [u8; PAGE_SIZE])],
    (first, last): (u64, u64),
) {
    d.advance_clock(5);
    let s = d
        .writeback(ctx, WritebackRequest::Pages { first, last })
        .unwrap();
    assert_eq!(s.written, last - first + 1, "{s:?}");
    let pages = &model[first as usize..=last as usize];
    let promoted = d.policy_stats().promoted_pages;
    check_all(d, ctx, pages);
    d.advance_clock(30);
    check_all(d, ctx, pages);
    assert_eq!(d.policy_stats().promoted_pages - promoted, last - first + 1);
}

/// [`promoted_by_two_reads`], then each promoted page read again 10 s later: a hit each, so a
/// credit of one a page (each bet paid back twice).
fn promoted_and_hit(
    d: &Device,
    ctx: &mut IoContext,
    model: &[(u64, [u8; PAGE_SIZE])],
    (first, last): (u64, u64),
) {
    promoted_by_two_reads(d, ctx, model, (first, last));
    d.advance_clock(10);
    check_all(d, ctx, &model[first as usize..=last as usize]);
}

#[test]
fn pages_read_back_soon_after_writeback_count_once_and_raise_the_cold_age() {
    let dir = tempdir("policy-early");
    let (d, mut ctx, model) = full_of_noise(&dir);
    d.set_policy("promote=0").unwrap();
    hundred_written_back(&d, &mut ctx);
    // Read at once (twice): 100 early reads, not 200.
    check_all(&d, &mut ctx, &model[..100]);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!(d.policy_stats().early_reads, 100);
    // Read again later: not early.
    d.advance_clock(EARLY_READ_SECS + 1);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!(d.policy_stats().early_reads, 100);
    // The next pressured tick judges: a tenth and more read back early, so the age doubles.
    let mut policy = Policy::new();
    policy.tick(&d, &mut ctx, &short_of_memory(40)).unwrap();
    assert_eq!(
        d.policy_stats().cold_age_secs,
        u64::from(COLD_AGE_START * 2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_page_read_twice_since_its_writeback_within_the_promote_age_comes_back_into_the_pool() {
    let dir = tempdir("policy-promote");
    let (d, mut ctx, model) = full_of_noise(&dir);
    let objects = d.pool.stats().objects;
    hundred_written_back(&d, &mut ctx);
    assert_eq!(d.pool.stats().objects, objects - 100);
    // The first read leaves the pages where they are.
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (100, 0));
    // A second one, within the promote age (60 s before any round for room), brings them back.
    d.advance_clock(30);
    check_all(&d, &mut ctx, &model[..100]);
    let p = d.policy_stats();
    assert_eq!((on_store(&d), p.promoted_pages), (0, 100));
    assert_eq!(d.pool.stats().objects, objects);
    // Their records are kept for reuse, as on any free of a page just read back.
    assert_eq!(p.kept_pages, 100);
    // From the pool now: nothing more to promote, and every page still reads right.
    check_all(&d, &mut ctx, &model);
    assert_eq!(d.policy_stats().promoted_pages, 100);
    // A promoted page that goes cold can be written back again.
    d.advance_clock(5);
    let s = d
        .writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 9 })
        .unwrap();
    assert_eq!(s.written, 10, "{s:?}");
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_read_after_the_promote_age_leaves_the_page_on_the_store_and_restarts_the_clock() {
    let dir = tempdir("policy-promote-late");
    let (d, mut ctx, model) = full_of_noise(&dir);
    hundred_written_back(&d, &mut ctx);
    check_all(&d, &mut ctx, &model[..100]);
    d.advance_clock(COLD_AGE_START);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (100, 0));
    // Measured from the last read, not from the writeback (10 s short of the age: the device's
    // clock also runs in real time, and a loaded test machine may cross a second meanwhile).
    d.advance_clock(COLD_AGE_START - 10);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (0, 100));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn promote_off_leaves_pages_read_twice_on_the_store() {
    let dir = tempdir("policy-promote-off");
    let (d, mut ctx, model) = full_of_noise(&dir);
    d.set_policy("promote=0").unwrap();
    assert_eq!(d.policy_stats().promote_age_secs, 0);
    hundred_written_back(&d, &mut ctx);
    for _ in 0..3 {
        check_all(&d, &mut ctx, &model[..100]);
    }
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (100, 0));
    d.set_policy("promote=1").unwrap();
    assert_eq!(d.policy_stats().promote_age_secs, u64::from(COLD_AGE_START));
    // (A read in the same second as the last is a piece of that read: a second later.)
    d.advance_clock(1);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (0, 100));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pool_at_its_limit_leaves_pages_read_twice_on_the_store() {
    let dir = tempdir("policy-promote-full");
    let (d, mut ctx, model) = full_of_noise(&dir);
    hundred_written_back(&d, &mut ctx);
    d.set_mem_limit(Some(d.pool.pages_used() * PAGE_SIZE as u64));
    check_all(&d, &mut ctx, &model[..100]);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_pages), (100, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_round_for_room_sets_the_promote_age_to_the_age_of_the_pages_it_wrote_back() {
    let dir = tempdir("policy-promote-age");
    let (d, mut ctx, model) = full_of_noise(&dir);
    // Pages 0..100 read a second ago; the rest untouched for 1000 s.
    d.advance_clock(1000);
    check_all(&d, &mut ctx, &model[..100]);
    d.advance_clock(1);
    let mut policy = Policy::new();
    // A 40 MiB host: a share of 8 MiB, within which the pool's cold pages go, down to half.
    let r = policy.tick(&d, &mut ctx, &short_of_memory(40)).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    let age = d.policy_stats().promote_age_secs;
    assert!((512..=1001).contains(&age), "promote age {age}");
    // What was read a second ago stayed in the pool.
    for i in 0..100 {
        assert!(
            d.peek(PageIndex(i)).flags.contains(SlotFlags::STORED),
            "page {i}"
        );
    }
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn promoted_pages_read_again_soon_turn_promotion_on_the_first_read_on() {
    let dir = tempdir("policy-first-read");
    let (d, mut ctx, model) = full_of_noise(&dir);
    // Each promotion bets one credit.
    promoted_by_two_reads(&d, &mut ctx, &model, (0, 199));
    assert_eq!(d.tiering().policy.first_read.credit(), -200);
    // Read from the pool within the promote age: 200 hits, each paying two back; once is what
    // counts.
    d.advance_clock(10);
    check_all(&d, &mut ctx, &model[..200]);
    check_all(&d, &mut ctx, &model[..200]);
    let p = d.policy_stats();
    assert_eq!((p.promote_hits, p.promote_misses), (200, 0));
    assert_eq!(d.tiering().policy.first_read.credit(), 200);
    // Now a written-back page comes back on its first read.
    hundred_written_back(&d, &mut ctx);
    check_all(&d, &mut ctx, &model[..100]);
    let p = d.policy_stats();
    assert_eq!(
        (on_store(&d), p.promoted_first, p.promoted_pages),
        (0, 100, 300)
    );
    assert_eq!(d.tiering().policy.first_read.credit(), 100);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn first_reads_promote_only_while_the_credit_lasts_and_misses_pay_nothing_back() {
    let dir = tempdir("policy-first-read-off");
    let (d, mut ctx, model) = full_of_noise(&dir);
    // 100 hits: a credit of 100.
    promoted_and_hit(&d, &mut ctx, &model, (0, 99));
    assert_eq!(d.tiering().policy.first_read.credit(), 100);
    // 150 first reads: 68 promote, down to the evidence floor of 32; the rest stay.
    d.advance_clock(5);
    d.writeback(
        &mut ctx,
        WritebackRequest::Pages {
            first: 100,
            last: 249,
        },
    )
    .unwrap();
    check_all(&d, &mut ctx, &model[100..250]);
    assert_eq!(d.policy_stats().promoted_first, 68);
    assert_eq!(on_store(&d), 150 - 68);
    assert_eq!(d.tiering().policy.first_read.credit(), 32);
    // The 68 promoted pages: 40 read after the promote age, 28 written back again unread.
    // 68 misses, nothing paid back.
    let promoted: Vec<u64> = (100..250)
        .filter(|&i| d.peek(PageIndex(i)).flags.contains(SlotFlags::PROMOTED))
        .collect();
    assert_eq!(promoted.len(), 68);
    d.advance_clock(COLD_AGE_START);
    for &i in &promoted[..40] {
        check_all(&d, &mut ctx, &model[i as usize..=i as usize]);
    }
    for &i in &promoted[40..] {
        d.writeback(&mut ctx, WritebackRequest::Pages { first: i, last: i })
            .unwrap();
    }
    let p = d.policy_stats();
    assert_eq!((p.promote_hits, p.promote_misses), (100, 68));
    assert_eq!(d.tiering().policy.first_read.credit(), 32);
    // First reads leave pages on the store now; second reads still promote.
    d.advance_clock(5);
    d.writeback(
        &mut ctx,
        WritebackRequest::Pages {
            first: 300,
            last: 399,
        },
    )
    .unwrap();
    let on = on_store(&d);
    check_all(&d, &mut ctx, &model[300..400]);
    assert_eq!(on_store(&d), on);
    d.advance_clock(30);
    check_all(&d, &mut ctx, &model[300..400]);
    assert_eq!(on_store(&d), on - 100);
    assert_eq!(d.policy_stats().promoted_first, 68);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn promote_off_turns_first_read_promotion_off_too() {
    let dir = tempdir("policy-first-read-promote-off");
    let (d, mut ctx, model) = full_of_noise(&dir);
    promoted_and_hit(&d, &mut ctx, &model, (0, 99));
    assert!(d.tiering().policy.first_read.credit() > 0);
    d.set_policy("promote=0").unwrap();
    hundred_written_back(&d, &mut ctx);
    check_all(&d, &mut ctx, &model[..100]);
    assert_eq!((on_store(&d), d.policy_stats().promoted_first), (100, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_page_read_in_pieces_is_judged_by_its_next_read_in_a_later_second() {
    let dir = tempdir("policy-promote-pieces");
    let (d, mut ctx, model) = full_of_noise(&dir);
    // The device clock runs in real time too: a try whose pieces straddle a second is done
    // again on the next page (three tries cannot all straddle one).
    let judged_in_one_second = (0..3u64).any(|i| {
        promoted_by_two_reads(&d, &mut ctx, &model, (i, i));
        let hits = d.policy_stats().promote_hits;
        let before = d.now();
        // The rest of the promoting read, 512 bytes at a time, in the same second: no hit.
        let mut piece = [0u8; 512];
        for k in 1..8u64 {
            d.read(&mut ctx, i * PAGE_SIZE as u64 + k * 512, &mut piece)
                .unwrap();
            let at = k as usize * 512;
            assert_eq!(piece[..], model[i as usize].1[at..at + 512]);
        }
        if d.now() != before {
            return false;
        }
        assert!(d.peek(PageIndex(i)).flags.contains(SlotFlags::PROMOTED));
        assert_eq!(d.policy_stats().promote_hits, hits);
        // A read a second later is the next one: a hit.
        d.advance_clock(1);
        d.read(&mut ctx, i * PAGE_SIZE as u64, &mut piece).unwrap();
        let s = d.peek(PageIndex(i));
        assert!(s.flags.contains(SlotFlags::STORED) && !s.flags.contains(SlotFlags::PROMOTED));
        assert_eq!(d.policy_stats().promote_hits, hits + 1);
        true
    });
    assert!(judged_in_one_second);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_age_scan_sets_the_promote_age_below_a_pass_of_a_cyclic_walk() {
    let dir = tempdir("policy-promote-measure-cyclic");
    let (d, mut ctx, model) = full_of_noise(&dir);
    // A walk in a cycle: the pool's pages read a quarter at a time, 100 s apart; ten pages
    // left unread since the fill (a rule taking the oldest page's age would say 447 s, and
    // promote what the walk reads once a pass).
    let n = model.len();
    for q in 0..4 {
        d.advance_clock(100);
        let first = if q == 0 { 10 } else { q * n / 4 };
        check_all(&d, &mut ctx, &model[first..(q + 1) * n / 4]);
    }
    d.advance_clock(100);
    let mut policy = Policy::new();
    policy.tick(&d, &mut ctx, &Pressure::none()).unwrap();
    // The coldest quarter was read a pass (400 s) ago: the age is under that.
    let age = d.policy_stats().promote_age_secs;
    assert!((256..400).contains(&age), "promote age {age}");
    // A written-back page read twice a pass apart stays on the store; read again within the
    // age, it comes back.
    d.writeback(
        &mut ctx,
        WritebackRequest::Pages {
            first: 10,
            last: 19,
        },
    )
    .unwrap();
    check_all(&d, &mut ctx, &model[10..20]);
    d.advance_clock(400);
    check_all(&d, &mut ctx, &model[10..20]);
    assert_eq!(d.policy_stats().promoted_pages, 0);
    d.advance_clock(200);
    check_all(&d, &mut ctx, &model[10..20]);
    assert_eq!(d.policy_stats().promoted_pages, 10);
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn beside_pages_left_cold_the_promote_age_is_theirs_and_a_hot_page_comes_back() {
    let dir = tempdir("policy-promote-measure-hotcold");
    let (d, mut ctx, model) = full_of_noise(&dir);
    let mut policy = Policy::new();
    // A round for room wrote back pages idle for a minute: then the pool's coldest.
    d.advance_clock(60);
    let r = policy.tick(&d, &mut ctx, &short_of_memory(40)).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    let round = d.policy_stats().promote_age_secs;
    assert!(round < 128, "promote age {round}");
    // A hot fifth (the last pages: the round took the first) read every 100 s for 1000 s;
    // the rest of the pool left alone.
    let n = model.len();
    let hot = &model[n - 300..];
    for _ in 0..10 {
        d.advance_clock(100);
        check_all(&d, &mut ctx, hot);
    }
    d.advance_clock(1);
    policy.tick(&d, &mut ctx, &Pressure::none()).unwrap();
    let age = d.policy_stats().promote_age_secs;
    assert!((512..=1061).contains(&age), "promote age {age}");
    // A hot page on the store read every 300 s (the kernel keeps it in RAM between its
    // faults): longer than the round's age, shorter than the cold pages'. Its second read
    // brings it back, and its next read from the pool is a hit.
    let ten = &hot[..10];
    let first = ten[0].0;
    let s = d
        .writeback(
            &mut ctx,
            WritebackRequest::Pages {
                first,
                last: first + 9,
            },
        )
        .unwrap();
    assert_eq!(s.written, 10, "{s:?}");
    for _ in 0..2 {
        check_all(&d, &mut ctx, ten);
        d.advance_clock(300);
    }
    let p = d.policy_stats();
    assert_eq!(
        (p.promoted_pages, p.promote_hits, p.promote_misses),
        (10, 0, 0)
    );
    check_all(&d, &mut ctx, ten);
    let p = d.policy_stats();
    assert_eq!((p.promote_hits, p.promote_misses), (10, 0));
    check_all(&d, &mut ctx, &model);
    let _ = std::fs::remove_dir_all(&dir);
}
