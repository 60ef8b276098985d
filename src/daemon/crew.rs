//! Queue threads started ahead of need. A successor takes the device over while its I/O waits,
//! and in a swap storm every page a takeover faults in comes from reclaim that cannot write swap
//! (the device is held): a queue thread started then waits there for its stack, its data buffer
//! and the page tables under them, for seconds. So each worker, and
//! each standby before it says it is ready, starts its queue threads first: an I/O flusher each,
//! its stack faulted in, its buffer written and its io_uring made, waiting for the queue to
//! serve. Nothing here knows libublk: a member runs the frontend's `Prepare` as it starts and
//! whatever job it is handed, with its buffer.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::thread::JoinHandle;

use super::{log, pin, MAX_IO_BYTES};

/// What a member runs: a queue's whole service, given the member's data buffer.
pub(super) type Job = Box<dyn FnOnce(&mut [u8]) + Send>;

/// A thread started ahead: its id (for the queue's CPU affinity), the depth its ring was made
/// for, where its job goes, and its handle (joined when the queue is down).
pub(super) struct Member {
    tid: libc::pid_t,
    depth: u16,
    job: SyncSender<Job>,
    handle: JoinHandle<()>,
}

/// The members started and not yet given a job.
static IDLE: Mutex<Vec<Member>> = Mutex::new(Vec::new());

/// Makes the calling thread's ring for a queue of that many tags (the ublk frontend's, which
/// the queue then finds made), or does nothing.
pub(super) type Prepare = fn(u16);

/// Starts `n` members for queues of `depth` tags, each running `prepare` as it starts. One not
/// used later (another depth) keeps its stack and buffer, locked, until the process ends.
pub(super) fn start(n: usize, depth: u16, prepare: Prepare) {
    for _ in 0..n {
        match member(depth, prepare) {
            Ok(m) => IDLE.lock().unwrap_or_else(|e| e.into_inner()).push(m),
            Err(e) => {
                log(&format!(
                    "warning: cannot start a queue thread ahead ({e}): it starts when the device does"
                ));
                return;
            }
        }
    }
}

/// `n` members for queues of `depth` tags: those started ahead for that depth, and as many
/// started now as are missing (a kernel device with more queues, or another depth, than this
/// worker was started for). All or none: a queue started without the others would leave the
/// device's char device held by a thread that waits for fetches no one completes.
pub(super) fn take(n: usize, depth: u16) -> std::io::Result<Vec<Member>> {
    let mut taken = Vec::with_capacity(n);
    {
        let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        while taken.len() < n {
            let Some(at) = idle.iter().position(|m| m.depth == depth) else {
                break;
            };
            taken.push(idle.swap_remove(at));
        }
    }
    while taken.len() < n {
        taken.push(member(depth, |_| {})?);
    }
    Ok(taken)
}

impl Member {
    /// Hands `job` to this member: its thread id (for the queue's CPU affinity) and handle.
    pub(super) fn run(self, job: Job) -> std::io::Result<(libc::pid_t, JoinHandle<()>)> {
        self.job
            .send(job)
            .map_err(|_| std::io::Error::other("a queue thread started ahead has ended"))?;
        Ok((self.tid, self.handle))
    }
}

/// Starts one member and waits until it is ready (its stack and buffer faulted in, `prepare`
/// run).
fn member(depth: u16, prepare: Prepare) -> std::io::Result<Member> {
    let (job_tx, job_rx) = sync_channel::<Job>(1);
    let (tid_tx, tid_rx) = sync_channel::<libc::pid_t>(1);
    let handle = std::thread::Builder::new()
        .name("uzram-queue".into())
        .spawn(move || serve(&tid_tx, &job_rx, || prepare(depth)))?;
    let tid = tid_rx
        .recv()
        .map_err(|_| std::io::Error::other("a queue thread ended as it started"))?;
    Ok(Member {
        tid,
        depth,
        job: job_tx,
        handle,
    })
}

/// A member's life: made ready, then its job, if one comes.
fn serve(tid: &SyncSender<libc::pid_t>, job: &Receiver<Job>, prepare: impl FnOnce()) {
    if let Err(e) = super::io_flusher() {
        log(&format!("queue thread: {e}"));
    }
    // Not yet served from the I/O heap (the job's `queue_start` does that): the buffer and the
    // ring come from malloc, made before the heap is.
    pin::prefault_stack::<{ pin::STACK_PREFAULT }>();
    // Written, not only allocated: its pages are faulted in (and locked) now.
    let mut buf = vec![0xA5u8; MAX_IO_BYTES as usize];
    prepare();
    if tid.send(crate::sys::gettid()).is_err() {
        return;
    }
    if let Ok(job) = job.recv() {
        job(&mut buf);
    }
}
