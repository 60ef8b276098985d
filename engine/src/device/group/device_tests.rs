//! Cold groups on a device, against a model of its pages: reads, writes, discards and partial
//! writes of grouped pages, the split, a writer racing the pass, and the counters.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::device::testutil::text_page;
use crate::device::{Device, Held, IoContext, PageIndex, PAGE_SIZE};
use crate::DeviceSetup;

fn device() -> Device {
    let mut setup = DeviceSetup::new();
    setup.set_recomp_algorithm("algo=zstd priority=1").unwrap();
    setup.init(4 << 20).unwrap()
}

/// Writes text pages `0..n` (page `i` from seed `seed + i`); returns the model.
fn fill(d: &Device, ctx: &mut IoContext, n: u64, seed: u64) -> HashMap<u64, [u8; PAGE_SIZE]> {
    (0..n)
        .map(|i| {
            let p = text_page(seed + i);
            d.write(ctx, i * PAGE_SIZE as u64, &p).unwrap();
            (i, p)
        })
        .collect()
}

fn check(d: &Device, ctx: &mut IoContext, model: &HashMap<u64, [u8; PAGE_SIZE]>, pages: u64) {
    let mut back = vec![0u8; PAGE_SIZE];
    for i in 0..pages {
        d.read(ctx, i * PAGE_SIZE as u64, &mut back).unwrap();
        let want = model.get(&i).copied().unwrap_or([0; PAGE_SIZE]);
        assert!(back[..] == want[..], "page {i}");
    }
    d.check_invariants().unwrap();
}

#[test]
fn grouped_pages_read_back_store_less_and_cost_one_decompression_a_group() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let model = fill(&d, &mut ctx, 64, 1);
    d.mark_idle(None);
    let est = d.estimate_groups(&mut ctx, 1, 16).unwrap();
    let before = d.stats();
    let pass = d.make_groups(&mut ctx, 1, 16).unwrap();
    assert_eq!((pass.groups, pass.pages), (4, 64), "{pass:?}");
    assert_eq!(
        (pass.pool_before, pass.pool_after),
        (est.pool_alone, est.pool_grouped)
    );
    let after = d.stats();
    assert!(
        after.mm.compr_data_size < before.mm.compr_data_size,
        "{} -> {}",
        before.mm.compr_data_size,
        after.mm.compr_data_size
    );
    assert_eq!(after.mm.orig_data_size, before.mm.orig_data_size);
    assert_eq!((after.groups.live, after.groups.pages), (4, 64));
    d.check_invariants().unwrap();
    // In order, as readahead reads: one decompression a group.
    ctx.group.forget();
    check(&d, &mut ctx, &model, 64);
    assert_eq!(d.stats().groups.decompressions, 4);
    // A page still grouped after its read, and still idle-marked away from.
    let s = d.slot_state(PageIndex(5)).unwrap();
    assert!(s.is_grouped());
}

#[test]
fn writes_discards_and_partial_writes_take_pages_out_and_the_last_frees_the_group() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let mut model = fill(&d, &mut ctx, 16, 7);
    d.mark_idle(None);
    let objects_before = d.pool().stats().objects;
    assert_eq!(d.make_groups(&mut ctx, 1, 16).unwrap().pages, 16);
    assert!(d.pool().stats().objects < objects_before);
    // Overwrite page 3, discard page 4, and write 512 bytes into page 5.
    let p = text_page(999);
    d.write(&mut ctx, 3 * 4096, &p).unwrap();
    model.insert(3, p);
    d.discard(4 * 4096, 4096).unwrap();
    model.remove(&4);
    d.write(&mut ctx, 5 * 4096 + 1024, &[0xab; 512]).unwrap();
    model.get_mut(&5).unwrap()[1024..1536].fill(0xab);
    assert_eq!(d.stats().groups.pages, 13);
    check(&d, &mut ctx, &model, 16);
    // Every page out: the group's chunks are freed.
    d.discard(0, 16 * 4096).unwrap();
    let s = d.stats();
    assert_eq!((s.groups.live, s.groups.pages, s.groups.bytes), (0, 0, 0));
    assert_eq!(d.pool().stats().objects, 0);
    check(&d, &mut ctx, &HashMap::new(), 16);
}

#[test]
fn a_group_below_half_is_split_into_single_pages() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let mut model = fill(&d, &mut ctx, 16, 3);
    d.mark_idle(None);
    assert_eq!(d.make_groups(&mut ctx, 1, 16).unwrap().groups, 1);
    for i in 0..8 {
        let p = text_page(500 + i);
        d.write(&mut ctx, i * 4096, &p).unwrap();
        model.insert(i, p);
    }
    assert_eq!(
        d.split_sparse_groups(&mut ctx).unwrap(),
        0,
        "half left: kept"
    );
    d.discard(8 * 4096, 4096).unwrap();
    model.remove(&8);
    assert_eq!(d.split_sparse_groups(&mut ctx).unwrap(), 1);
    let s = d.stats();
    assert_eq!((s.groups.live, s.groups.split), (0, 1));
    assert!(!d.slot_state(PageIndex(9)).unwrap().is_grouped());
    check(&d, &mut ctx, &model, 16);
}

#[test]
fn runs_shorter_than_the_least_group_and_unidle_pages_stay_single() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let model = fill(&d, &mut ctx, 11, 5);
    d.mark_idle(None);
    // Page 3 read: no longer idle, so the run is 0..3 (too short) then 4..11.
    let mut back = vec![0u8; PAGE_SIZE];
    d.read(&mut ctx, 3 * 4096, &mut back).unwrap();
    let pass = d.make_groups(&mut ctx, 1, 16).unwrap();
    assert_eq!((pass.groups, pass.pages), (1, 7), "{pass:?}");
    for i in 0..4 {
        assert!(
            !d.slot_state(PageIndex(i)).unwrap().is_grouped(),
            "page {i}"
        );
    }
    check(&d, &mut ctx, &model, 11);
}

#[test]
fn a_writer_racing_the_pass_loses_no_page() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let pages = 256u64;
    fill(&d, &mut ctx, pages, 11);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (last, changed) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut ctx = d.context().unwrap();
            let mut last: HashMap<u64, [u8; PAGE_SIZE]> = HashMap::new();
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = (round * 37) % pages;
                let p = text_page(10_000 + round);
                d.write(&mut ctx, i * 4096, &p).unwrap();
                last.insert(i, p);
                if round % 8 == 0 {
                    d.mark_idle(None);
                }
                round += 1;
            }
            last
        });
        // Until the writer has got between a run's read and its commit at least once (on a
        // loaded machine that may take many passes).
        let mut changed = 0;
        for round in 0..2000 {
            if round >= 5 && changed > 0 {
                break;
            }
            d.mark_idle(None);
            changed += d.make_groups(&mut ctx, 1, 16).unwrap().changed;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (writer.join().unwrap(), changed)
    });
    let mut model: HashMap<u64, [u8; PAGE_SIZE]> =
        (0..pages).map(|i| (i, text_page(11 + i))).collect();
    model.extend(last);
    check(&d, &mut ctx, &model, pages);
    assert!(
        changed > 0,
        "the writer never raced a commit: this run proved nothing"
    );
}

#[test]
fn a_copy_kept_for_an_earlier_group_at_the_same_handle_is_not_read() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let model = fill(&d, &mut ctx, 16, 20);
    d.mark_idle(None);
    d.make_groups(&mut ctx, 1, 16).unwrap();
    let Held::Member { head, .. } = d.slot_state(PageIndex(0)).unwrap().held() else {
        panic!("page 0 is not grouped");
    };
    let stamp = super::header(d.pool(), head).unwrap().stamp;
    // What a context holds after reading an earlier group whose head had this handle.
    ctx.group.pretend(head, stamp.wrapping_sub(1), 0xee);
    let reads = d.stats().groups.decompressions;
    check(&d, &mut ctx, &model, 16);
    assert_eq!(d.stats().groups.decompressions, reads + 1);
    // The same key is this group's copy: read from it, no decompression.
    ctx.group.pretend(head, stamp, 0xee);
    let mut back = vec![0u8; PAGE_SIZE];
    d.read(&mut ctx, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xee));
    assert_eq!(d.stats().groups.decompressions, reads + 1);
}

#[test]
fn lz4_groups_read_back_too() {
    let d = device();
    let mut ctx = d.context().unwrap();
    let model = fill(&d, &mut ctx, 32, 60);
    d.mark_idle(None);
    assert_eq!(d.make_groups(&mut ctx, 0, 8).unwrap().pages, 32);
    ctx.group.forget();
    check(&d, &mut ctx, &model, 32);
}

/// A device with a backing file, zstd for recompression, the policy's `groups` as given.
fn backed(dir: &std::path::Path, name: &str, groups: &str) -> Device {
    let mut setup = DeviceSetup::new();
    setup.set_recomp_algorithm("algo=zstd priority=1").unwrap();
    setup.set_backing_dev(&dir.join(name));
    let d = setup.init(4 << 20).unwrap();
    d.set_policy(groups).unwrap();
    d
}

/// The bytes page `p` takes compressed alone with the devices' zstd (their recompression's
/// codec, at its default level), or raw from `threshold` on.
fn zstd_alone(p: &[u8; PAGE_SIZE], threshold: usize) -> usize {
    let codec = uzram_codecs::Codec::new(
        uzram_codecs::Algorithm::Zstd,
        uzram_codecs::CodecParams::default(),
    )
    .unwrap();
    let mut dst = vec![0u8; uzram_codecs::MAX_COMPRESSED_LEN];
    let n = codec.stream().unwrap().compress(p, &mut dst).unwrap();
    if n < threshold {
        n
    } else {
        PAGE_SIZE
    }
}

#[test]
fn grouped_pages_are_written_back_alone_with_their_groups_codec() {
    let dir = crate::device::testutil::tempdir("groups-wb");
    // The same pages on two devices: one groups them (by hand: the policy makes no groups on
    // a device with a backing store), the other recompresses them page by page.
    let (g, p) = (
        backed(&dir, "grouped", "groups=16"),
        backed(&dir, "plain", "groups=off"),
    );
    let (mut gc, mut pc) = (g.context().unwrap(), p.context().unwrap());
    let model = fill(&g, &mut gc, 40, 80);
    fill(&p, &mut pc, 40, 80);
    g.mark_idle(None);
    let pass = g.make_groups(&mut gc, 1, 16).unwrap();
    assert!(pass.pages >= 32, "{pass:?}");
    p.mark_idle(None);
    p.recompress(&mut pc, &"type=idle".parse().unwrap())
        .unwrap();
    let members: Vec<u64> = (0..40)
        .filter(|&i| g.slot_state(PageIndex(i)).unwrap().is_grouped())
        .collect();
    let (groups, decompressions) = (g.stats().groups.live, g.stats().groups.decompressions);
    for (d, ctx) in [(&g, &mut gc), (&p, &mut pc)] {
        d.mark_idle(None);
        let wb = d
            .writeback(ctx, crate::device::writeback::WritebackRequest::Idle)
            .unwrap();
        assert_eq!((wb.written, wb.failed), (40, 0), "{wb:?}");
    }
    // Every group left with its last member, each decompressed once for the batch.
    let after = g.stats().groups;
    assert_eq!(
        (after.live, after.pages, after.bytes),
        (0, 0, 0),
        "{after:?}"
    );
    assert_eq!(after.decompressions - decompressions, groups);
    // Each grouped page's record holds it alone with the group's codec; together they take no
    // more of the store than the same pages recompressed one by one.
    let threshold = g.huge_threshold();
    let (mut with, mut without) = (0, 0);
    for &i in &members {
        let a = g.slot_state(PageIndex(i)).unwrap();
        assert_eq!(
            (a.prio, usize::from(a.size)),
            (1, zstd_alone(&model[&i], threshold)),
            "page {i}"
        );
        with += crate::device::writeback::record_bytes(usize::from(a.size));
        let b = p.slot_state(PageIndex(i)).unwrap();
        without += crate::device::writeback::record_bytes(usize::from(b.size));
    }
    assert!(
        with <= without,
        "{with} B on the store, {without} B page by page"
    );
    check(&g, &mut gc, &model, 40);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_policy_makes_no_groups_with_a_backing_store_but_writes_groups_back_by_age() {
    use crate::device::policy::Policy;
    let dir = crate::device::testutil::tempdir("groups-policy");
    let d = backed(
        &dir,
        "backing",
        "recompress_after=10m writeback_after=1h min_free=0 psi=off",
    );
    let mut ctx = d.context().unwrap();
    let mut policy = Policy::new();
    let model = fill(&d, &mut ctx, 64, 300);
    d.advance_clock(610);
    let r = policy.tick(&d, &mut ctx, &crate::Pressure::none()).unwrap();
    assert_eq!((r.grouped, r.recompressed), (0, 64), "{r:?}");
    // Groups made by hand (of the pages recompressed alone, idle again).
    d.mark_idle(None);
    let pass = d.make_groups(&mut ctx, 1, 16).unwrap();
    assert!(pass.pages >= 48, "{pass:?}");
    d.advance_clock(3600);
    let r = policy.tick(&d, &mut ctx, &crate::Pressure::none()).unwrap();
    // The policy thread writes grouped pages back with its own streams and copy.
    assert_eq!(r.written_back, 64, "{r:?}");
    assert_eq!(d.stats().groups.live, 0);
    check(&d, &mut ctx, &model, 64);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn writes_at_the_limit_evict_grouped_pages_rather_than_fail() {
    let dir = crate::device::testutil::tempdir("groups-evict");
    let d = backed(&dir, "backing", "groups=16");
    let mut ctx = d.context().unwrap();
    let mut model = fill(&d, &mut ctx, 256, 7);
    d.mark_idle(None);
    let pass = d.make_groups(&mut ctx, 1, 16).unwrap();
    assert!(pass.pages >= 240, "{pass:?}");
    // The pool holds groups alone, and no room is left: the next writes must evict grouped
    // pages (nothing else is there to evict).
    d.set_mem_limit(Some(d.stats().mm.mem_used_total));
    for i in 256..320u64 {
        let p = text_page(1000 + i);
        d.write(&mut ctx, i * PAGE_SIZE as u64, &p).unwrap();
        model.insert(i, p);
    }
    let s = d.stats();
    assert!(s.groups.pages < pass.pages, "{:?}", s.groups);
    assert!(d.policy_stats().evicted_pages > 0);
    check(&d, &mut ctx, &model, 320);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn readers_of_a_group_see_old_or_new_pages_while_writers_empty_it() {
    for round in 0..4u64 {
        let d = device();
        let mut ctx = d.context().unwrap();
        let old = fill(&d, &mut ctx, 16, 100 + round);
        d.mark_idle(None);
        assert_eq!(d.make_groups(&mut ctx, 1, 16).unwrap().pages, 16);
        let new: HashMap<u64, [u8; PAGE_SIZE]> =
            (0..16).map(|i| (i, text_page(5000 + i))).collect();
        std::thread::scope(|scope| {
            for r in 0..2u64 {
                let (d, old, new) = (&d, &old, &new);
                scope.spawn(move || {
                    let mut ctx = d.context().unwrap();
                    let mut back = vec![0u8; PAGE_SIZE];
                    for k in 0..400u64 {
                        let i = (k * 7 + r * 3) % 16;
                        d.read(&mut ctx, i * 4096, &mut back).unwrap();
                        assert!(
                            back[..] == old[&i][..] || back[..] == new[&i][..],
                            "page {i}: neither its old nor its new bytes"
                        );
                    }
                });
            }
            let mut wctx = d.context().unwrap();
            for i in (0..16).rev() {
                d.write(&mut wctx, i * 4096, &new[&i]).unwrap();
            }
        });
        assert_eq!(d.stats().groups.live, 0);
        check(&d, &mut ctx, &new, 16);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write { page: u64, seed: u64 },
    Partial { page: u64, sector: usize, byte: u8 },
    Discard { page: u64, pages: u64 },
    Read { page: u64 },
    MarkIdle,
    Group { max: usize },
    Split,
    Forget,
}

const PAGES: u64 = 40;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PAGES, 0..1_000u64).prop_map(|(page, seed)| Op::Write { page, seed }),
        2 => (0..PAGES, 0..8usize, any::<u8>()).prop_map(|(page, sector, byte)| Op::Partial { page, sector, byte }),
        1 => (0..PAGES, 1..6u64).prop_map(|(page, pages)| Op::Discard { page, pages }),
        3 => (0..PAGES).prop_map(|page| Op::Read { page }),
        2 => Just(Op::MarkIdle),
        2 => (1..20usize).prop_map(|max| Op::Group { max }),
        1 => Just(Op::Split),
        1 => Just(Op::Forget),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn groups_keep_every_page_against_a_model(ops in proptest::collection::vec(op(), 1..60)) {
        let d = device();
        let mut ctx = d.context().unwrap();
        let mut model = fill(&d, &mut ctx, PAGES, 0);
        let mut back = vec![0u8; PAGE_SIZE];
        for op in ops {
            match op {
                Op::Write { page, seed } => {
                    let p = text_page(seed);
                    d.write(&mut ctx, page * 4096, &p).unwrap();
                    model.insert(page, p);
                }
                Op::Partial { page, sector, byte } => {
                    d.write(&mut ctx, page * 4096 + sector as u64 * 512, &[byte; 512]).unwrap();
                    let p = model.entry(page).or_insert([0; PAGE_SIZE]);
                    p[sector * 512..sector * 512 + 512].fill(byte);
                }
                Op::Discard { page, pages } => {
                    let pages = pages.min(PAGES - page);
                    d.discard(page * 4096, pages * 4096).unwrap();
                    for i in page..page + pages {
                        model.remove(&i);
                    }
                }
                Op::Read { page } => {
                    d.read(&mut ctx, page * 4096, &mut back).unwrap();
                    let want = model.get(&page).copied().unwrap_or([0; PAGE_SIZE]);
                    prop_assert!(back[..] == want[..], "page {}", page);
                }
                Op::MarkIdle => {
                    d.mark_idle(None);
                }
                Op::Group { max } => {
                    d.make_groups(&mut ctx, 1, max).unwrap();
                }
                Op::Split => {
                    d.split_sparse_groups(&mut ctx).unwrap();
                }
                Op::Forget => ctx.group.forget(),
            }
            d.check_invariants().map_err(TestCaseError::fail)?;
        }
        check(&d, &mut ctx, &model, PAGES);
    }
}

#[test]
fn adoption_checks_each_members_place_and_stamps_past_every_group() {
    let d = device();
    let mut ctx = d.context().unwrap();
    fill(&d, &mut ctx, 40, 70);
    d.mark_idle(None);
    assert_eq!(d.make_groups(&mut ctx, 1, 16).unwrap().groups, 3);
    let named = |skip: u64| {
        let mut m = super::Members::default();
        for i in skip..40 {
            let s = d.slot_state(PageIndex(i)).unwrap();
            if let Held::Member { head, member } = s.held() {
                m.note(i, &s, head, member).unwrap();
            }
        }
        m
    };
    let found = named(0).adopt(d.pool(), d.pages()).unwrap();
    assert_eq!(found.entries.len(), 3);
    let stamps: Vec<u32> = found
        .entries
        .iter()
        .map(|&(h, _)| super::header(d.pool(), h).unwrap().stamp)
        .collect();
    assert!(stamps.iter().all(|&s| s < found.next_stamp), "{stamps:?}");
    // A group whose pages would not fit the device, and a member at a page below its place.
    assert!(named(0).adopt(d.pool(), 39).is_err());
    let s = d.slot_state(PageIndex(5)).unwrap();
    let Held::Member { head, member } = s.held() else {
        panic!("page 5 is not grouped")
    };
    let mut bad = super::Members::default();
    bad.note(u64::from(member) - 1, &s, head, member).unwrap();
    let err = bad.adopt(d.pool(), d.pages()).map(|_| ()).unwrap_err();
    assert!(err.contains("do not fit"), "{err}");
}
