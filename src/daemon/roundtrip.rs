//! What the queue threads pay per request beyond the engine's work: the requests they complete,
//! the `io_uring_enter` calls they make (each wait for requests, with the commits queued since
//! the last, is one), the copies through the ublk char device (`UBLK_F_USER_COPY`: one `pread`
//! or `pwrite` each; a write put off copies again each time it is tried, so a storm can count
//! more copies than requests), and their context switches (the kernel's counts for each queue
//! thread).
//! Counted with relaxed atomics, one set per queue, made once when the device starts (no
//! allocation on the I/O path); `uzram_stat` reads the sums (`queue_*`).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

use uzram_engine::attrs::RoundTrips;

/// One queue thread's counts.
#[derive(Default)]
pub struct QueueCounts {
    requests: AtomicU64,
    enters: AtomicU64,
    copies: AtomicU64,
    /// The thread's id, for its context switches (0 until it runs).
    tid: AtomicI32,
}

impl QueueCounts {
    /// A request completed.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
    /// An `io_uring_enter` made.
    pub fn enter(&self) {
        self.enters.fetch_add(1, Ordering::Relaxed);
    }
    /// A copy through the char device made.
    pub fn copy(&self) {
        self.copies.fetch_add(1, Ordering::Relaxed);
    }
}

/// The device's queues' counts (set once, by [`start`]).
static QUEUES: OnceLock<Box<[QueueCounts]>> = OnceLock::new();
/// Counts for a queue id past the device's queues (never expected): counted, not reported.
static SPARE: QueueCounts = QueueCounts {
    requests: AtomicU64::new(0),
    enters: AtomicU64::new(0),
    copies: AtomicU64::new(0),
    tid: AtomicI32::new(0),
};

/// Makes the counts of a device of `queues` queues (once; later calls change nothing).
pub fn start(queues: usize) {
    let _ = QUEUES.set((0..queues).map(|_| QueueCounts::default()).collect());
}

/// Queue `qid`'s counts, its thread (the caller) noted for its context switches.
pub fn for_queue_thread(qid: u16) -> &'static QueueCounts {
    let counts = QUEUES
        .get()
        .and_then(|q| q.get(usize::from(qid)))
        .unwrap_or(&SPARE);
    counts.tid.store(crate::sys::gettid(), Ordering::Relaxed);
    counts
}

/// The sums over the device's queues, with each queue thread's context switches as the kernel
/// counts them (`/proc/self/task/TID/status`; a thread that ended counts 0).
pub fn totals() -> RoundTrips {
    let mut t = RoundTrips::default();
    for q in QUEUES.get().map_or(&[][..], |q| &q[..]) {
        t.requests += q.requests.load(Ordering::Relaxed);
        t.ring_enters += q.enters.load(Ordering::Relaxed);
        t.copies += q.copies.load(Ordering::Relaxed);
        let tid = q.tid.load(Ordering::Relaxed);
        if tid > 0 {
            let path = format!("/proc/self/task/{tid}/status");
            if let Ok(status) = crate::common::read_text(std::path::Path::new(&path), 1 << 16) {
                let (v, n) = switches(&status);
                t.switches_voluntary += v;
                t.switches_involuntary += n;
            }
        }
    }
    t
}

/// A status file's voluntary and involuntary context switches (0 where a line is missing).
fn switches(status: &str) -> (u64, u64) {
    let field = |name: &[u8]| super::watchdog::status_field(status.as_bytes(), name);
    (
        field(b"voluntary_ctxt_switches:"),
        field(b"nonvoluntary_ctxt_switches:"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_are_read_from_a_status_file() {
        let status =
            "Name:\tuzram\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(switches(status), (1234, 56));
        assert_eq!(switches("Name:\tx\n"), (0, 0));
    }

    #[test]
    fn this_threads_switches_are_found_and_counts_add_up() {
        start(1);
        let q = for_queue_thread(0);
        let before = totals();
        q.request();
        q.enter();
        q.enter();
        q.copy();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = totals();
        assert_eq!(after.requests - before.requests, 1);
        assert_eq!(after.ring_enters - before.ring_enters, 2);
        assert_eq!(after.copies - before.copies, 1);
        // The test thread slept, so the kernel counted a voluntary switch of it.
        assert_eq!(crate::sys::gettid(), q.tid.load(Ordering::Relaxed));
        assert!(after.switches_voluntary > before.switches_voluntary);
    }
}
