//! The heap refill on the main thread before any other thread exists, as the daemon does it
//! (a test harness's threads would each have their own malloc arena). `harness = false`.

fn main() {
    uzram::daemon::pin::tune_malloc();
    if uzram::daemon::pin::heap_top_bytes().is_none() {
        println!("pin: not glibc, nothing to check");
        return;
    }
    let reserve = uzram::daemon::pin::HEAP_RESERVE;
    // Use up the top chunk, then refill: the top is resident and large again.
    let mut hog: Vec<Vec<u8>> = Vec::with_capacity(1024);
    let pad = uzram::daemon::pin::TOP_PAD;
    while uzram::daemon::pin::heap_top_bytes().unwrap() >= reserve / 2 + pad && hog.len() < 1024 {
        hog.push(vec![7u8; 64 << 10]);
    }
    let before = uzram::daemon::pin::heap_top_bytes().unwrap();
    assert!(before < reserve / 2 + pad, "could not use up the top chunk");
    let rss = rss_anon_kib();
    let touched = uzram::daemon::pin::refill_heap();
    assert!(touched > 0, "a {before}-byte top chunk was not refilled");
    let top = uzram::daemon::pin::heap_top_bytes().unwrap();
    assert!(
        top >= reserve / 2 + pad,
        "{top}-byte top chunk after a refill that touched {touched} bytes"
    );
    // What was touched is resident.
    let grown = rss_anon_kib() - rss;
    assert!(
        grown * 1024 >= reserve.saturating_sub(before) as u64 * 9 / 10,
        "a refill from a {before}-byte top made only {grown} KiB resident"
    );
    assert_eq!(
        uzram::daemon::pin::refill_heap(),
        0,
        "a full top needs no refill"
    );
    drop(hog);
    uzram::daemon::pin::prefault_stack();
    io_path_fits_in_the_prefaulted_stack();
    println!("pin: top chunk {top} bytes after touching {touched}");
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

/// The request path (`io::handle`, as a queue thread calls it), run on a thread whose whole
/// stack is [`STACK_PREFAULT`] less 32 KiB (libublk's frames above the handler): a deeper path
/// would overflow it (the guard page ends the test with SIGSEGV), so the stack a queue thread
/// faults in before serving covers every page it will touch.
fn io_path_fits_in_the_prefaulted_stack() {
    use uzram::daemon::io::{handle, InPlace, Op, Request};
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
            };
            for i in 0..64u64 {
                let mut two = text_page(i).to_vec();
                two.extend_from_slice(&noise_page(i));
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
    std::thread::Builder::new()
        .stack_size(uzram::daemon::pin::STACK_PREFAULT - (32 << 10))
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}
