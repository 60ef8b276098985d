//! The progress log (`UZRAM_PROGRESS_SECS`): request counters, pool and RSS figures written to
//! the kernel log, without locks or allocation in its loop (but the one open of the memory
//! thread's stack file as it starts: see `stallstack`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use uzram_engine::Device;

use super::io::{FINISHED, STARTED};
use super::stallstack::StallStacks;
use super::threads::{clock_ms, memory_phase, Phase, REFILLED_ARENAS, SLOWEST_REFILL_MS};

/// Whether the device is served: added and started, or, for a successor, taken over. Until
/// then the progress line says so, and counts as a stall.
pub static SERVING: AtomicBool = AtomicBool::new(false);

/// The steps of a start, in the order the main thread of a worker takes them before the device
/// is served (a successor's I/O waits for it; see [`step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Step {
    /// Building or adopting the device.
    Device = 0,
    /// Making malloc's heap resident.
    Heap,
    /// Committing the I/O heap's margin.
    IoHeap,
    /// Starting the memory, policy and progress threads.
    Upkeep,
    /// Opening the device's control.
    Control,
    /// `START_USER_RECOVERY`: the kernel quiesces the device (the dead worker's requests).
    Recovery,
    /// Starting the control, signal and swap-watch threads.
    Threads,
    /// Starting the queues (their threads, buffers and rings) and ending the recovery.
    Queues,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Device => "building or adopting the device",
            Step::Heap => "making malloc's heap resident",
            Step::IoHeap => "committing the I/O heap",
            Step::Upkeep => "starting the upkeep threads",
            Step::Control => "opening the device's control",
            Step::Recovery => "START_USER_RECOVERY (the kernel quiescing the device)",
            Step::Threads => "starting the control and swap-watch threads",
            Step::Queues => "starting the queues",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Step::Device => "device",
            Step::Heap => "heap",
            Step::IoHeap => "I/O heap",
            Step::Upkeep => "upkeep threads",
            Step::Control => "control",
            Step::Recovery => "recovery",
            Step::Threads => "threads",
            Step::Queues => "queues",
        }
    }

    /// Every step, in order.
    const ALL: [Step; STEPS] = [
        Step::Device,
        Step::Heap,
        Step::IoHeap,
        Step::Upkeep,
        Step::Control,
        Step::Recovery,
        Step::Threads,
        Step::Queues,
    ];
}

/// When each step began (the daemon's clock, `threads::clock_ms`), 0 for a step not taken.
/// Steps are taken in order, so the last one taken is the one under way.
static STEP_AT: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];
const STEPS: usize = Step::Queues as usize + 1;

/// Records that the main thread starts step `s` of a start.
pub(super) fn step(s: Step) {
    STEP_AT[s as usize].store(clock_ms().max(1), Ordering::Relaxed);
}

/// The step under way and when it began, if one was taken.
fn current_step() -> Option<(Step, u64)> {
    Step::ALL
        .iter()
        .zip(&STEP_AT)
        .map(|(&s, at)| (s, at.load(Ordering::Relaxed)))
        .filter(|&(_, t)| t != 0)
        .last()
}

/// Where the time from [`Step::Device`] to now went, step by step ("device 12 ms, heap 3 ms,
/// ..."), for a successor's log once it serves (a takeover that took long says why).
pub(super) fn steps_taken() -> String {
    let now = clock_ms();
    let at: Vec<(Step, u64)> = Step::ALL
        .iter()
        .zip(&STEP_AT)
        .map(|(&s, at)| (s, at.load(Ordering::Relaxed)))
        .filter(|&(_, t)| t != 0)
        .collect();
    let mut out = String::new();
    for (i, &(s, t)) in at.iter().enumerate() {
        let end = at.get(i + 1).map_or(now, |&(_, next)| next);
        let sep = if out.is_empty() { "" } else { ", " };
        out.push_str(&format!("{sep}{} {} ms", s.short(), end.saturating_sub(t)));
    }
    out
}

/// With `UZRAM_PROGRESS_SECS=N`, a thread that writes the request counters to the kernel log
/// every N seconds: a diagnostic for stalls, readable even when user space is stuck on memory
/// (it takes no lock and allocates nothing in its loop once the memory thread's stack file is
/// open, and /dev/kmsg lands in the console).
/// With `UZRAM_STALL_SYSRQ=1` as well, a request that makes no progress for 20 s, or a memory
/// thread that stays 20 s in one phase (a fault it takes loops in reclaim: it is an I/O flusher,
/// for which the kernel never calls the OOM killer), makes it ask the kernel for the memory's
/// state and the stacks of blocked tasks and of all tasks (sysrq `m`, `w` and `t`), once per
/// stall.
pub(super) fn progress_log(device: Arc<Device>) {
    let Some(secs) = std::env::var("UZRAM_PROGRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
    else {
        return;
    };
    let sysrq = std::env::var_os("UZRAM_STALL_SYSRQ").is_some();
    std::thread::spawn(move || {
        use std::io::Read;
        let Ok(mut kmsg) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") else {
            return;
        };
        let mut sysrq = sysrq
            .then(|| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/proc/sysrq-trigger")
                    .ok()
            })
            .flatten();
        let mut line = [0u8; 640];
        let mut status = [0u8; 4096];
        let (mut last_finished, mut stalled_secs, mut dumped) = (0, 0, false);
        let mut stacks = StallStacks::new();
        loop {
            // Ten looks a second at the memory thread between two records: its stalls last
            // a second or two.
            for _ in 0..secs.saturating_mul(10) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                stacks.prepare();
                let (phase, ms) = memory_phase();
                stacks.sample(&mut kmsg, phase, ms);
            }
            let sum = |c: &[AtomicU64; 5]| c.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
            let (started, finished) = (sum(&STARTED), sum(&FINISHED));
            // A successor that has not taken the device over yet: its I/O waits for it.
            let waiting = !SERVING.load(Ordering::Relaxed);
            let phase = memory_phase();
            let memory_stuck = phase.0 != Phase::Waiting && phase.1 >= 20_000;
            if (started != finished && finished == last_finished) || waiting {
                stalled_secs += secs;
            } else if !memory_stuck {
                (stalled_secs, dumped) = (0, false);
            }
            last_finished = finished;
            let n = std::fs::File::open("/proc/self/status")
                .and_then(|mut f| f.read(&mut status))
                .unwrap_or(0);
            let rss = status_field(&status[..n], b"VmRSS:");
            let mut w = std::io::Cursor::new(&mut line[..]);
            progress_line(&mut w, &device, rss, phase, stalled_secs > 0, waiting);
            let len = w.position() as usize;
            let _ = kmsg.write_all(&line[..len]);
            if (stalled_secs >= 20 || memory_stuck) && !dumped {
                if let Some(t) = sysrq.as_mut() {
                    // "8": console log level 8 first, or the dumps stay out of the console.
                    for cmd in [b"8", b"m", b"w", b"t"] {
                        let _ = t.write_all(cmd);
                    }
                }
                dumped = true;
            }
        }
    });
}

/// One progress record into `w`: the requests, the pool, the daemon's memory, the memory
/// thread's `phase`, whether the device is `stalled` or `waiting` for this process.
fn progress_line(
    w: &mut std::io::Cursor<&mut [u8]>,
    device: &Device,
    rss: u64,
    phase: (Phase, u64),
    stalled: bool,
    waiting: bool,
) {
    let counts = |w: &mut dyn Write, c: &[AtomicU64; 5]| {
        for (i, c) in c.iter().enumerate() {
            let _ = write!(
                w,
                "{}{}",
                if i == 0 { " " } else { "/" },
                c.load(Ordering::Relaxed)
            );
        }
    };
    let (orig, used) = device.usage();
    let heap = super::heap::stats();
    // Region pages an I/O thread wrote first (and so faulted on): each could have waited for
    // reclaim.
    let unready = device.region_unready();
    // "<3>" (error level) so that it reaches the console; one write(2) per record.
    let _ = write!(
        w,
        "<3>uzram: requests read/write/flush/discard/other started"
    );
    counts(w, &STARTED);
    let _ = write!(w, " finished");
    counts(w, &FINISHED);
    let _ = writeln!(
        w,
        ", stored {orig} B, pool {used} B, daemon VmRSS {} kB, I/O heap {}/{} kB ({} fallbacks, {} refused, largest block {} kB), reserve {} arenas{}, refilled {} (slowest {} ms), writes put off {}, unready leaves/chunks taken {}/{}{}{}",
        rss,
        heap.in_use >> 10,
        heap.committed >> 10,
        heap.fallbacks,
        heap.refused,
        heap.largest >> 10,
        device.pool_reserve_target(),
        if super::heap::memory_short() {
            " (memory short)"
        } else {
            ""
        },
        REFILLED_ARENAS.load(Ordering::Relaxed),
        SLOWEST_REFILL_MS.load(Ordering::Relaxed),
        super::defer::DEFERRED.load(Ordering::Relaxed),
        unready.0,
        unready.1,
        MemoryThread(phase),
        match (stalled, waiting) {
            (true, true) => ", NOT SERVING YET",
            (true, false) => ", NO PROGRESS",
            (false, _) => "",
        }
    );
    let at = w.position().saturating_sub(1);
    // Before the newline written above (unless the record was cut short): one line a record.
    if let Some((step, since)) = current_step().filter(|_| waiting) {
        if w.get_ref().get(at as usize) == Some(&b'\n') {
            w.set_position(at);
            let ms = clock_ms().saturating_sub(since);
            let _ = writeln!(w, ": {} for {ms} ms", step.name());
        }
    }
}

/// The memory thread's phase in the progress line, when it has been in one (other than waiting
/// to be asked) for 100 ms or more.
struct MemoryThread((Phase, u64));

impl std::fmt::Display for MemoryThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            (Phase::Waiting, _) => Ok(()),
            (_, ms) if ms < 100 => Ok(()),
            (phase, ms) => write!(f, ", memory thread {} for {ms} ms", phase.name()),
        }
    }
}

/// The number after `name` in /proc/self/status's text (0 if absent).
pub(super) fn status_field(status: &[u8], name: &[u8]) -> u64 {
    status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(name))
        .map_or(0, |rest| {
            rest.iter()
                .filter(|b| b.is_ascii_digit())
                .fold(0, |n, &b| n * 10 + u64::from(b - b'0'))
        })
}

/// The daemon's resident memory in bytes.
pub(super) fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field(status.as_bytes(), b"VmRSS:") * 1024
}
