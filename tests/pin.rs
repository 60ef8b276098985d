//! The daemon's fault-free memory, as the daemon sets it up: its global allocator (the I/O heap
//! for marked threads, malloc for the rest) and the stack a queue thread faults in.
//! `harness = false`: one process, one global allocator, no harness threads.

use uzram::daemon::heap::{self, DaemonAlloc};

#[global_allocator]
static ALLOCATOR: DaemonAlloc = DaemonAlloc;

fn main() {
    uzram::daemon::pin::tune_malloc();
    io_heap_serves_marked_threads();
    uzram::daemon::pin::prefault_stack::<{ uzram::daemon::pin::STACK_PREFAULT }>();
    io_path_fits_in_the_prefaulted_stack();
    evicting_writes_fit_in_the_prefaulted_stack();
    upkeep_fits_in_its_prefaulted_stack();
    let s = heap::stats();
    println!(
        "pin: I/O heap {} of {} KiB in use, {} fallbacks",
        s.in_use >> 10,
        s.committed >> 10,
        s.fallbacks
    );
}

/// A marked thread's blocks come from the I/O heap (resident before they are handed out), stay
/// intact through growth, shrinking and frees from other threads, and a block the heap cannot
/// hold goes to malloc and is counted; unmarked threads never touch the heap. The model: every
/// live block with the byte it was filled with.
fn io_heap_serves_marked_threads() {
    heap_refills_and_trims();
    heap_blocks_stay_intact();
}

/// The heap's margin: committed by refills (one step at a time between arenas while memory is
/// short), given back by a trim once it is not, and the heap's own again when recommitted.
fn heap_refills_and_trims() {
    // Before the heap exists a marked thread still allocates (from malloc).
    std::thread::spawn(|| {
        heap::serve_from_io_heap();
        let v = vec![3u8; 1000];
        assert!(!heap::owns(v.as_ptr()));
    })
    .join()
    .unwrap();
    // Locked as in the daemon where this process may lock (root, as in CI).
    heap::init(64 << 30, uzram::sys::uid() == 0).unwrap();
    let rss = rss_anon_kib();
    // Memory not short: a first refill keeps the calm margin ahead, no more.
    let calm = heap::refill();
    assert!(
        (heap::CALM_RESERVE..heap::RESERVE).contains(&calm),
        "a first refill committed {calm} bytes"
    );
    assert_eq!(heap::refill(), 0, "a full heap needs no refill");
    // Memory short: a refill to the calm margin (the memory thread's between the pool's
    // arenas) commits one step toward the whole margin, no more; a whole refill the rest.
    heap::set_memory_short(true);
    let step = heap::refill_with(heap::Margin::Calm, &mut |_| {});
    assert_eq!(
        step,
        1 << 20,
        "a refill between arenas committed {step} bytes"
    );
    let added = calm + step + heap::refill();
    assert!(
        added >= heap::RESERVE,
        "refills with memory short committed {added} bytes"
    );
    let grown = rss_anon_kib() - rss;
    assert!(
        grown * 1024 >= added as u64 * 9 / 10,
        "a refill of {added} bytes made only {grown} KiB resident"
    );
    assert_eq!(heap::refill(), 0, "a full heap needs no refill");
    // Short memory over: a trim gives back all but the calm margin (and under a step more), and
    // they are no longer resident; refills commit again what memory short needs.
    heap::set_memory_short(false);
    let before = rss_anon_kib();
    let committed = heap::stats().committed;
    let trimmed = heap::trim();
    assert_eq!(heap::stats().committed, committed - trimmed);
    assert_eq!(trimmed % (1 << 20), 0, "a trim gives back whole steps");
    assert!(
        trimmed >= (heap::RESERVE - heap::CALM_RESERVE) & !((1 << 20) - 1),
        "a trim gave back only {trimmed} of {added} bytes"
    );
    let shrunk = before.saturating_sub(rss_anon_kib());
    assert!(
        shrunk * 1024 >= trimmed as u64 * 9 / 10,
        "a trim of {trimmed} bytes left all but {shrunk} KiB resident"
    );
    assert_eq!(heap::trim(), 0, "a trimmed heap trims no more");
    assert_eq!(heap::refill(), 0, "a trim keeps the calm margin");
    heap::set_memory_short(true);
    assert_eq!(heap::trim(), 0, "no trim while memory is short");
    let again = heap::refill();
    assert!(
        again > 0,
        "memory short again: the margin is committed again"
    );
    assert_eq!(heap::stats().committed, committed - trimmed + again);
    // The steps committed again are the heap's: a block nearly as large as the margin fits.
    std::thread::spawn(|| {
        heap::serve_from_io_heap();
        let v = vec![7u8; heap::RESERVE - (64 << 10)];
        assert!(
            heap::owns(v.as_ptr()),
            "the recommitted top is not the heap's"
        );
        assert!(v.iter().all(|&b| b == 7));
    })
    .join()
    .unwrap();
}

/// Blocks of marked threads come from the heap and stay intact through growth, shrinking and
/// frees from other threads; what the heap cannot hold goes to malloc and is counted.
fn heap_blocks_stay_intact() {
    // Unmarked threads (this one) allocate from malloc.
    let plain = vec![1u8; 4096];
    assert!(!heap::owns(plain.as_ptr()));

    let start = heap::stats();
    let live = std::thread::spawn(move || {
        heap::serve_from_io_heap();
        let mut live: Vec<(Vec<u8>, u8)> = Vec::new();
        for i in 0..1500usize {
            let len = i * 37 % 2000 + 1;
            live.push((vec![i as u8; len], i as u8));
        }
        assert!(heap::owns(live.as_ptr()));
        assert!(live.iter().all(|(v, _)| heap::owns(v.as_ptr())));
        let mid = heap::stats();
        let bytes: usize = live.iter().map(|(v, _)| v.len()).sum();
        assert!(
            mid.in_use >= start.in_use + bytes,
            "{mid:?} after {bytes} bytes"
        );
        assert_eq!(
            mid.fallbacks, start.fallbacks,
            "the heap had room for all of it"
        );
        // Grow and shrink every third block, free every fifth.
        for (i, (v, fill)) in live.iter_mut().enumerate() {
            if i % 3 == 0 {
                v.resize(v.len() * 2 + 100, *fill);
            } else if i % 3 == 1 {
                v.truncate(v.len() / 2 + 1);
                v.shrink_to_fit();
            }
        }
        let mut i = 0;
        live.retain(|_| {
            i += 1;
            i % 5 != 0
        });
        // Draining the heap's top below half the reserve asks for a refill, once, before
        // anything falls back to malloc.
        let _ = heap::take_low();
        let mut drain = Vec::new();
        while !heap::take_low() {
            drain.push(vec![5u8; 64 << 10]);
            assert!(
                drain.len() < 64,
                "4 MiB allocated and the heap never said it was low"
            );
        }
        assert!(!heap::take_low(), "asked twice for one refill");
        assert!(drain.iter().all(|v| heap::owns(v.as_ptr())));
        assert_eq!(heap::stats().fallbacks, start.fallbacks);
        drop(drain);
        // A block bigger than all the heap has free goes to malloc, and is counted.
        let big = vec![9u8; 2 * heap::RESERVE];
        assert!(!heap::owns(big.as_ptr()));
        assert_eq!(heap::stats().fallbacks, start.fallbacks + 1);
        // Growing a malloc block on a marked thread moves it into the heap.
        let mut moved = plain;
        moved.reserve_exact(8192);
        assert!(heap::owns(moved.as_ptr()));
        assert!(moved.iter().all(|&b| b == 1));
        for (v, fill) in &live {
            assert!(v.iter().all(|b| b == fill), "block {fill} changed");
        }
        (live, moved)
    })
    .join()
    .unwrap();
    // This (unmarked) thread grows the heap's blocks (in place, or out to malloc) and frees them.
    let (mut live, moved) = live;
    let mut out = 0;
    for (v, fill) in live.iter_mut().step_by(7) {
        v.resize(v.len() + 50_000, *fill);
        out += usize::from(!heap::owns(v.as_ptr()));
    }
    assert!(
        out > 0,
        "no block grown off the I/O path moved out of its heap"
    );
    for (v, fill) in &live {
        assert!(v.iter().all(|b| b == fill), "block {fill} changed");
    }
    drop(live);
    drop(moved);
    let end = heap::stats();
    assert_eq!(
        end.in_use, start.in_use,
        "every block was freed: {start:?} then {end:?}"
    );
}

/// The process's resident anonymous memory, KiB.
fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Runs `check` on a thread served from the I/O heap, as the daemon's I/O and upkeep threads
/// are, whose whole stack is what such a thread faults in (`prefault`) less 32 KiB for the
/// frames above what is checked (libublk's on a queue thread): a deeper path overflows it (the
/// guard page ends the test with SIGSEGV). The daemon is built in release, and there that is
/// the check; a debug build's frames are several times larger (zstd's C at `-O0` among them),
/// so its check gets twice the room: it still catches a path that grew severalfold, and
/// `cargo test --release --test pin` (in `.ci/long`) checks the budget itself.
fn in_checked_stack(prefault: usize, check: impl FnOnce() + Send + 'static) {
    let room = if cfg!(debug_assertions) { 2 } else { 1 };
    std::thread::Builder::new()
        .stack_size(room * prefault - (32 << 10))
        .spawn(move || {
            heap::serve_from_io_heap();
            check();
        })
        .unwrap()
        .join()
        .unwrap();
}

/// A request's first attempt, as a queue thread makes it (none is put off here).
fn handle(
    device: &uzram_engine::Device,
    ctx: &mut uzram_engine::IoContext,
    req: uzram::daemon::io::Request,
    buf: &mut [u8],
    transfer: &uzram::daemon::io::InPlace,
) -> i32 {
    use uzram::daemon::defer::Deferral;
    use uzram::daemon::io::{Attempt, Served};
    let mut deferral = Deferral::default();
    match uzram::daemon::io::handle(
        device,
        ctx,
        req,
        buf,
        transfer,
        Attempt::FIRST,
        &mut deferral,
    ) {
        Served::Result(res) => res,
        put_off => panic!("{req:?} was {put_off:?}"),
    }
}

/// The request path (`io::handle`, as a queue thread calls it), run on a thread whose whole
/// stack is [`in_checked_stack`] ([`STACK_PREFAULT`] less 32 KiB in release): a deeper path
/// would overflow it (the guard page ends the test with SIGSEGV), so the stack a queue thread
/// faults in before serving covers every page it will touch.
fn io_path_fits_in_the_prefaulted_stack() {
    use uzram::daemon::io::{InPlace, Op, Request};

    use uzram_engine::testing::pages::{noise_page, text_page};
    use uzram_engine::DeviceSetup;
    let run = || {
        for (algo, params) in [("lz4", ""), ("zstd", "level=1"), ("zstd", "level=19")] {
            let mut setup = DeviceSetup::new();
            setup.set_comp_algorithm(algo).unwrap();
            if !params.is_empty() {
                setup.set_algorithm_params(params).unwrap();
            }
            let device = setup.init(1 << 20).unwrap();
            let mut ctx = device.context().unwrap();
            let mut buf = vec![0u8; 128 << 10];
            let req = |op, start_sector, nr_sectors| Request {
                op,
                start_sector,
                nr_sectors,
                swap: true,
            };
            for i in 0..64u64 {
                // Half noise: zstd compresses it (a page of noise alone it stores whole
                // without compressing).
                let mut mixed = noise_page(i);
                mixed[..2048].copy_from_slice(&text_page(i)[..2048]);
                let mut two = text_page(i).to_vec();
                two.extend_from_slice(&mixed);
                let at = i % 16 * 16;
                buf[..8192].copy_from_slice(&two);
                assert_eq!(
                    handle(
                        &device,
                        &mut ctx,
                        req(Op::Write, at, 16),
                        &mut buf,
                        &InPlace
                    ),
                    8192
                );
                buf[..8192].fill(0);
                assert_eq!(
                    handle(&device, &mut ctx, req(Op::Read, at, 16), &mut buf, &InPlace),
                    8192
                );
                assert_eq!(buf[..8192], two[..]);
                // A partial write: read-modify-write under the slot lock.
                assert_eq!(
                    handle(
                        &device,
                        &mut ctx,
                        req(Op::Write, at + 1, 2),
                        &mut buf,
                        &InPlace
                    ),
                    1024
                );
                assert_eq!(
                    handle(
                        &device,
                        &mut ctx,
                        req(Op::Discard, at, 8),
                        &mut buf,
                        &InPlace
                    ),
                    0
                );
            }
        }
    };
    heap::refill();
    let before = heap::stats().fallbacks;
    in_checked_stack(uzram::daemon::pin::STACK_PREFAULT, move || {
        run();
        assert_eq!(
            heap::stats().fallbacks,
            before,
            "the request path outgrew a full I/O heap"
        );
    });
}

/// A queue thread's deepest request: a write at the pool's limit that evicts inline (a block
/// device's backing store: no hand-off) a batch of grouped pages, each decompressed from its
/// zstd group and compressed alone, sealed with the store's key. Run, as above, on a thread
/// whose whole stack is [`in_checked_stack`]; every page is read back as written.
///
/// [`STACK_PREFAULT`]: uzram::daemon::pin::STACK_PREFAULT
fn evicting_writes_fit_in_the_prefaulted_stack() {
    use uzram::daemon::io::{InPlace, Op, Request};
    use uzram_engine::testing::pages::text_page;
    use uzram_engine::{BackingKey, DeviceSetup, PAGE_SIZE};
    const PAGES: u64 = 256;
    let dir = std::env::temp_dir().join(format!("uzram-pin-evict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let device = {
        let mut setup = DeviceSetup::new();
        setup.set_recomp_algorithm("zstd").unwrap();
        setup.set_backing_dev(&dir.join("backing"));
        setup.set_backing_key(BackingKey::generate());
        setup.set_policy("min_free=0 psi=off evict=1").unwrap();
        setup.init(4 * PAGES * PAGE_SIZE as u64).unwrap()
    };
    device.set_evict_hand_off(false);
    let run = move || {
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 128 << 10];
        let req = |op, page: u64| Request {
            op,
            start_sector: page * 8,
            nr_sectors: 8,
            swap: true,
        };
        let write = |ctx: &mut uzram_engine::IoContext, page: u64, buf: &mut [u8]| {
            buf[..PAGE_SIZE].copy_from_slice(&text_page(page));
            assert_eq!(
                handle(&device, ctx, req(Op::Write, page), buf, &InPlace),
                PAGE_SIZE as i32
            );
        };
        for page in 0..PAGES {
            write(&mut ctx, page, &mut buf);
        }
        device.mark_idle(None);
        let pass = device.make_groups(&mut ctx, 1, 16).unwrap();
        assert!(pass.pages >= PAGES - 16, "{pass:?}");
        // No room left but what eviction makes: only grouped pages are there to evict.
        device.set_mem_limit(Some(device.stats().mm.mem_used_total));
        for page in PAGES..PAGES + 64 {
            write(&mut ctx, page, &mut buf);
        }
        assert!(device.policy_stats().evicted_pages > 0);
        assert!(device.stats().groups.pages < pass.pages);
        for page in 0..PAGES + 64 {
            assert_eq!(
                handle(&device, &mut ctx, req(Op::Read, page), &mut buf, &InPlace),
                PAGE_SIZE as i32
            );
            assert!(
                buf[..PAGE_SIZE] == text_page(page)[..],
                "page {page} differs"
            );
        }
    };
    in_checked_stack(uzram::daemon::pin::STACK_PREFAULT, run);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The memory thread's rounds on `d` (a region, its pool in reserve mode): calm, then short.
fn memory_rounds(d: &uzram_engine::Device) {
    use std::time::Duration;
    use uzram_engine::testing::pages::text_page;
    use uzram_engine::{Pressure, PAGE_SIZE};
    const PAGE: u64 = PAGE_SIZE as u64;
    // The memory thread: rounds with memory calm, then short.
    for short in [false, true] {
        d.set_memory_short(short);
        heap::set_memory_short(short);
        assert!(d.wait_for_maintenance(Duration::ZERO) || !short);
        let _ = d.reclaim_freed_until(|| false);
        let _ = Pressure::read().short();
        let _ = Pressure::swap_outs();
        let mut after_each = || {
            heap::refill_with(heap::Margin::Calm, &mut |pages| {
                d.note_upkeep_progress(pages)
            });
            d.prefault_region(false);
        };
        let m = d.maintain_memory_with(&mut after_each).unwrap();
        assert!(m.arenas_mapped > 0 || !short, "{m:?}");
        heap::refill_with(heap::Margin::Whole, &mut |_| {});
        let (leaves, chunks) = d.prefault_region(short);
        assert!(!short || leaves + chunks as usize > 0);
    }
    heap::set_memory_short(false);
    heap::trim();
    let mut ctx = d.context().unwrap();
    for i in 0..64u64 {
        d.write(&mut ctx, i * PAGE, &text_page(i)).unwrap();
    }
}

/// The policy thread's rounds on `d` (a backing file, zstd second): recompression and
/// writeback by age, eviction above the watermark; every page read back as written.
fn policy_rounds(d: &uzram_engine::Device) {
    use std::time::Duration;
    use uzram_engine::testing::pages::{noise_page, text_page};
    use uzram_engine::{Policy, Pressure, PAGE_SIZE};
    const PAGE: u64 = PAGE_SIZE as u64;
    let mut ctx = d.context().unwrap();
    let mut policy = Policy::new();
    policy.make_buffers();
    let model: Vec<(u64, [u8; PAGE_SIZE])> = (0..300)
        .map(|i| {
            (
                i,
                if i % 3 == 0 {
                    noise_page(i)
                } else {
                    text_page(i)
                },
            )
        })
        .collect();
    for (i, p) in &model {
        d.write(&mut ctx, i * PAGE, p).unwrap();
    }
    d.advance_clock(610);
    let _ = Pressure::read().short();
    let r = policy.tick(d, &mut ctx, &Pressure::none()).unwrap();
    assert!(r.recompressed > 0, "{r:?}");
    d.advance_clock(3600);
    let r = policy.tick(d, &mut ctx, &Pressure::none()).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    // Above the watermark: the coldest pages are evicted.
    for (i, p) in &model {
        d.write(&mut ctx, (1000 + i) * PAGE, p).unwrap();
    }
    d.set_mem_limit(Some(d.stats().mm.mem_used_total / 2));
    d.advance_clock(60);
    let r = policy.tick(d, &mut ctx, &Pressure::none()).unwrap();
    assert!(r.written_back > 0, "{r:?}");
    policy.serve_evictions(d, Duration::ZERO);
    d.compact();
    let mut back = [0u8; PAGE_SIZE];
    for (i, p) in &model {
        d.read(&mut ctx, i * PAGE, &mut back).unwrap();
        assert!(back == *p, "page {i} differs");
    }
}

/// The policy thread's rounds on `d` (no backing store, zstd second): idle pages grouped; every
/// page read back as written, each grouped one through its group.
fn group_rounds(d: &uzram_engine::Device) {
    use uzram_engine::testing::pages::text_page;
    use uzram_engine::{Policy, Pressure, PAGE_SIZE};
    const PAGE: u64 = PAGE_SIZE as u64;
    let mut ctx = d.context().unwrap();
    let mut policy = Policy::new();
    for i in 0..256 {
        d.write(&mut ctx, i * PAGE, &text_page(i)).unwrap();
    }
    d.advance_clock(610);
    policy.tick(d, &mut ctx, &Pressure::none()).unwrap();
    assert!(d.stats().groups.pages >= 240, "{:?}", d.stats().groups);
    let mut back = [0u8; PAGE_SIZE];
    for i in 0..256 {
        d.read(&mut ctx, i * PAGE, &mut back).unwrap();
        assert!(back == text_page(i), "page {i} differs");
    }
}

/// The memory thread's and the policy thread's rounds, run [`in_checked_stack`]
/// ([`UPKEEP_STACK_PREFAULT`] less 32 KiB in release, the thread's own frames above them): a
/// deeper round would overflow it (SIGSEGV), so the stack those threads fault in covers every
/// page they touch. Each step's result is checked against what it must have done.
///
/// [`UPKEEP_STACK_PREFAULT`]: uzram::daemon::pin::UPKEEP_STACK_PREFAULT
fn upkeep_fits_in_its_prefaulted_stack() {
    use std::time::Duration;
    use uzram_engine::{Device, DeviceSetup, Growth, Region, PAGE_SIZE};
    const PAGE: u64 = PAGE_SIZE as u64;
    let dir = std::env::temp_dir().join(format!("uzram-pin-upkeep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The memory thread's device: in a region, its pool in reserve mode.
    let memory_device = {
        let size = Device::region_size(4096 * PAGE).unwrap();
        let mut setup = DeviceSetup::new();
        setup.set_region(Region::create("uzram-pin-upkeep", size).unwrap());
        setup.set_pool_growth(Growth::Reserve {
            wait: Duration::from_secs(1),
        });
        setup.set_pool_reserve(4 << 21);
        setup.init(4096 * PAGE).unwrap()
    };
    // The policy thread's: a backing file (its records sealed), zstd as the secondary
    // algorithm, recompression and writeback by age, eviction above the watermark.
    let policy_device = {
        let mut setup = DeviceSetup::new();
        setup.set_recomp_algorithm("zstd").unwrap();
        setup.set_backing_dev(&dir.join("backing"));
        setup
            .set_policy("recompress_after=10m writeback_after=1h min_free=0 psi=off evict=1")
            .unwrap();
        setup.init(4096 * PAGE).unwrap()
    };
    // Without a backing store the policy's recompression makes cold groups (zstd over runs
    // of neighbours, at the groups' level).
    let group_device = {
        let mut setup = DeviceSetup::new();
        setup.set_recomp_algorithm("zstd").unwrap();
        setup
            .set_policy("recompress_after=10m min_free=0 psi=off")
            .unwrap();
        setup.init(4096 * PAGE).unwrap()
    };
    let run = move || {
        memory_rounds(&memory_device);
        policy_rounds(&policy_device);
        group_rounds(&group_device);
    };
    in_checked_stack(uzram::daemon::pin::UPKEEP_STACK_PREFAULT, run);
    let _ = std::fs::remove_dir_all(&dir);
}
