use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::super::testutil::text_page;
use super::*;
use crate::device::{DeviceSetup, IoContext, PAGE_SIZE};

/// Pages of the model devices: two summary words' worth of page words, so marks cross words
/// and summary words.
const PAGES: u64 = 64 * 64 + 200;

fn device(pages: u64) -> (Device, IoContext) {
    let d = DeviceSetup::new().init(pages * PAGE_SIZE as u64).unwrap();
    d.set_freed_pages(FreedPages::in_memory(pages)).unwrap();
    let ctx = d.context().unwrap();
    (d, ctx)
}

fn read(d: &Device, ctx: &mut IoContext, page: u64) -> Vec<u8> {
    let mut buf = vec![0xa5; PAGE_SIZE];
    d.read(ctx, page * PAGE_SIZE as u64, &mut buf).unwrap();
    buf
}

#[derive(Debug, Clone)]
enum Op {
    /// A whole page of text made from the seed.
    Write(u64, u8),
    /// 512 bytes of 0x5a at sector `s` of the page (a read-modify-write).
    Partial(u64, u8),
    /// Marks pages as the probe does.
    Mark(u64, u64),
    /// Discards one page.
    Discard(u64),
    Reclaim,
    Read(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let page = prop_oneof![0..PAGES, 60u64..70, 4090u64..4100];
    prop_oneof![
        4 => (page.clone(), any::<u8>()).prop_map(|(p, s)| Op::Write(p, s)),
        1 => (page.clone(), 0u8..8).prop_map(|(p, s)| Op::Partial(p, s)),
        3 => (page.clone(), 1u64..600).prop_map(|(p, n)| Op::Mark(p, n)),
        1 => page.clone().prop_map(Op::Discard),
        1 => Just(Op::Reclaim),
        2 => page.prop_map(Op::Read),
    ]
}

/// The model: each page's bytes, the marks not yet taken, and what zram would have counted.
#[derive(Default)]
struct Model {
    pages: HashMap<u64, Vec<u8>>,
    marked: HashSet<u64>,
    notify_free: u64,
    notice_freed: u64,
}

impl Model {
    fn data(&self, page: u64) -> Vec<u8> {
        self.pages
            .get(&page)
            .cloned()
            .unwrap_or_else(|| vec![0; PAGE_SIZE])
    }

    /// A write stored new data at `page`: it takes the page's mark.
    fn written(&mut self, page: u64, data: Vec<u8>) {
        if self.marked.remove(&page) {
            self.notify_free += 1;
        }
        self.pages.insert(page, data);
    }
}

fn run(ops: Vec<Op>) {
    let (d, mut ctx) = device(PAGES);
    let mut m = Model::default();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write(p, seed) => {
                let page = text_page(u64::from(seed) | p << 8);
                d.write(&mut ctx, p * PAGE_SIZE as u64, &page).unwrap();
                m.written(p, page.to_vec());
            }
            Op::Partial(p, s) => {
                let off = p * PAGE_SIZE as u64 + u64::from(s) * 512;
                d.write(&mut ctx, off, &[0x5a; 512]).unwrap();
                // Merged with the page's bytes, dead or not: a partial write of a freed slot
                // is not something swap does, and the old bytes are only zeros once taken.
                let mut data = m.data(p);
                data[usize::from(s) * 512..][..512].fill(0x5a);
                m.written(p, data);
            }
            Op::Mark(p, n) => {
                d.freed_pages().unwrap().mark(PageIndex(p), n);
                m.marked.extend(p..(p + n).min(PAGES));
            }
            Op::Discard(p) => {
                d.discard(p * PAGE_SIZE as u64, PAGE_SIZE as u64).unwrap();
                m.pages.remove(&p);
                m.notify_free += 1;
            }
            Op::Reclaim => {
                let taken = d.reclaim_freed();
                assert_eq!(taken, m.marked.len() as u64, "step {step}: marks taken");
                for p in m.marked.drain() {
                    m.notify_free += 1;
                    if m.pages.remove(&p).is_some() {
                        m.notice_freed += 1;
                    }
                }
            }
            Op::Read(p) => {
                // A marked page not yet taken still reads as what it held.
                assert!(read(&d, &mut ctx, p) == m.data(p), "step {step}: page {p}");
            }
        }
        let s = d.stats();
        assert_eq!(
            s.mm.orig_data_size,
            m.pages.len() as u64 * PAGE_SIZE as u64,
            "step {step}: orig_data_size"
        );
        assert_eq!(s.io.notify_free, m.notify_free, "step {step}: notify_free");
        assert_eq!(
            s.notice_freed_pages, m.notice_freed,
            "step {step}: notice_freed_pages"
        );
        for p in [0, 63, 64, PAGES - 1] {
            assert_eq!(
                d.freed_pages().unwrap().is_marked(PageIndex(p)),
                m.marked.contains(&p),
                "step {step}: mark of page {p}"
            );
        }
    }
    d.reclaim_freed();
    for p in m.marked.drain() {
        m.pages.remove(&p);
    }
    for p in 0..PAGES {
        assert!(read(&d, &mut ctx, p) == m.data(p), "end: page {p}");
    }
    d.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn marks_free_pages_against_a_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops);
    }
}

#[test]
fn a_mark_frees_the_page_once_reclaimed_and_never_a_later_write() {
    let (d, mut ctx) = device(256);
    let (old, new) = (text_page(1), text_page(2));
    d.write(&mut ctx, 0, &old).unwrap();
    d.write(&mut ctx, 4096, &old).unwrap();
    let used = d.stats().mm.mem_used_total;
    assert!(used > 0);
    // Page 0 is freed and written again before the daemon looks; page 1 only freed.
    d.freed_pages().unwrap().mark(PageIndex(0), 2);
    d.write(&mut ctx, 0, &new).unwrap();
    assert_eq!(d.reclaim_freed(), 1, "the write took page 0's mark");
    assert!(read(&d, &mut ctx, 0) == new.to_vec());
    assert!(read(&d, &mut ctx, 1) == vec![0; PAGE_SIZE]);
    let s = d.stats();
    assert_eq!(s.mm.orig_data_size, PAGE_SIZE as u64);
    assert_eq!(s.notice_freed_pages, 1);
    assert_eq!(s.io.notify_free, 2);
    assert_eq!(d.reclaim_freed(), 0, "nothing is left to take");
}

#[test]
fn marks_are_sized_and_given_once() {
    let d = DeviceSetup::new().init(100 * PAGE_SIZE as u64).unwrap();
    assert!(matches!(
        d.set_freed_pages(FreedPages::in_memory(64)),
        Err(Error::FreeMarksTooShort { pages: 100, .. })
    ));
    let short: Box<[AtomicU64]> = (0..1).map(|_| AtomicU64::new(0)).collect();
    assert!(matches!(
        FreedPages::new(Box::new(short), 100),
        Err(Error::FreeMarksTooShort { needed: 3, .. })
    ));
    d.set_freed_pages(FreedPages::in_memory(100)).unwrap();
    assert!(matches!(
        d.set_freed_pages(FreedPages::in_memory(100)),
        Err(Error::Busy { .. })
    ));
    // Marks past the device are ignored; marks on pages never written are taken, freeing
    // nothing.
    d.freed_pages().unwrap().mark(PageIndex(90), 1000);
    assert_eq!(d.reclaim_freed(), 10);
    assert_eq!(d.stats().notice_freed_pages, 0);
}

/// Swap's protocol, raced: a "kernel" thread writes a page, frees it (marks it) and writes it
/// again with new data, as swap reuses a slot, while another thread reclaims marks as fast as it
/// can. Every page must end with its new data: a late mark never frees a later write.
#[test]
fn a_racing_reclaim_never_frees_a_rewritten_page() {
    let pages = 2048;
    let (d, _) = device(pages);
    let d = Arc::new(d);
    let done = Arc::new(AtomicBool::new(false));
    let reclaimer = {
        let (d, done) = (Arc::clone(&d), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut taken = 0;
            while !done.load(Ordering::Acquire) {
                taken += d.reclaim_freed();
            }
            taken
        })
    };
    let mut ctx = d.context().unwrap();
    for round in 0..4u64 {
        for p in 0..pages {
            let off = p * PAGE_SIZE as u64;
            d.write(&mut ctx, off, &text_page(round << 32 | p)).unwrap();
            d.freed_pages().unwrap().mark(PageIndex(p), 1);
            d.write(&mut ctx, off, &text_page(round << 32 | p | 1 << 20))
                .unwrap();
        }
        for p in 0..pages {
            assert!(
                read(&d, &mut ctx, p) == text_page(round << 32 | p | 1 << 20).to_vec(),
                "round {round}: page {p} lost its rewrite"
            );
        }
    }
    done.store(true, Ordering::Release);
    let taken = reclaimer.join().unwrap() + d.reclaim_freed();
    // Every mark was taken once, by the reclaim (freeing the first write) or by the rewrite.
    assert_eq!(d.stats().io.notify_free, 4 * pages);
    assert_eq!(d.stats().notice_freed_pages, taken);
    assert!(
        taken > 0,
        "the reclaim never won a race: the test proves nothing"
    );
    // Pages freed and not written again are freed by the next reclaim.
    d.freed_pages().unwrap().mark(PageIndex(0), pages);
    assert_eq!(d.reclaim_freed(), pages);
    assert_eq!(d.stats().mm.orig_data_size, 0);
    assert_eq!(d.stats().mm.mem_used_total, 0);
    d.check_invariants().unwrap();
}

/// A reclaim in steps frees what one whole reclaim would, over as many calls as it takes: a
/// step stopped after some words leaves the rest marked (also the summary bits it had not read
/// yet), and the pages it did not reach keep their data until a later step.
#[test]
fn a_reclaim_in_steps_frees_every_page_across_its_calls() {
    let (d, mut ctx) = device(PAGES);
    for p in 0..PAGES {
        d.write(&mut ctx, p * PAGE_SIZE as u64, &text_page(p))
            .unwrap();
    }
    // Every odd page freed, across both summary words, and page 0 (a word's first bit).
    let freed: HashSet<u64> = (0..PAGES).filter(|p| p % 2 == 1 || *p == 0).collect();
    for &p in &freed {
        d.freed_pages().unwrap().mark(PageIndex(p), 1);
    }
    let mut taken = 0;
    let mut calls = 0;
    loop {
        // Stop after three words of page bits each call.
        let mut words = 0;
        let (n, more) = d.reclaim_freed_until(|| {
            words += 1;
            words == 3
        });
        taken += n;
        calls += 1;
        assert!(n <= 3 * 64, "call {calls}: {n} marks taken in three words");
        if calls == 1 {
            assert!(more, "the first call stopped early: pages are still marked");
            // The pages it did not reach still read as written.
            let last = PAGES - 1;
            assert_eq!(read(&d, &mut ctx, last), text_page(last).to_vec());
        }
        if !more {
            break;
        }
        assert!(calls < 1000, "the steps never finish");
    }
    assert!(calls > 2, "{calls} calls: the steps did not stop");
    assert_eq!(taken, freed.len() as u64);
    assert_eq!(d.reclaim_freed(), 0, "nothing was left marked");
    for p in 0..PAGES {
        let want = if freed.contains(&p) {
            vec![0; PAGE_SIZE]
        } else {
            text_page(p).to_vec()
        };
        assert!(read(&d, &mut ctx, p) == want, "page {p}");
    }
    assert_eq!(d.stats().notice_freed_pages, freed.len() as u64);
    d.check_invariants().unwrap();
}
