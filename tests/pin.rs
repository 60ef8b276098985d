//! The heap refill on the main thread before any other thread exists, as the daemon does it
//! (a test harness's threads would each have their own malloc arena). `harness = false`.

fn main() {
    uzram::daemon::pin::tune_malloc();
    if uzram::daemon::pin::heap_top_bytes().is_none() {
        println!("pin: not glibc, nothing to check");
        return;
    }
    let reserve = uzram::daemon::pin::heap_reserve(1);
    assert_eq!(reserve, uzram::daemon::pin::HEAP_RESERVE_MIN);
    assert_eq!(
        uzram::daemon::pin::heap_reserve(usize::MAX),
        uzram::daemon::pin::HEAP_RESERVE_MAX
    );
    // Use up the top chunk, then refill: the top is resident and large again.
    let mut hog: Vec<Vec<u8>> = Vec::with_capacity(1024);
    while uzram::daemon::pin::heap_top_bytes().unwrap() >= reserve / 2 && hog.len() < 1024 {
        hog.push(vec![7u8; 64 << 10]);
    }
    let before = uzram::daemon::pin::heap_top_bytes().unwrap();
    assert!(before < reserve / 2, "could not use up the top chunk");
    let rss = rss_anon_kib();
    let top = uzram::daemon::pin::refill_heap(reserve);
    // All of the top is resident (the refill says how much is).
    assert_eq!(top, uzram::daemon::pin::heap_top_bytes().unwrap());
    assert!(
        top >= reserve,
        "a {before}-byte top chunk grew only to {top} bytes"
    );
    // The new top is resident: faulted in without being written.
    let grown = rss_anon_kib() - rss;
    assert!(
        grown * 1024 >= (top - before) as u64 * 9 / 10,
        "the top grew by {} bytes but only {grown} KiB became resident",
        top - before
    );
    assert_eq!(
        uzram::daemon::pin::refill_heap(reserve),
        top,
        "a full top does not grow"
    );
    drop(hog);
    uzram::daemon::pin::prefault_stack();
    io_path_fits_in_the_prefaulted_stack();
    println!("pin: top chunk {top} bytes after a refill");
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

/// The I/O path, run on a thread whose whole stack is [`STACK_PREFAULT`]: a deeper path would
/// overflow it (the guard page ends the test with SIGSEGV), so the stack an I/O thread faults in
/// before serving covers every page it will touch.
fn io_path_fits_in_the_prefaulted_stack() {
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
            let mut back = vec![0u8; 8192];
            for i in 0..64u64 {
                let mut two = text_page(i).to_vec();
                two.extend_from_slice(&noise_page(i));
                device.write(&mut ctx, i % 16 * 8192, &two).unwrap();
                device.read(&mut ctx, i % 16 * 8192, &mut back).unwrap();
                assert_eq!(back, two);
                // A partial write: read-modify-write under the slot lock.
                device
                    .write(&mut ctx, i % 16 * 8192 + 512, &two[..1024])
                    .unwrap();
            }
        }
    };
    std::thread::Builder::new()
        .stack_size(uzram::daemon::pin::STACK_PREFAULT)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}
