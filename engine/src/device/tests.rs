use std::collections::HashMap;
use std::time::Duration;

use super::testutil::noise_page;
use super::*;

fn device(pages: u64) -> (Device, IoContext) {
    let d = DeviceSetup::new().init(pages * PAGE_SIZE as u64).unwrap();
    let ctx = d.context().unwrap();
    (d, ctx)
}

fn text_page(seed: u8) -> [u8; PAGE_SIZE] {
    crate::testing::pages::text_page(seed.into())
}

/// Compares pages without printing 4 KiB arrays on failure.
fn assert_page(got: &[u8], want: &[u8]) {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("pages differ first at byte {i}: {} != {}", got[i], want[i]);
    }
    assert_eq!(got.len(), want.len());
}

#[test]
fn segments_cover_the_range_page_by_page() {
    let s: Vec<_> = segments(3584, 5120).collect();
    assert_eq!(
        s,
        vec![
            (PageIndex(0), 3584, 512),
            (PageIndex(1), 0, 4096),
            (PageIndex(2), 0, 512)
        ]
    );
    assert_eq!(segments(0, 0).count(), 0);
}

#[test]
fn same_filled_detection() {
    assert_eq!(same_filled(&[0; PAGE_SIZE]), Some(0));
    let mut p = [0u8; PAGE_SIZE];
    fill(&mut p, 0x0102_0304_0506_0708);
    assert_eq!(same_filled(&p), Some(0x0102_0304_0506_0708));
    p[2000] ^= 1;
    assert_eq!(same_filled(&p), None);
}

#[test]
fn pages_round_trip_by_kind() {
    // lz4 compresses every page; zstd stores the noise page whole without compressing it (it
    // looks incompressible), and compresses the page that is half noise.
    for algorithm in ["lz4", "zstd"] {
        let mut setup = DeviceSetup::new();
        setup.set_comp_algorithm(algorithm).unwrap();
        let d = setup.init(8 * PAGE_SIZE as u64).unwrap();
        let mut ctx = d.context().unwrap();
        let text = text_page(1);
        let noise = crate::testing::pages::noise_page(0x9e37_79b9_7f4a_7c15);
        assert!(uzram_codecs::looks_incompressible(&noise));
        let mut same = [0u8; PAGE_SIZE];
        fill(&mut same, 0xabab_abab_abab_abab);
        let mut half = noise;
        half[PAGE_SIZE / 2..].copy_from_slice(&text[..PAGE_SIZE / 2]);
        let pages = [text, noise, same, half];
        for (i, p) in pages.iter().enumerate() {
            d.write(&mut ctx, i as u64 * 4096, p).unwrap();
        }
        let mut out = [0u8; PAGE_SIZE];
        for (i, want) in pages.iter().chain([&[0; PAGE_SIZE]]).enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut out).unwrap();
            assert_page(&out, want);
        }
        let st = d.stats().mm;
        assert_eq!(
            (st.same_pages, st.huge_pages, st.huge_pages_since),
            (1, 1, 1),
            "{algorithm}"
        );
        assert_eq!(st.orig_data_size, 4 * 4096);
        let flags = |i| d.slot_state(PageIndex(i)).unwrap().flags;
        assert!(flags(1).contains(SlotFlags::HUGE));
        assert!(!flags(3).contains(SlotFlags::HUGE), "{algorithm}");
        d.check_invariants().unwrap();
    }
}

#[test]
fn partial_writes_read_modify_write() {
    let (d, mut ctx) = device(4);
    let text = text_page(3);
    d.write(&mut ctx, 0, &text).unwrap();
    d.write(&mut ctx, 512, &[7u8; 1024]).unwrap();
    let mut out = [0u8; PAGE_SIZE];
    d.read(&mut ctx, 0, &mut out).unwrap();
    let mut want = text;
    want[512..1536].fill(7);
    assert_page(&out, &want);
    let mut part = [0u8; 512];
    d.read(&mut ctx, 1024, &mut part).unwrap();
    assert_eq!(part[..], want[1024..1536]);
    d.check_invariants().unwrap();
}

#[test]
fn discard_and_write_zeroes_free_pages() {
    let (d, mut ctx) = device(4);
    for i in 0..4u8 {
        d.write(&mut ctx, u64::from(i) * 4096, &text_page(i))
            .unwrap();
    }
    d.discard(2048, 4096 + 2048).unwrap();
    assert_eq!(
        d.stats().io.notify_free,
        1,
        "only the whole page 1 is freed"
    );
    d.write_zeroes(&mut ctx, 8192 + 512, 4096 + 512).unwrap();
    let mut out = [0u8; PAGE_SIZE];
    d.read(&mut ctx, 4096, &mut out).unwrap();
    assert_eq!(out, [0; PAGE_SIZE]);
    d.read(&mut ctx, 8192, &mut out).unwrap();
    let mut want = text_page(2);
    want[512..].fill(0);
    assert_page(&out, &want);
    d.read(&mut ctx, 3 * 4096, &mut out).unwrap();
    let mut want = text_page(3);
    want[..1024].fill(0);
    assert_page(&out, &want);
    d.check_invariants().unwrap();
    assert_eq!(
        d.stats().mm.orig_data_size,
        3 * 4096,
        "pages 0, 2 and 3 hold data"
    );
}

#[test]
fn bad_ranges_are_errors_and_count() {
    let (d, mut ctx) = device(2);
    let mut buf = [1u8; 512];
    assert!(matches!(
        d.read(&mut ctx, 8192, &mut buf),
        Err(IoError::OutOfRange { .. })
    ));
    assert_eq!(buf, [0; 512], "a failed read leaves no stale bytes");
    assert!(matches!(
        d.read(&mut ctx, 100, &mut buf),
        Err(IoError::Misaligned { .. })
    ));
    assert!(matches!(
        d.write(&mut ctx, u64::MAX - 511, &buf),
        Err(IoError::OutOfRange { .. })
    ));
    assert!(matches!(
        d.discard(4096, 8192),
        Err(IoError::OutOfRange { .. })
    ));
    let io = d.stats().io;
    assert_eq!((io.failed_reads, io.failed_writes), (2, 1));
}

#[test]
fn algorithm_is_fixed_once_initialised() {
    let mut setup = DeviceSetup::new();
    setup.set_comp_algorithm("zstd").unwrap();
    setup.set_algorithm_params("level=5").unwrap();
    let err = setup.set_comp_algorithm("lzo").unwrap_err();
    assert!(err.to_string().contains("lz4"), "{err}");
    assert!(setup.set_algorithm_params("level=99").is_err());
    let d = setup.init(10_000).unwrap();
    assert_eq!(d.algorithm(), Algorithm::Zstd);
    assert_eq!(d.codec().level(), 5);
    assert_eq!(d.disksize(), 12_288, "rounded up to pages");
    assert!(DeviceSetup::new().init(0).is_err());
}

#[test]
fn memory_limit_refuses_writes_and_keeps_old_contents() {
    let (d, mut ctx) = device(1024);
    d.set_mem_limit(Some(64 * 4096));
    // Incompressible pages take one pool page each: the 65th does not fit.
    for i in 0..64 {
        d.write(&mut ctx, i * 4096, &noise_page(i)).unwrap();
    }
    let err = d.write(&mut ctx, 64 * 4096, &noise_page(64)).unwrap_err();
    assert!(
        matches!(err, IoError::MemLimit { index, limit_bytes } if limit_bytes == 64 * 4096 && index == PageIndex(64)),
        "{err}"
    );
    // Overwriting a page past the limit fails too, and the old page survives.
    assert!(matches!(
        d.write(&mut ctx, 0, &noise_page(99)),
        Err(IoError::MemLimit { .. })
    ));
    let mut out = [0u8; PAGE_SIZE];
    d.read(&mut ctx, 0, &mut out).unwrap();
    assert_page(&out, &noise_page(0));
    let st = d.stats();
    assert_eq!(st.mm.mem_used_total, 64 * 4096);
    assert_eq!(st.mm.orig_data_size, 64 * 4096);
    assert_eq!(st.io.failed_writes, 2);
    // Same-filled pages cost no pool memory and still go through.
    d.write(&mut ctx, 100 * 4096, &[0u8; PAGE_SIZE]).unwrap();
    // Freeing makes room again.
    d.discard(0, 4096).unwrap();
    d.write(&mut ctx, 64 * 4096, &noise_page(64)).unwrap();
    d.check_invariants().unwrap();
}

#[test]
fn free_pages_older_than_keeps_newer_pages_and_page_zero() {
    let d = DeviceSetup::new().init(64 * PAGE_SIZE as u64).unwrap();
    let mut ctx = d.context().unwrap();
    for i in 0..8u64 {
        d.write(&mut ctx, i * PAGE_SIZE as u64, &[i as u8 + 1; PAGE_SIZE])
            .unwrap();
    }
    // Everything was written in second 0: a cutoff of 0 frees nothing, 1 frees all but page 0.
    assert_eq!(d.free_pages_older_than(PageIndex(1), 0), 0);
    assert_eq!(d.free_pages_older_than(PageIndex(1), d.clock_secs() + 1), 7);
    let mut back = vec![0u8; PAGE_SIZE];
    d.read(&mut ctx, 0, &mut back).unwrap();
    assert_eq!(back, vec![1u8; PAGE_SIZE]);
    d.read(&mut ctx, PAGE_SIZE as u64, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    assert_eq!(d.stats().mm.orig_data_size, PAGE_SIZE as u64);
    d.check_invariants().unwrap();
}

/// A 1 GiB device holds a slot-table leaf (4 KiB, 1 MiB of the device) only where pages were
/// written: reads of unwritten pages return zeros and allocate nothing, and the scans over the
/// table (idle marking, the invariants check) see the pages in the leaves that are there.
#[test]
fn slot_table_holds_only_the_leaves_written() {
    let (d, mut ctx) = device(1 << 18);
    let directory = 1024 * 16;
    let metadata = |d: &Device| d.stats().table_bytes - d.pool().stats().metadata_bytes;
    assert_eq!(metadata(&d), directory, "a fresh table holds no leaf");
    let mut out = [1u8; PAGE_SIZE];
    d.read(&mut ctx, 700 << 20, &mut out).unwrap();
    assert_page(&out, &[0; PAGE_SIZE]);
    let mut part = [1u8; 512];
    d.read(&mut ctx, (300 << 20) + 1024, &mut part).unwrap();
    assert_eq!(part, [0; 512]);
    assert_eq!(metadata(&d), directory, "reads allocate no leaf");
    let pages = [
        (0u64, 1u8),
        (255, 2),
        (256, 3),
        (1 << 17, 4),
        ((1 << 18) - 1, 5),
    ];
    for &(page, seed) in &pages {
        d.write(&mut ctx, page * 4096, &text_page(seed)).unwrap();
    }
    // A partial write into a fresh leaf reads its page's other bytes as zeros.
    d.write(&mut ctx, (600 << 20) + 512, &[7u8; 512]).unwrap();
    assert_eq!(metadata(&d), directory + 5 * 4096);
    for &(page, seed) in &pages {
        d.read(&mut ctx, page * 4096, &mut out).unwrap();
        assert_page(&out, &text_page(seed));
    }
    d.read(&mut ctx, 600 << 20, &mut out).unwrap();
    assert!(out[..512].iter().chain(&out[1024..]).all(|&b| b == 0));
    assert!(out[512..1024].iter().all(|&b| b == 7));
    assert_eq!(d.mark_idle(None), 6);
    d.check_invariants().unwrap();
    // A discard of a range never written frees nothing and allocates nothing.
    d.discard(400 << 20, 8 << 20).unwrap();
    assert_eq!(metadata(&d), directory + 5 * 4096);
    assert_eq!(d.stats().stored_pages, 6);
}

/// A disksize whose full slot table (16 B a page) would not fit in this machine's memory is
/// refused, as zram's allocation of its table would fail, and allocates nothing.
#[test]
fn a_table_larger_than_memory_is_refused() {
    let mem_total = policy::Pressure::read().mem_total;
    if mem_total == 0 {
        return; // no /proc/meminfo: the bound is off
    }
    let pages = mem_total / 16 + 1;
    match DeviceSetup::new().init(pages * PAGE_SIZE as u64) {
        Err(Error::TableTooLarge { table_bytes, .. }) => assert_eq!(table_bytes, pages * 16),
        r => panic!("a {}-page device was not refused: {r:?}", pages),
    }
}

/// A 16 MiB device whose pool has one arena (2 MiB) mapped and no thread to map more: the
/// reserve runs dry after about 500 incompressible pages. `own`: the pool's own wait.
fn one_arena_device(own: Duration) -> Device {
    let mut setup = DeviceSetup::new();
    setup.set_pool_reserve(2 << 20);
    setup.set_pool_reserve_min(2 << 20);
    setup.set_pool_growth(Growth::Reserve { wait: own });
    let d = setup.init(4096 * PAGE_SIZE as u64).unwrap();
    d.maintain_memory_with(&mut || {}).unwrap();
    d
}

#[test]
fn a_context_with_a_shorter_reserve_wait_fails_a_write_sooner() {
    let own = Duration::from_millis(400);
    let d = one_arena_device(own);
    let mut ctx = d.context().unwrap();
    // Nobody refills: incompressible pages fill the reserve's arena, then a write waits.
    let short = Duration::from_millis(50);
    ctx.set_reserve_wait(ReserveWait::Within(short));
    let mut written = 0;
    let (err, waited) = loop {
        let t = Instant::now();
        match d.write(&mut ctx, written * 4096, &noise_page(written)) {
            Ok(()) => written += 1,
            Err(e) => break (e, t.elapsed()),
        }
        assert!(written < 4096, "the reserve never ran out");
    };
    assert!(
        matches!(
            err,
            IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted { .. })
        ),
        "{err:?}"
    );
    assert!(waited >= short && waited < own, "waited {waited:?}");
    // Every page written before is intact, and the failed one reads as it was (zeros).
    for i in 0..written {
        let mut got = [0u8; PAGE_SIZE];
        d.read(&mut ctx, i * 4096, &mut got).unwrap();
        assert_page(&got, &noise_page(i));
    }
    let mut got = [1u8; PAGE_SIZE];
    d.read(&mut ctx, written * 4096, &mut got).unwrap();
    assert_page(&got, &[0u8; PAGE_SIZE]);
    // A context made for another device keeps its wait when it is refitted.
    let other = DeviceSetup::new().init(PAGE_SIZE as u64).unwrap();
    let mut foreign = other.context().unwrap();
    foreign.set_reserve_wait(ReserveWait::Within(short));
    d.fit_context(&mut foreign).unwrap();
    assert_eq!(foreign.reserve_wait, ReserveWait::Within(short));
}

#[test]
fn a_write_that_stops_short_for_the_reserve_tells_how_far_it_got_and_counts_no_failure() {
    let own = Duration::from_millis(400);
    let slice = Duration::from_millis(30);
    let d = one_arena_device(own);
    let mut ctx = d.context().unwrap();
    ctx.set_reserve_wait(ReserveWait::Slice(slice));
    // Writes of 32 incompressible pages until one stops short: nobody refills meanwhile.
    let mut model: HashMap<u64, [u8; PAGE_SIZE]> = HashMap::new();
    let run = |first: u64| -> Vec<u8> { (first..first + 32).flat_map(noise_page).collect() };
    let mut first = 0u64;
    let (short, waited) = loop {
        let data = run(first);
        let t = Instant::now();
        match d.write_prefix(&mut ctx, first * 4096, &data) {
            Ok(()) => {
                for i in first..first + 32 {
                    model.insert(i, noise_page(i));
                }
                first += 32;
            }
            Err(short) => break (short, t.elapsed()),
        }
        assert!(first < 4096, "the reserve never ran out");
    };
    assert!(
        matches!(
            short.error,
            IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted { .. })
        ),
        "{:?}",
        short.error
    );
    assert!(waited >= slice && waited < own, "waited {waited:?}");
    assert_eq!(short.written % PAGE_SIZE, 0);
    assert!(short.written < 32 * PAGE_SIZE);
    let stored = (short.written / PAGE_SIZE) as u64;
    for i in first..first + stored {
        model.insert(i, noise_page(i));
    }
    assert_eq!(
        d.stats().io.failed_writes,
        0,
        "a short write is not a failed one"
    );
    // A second write waits its slice again (no failing at once for the first one's wait).
    let t = Instant::now();
    let again = d.write_prefix(
        &mut ctx,
        (first + stored) * 4096,
        &noise_page(first + stored),
    );
    assert!(
        again.is_err() && t.elapsed() >= slice,
        "{again:?} after {:?}",
        t.elapsed()
    );
    // Once an arena comes, the rest of the write goes in where it stopped.
    d.maintain_memory_with(&mut || {}).unwrap();
    let rest = &run(first)[short.written..];
    d.write_prefix(&mut ctx, (first + stored) * 4096, rest)
        .unwrap();
    for i in first..first + 32 {
        model.insert(i, noise_page(i));
    }
    for i in 0..4096u64 {
        let mut got = [1u8; PAGE_SIZE];
        d.read(&mut ctx, i * 4096, &mut got).unwrap();
        assert_page(&got, model.get(&i).unwrap_or(&[0u8; PAGE_SIZE]));
    }
    d.count_failed_write(&ctx);
    assert_eq!(d.stats().io.failed_writes, 1);
}

#[test]
fn io_threads_hold_no_recompression_workspace_without_a_backing_store() {
    let mut setup = DeviceSetup::new();
    setup.set_recomp_algorithm("zstd").unwrap();
    let d = setup.init(64 * PAGE_SIZE as u64).unwrap();
    let mut ctx = d.context().unwrap();
    let full = d.codecs[1]
        .as_ref()
        .unwrap()
        .stream()
        .unwrap()
        .context_bytes();
    let bytes = |ctx: &IoContext| ctx.streams[1].as_ref().unwrap().context_bytes();
    assert!(bytes(&ctx) + (32 << 10) < full, "{} of {full}", bytes(&ctx));
    // Reads of recompressed pages, on such a context, are exact. (Every other page: no run of
    // neighbours to group.)
    let pages: Vec<_> = (0..16).map(text_page).collect();
    for (i, p) in pages.iter().enumerate() {
        d.write(&mut ctx, 2 * i as u64 * 4096, p).unwrap();
    }
    // A pass makes its context's workspace before it takes a slot lock: one that finds
    // nothing to recompress (no page idle yet) has made it too.
    let mut policy_ctx = d.context().unwrap();
    let r = d
        .recompress(&mut policy_ctx, &"type=idle".parse().unwrap())
        .unwrap();
    assert_eq!(r.recompressed, 0, "{r:?}");
    assert_eq!(bytes(&policy_ctx), full);
    d.mark_idle(None);
    let r = d
        .recompress(&mut policy_ctx, &"type=idle".parse().unwrap())
        .unwrap();
    assert!(r.recompressed > 0, "{r:?}");
    assert!(bytes(&ctx) + (32 << 10) < full);
    let mut out = [0u8; PAGE_SIZE];
    for (i, p) in pages.iter().enumerate() {
        d.read(&mut ctx, 2 * i as u64 * 4096, &mut out).unwrap();
        assert_page(&out, p);
    }
    // With a backing store an I/O thread may compress with it (an eviction writes a grouped
    // page back alone), so its context has the workspace from the start.
    let dir = super::testutil::tempdir("ctx-backing");
    let mut setup = DeviceSetup::new();
    setup.set_recomp_algorithm("zstd").unwrap();
    setup.set_backing_dev(&dir.join("backing"));
    let d = setup.init(64 * PAGE_SIZE as u64).unwrap();
    assert_eq!(bytes(&d.context().unwrap()), full);
    let _ = std::fs::remove_dir_all(dir);
}
