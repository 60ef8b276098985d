//! The ublk frontend: serves a [`Device`] as `/dev/ublkbN` through the kernel's ublk driver. The
//! only module that talks to libublk (behind the `ublk` cargo feature).
//!
//! Each queue thread drives the engine directly with its own [`crate::IoContext`]; no hand-off to
//! other threads on the I/O path. Before any I/O is served the process pins its memory
//! (`mlockall`), marks every I/O thread `PR_SET_IO_FLUSHER` and sets `oom_score_adj` to -1000: a
//! server that backs swap must never wait for the memory it is asked to free (see ARCHITECTURE.md).

use std::io::Write;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDesc, BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, UblkFlags, UblkIORes};

use crate::{Device, DeviceSetup, Error, IoContext};

/// `prctl(PR_SET_IO_FLUSHER)`; libc has no constant for it.
const PR_SET_IO_FLUSHER: libc::c_int = 57;
/// `prctl(PR_GET_IO_FLUSHER)`.
const PR_GET_IO_FLUSHER: libc::c_int = 58;

/// Largest I/O the device takes: 128 KiB. Each tag of each queue has a buffer this large, locked
/// in RAM: 2 queues x depth 64 x 128 KiB = 16 MiB. Swap writes pages one folio at a time and the
/// block layer merges neighbours up to this size; larger requests would only cost locked memory.
pub const MAX_IO_BYTES: u32 = 128 << 10;
/// Longest a write waits for the memory thread to refill the pool's reserve without seeing it
/// make progress, before it fails with ENOMEM (swap then keeps the page and retries it later);
/// a refill that keeps faulting pages in is waited for up to 8 times this (see
/// `Growth::Reserve`). Long enough for a slow refill (100 ms failed ext4 writes in the VM);
/// short enough that a memory thread stuck in reclaim cannot stall swap-out for long.
const RESERVE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Default queue depth.
pub const DEFAULT_DEPTH: u16 = 64;

/// Arguments of `uzram serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Device size, as zram's disksize takes it (4G, 512M, bytes)
    #[arg(long)]
    pub size: String,
    /// The algorithm and its parameters
    #[command(flatten)]
    pub codec: crate::cli::CodecArgs,
    /// zram's mem_limit (0 = none)
    #[arg(long, value_name = "SIZE")]
    pub mem_limit: Option<String>,
    /// Queues (one thread each); default one per CPU
    #[arg(long)]
    pub queues: Option<u16>,
    /// Queue depth
    #[arg(long, default_value_t = DEFAULT_DEPTH)]
    pub depth: u16,
    /// Pool memory to map (and lock) up front and keep mapped, so that swap-out does not have to
    /// ask the kernel for memory while it is short of it (default: 1/64 of the size, 8M..16M)
    #[arg(long, value_name = "SIZE")]
    pub reserve: Option<String>,
    /// Device id N for /dev/ublkbN (default: the first free one)
    #[arg(long)]
    pub id: Option<i32>,
    /// Append the daemon's messages to this file (default: stderr; with --detached, syslog)
    #[arg(long, value_name = "FILE")]
    pub log: Option<std::path::PathBuf>,
    /// Run as the background daemon of `uzram --find`: report the device path (or the error)
    /// on stdout, then close it
    #[arg(long, hide = true)]
    pub detached: bool,
}

/// Where the daemon's messages go: stderr (a terminal, or the --log file it was pointed at),
/// and syslog when detached without a --log file.
static SYSLOG: std::sync::OnceLock<std::os::unix::net::UnixDatagram> = std::sync::OnceLock::new();

/// Logs one message of the daemon.
pub fn log(msg: &str) {
    eprintln!("uzram: {msg}");
    if let Some(sock) = SYSLOG.get() {
        // RFC 3164 as syslogd and journald take it on /dev/log: <facility*8+severity>tag[pid]: msg
        // (daemon facility 3, severity error 3).
        let line = format!("<27>uzram[{}]: {msg}", std::process::id());
        let _ = sock.send(line.as_bytes());
    }
}

fn open_syslog() {
    if let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() {
        if sock.connect("/dev/log").is_ok() {
            let _ = SYSLOG.set(sock);
        }
    }
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No ublk driver in this kernel.
    #[error("kernel has no ublk driver (/dev/ublk-control is missing): load ublk_drv, or run on Linux >= 6.0 built with CONFIG_BLK_DEV_UBLK")]
    NoDriver,
    /// The engine refused the configuration.
    #[error(transparent)]
    Device(#[from] Error),
    /// A system call that makes the server safe for swap failed.
    #[error("cannot {what}")]
    Setup {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// libublk failed.
    #[error("ublk: {0}")]
    Ublk(String),
}

/// The one place engine errors become errnos for the kernel.
pub fn errno(e: &Error) -> i32 {
    match e {
        Error::OutOfRange { .. } | Error::Misaligned { .. } => libc::EINVAL,
        Error::MemLimit { .. } => libc::ENOSPC,
        Error::OutOfMemory(_) | Error::TableTooLarge { .. } => libc::ENOMEM,
        Error::Corrupt { .. } | Error::Compress { .. } | Error::Lost { .. } => libc::EIO,
        _ => libc::EIO,
    }
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EIO => "EIO",
        libc::ENOMEM => "ENOMEM",
        libc::ENOSPC => "ENOSPC",
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "an error",
    }
}

/// Why a request failed, in words that need no allocation (the I/O path records it; see
/// [`note_failure`]).
pub fn cause(e: &Error) -> &'static str {
    use crate::device::writeback::BackingError;
    use uzram_allocator::Error as PoolError;
    match e {
        Error::OutOfRange { .. } => "beyond the device's size",
        Error::Misaligned { .. } => "not aligned to 512-byte sectors",
        Error::MemLimit { .. } => "mem_limit reached",
        Error::OutOfMemory(PoolError::ReserveExhausted { .. }) => {
            "the pool's reserve ran out and was not refilled in time (memory short)"
        }
        Error::OutOfMemory(PoolError::OutOfMemory { .. }) => "no memory for the pool",
        Error::OutOfMemory(_) => "out of memory",
        Error::Corrupt { .. } => "a stored page failed to decompress",
        Error::Compress { .. } => "a page failed to compress",
        Error::Lost { .. } => "a page's object is missing from the pool",
        Error::NoCodec { .. } => "a page's codec is gone",
        Error::Backing { source, .. } => match source {
            BackingError::Tampered { .. } => {
                "a written-back record failed authentication (the backing file changed)"
            }
            BackingError::Full => "the backing device is full",
            BackingError::Io(_) => "the backing device failed the I/O",
            _ => "the backing device",
        },
        _ => "an internal error",
    }
}

fn io_flusher() -> Result<(), ServeError> {
    // SAFETY: prctl with integer arguments only; the result is checked.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    // SAFETY: as above.
    if r != 0 || unsafe { libc::prctl(PR_GET_IO_FLUSHER, 0, 0, 0, 0) } != 1 {
        return Err(ServeError::Setup {
            what: "mark the I/O thread PR_SET_IO_FLUSHER",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Locks every page the process has now, and every page it touches later (`MCL_ONFAULT`: new
/// mappings are locked as they are faulted in, not populated by `mmap` itself, which would hold
/// the process's `mmap_lock` while the kernel allocates; see ARCHITECTURE.md, "Safe to hold swap").
fn pin_memory() -> Result<(), ServeError> {
    for flags in [libc::MCL_CURRENT, libc::MCL_FUTURE | libc::MCL_ONFAULT] {
        // SAFETY: mlockall takes flags only; the result is checked.
        if unsafe { libc::mlockall(flags) } != 0 {
            return Err(ServeError::Setup {
                what: "lock the daemon's memory (mlockall); raise RLIMIT_MEMLOCK or run as root",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    std::fs::write("/proc/self/oom_score_adj", "-1000").map_err(|source| ServeError::Setup {
        what: "set oom_score_adj to -1000",
        source,
    })
}

/// The device's block parameters, set explicitly: 4 KiB blocks, no volatile cache,
/// non-rotational, discard and write-zeroes in one segment at 4 KiB granularity.
fn set_params(dev: &mut UblkDev, disksize: u64) {
    let max_sectors = dev.dev_info.max_io_buf_bytes >> 9;
    dev.tgt.dev_size = disksize;
    dev.tgt.params = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs: 0,
            logical_bs_shift: 12,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors,
            dev_sectors: disksize >> 9,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 4096,
            max_discard_sectors: u32::MAX >> 9,
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            reserved0: 0,
        },
        ..Default::default()
    };
}

/// Requests started and finished, by op (read, write, flush, discard, other): what the progress
/// log (`UZRAM_PROGRESS_SECS`) prints.
static STARTED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static FINISHED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
/// Arenas the memory thread has mapped into the pool's reserve, and the longest one took (ms):
/// how close a write burst came to outrunning it, in the progress log.
static REFILLED_ARENAS: AtomicU64 = AtomicU64::new(0);
static SLOWEST_REFILL_MS: AtomicU64 = AtomicU64::new(0);

fn op_slot(op: u32) -> usize {
    match op {
        sys::UBLK_IO_OP_READ => 0,
        sys::UBLK_IO_OP_WRITE => 1,
        sys::UBLK_IO_OP_FLUSH => 2,
        sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES => 3,
        _ => 4,
    }
}

/// With `UZRAM_PROGRESS_SECS=N`, a thread that writes the request counters to the kernel log
/// every N seconds: a diagnostic for stalls, readable even when user space is stuck on memory
/// (it takes no lock and allocates nothing in its loop, and /dev/kmsg lands in the console).
/// With `UZRAM_STALL_SYSRQ=1` as well, a request that makes no progress for 20 s makes it ask
/// the kernel for the stacks of blocked tasks and of all tasks (sysrq `w` and `t`), once per stall.
fn progress_log(device: Arc<Device>) {
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
        let mut line = [0u8; 512];
        let mut status = [0u8; 4096];
        let (mut last_finished, mut stalled_secs, mut dumped) = (0, 0, false);
        loop {
            std::thread::sleep(std::time::Duration::from_secs(secs));
            let sum = |c: &[AtomicU64; 5]| c.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
            let (started, finished) = (sum(&STARTED), sum(&FINISHED));
            if started != finished && finished == last_finished {
                stalled_secs += secs;
            } else {
                (stalled_secs, dumped) = (0, false);
            }
            last_finished = finished;
            let (orig, used) = device.usage();
            let n = std::fs::File::open("/proc/self/status")
                .and_then(|mut f| f.read(&mut status))
                .unwrap_or(0);
            let rss = status_field(&status[..n], b"VmRSS:");
            let mut w = std::io::Cursor::new(&mut line[..]);
            // "<3>" (error level) so that it reaches the console; one write(2) per record.
            let _ = write!(
                w,
                "<3>uzram: requests read/write/flush/discard/other started"
            );
            for (i, c) in STARTED.iter().enumerate() {
                let _ = write!(
                    w,
                    "{}{}",
                    if i == 0 { " " } else { "/" },
                    c.load(Ordering::Relaxed)
                );
            }
            let _ = write!(w, " finished");
            for (i, c) in FINISHED.iter().enumerate() {
                let _ = write!(
                    w,
                    "{}{}",
                    if i == 0 { " " } else { "/" },
                    c.load(Ordering::Relaxed)
                );
            }
            let _ = writeln!(
                w,
                ", stored {orig} B, pool {used} B, daemon VmRSS {} kB, heap top {} kB, reserve refilled {} arenas (slowest {} ms){}",
                rss,
                crate::pin::last_heap_top() >> 10,
                REFILLED_ARENAS.load(Ordering::Relaxed),
                SLOWEST_REFILL_MS.load(Ordering::Relaxed),
                if stalled_secs > 0 {
                    ", NO PROGRESS"
                } else {
                    ""
                }
            );
            let len = w.position() as usize;
            let _ = kmsg.write_all(&line[..len]);
            if stalled_secs >= 20 && !dumped {
                if let Some(t) = sysrq.as_mut() {
                    // "8": console log level 8 first, or the dumps stay out of the console.
                    for cmd in [b"8", b"w", b"t"] {
                        let _ = t.write_all(cmd);
                    }
                }
                dumped = true;
            }
        }
    });
}

/// The number after `name` in /proc/self/status's text (0 if absent).
fn status_field(status: &[u8], name: &[u8]) -> u64 {
    status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(name))
        .map_or(0, |rest| {
            rest.iter()
                .filter(|b| b.is_ascii_digit())
                .fold(0, |n, &b| n * 10 + u64::from(b - b'0'))
        })
}

/// Serves one request; returns the bytes done or a negative errno.
fn handle(device: &Device, ctx: &mut IoContext, iod: &sys::ublksrv_io_desc, buf: &mut [u8]) -> i32 {
    let op = iod.op_flags & 0xff;
    STARTED[op_slot(op)].fetch_add(1, Ordering::Relaxed);
    // A bug that panics must cost one request (EIO), not the queue thread: a dead queue fails
    // every later request on it, and its device can then only be deleted.
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve_one(device, ctx, iod, buf, op)
    }))
    .unwrap_or_else(|_| {
        log(&format!(
            "BUG: serving {} of {} sectors at sector {} panicked (see the message above); failed with EIO",
            op_name(op),
            iod.nr_sectors,
            iod.start_sector
        ));
        -libc::EIO
    });
    FINISHED[op_slot(op)].fetch_add(1, Ordering::Relaxed);
    res
}

fn op_name(op: u32) -> &'static str {
    match op {
        sys::UBLK_IO_OP_READ => "a read",
        sys::UBLK_IO_OP_WRITE => "a write",
        sys::UBLK_IO_OP_FLUSH => "a flush",
        sys::UBLK_IO_OP_DISCARD => "a discard",
        sys::UBLK_IO_OP_WRITE_ZEROES => "a write-zeroes",
        _ => "a request",
    }
}

/// The latest failed request, kept for [`report_failures`]. An I/O thread never logs: writing
/// the log may need memory (the log file's page cache, a socket buffer), and under pressure that
/// memory waits for swap writes, which may be this device's own, queued behind the writing thread.
/// So the I/O path only counts and, when the mailbox is free, leaves the details (no allocation,
/// never a wait); a thread that serves no I/O writes the log line.
#[derive(Clone, Copy)]
struct Failure {
    op: u32,
    offset: u64,
    len: u64,
    errno: i32,
    cause: &'static str,
}

static FAILED_REQUESTS: AtomicU64 = AtomicU64::new(0);
static LATEST_FAILURE: parking_lot::Mutex<Option<Failure>> = parking_lot::Mutex::new(None);

fn note_failure(op: u32, offset: u64, len: u64, e: &Error) {
    FAILED_REQUESTS.fetch_add(1, Ordering::Relaxed);
    if let Some(mut latest) = LATEST_FAILURE.try_lock() {
        *latest = Some(Failure {
            op,
            offset,
            len,
            errno: errno(e),
            cause: cause(e),
        });
    }
}

/// Logs the requests that failed since the last report, with the latest one's cause: at most
/// one line per `min_gap`, so a device at its limit does not flood the log (zram's users
/// complain of exactly that). `reported` is the count at the last report. For a thread that
/// serves no I/O.
fn report_failures(
    reported: &mut u64,
    last: &mut Option<std::time::Instant>,
    min_gap: std::time::Duration,
) {
    let n = FAILED_REQUESTS.load(Ordering::Relaxed);
    if n == *reported || last.is_some_and(|t| t.elapsed() < min_gap) {
        return;
    }
    let Some(f) = *LATEST_FAILURE.lock() else {
        return;
    };
    log(&format!(
        "{} requests failed{}; the latest: {} of {} bytes at byte {}: {} ({})",
        n - *reported,
        if *reported == 0 {
            ""
        } else {
            " since the last report"
        },
        op_name(f.op),
        f.len,
        f.offset,
        errno_name(f.errno),
        f.cause
    ));
    *reported = n;
    *last = Some(std::time::Instant::now());
}

fn serve_one(
    device: &Device,
    ctx: &mut IoContext,
    iod: &sys::ublksrv_io_desc,
    buf: &mut [u8],
    op: u32,
) -> i32 {
    // FLUSH carries no meaningful sector: answer it before any range check.
    if op == sys::UBLK_IO_OP_FLUSH {
        return 0;
    }
    let offset = iod.start_sector << 9;
    let len = u64::from(iod.nr_sectors) << 9;
    let result = match op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE => match buf.get_mut(..len as usize) {
            Some(data) if op == sys::UBLK_IO_OP_READ => device.read(ctx, offset, data),
            Some(data) => device.write(ctx, offset, data),
            None => return -libc::EINVAL,
        },
        sys::UBLK_IO_OP_DISCARD => device.discard(offset, len),
        sys::UBLK_IO_OP_WRITE_ZEROES => device.write_zeroes(ctx, offset, len),
        _ => return -libc::EOPNOTSUPP,
    };
    match result {
        Ok(()) => {
            if op == sys::UBLK_IO_OP_READ {
                break_reads_for_tests(offset, &mut buf[..len as usize]);
            }
            len as i32
        }
        Err(e) => {
            note_failure(op, offset, len, &e);
            -errno(&e)
        }
    }
}

/// `UZRAM_TEST_BREAK_READS=1`: a deliberately broken device for proving that the VM checks can
/// fail. Flips one bit in every read of every 61st page. Read once at startup; never set it on a
/// device that holds data you want.
static BREAK_READS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn break_reads_for_tests(offset: u64, data: &mut [u8]) {
    if !*BREAK_READS
        .get_or_init(|| std::env::var_os("UZRAM_TEST_BREAK_READS").is_some_and(|v| v == "1"))
    {
        return;
    }
    let first = offset / crate::PAGE_SIZE as u64;
    for (i, page) in data.chunks_mut(crate::PAGE_SIZE).enumerate() {
        if (first + i as u64) % 61 == 0 {
            if let Some(b) = page.get_mut(100) {
                *b ^= 1;
            }
        }
    }
}

/// The thread that keeps the pool's reserve filled: it maps memory the I/O threads then use
/// without asking the kernel. An I/O flusher too: its page faults may wait for reclaim, but never
/// write to swap themselves. As a plain thread it did, and a swap storm then went like this:
/// the refill's fault started swap writes to this device, waited for a tag held by writes that
/// were waiting for the refill, and the reserve stayed empty (311 to 17220 failed writes per
/// 2x-MemAvailable fill in the VM; none in three runs since).
fn memory_thread(device: Arc<Device>) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-memory".into())
        .spawn(move || {
            if let Err(e) = io_flusher() {
                log(&format!("memory: {e}"));
            }
            let mut last_report: Option<std::time::Instant> = None;
            loop {
                device.wait_for_maintenance(std::time::Duration::from_secs(1));
                let t = std::time::Instant::now();
                crate::pin::refill_heap();
                match device.maintain_memory() {
                    Ok(m) if m.arenas_mapped > 0 => {
                        let per = t.elapsed().as_millis() as u64 / m.arenas_mapped as u64;
                        REFILLED_ARENAS.fetch_add(m.arenas_mapped as u64, Ordering::Relaxed);
                        SLOWEST_REFILL_MS.fetch_max(per, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if !matches!(last_report, Some(t) if t.elapsed().as_secs() < 10) {
                            log(&format!("cannot refill the pool's reserve: {e}"));
                            last_report = Some(std::time::Instant::now());
                        }
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            }
        })
        .map(drop)
        .map_err(|source| ServeError::Setup {
            what: "start the memory thread",
            source,
        })
}

/// The tiering policy's thread: once a second, a round of [`crate::Policy::tick`] with the
/// host's memory figures; in between, it serves the evictions that writes hand it (a regular
/// backing file: see `Device::make_room`). An I/O flusher, like the queue threads: its writes to
/// the backing file (and its filesystem's journal) must not wait for swap, which may be this
/// device; a write it serves waits for it at most `EVICT_WAIT`.
fn policy_thread(device: Arc<Device>) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-policy".into())
        .spawn(move || {
            if let Err(e) = io_flusher() {
                return log(&format!("policy: {e}"));
            }
            crate::pin::prefault_stack();
            let mut ctx = match device.context() {
                Ok(ctx) => ctx,
                Err(e) => return log(&format!("policy: {e}")),
            };
            let mut policy = crate::Policy::new();
            let mut last_report: Option<std::time::Instant> = None;
            let second = std::time::Duration::from_secs(1);
            let mut next_tick = std::time::Instant::now() + second;
            loop {
                let now = std::time::Instant::now();
                if now < next_tick {
                    // Wake at least every 100 ms: between ticks it also keeps the pool under
                    // the high watermark.
                    let wait = (next_tick - now).min(std::time::Duration::from_millis(100));
                    policy.serve_evictions(&device, wait);
                    continue;
                }
                next_tick = now + second;
                if let Err(e) = policy.tick(&device, &mut ctx, &crate::Pressure::read()) {
                    if !matches!(last_report, Some(t) if t.elapsed().as_secs() < 60) {
                        log(&format!("policy: {e}"));
                        last_report = Some(std::time::Instant::now());
                    }
                }
            }
        })
        .map(drop)
        .map_err(|source| ServeError::Setup {
            what: "start the policy thread",
            source,
        })
}

fn queue_thread(qid: u16, dev: &UblkDev, device: &Device) {
    if let Err(e) = io_flusher() {
        log(&format!("queue {qid}: {e}"));
        return;
    }
    crate::pin::prefault_stack();
    let mut ctx = match device.context() {
        Ok(ctx) => ctx,
        Err(e) => return log(&format!("queue {qid}: {e}")),
    };
    let bufs = Rc::new(dev.alloc_queue_io_bufs());
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => return log(&format!("queue {qid}: {e}")),
    };
    let handler = move |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
        let iod = q.get_iod(tag);
        let io_buf = &bufs[usize::from(tag)];
        // SAFETY: the buffer of `tag` belongs to this queue thread from the fetch completion
        // until the commit below: the kernel copied a write's data in before completing the
        // fetch, and copies a read's data out only after the commit; no other reference to it
        // is live here.
        let buf = unsafe { std::slice::from_raw_parts_mut(io_buf.as_mut_ptr(), io_buf.len()) };
        let res = handle(device, &mut ctx, iod, buf);
        if let Err(e) = q.complete_io_cmd_unified(
            tag,
            BufDesc::Slice(io_buf.as_slice()),
            Ok(UblkIORes::Result(res)),
        ) {
            log(&format!("queue {qid}: completing tag {tag}: {e}"));
        }
    };
    queue.wait_and_handle_io(handler);
}

/// Creates the device, prints `/dev/ublkbN` once it serves I/O, and serves until the device is
/// stopped (SIGTERM/SIGINT delete it).
pub fn serve(args: &ServeArgs) -> Result<(), ServeError> {
    if !Path::new("/dev/ublk-control").exists() {
        return Err(ServeError::NoDriver);
    }
    let detached = args.detached;
    if std::env::var_os("UZRAM_TEST_BREAK_READS").is_some_and(|v| v == "1") {
        log("UZRAM_TEST_BREAK_READS is set: this device corrupts reads on purpose (for tests)");
    }
    if detached && args.log.is_none() {
        open_syslog();
    }
    crate::pin::tune_malloc();
    let mut setup = DeviceSetup::new();
    let disksize = crate::parse_size(&args.size)?;
    let reserve = match &args.reserve {
        Some(r) => crate::parse_size(r)?,
        // Smaller reserves ran dry under an ext4 write burst in the VM (TCG maps slowly): 8 MiB
        // is the floor.
        None => (disksize / 64).clamp(8 << 20, 16 << 20),
    };
    setup.set_pool_reserve(reserve);
    setup.set_pool_growth(crate::Growth::Reserve { wait: RESERVE_WAIT });
    args.codec.apply(&mut setup)?;
    if let Some(l) = &args.mem_limit {
        setup.set_mem_limit(Some(crate::parse_size(l)?));
    }
    let device = Arc::new(setup.init(disksize)?);
    // A regular backing file: the I/O threads never write to it (its filesystem may wait for
    // swap); the policy thread evicts for them.
    device.set_evict_hand_off(device.backing().is_some_and(|b| !b.all_block_devices()));
    let signals = block_stop_signals()?;
    pin_memory()?;
    crate::pin::refill_heap();
    memory_thread(Arc::clone(&device))?;
    policy_thread(Arc::clone(&device))?;
    progress_log(Arc::clone(&device));
    io_flusher()?;
    let queues = args.queues.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(16) as u16
    });
    let ctrl = UblkCtrlBuilder::default()
        .name("uzram")
        .id(args.id.unwrap_or(-1))
        .nr_queues(queues)
        .depth(args.depth)
        .io_buf_bytes(MAX_IO_BYTES)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER)
        .build()
        .map_err(|e| ServeError::Ublk(format!("cannot add the device: {e}")))?;
    let id = ctrl.dev_info().dev_id;
    stop_on_signals(signals, id as i32);
    if let Err(e) = control_thread(id, Arc::clone(&device), usize::from(queues)) {
        let _ = ctrl.del_dev();
        return Err(e);
    }
    swap_watch_thread(id, Arc::clone(&device));
    let disksize = device.disksize();
    let q_device = Arc::clone(&device);
    let served = ctrl.run_target(
        move |dev: &mut UblkDev| {
            set_params(dev, disksize);
            Ok(())
        },
        move |qid, dev: &UblkDev| queue_thread(qid, dev, &q_device),
        move |ctrl: &UblkCtrl| {
            disable_writeback_throttling(ctrl.dev_info().dev_id);
            println!("{}", ctrl.get_bdev_path());
            let _ = std::io::stdout().flush();
            log(&format!("{} serving", ctrl.get_bdev_path()));
            if detached {
                // `uzram --find` has its answer: close its pipe.
                redirect_stdout_to_null();
            }
        },
    );
    // Delete the device whether serving ended by a signal or failed: never leave one behind.
    let _ = UblkCtrl::new_simple(id as i32).and_then(|c| c.del_dev());
    let _ = std::fs::remove_file(crate::control::socket_path(id));
    log(&format!("/dev/ublkb{id} deleted"));
    served
        .map(|_| ())
        .map_err(|e| ServeError::Ublk(format!("serving /dev/ublkb{id}: {e}")))
}

/// Why `/dev/ublkb{id}` cannot be reset now, if it cannot: it is swap, mounted, or held open
/// exclusively by someone. Returns the exclusive claim it took when free, to hold while the
/// device is stopped (no one can swapon or mount it meanwhile).
pub fn claim_unused(id: u32) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/dev/ublkb{id}");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&path);
    let err = match file {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    if err.raw_os_error() != Some(libc::EBUSY) {
        return Err(format!("{path}: {err}"));
    }
    if crate::listing::is_swap(&path) {
        return Err(format!("{path} is in use as swap: swapoff {path} first"));
    }
    if let Some(point) = crate::listing::mount_point(&path) {
        return Err(format!("{path} is mounted on {point}: umount it first"));
    }
    Err(format!(
        "{path} is in use (held open exclusively by another program)"
    ))
}

/// Deletes device `id` whose daemon is gone (killed): what `uzram --reset` does for a dead
/// device. The kernel has already stopped the disk; this removes the control device.
pub fn remove_dead(id: u32) -> Result<(), ServeError> {
    let ctrl = UblkCtrl::new_simple(id as i32)
        .map_err(|e| ServeError::Ublk(format!("/dev/ublkc{id}: {e}")))?;
    let _ = ctrl.kill_dev();
    ctrl.del_dev()
        .map(drop)
        .map_err(|e| ServeError::Ublk(format!("deleting /dev/ublkc{id}: {e}")))?;
    let _ = std::fs::remove_file(crate::control::socket_path(id));
    Ok(())
}

/// The daemon's resident memory in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field(status.as_bytes(), b"VmRSS:") * 1024
}

/// Binds the control socket of device `id` and answers it from a thread.
fn control_thread(id: u32, device: Arc<Device>, streams: usize) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let setup = |what, source| ServeError::Setup { what, source };
    std::fs::create_dir_all(crate::control::RUN_DIR).map_err(|e| setup("create /run/uzram", e))?;
    let path = crate::control::socket_path(id);
    // A socket left by a killed daemon of an earlier device with this id.
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| setup("bind the control socket", e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| setup("open the control socket to all users", e))?;
    std::thread::Builder::new()
        .name("uzram-control".into())
        .spawn(move || {
            // SAFETY: prctl with integer arguments; this thread serves no I/O.
            unsafe { libc::prctl(PR_SET_IO_FLUSHER, 0, 0, 0, 0) };
            let info = || crate::attrs::DaemonInfo {
                streams,
                rss_bytes: rss_bytes(),
                pid: std::process::id(),
            };
            crate::control::serve(&listener, |request| {
                use crate::attrs::AttrError;
                use crate::control::Request;
                match request {
                    Request::Read(name) => crate::attrs::read(&device, &info(), name),
                    // zram's reset takes a non-zero number.
                    Request::Write(name, value) if name == "reset" => {
                        match value.trim().parse::<u64>() {
                            Ok(n) if n > 0 => reset(id),
                            _ => Err(AttrError::new(libc::EINVAL, "reset takes a non-zero number")),
                        }
                    }
                    Request::Write(name, value) => {
                        crate::attrs::write(&device, name, value).map(|()| String::new())
                    }
                    Request::Reset => reset(id),
                    Request::Info => {
                        let i = info();
                        let p = device.policy_stats();
                        let bd_used: u64 = device
                            .backing()
                            .map_or(0, |b| b.files().iter().map(|f| f.used_bytes).sum());
                        Ok(format!(
                            "name=/dev/ublkb{id}\npid={}\nalgorithm={}\ndisksize={}\nstreams={}\nrss={}\nbd_used={bd_used}\nevicted={}\nrecompressed={}\nwritten_back={}\nmm_stat={}",
                            i.pid,
                            device.algorithm().name(),
                            device.disksize(),
                            i.streams,
                            i.rss_bytes,
                            p.evicted_pages,
                            p.recompressed_pages,
                            p.age_wb_pages + p.watermark_wb_pages + p.host_wb_pages,
                            device.mm_stat()
                        ))
                    }
                }
            });
        })
        .map(drop)
        .map_err(|e| setup("start the control thread", e))
}

/// Logs failed requests (see [`report_failures`]) and watches whether the device is swap
/// (`/proc/swaps`, once a second) and, when a swapoff has
/// ended, frees the swap area's old pages (not the header, nothing written since): the kernel tells a ublk disk nothing when swap
/// slots are freed (kernel zram has a private hook for it), and clusters freed during swapoff are
/// not discarded either, so without this a swapped-off device would keep every page it ever held.
/// The kernel has read every page back in before it drops the device from /proc/swaps; the
/// reclaim holds the device's exclusive claim (no mkfs, mount or swapon meanwhile) and checks
/// that page 0 still carries the swap signature.
fn swap_watch_thread(id: u32, device: Arc<Device>) {
    let spawned = std::thread::Builder::new()
        .name("uzram-swapwatch".into())
        .spawn(move || {
            // SAFETY: prctl with integer arguments; this thread serves no I/O.
            unsafe { libc::prctl(PR_SET_IO_FLUSHER, 0, 0, 0, 0) };
            let path = format!("/dev/ublkb{id}");
            // The device clock's second when the device was last seen as swap: every page the
            // swap area wrote is older; anything written after the swapoff is not.
            let mut last_seen_swap: Option<u32> = None;
            // Failed requests, logged from here (an I/O thread never logs).
            let (mut reported, mut last_report) = (0, None);
            loop {
                report_failures(
                    &mut reported,
                    &mut last_report,
                    std::time::Duration::from_secs(10),
                );
                let now = device.clock_secs();
                match (crate::listing::is_swap(&path), last_seen_swap) {
                    (true, _) => last_seen_swap = Some(now),
                    (false, Some(seen)) => {
                        reclaim_after_swapoff(id, &device, seen);
                        last_seen_swap = None;
                    }
                    (false, None) => {}
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        });
    if let Err(e) = spawned {
        log(&format!("cannot start the swap watcher: {e}"));
    }
}

/// Frees the pages swap left behind: those last written or read no later than the second after
/// `seen` (the clock's second when the device was last seen as swap; the watcher samples once a
/// second), keeping the swap header and anything written later. Holds the device's exclusive
/// claim meanwhile and requires the swap signature on page 0.
fn reclaim_after_swapoff(id: u32, device: &Device, seen: u32) {
    let claim = match claim_unused(id) {
        Ok(c) => c,
        Err(why) => {
            return log(&format!(
                "after swapoff: not freeing the old swap pages: {why}"
            ))
        }
    };
    let mut page = vec![0u8; crate::PAGE_SIZE];
    let signed = device
        .context()
        .and_then(|mut ctx| device.read(&mut ctx, 0, &mut page))
        .is_ok()
        && page[crate::PAGE_SIZE - 10..] == *b"SWAPSPACE2";
    if !signed {
        return log("after swapoff: page 0 is no longer a swap header; leaving the contents alone");
    }
    // Swapoff reads (and so stamps) every page before the device leaves /proc/swaps, and it
    // ended before the next sample, at most a second after the last sighting: pages stamped up to
    // the second after `seen` are swap's. A write in that window by someone who neither holds the
    // device exclusively nor touches page 0 is the one case not told apart.
    let freed = device.free_pages_older_than(crate::PageIndex(1), seen.saturating_add(2));
    log(&format!(
        "/dev/ublkb{id}: swapoff: freed {freed} old swap pages"
    ));
    drop(claim);
}

/// A reset request: refused while the device is in use; otherwise the device is stopped (the
/// claim on it held until then) and the daemon exits.
fn reset(id: u32) -> Result<String, crate::attrs::AttrError> {
    let claim = claim_unused(id).map_err(|m| crate::attrs::AttrError::new(libc::EBUSY, m))?;
    log(&format!("/dev/ublkb{id}: reset requested, stopping"));
    std::thread::spawn(move || {
        if let Ok(ctrl) = UblkCtrl::new_simple(id as i32) {
            let _ = ctrl.kill_dev();
        }
        drop(claim);
    });
    Ok(String::new())
}

/// Turns off writeback throttling (wbt) on the device. zram, being bio-based, has none; on a
/// request-based ublk disk wbt holds reclaim's swap writes to a trickle (seen in the VM: khugepaged
/// blocked in `wbt_wait` from `swap_writepage` past the 30 s hung-task limit), and a swap device
/// must take reclaim's writes as fast as it can.
fn disable_writeback_throttling(id: u32) {
    let path = format!("/sys/block/ublkb{id}/queue/wbt_lat_usec");
    if let Err(e) = std::fs::write(&path, "0") {
        log(&format!(
            "warning: cannot turn off writeback throttling ({path}): {e}"
        ));
    }
}

fn redirect_stdout_to_null() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto fd 1 of a valid fd; stdout's buffer was flushed just before.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Blocks SIGTERM and SIGINT in this thread and every thread it creates from now on, so that a
/// signal that arrives before the device serves stays pending for [`stop_on_signals`] instead of
/// killing the process with a device left behind.
fn block_stop_signals() -> Result<libc::sigset_t, ServeError> {
    // SAFETY: sigset manipulation on a local set, then blocking those signals for this thread;
    // results are checked.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(ServeError::Setup {
                what: "block SIGTERM/SIGINT",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(set)
    }
}

/// A thread that waits for SIGTERM or SIGINT (blocked by [`block_stop_signals`]) and stops the
/// device, so `run_target` returns.
fn stop_on_signals(set: libc::sigset_t, id: i32) {
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on a set of signals blocked in every thread; `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&set, &mut sig) };
        if let Ok(ctrl) = UblkCtrl::new_simple(id) {
            let _ = ctrl.kill_dev();
        }
    });
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::PageIndex;

    #[test]
    fn every_engine_error_has_one_errno() {
        let range = Error::OutOfRange {
            offset: 0,
            len_bytes: 1,
            disksize: 0,
        };
        assert_eq!(errno(&range), libc::EINVAL);
        assert_eq!(
            errno(&Error::Misaligned {
                offset: 1,
                len_bytes: 1
            }),
            libc::EINVAL
        );
        assert_eq!(
            errno(&Error::MemLimit {
                index: PageIndex(0),
                limit_bytes: 1
            }),
            libc::ENOSPC
        );
        let lost = Error::Lost {
            index: PageIndex(0),
            source: uzram_allocator::Error::InvalidHandle { raw: 0 },
        };
        assert_eq!(errno(&lost), libc::EIO);
    }

    #[test]
    fn a_failed_request_is_counted_with_its_cause_not_logged_by_the_io_thread() {
        let device = DeviceSetup::new().init(1 << 20).unwrap();
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 4096];
        let iod = sys::ublksrv_io_desc {
            op_flags: sys::UBLK_IO_OP_READ,
            nr_sectors: 8,
            start_sector: 1 << 20,
            ..Default::default()
        };
        let before = FAILED_REQUESTS.load(Ordering::Relaxed);
        assert_eq!(handle(&device, &mut ctx, &iod, &mut buf), -libc::EINVAL);
        assert!(FAILED_REQUESTS.load(Ordering::Relaxed) > before);
        assert!(LATEST_FAILURE.lock().is_some());
        let range = Error::OutOfRange {
            offset: 0,
            len_bytes: 1,
            disksize: 0,
        };
        assert_eq!(cause(&range), "beyond the device's size");
        let short =
            Error::OutOfMemory(uzram_allocator::Error::ReserveExhausted { waited_ms: 1000 });
        assert!(cause(&short).contains("reserve"));
        assert_eq!(errno(&short), libc::ENOMEM);
    }

    #[test]
    fn flush_is_answered_before_any_range_check() {
        let device = DeviceSetup::new().init(1 << 20).unwrap();
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 4096];
        let iod = |op: u32, start_sector: u64, nr_sectors: u32| sys::ublksrv_io_desc {
            op_flags: op,
            nr_sectors,
            start_sector,
            ..Default::default()
        };
        // mkswap sends a FLUSH with a meaningless start sector.
        assert_eq!(
            handle(
                &device,
                &mut ctx,
                &iod(sys::UBLK_IO_OP_FLUSH, u64::MAX >> 9, 0),
                &mut buf
            ),
            0
        );
        assert_eq!(
            handle(
                &device,
                &mut ctx,
                &iod(sys::UBLK_IO_OP_READ, 1 << 20, 8),
                &mut buf
            ),
            -libc::EINVAL
        );
        assert_eq!(
            handle(
                &device,
                &mut ctx,
                &iod(sys::UBLK_IO_OP_WRITE, 0, 8),
                &mut buf
            ),
            4096
        );
        assert_eq!(
            handle(&device, &mut ctx, &iod(99, 0, 8), &mut buf),
            -libc::EOPNOTSUPP
        );
        // A request longer than the buffer is refused, not a panic.
        assert_eq!(
            handle(
                &device,
                &mut ctx,
                &iod(sys::UBLK_IO_OP_READ, 0, 16),
                &mut buf
            ),
            -libc::EINVAL
        );
    }
}
