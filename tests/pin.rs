//! The heap refill on the main thread before any other thread exists, as the daemon does it
//! (a test harness's threads would each have their own malloc arena). `harness = false`.

fn main() {
    uzram::daemon::pin::tune_malloc();
    if uzram::daemon::pin::heap_top_bytes().is_none() {
        println!("pin: not glibc, nothing to check");
        return;
    }
    // Use up the top chunk, then refill: the top is resident and large again.
    let mut hog: Vec<Vec<u8>> = Vec::with_capacity(1024);
    while uzram::daemon::pin::heap_top_bytes().unwrap() >= uzram::daemon::pin::HEAP_RESERVE / 2
        && hog.len() < 1024
    {
        hog.push(vec![7u8; 64 << 10]);
    }
    let before = uzram::daemon::pin::heap_top_bytes().unwrap();
    assert!(
        before < uzram::daemon::pin::HEAP_RESERVE / 2,
        "could not use up the top chunk"
    );
    let touched = uzram::daemon::pin::refill_heap();
    assert!(touched > 0, "a {before}-byte top chunk was not refilled");
    let top = uzram::daemon::pin::heap_top_bytes().unwrap();
    assert!(
        top >= uzram::daemon::pin::HEAP_RESERVE / 2,
        "{top}-byte top chunk after a refill that touched {touched} bytes"
    );
    assert_eq!(
        uzram::daemon::pin::refill_heap(),
        0,
        "a full top needs no refill"
    );
    drop(hog);
    uzram::daemon::pin::prefault_stack();
    println!("pin: top chunk {top} bytes after touching {touched}");
}
