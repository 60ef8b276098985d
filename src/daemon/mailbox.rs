//! Failed requests: counted on the I/O path, logged by a thread that serves no I/O.
//!
//! An I/O thread never logs: writing the log may need memory (the log file's page cache, a
//! socket buffer), and under pressure that memory waits for swap writes, which may be this
//! device's own, queued behind the writing thread. So the I/O path only counts and, when the
//! mailbox is free, leaves the details (no allocation, never a wait). The mailbox is a leaf lock:
//! an I/O thread only `try_lock`s it; the swap watcher locks it alone to copy the latest out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use uzram_engine::IoError;

use super::errno;
use super::threads::{memory_phase, Phase};

/// The latest failed request, kept for [`report_failures`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Failure {
    /// The op in a sentence ("a read": `io::Op::name`).
    op: &'static str,
    /// Swap's request (see `io::Request::swap`).
    swap: bool,
    offset: u64,
    len: u64,
    errno: i32,
    cause: &'static str,
    /// How long it waited for the pool's reserve first, ms (0 when it did not).
    waited_ms: u64,
    /// When the reserve ran out: what the memory thread was doing as the failure was noted,
    /// and for how long (ms).
    memory: Option<(Phase, u64)>,
}

static FAILED_REQUESTS: AtomicU64 = AtomicU64::new(0);
static LATEST_FAILURE: Mutex<Option<Failure>> = Mutex::new(None);
/// The first write since the last report whose wait for the reserve ran out: what the memory
/// thread was doing then is the cause; the writes after it that fail at once only show where it
/// has got to since.
static RAN_OUT: Mutex<Option<Failure>> = Mutex::new(None);

/// Counts a failed request and, if nobody holds the mailbox, leaves its details there.
pub(super) fn note_failure(op: &'static str, swap: bool, offset: u64, len: u64, e: &IoError) {
    let (waited_ms, memory) = match e {
        IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted { waited_ms }) => {
            (*waited_ms, Some(memory_phase()))
        }
        _ => (0, None),
    };
    record(Failure {
        op,
        swap,
        offset,
        len,
        errno: errno::errno(e),
        cause: errno::cause(e),
        waited_ms,
        memory,
    });
}

/// Counts a failed request that failed with `errno` for `cause`; see [`note_failure`].
pub(super) fn note(op: &'static str, offset: u64, len: u64, errno: i32, cause: &'static str) {
    record(Failure {
        op,
        swap: false,
        offset,
        len,
        errno,
        cause,
        waited_ms: 0,
        memory: None,
    });
}

fn record(failure: Failure) {
    FAILED_REQUESTS.fetch_add(1, Ordering::Relaxed);
    if failure.waited_ms > 0 {
        if let Some(mut ran_out) = RAN_OUT.try_lock() {
            ran_out.get_or_insert(failure);
        }
    }
    if let Some(mut latest) = LATEST_FAILURE.try_lock() {
        *latest = Some(failure);
    }
}

/// Requests failed since the daemon started.
pub(super) fn failed_requests() -> u64 {
    FAILED_REQUESTS.load(Ordering::Relaxed)
}

/// The latest failure left in the mailbox.
pub(super) fn latest() -> Option<Failure> {
    *LATEST_FAILURE.lock()
}

/// Logs the requests that failed since the last report, with the latest one's cause: at most
/// one line per `min_gap`, so a device at its limit does not flood the log. `reported` is the
/// count at the last report. For a thread that serves no I/O.
pub(super) fn report_failures(reported: &mut u64, last: &mut Option<Instant>, min_gap: Duration) {
    let n = failed_requests();
    if n == *reported || last.is_some_and(|t| t.elapsed() < min_gap) {
        return;
    }
    let Some(f) = latest() else {
        return;
    };
    super::log(&format!(
        "{} requests failed{}; the latest: {}{} of {} bytes at byte {}: {} ({}{})",
        n - *reported,
        if *reported == 0 {
            ""
        } else {
            " since the last report"
        },
        f.op,
        swap_word(f.swap),
        f.len,
        f.offset,
        errno::errno_name(f.errno),
        f.cause,
        match (f.waited_ms, f.memory) {
            (_, None) => String::new(),
            (w, Some((phase, ms))) => format!(
                ", {}; the memory thread had been {} for {ms} ms",
                if w == 0 {
                    "at once: an earlier write's wait had run out, and no arena came since"
                        .to_string()
                } else {
                    format!("after the memory thread had made no progress for {w} ms")
                },
                phase.name()
            ),
        }
    ));
    if let Some(f) = RAN_OUT.lock().take() {
        if let Some((phase, ms)) = f.memory {
            super::log(&format!(
                "the first of them to wait for the reserve ({}{} of {} bytes at byte {}) failed \
                 once the memory thread had made no progress for {} ms; it had been {} for {ms} ms",
                f.op,
                swap_word(f.swap),
                f.len,
                f.offset,
                f.waited_ms,
                phase.name()
            ));
        }
    }
    *reported = n;
    *last = Some(Instant::now());
}

/// " (swap's)" after a request's name, for swap's requests.
fn swap_word(swap: bool) -> &'static str {
    if swap {
        " (swap's)"
    } else {
        ""
    }
}
