//! The daemon, `uzram serve`: serves a [`Device`] as `/dev/ublkbN` through the kernel's ublk
//! driver, safe to hold swap.
//!
//! Each queue thread drives the engine directly with its own [`uzram_engine::IoContext`]; no
//! hand-off to other threads on the I/O path. Before any I/O is served the process pins its
//! memory (`mlockall`), marks every I/O thread `PR_SET_IO_FLUSHER` and sets `oom_score_adj` to
//! -1000: a server that backs swap must never wait for the memory it is asked to free (see
//! docs/design/safe-to-hold-swap.md).
//!
//! Parts: [`io`] (one request: the op, the engine call, the errno map), `mailbox` (failed
//! requests, counted on the I/O path and logged elsewhere), `roundtrip` (the queue threads'
//! system calls and context switches), `threads` (memory and policy),
//! `swapwatch`, `control` (the socket's answers), `watchdog` (the progress log), `pin` (locked
//! memory, fault-free stacks), [`heap`] (the I/O path's fault-free heap), [`slotfree`] (the
//! eBPF probe that tells the device which swap slots the kernel freed, the only module that
//! talks to aya), `log` (stderr and syslog) and `ublk`, the only module that talks to libublk
//! (cargo feature `ublk`). Every libc call is in `crate::sys`.

// Without the `ublk` feature nothing starts the daemon, but its parts still build and test.
#![cfg_attr(not(feature = "ublk"), allow(dead_code))]

mod control;
mod crew;
pub mod defer;
pub mod errno;
mod fdstore;
#[allow(unsafe_code)] // the global allocator: talc over a span of its own
pub mod heap;
pub mod io;
mod log;
mod mailbox;
pub mod pin;
mod roundtrip;
pub mod slotfree;
mod stallstack;
mod standby;
#[cfg(feature = "ublk")]
mod supervisor;
mod swapwatch;
mod threads;
#[cfg(feature = "ublk")]
mod ublk;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

pub use self::log::{kmsg, log};
#[cfg(feature = "ublk")]
pub use self::ublk::remove_dead;
use crate::common::options::{self, DeviceArgs, OptionsError};
use uzram_engine::{Device, DeviceSetup, Growth};

/// `uzram serve`: the supervisor, which starts and restarts workers (see `supervisor`); with
/// `--worker-region-fd`, a worker; with `--check-region` too, the check a supervisor asks of a
/// new binary.
#[cfg(feature = "ublk")]
pub fn serve(args: &ServeArgs) -> Result<(), ServeError> {
    if args.check_region {
        supervisor::check_region(args)
    } else if args.worker_region_fd.is_some() {
        ublk::serve_worker(args)
    } else {
        supervisor::supervise(args)
    }
}

/// Largest I/O the device takes: 128 KiB. Each queue thread has one buffer this large (the
/// kernel's `UBLK_F_USER_COPY`: the thread copies each request's data through it), locked in
/// RAM; on a kernel without user copy each tag has one (2 queues x depth 64 x 128 KiB = 16 MiB).
/// Swap writes pages one folio at a time and the block layer merges neighbours up to this
/// size; larger requests would only cost memory.
pub const MAX_IO_BYTES: u32 = 128 << 10;
/// Longest the memory thread may fault in no page, while the pool's reserve is dry, before a
/// write fails with ENOMEM (a file system or a raw writer takes it as an I/O error; swap's
/// writes are less patient: [`SWAP_RESERVE_WAIT`]); until then the write is put off (see
/// `defer`), up to 8 times this without a whole arena. The pool waits as long for its own
/// stores (`Growth::Reserve`). Kernel zram waits in reclaim for its memory; this waits for a
/// thread that does, so it is long enough for a few faults while memory is short and reclaim
/// takes back page cache under them (over 1 s on a busy or emulated machine), and short enough
/// that a memory thread truly stuck fails the queue's writes well before the kernel's
/// hung-task watchdog (120 s) notices them.
pub(super) const RESERVE_WAIT: Duration = Duration::from_secs(4);
/// [`RESERVE_WAIT`] for swap's writes. Swap keeps a page whose write failed and tries it later,
/// so failing is cheap, and pages held under writeback are not: reclaim cannot take them, nor
/// can a suspend freeze while they are in flight, and a refill under memory starvation can
/// take tens of seconds. Two seconds: in a swap storm on an emulated machine the memory thread
/// has gone 1.0-1.6 s without faulting a page in while mapping an arena; eight times this (a
/// put-off write's longest wait while no arena comes) stays under the freezer's 20 s.
pub(super) const SWAP_RESERVE_WAIT: Duration = Duration::from_secs(2);

/// The reserve a fresh or idle device keeps unless told: none. While memory is plentiful the
/// first write that needs a new arena waits for the memory thread to map one (a millisecond);
/// while it is short, the whole reserve is there.
const DEFAULT_RESERVE_MIN: u64 = 0;

/// Default queue depth.
pub const DEFAULT_DEPTH: u16 = 64;

/// Arguments of `uzram serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Device size, as zram's disksize takes it (4G, 512M, bytes)
    #[arg(short = 's', long, allow_hyphen_values = true)]
    pub size: String,
    /// What the device is made of
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Queues (one thread each); default 2 (1 on a one-CPU machine)
    #[arg(long, allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<u16>(1, crate::common::options::MAX_QUEUES.into()))]
    pub queues: Option<u16>,
    /// Queue depth
    #[arg(long, default_value_t = DEFAULT_DEPTH, allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<u16>(1, u16::MAX.into()))]
    pub depth: u16,
    /// The most pool memory kept mapped (and locked) ahead of writes, so that swap-out does not
    /// have to ask the kernel for memory while it is short of it: the reserve starts at
    /// --reserve-min, is all of this while the host's memory is short (MemAvailable under a third
    /// of MemTotal, PSI stalls, or swap writing; for a swap device, under half or falling
    /// fast), doubles under a burst of writes up to this, and halves back after each 10 s
    /// without either (default: 1/64 of the size, 8M..16M)
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true)]
    pub reserve: Option<String>,
    /// The reserve a fresh or idle device keeps, and shrinks back to after a burst (default: 0,
    /// none; set it to --reserve to map the whole reserve up front and keep it)
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true)]
    pub reserve_min: Option<String>,
    /// Device id N for /dev/ublkbN (default, or -1: the first free one)
    #[arg(long, allow_hyphen_values = true, value_parser = crate::common::options::whole_in::<i32>(-1, (1 << 20) - 1))]
    pub id: Option<i32>,
    /// Append the daemon's messages to this file (default: stderr; with --detached, syslog)
    #[arg(long, value_name = "FILE")]
    pub log: Option<std::path::PathBuf>,
    /// Run as the background daemon of `uzram --find`: report the device path (or the error)
    /// on stdout, then close it
    #[arg(long, hide = true)]
    pub detached: bool,
    /// Internal: run as the worker of a supervising `uzram serve` (which holds the device's
    /// memory region, passed as this descriptor, and restarts the worker if it dies)
    #[arg(long, hide = true, value_name = "FD")]
    pub worker_region_fd: Option<i32>,
    /// Internal, with --worker-region-fd: the slot-free probe's BPF link, which the supervisor
    /// loaded and holds across its workers' deaths (with --worker-probe-map-fd)
    #[arg(long, hide = true, value_name = "FD", requires = "worker_probe_map_fd")]
    pub worker_probe_link_fd: Option<i32>,
    /// Internal, with --worker-probe-link-fd: the probe's map of marks
    #[arg(
        long,
        hide = true,
        value_name = "FD",
        requires = "worker_probe_link_fd"
    )]
    pub worker_probe_map_fd: Option<i32>,
    /// Internal, with --worker-probe-link-fd: the protocol of the binary that loaded the probe
    /// (its map's layout), which this worker must speak to use it
    #[arg(
        long,
        hide = true,
        value_name = "PROTOCOL",
        requires = "worker_probe_link_fd"
    )]
    pub worker_probe_protocol: Option<String>,
    /// Internal, with --worker-region-fd: a sealed memfd holding the key of the backing store's
    /// records (the supervisor drew it; every worker of the device seals with it)
    #[arg(long, hide = true, value_name = "FD")]
    pub worker_key_fd: Option<i32>,
    /// Internal, with --worker-region-fd: die (SIGKILL) when supervisor PID ends. A supervisor
    /// run as a systemd service keeps the region in systemd's descriptor store, and systemd
    /// restarts it, once whatever it left in the service is gone: its worker dies at once, the
    /// device quiesced, and the restarted supervisor's successor takes over
    #[arg(long, hide = true, value_name = "PID")]
    pub die_with_supervisor: Option<u32>,
    /// Internal, with --worker-region-fd: take over device N, left by a worker that died
    #[arg(long, hide = true, value_name = "N")]
    pub recover: Option<u32>,
    /// Internal: how often the supervisor restarted the worker so far
    #[arg(long, hide = true, default_value_t = 0)]
    pub restarts: u64,
    /// Internal: why the last worker ended
    #[arg(long, hide = true, default_value = "none")]
    pub last_restart: String,
    /// Internal, for a successor: the descriptor its messages go to once it serves (its stderr
    /// is /dev/null until then: the log file's pages may be in swap on the device)
    #[arg(long, hide = true, value_name = "FD")]
    pub log_fd: Option<i32>,
    /// Internal: a successor started ahead of need, which waits (pinned, its heap committed)
    /// for the supervisor's `go ID RESTARTS CAUSE` on stdin before it takes device ID over
    #[arg(long, hide = true)]
    pub standby: bool,
    /// Internal, with --standby: a reserve for device N, outside the supervisor's service (its
    /// cgroup): it takes the device over when the supervisor and all its workers have ended
    /// (its stdin, a pipe they hold, reaches its end); see `daemon::standby`
    #[arg(long, hide = true, value_name = "N", requires = "standby")]
    pub reserve_for: Option<u32>,
    /// Internal, with --worker-region-fd: check that this binary could take the device in the
    /// region over (its options; the region's header, descriptors and settings; its codecs:
    /// `Device::check_adoptable`), print `ok` and exit; changes nothing.
    /// What a supervisor asks of a new binary before an upgrade stops the running worker.
    #[arg(long, hide = true)]
    pub check_region: bool,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No ublk driver in this kernel.
    #[error("{}", crate::common::NO_DRIVER)]
    NoDriver,
    /// The options were refused.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// The engine refused the configuration.
    #[error(transparent)]
    Device(#[from] uzram_engine::Error),
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
    /// The supervisor's worker could not serve the device.
    #[error("{0}")]
    Worker(String),
    /// The slot-free probe the supervisor passed could not be stopped, and this worker cannot
    /// use it: it would serve writes that take no marks while the probe marks.
    #[error(
        "this worker cannot use the supervisor's slot-free probe ({why}), nor stop it: it would \
         serve writes that take no marks while the probe marks"
    )]
    ProbeNotStopped {
        /// Why the worker cannot use it.
        why: String,
        /// Why it could not be stopped.
        #[source]
        source: std::io::Error,
    },
}

/// The slot-free probe the supervisor passed (--worker-probe-link-fd, --worker-probe-map-fd),
/// if it passed one.
fn inherited_probe(args: &ServeArgs) -> Result<Option<slotfree::Descriptors>, ServeError> {
    let (Some(link), Some(map)) = (args.worker_probe_link_fd, args.worker_probe_map_fd) else {
        return Ok(None);
    };
    let take = |fd: i32| {
        crate::sys::take_inherited_fd(fd).map_err(|source| ServeError::Setup {
            what: "take the slot-free probe's descriptors from the supervisor",
            source,
        })
    };
    Ok(Some(slotfree::Descriptors {
        link: take(link)?,
        map: take(map)?,
    }))
}

/// The probe the supervisor passed, which this worker could not use (`why`), stopped before
/// this worker serves: its marks are not this worker's (see [`slotfree::disown`]). A worker
/// that cannot stop it must not serve at all.
fn disown_probe(probe: &slotfree::Descriptors, why: &str) -> Result<(), ServeError> {
    use std::os::fd::AsFd;
    slotfree::disown(probe.map.as_fd()).map_err(|source| ServeError::ProbeNotStopped {
        why: why.to_string(),
        source,
    })
}

/// What a new device's options may not hold beyond what [`configure`] takes (see
/// [`DeviceArgs::check_new`]), and `--reserve-min` above `--reserve` (which [`configure`]
/// clamps). Only where a device is made, never in a successor or standby.
pub fn check_new(args: &ServeArgs) -> Result<(), ServeError> {
    args.device.check_new()?;
    if let (Some(min), Some(most)) = (&args.reserve_min, &args.reserve) {
        if options::parse_size_option("--reserve-min", min)?
            > options::parse_size_option("--reserve", most)?
        {
            return Err(options::OptionsError::ReserveMinAboveReserve {
                min: min.clone(),
                reserve: most.clone(),
            }
            .into());
        }
    }
    Ok(())
}

/// The engine's setup and disksize for `args`: what `uzram --find` checks too (through the same
/// [`options::check`]), plus the daemon's pool settings (a reserve, kept filled by the memory
/// thread).
pub fn configure(args: &ServeArgs) -> Result<(DeviceSetup, u64), ServeError> {
    // A worker (first or successor), a standby or an upgrade's check: the supervisor made the
    // device, and the worker serving it holds its backing files.
    let (mut setup, disksize) = if args.worker_region_fd.is_some() {
        options::check_held(&args.size, &args.device, args.queues)?
    } else {
        options::check(&args.size, &args.device, args.queues)?
    };
    let reserve = match &args.reserve {
        Some(r) => options::parse_size_option("--reserve", r)?,
        // The most is at least 8 MiB: a burst (a filesystem's writes, a swap storm) where
        // mapping is slow runs a smaller reserve dry. The reserve starts at its least and
        // doubles each round of a burst, so it is there within a few rounds.
        None => (disksize / 64).clamp(8 << 20, 16 << 20),
    };
    setup.set_pool_reserve(reserve);
    // Unless told, the reserve follows demand from none: it is whole while the host's memory
    // is short (the memory thread tells the pool; swap writes come then), one arena once a
    // write found none, doubling under a burst of writes, and shrinks back to none once both
    // are over.
    let reserve_min = match &args.reserve_min {
        Some(r) => options::parse_size_option("--reserve-min", r)?,
        None => DEFAULT_RESERVE_MIN,
    };
    setup.set_pool_reserve_min(reserve_min.min(reserve));
    setup.set_pool_growth(Growth::Reserve { wait: RESERVE_WAIT });
    Ok((setup, disksize))
}

/// Marks the calling thread an I/O flusher (see `sys::set_io_flusher`), and so every thread it
/// starts later. Every thread of a worker is one, those that serve no I/O too: a worker killed
/// with I/O in flight ends thread by thread, and each allocates as it ends (the kernel's
/// task statistics); one that reclaimed by writing swap to the device would wait for a tag the
/// dying worker still holds, the worker would never end, and no successor could take the device
/// over (the kernel hands it over only once the old worker's descriptors are closed).
fn io_flusher() -> Result<(), ServeError> {
    crate::sys::set_io_flusher(true).map_err(|source| ServeError::Setup {
        what: "mark the I/O thread PR_SET_IO_FLUSHER",
        source,
    })
}

/// What [`start`] hands the rest of serving.
struct Started {
    device: Arc<Device>,
    /// Whether the device lives in a region its supervisor holds (then it is added with user
    /// recovery, so that a successor can take it over).
    in_region: bool,
    /// What adopting the device found, to log once the device is served again (not before:
    /// the log file's pages may be in swap on the device, whose I/O waits for this process).
    adopted: Option<String>,
    /// The device to take over (`--recover`, or a standby's `go`) and the restarts so far.
    recover: Option<(u32, u64, String)>,
    /// SIGTERM and SIGINT, blocked (see [`crate::sys::BlockedSignals`]).
    signals: crate::sys::BlockedSignals,
    /// The slot-free probe, loaded for the device to watch once it exists; or why not.
    slot_free: Result<slotfree::Loaded, String>,
}

/// The slot-free probe a worker uses: its supervisor's, handed over (`inherited`), or one it
/// loads itself; or why none.
fn slot_free_for(
    args: &ServeArgs,
    pages: u64,
    inherited: Option<&slotfree::Descriptors>,
) -> Result<slotfree::Loaded, String> {
    match (args.device.slot_free, inherited) {
        (options::SlotFree::Discard, _) => Err("turned off (--slot-free discard)".to_string()),
        // The supervisor's: loaded once, before its first worker, and held.
        (options::SlotFree::Probe, Some(probe)) => {
            let protocol = args.worker_probe_protocol.as_deref().unwrap_or_default();
            slotfree::adopt(probe, pages, protocol)
        }
        // A successor whose supervisor holds none (its own load failed, or systemd restarted
        // it) starts while the device's I/O waits for it, often with memory short and swap
        // held up: loading the probe (a helper process parsing the kernel's BTF) could wait
        // for memory that only swap would free.
        (options::SlotFree::Probe, None) if args.recover.is_some() || args.standby => Err(
            "not loaded by a successor whose supervisor holds none (it would need memory while the device waits for it)"
                .to_string(),
        ),
        (options::SlotFree::Probe, None) => slotfree::load(pages),
    }
}

/// Everything before the device is added: the slot-free probe loaded, the device built, the
/// process pinned, the memory, policy and watchdog threads started, the calling thread an I/O
/// flusher.
fn start(args: &ServeArgs) -> Result<Started, ServeError> {
    if !crate::common::have_ublk_driver() {
        return Err(ServeError::NoDriver);
    }
    if io::breaks_reads() {
        log("UZRAM_TEST_BREAK_READS is set: this device corrupts reads on purpose (for tests)");
    }
    if args.detached && args.log.is_none() {
        self::log::open_syslog();
    }
    // An I/O flusher from the start: a successor starts, and adopts the device, while the
    // device's I/O waits for it, and an allocation that reclaimed by writing swap could wait
    // on that very I/O.
    io_flusher()?;
    pin::tune_malloc();
    // The region and the key the supervisor passed are this process's alone: no program it
    // starts (the slot-free probe's helper below) may inherit them.
    for fd in [
        args.worker_region_fd,
        args.worker_key_fd,
        args.worker_probe_link_fd,
        args.worker_probe_map_fd,
    ]
    .into_iter()
    .flatten()
    {
        crate::sys::keep_inherited_fd(fd).map_err(|source| ServeError::Setup {
            what: "take the descriptors the supervisor passed",
            source,
        })?;
    }
    if let Some(pid) = args.die_with_supervisor {
        crate::sys::die_with_parent(pid).map_err(|source| ServeError::Setup {
            what: "die with the supervisor",
            source,
        })?;
    }
    standby::prepare(args)?;
    let (setup, disksize) = configure(args)?;
    // Before memory is locked: the helper that loads it is a process of its own (its answer
    // is read on this thread, with a deadline).
    let pages = disksize.div_ceil(uzram_engine::PAGE_SIZE as u64);
    let inherited = inherited_probe(args)?;
    let slot_free = slot_free_for(args, pages, inherited.as_ref());
    let signals =
        crate::sys::BlockedSignals::block(&[libc::SIGTERM, libc::SIGINT]).map_err(|source| {
            ServeError::Setup {
                what: "block SIGTERM/SIGINT",
                source,
            }
        })?;
    pin::pin_memory()?;
    pin::end_a_thread();
    // The queue threads, ready before the device is built or, in a standby, before it says it
    // is ready (see `crew`).
    #[cfg(feature = "ublk")]
    let prepare: crew::Prepare = ublk::prepare_queue_ring;
    #[cfg(not(feature = "ublk"))]
    let prepare: crew::Prepare = |_| {};
    crew::start(usize::from(queues(args)), args.depth, prepare);
    heap::init(disksize, true).map_err(|source| ServeError::Setup {
        what: "reserve address space for the I/O heap",
        source,
    })?;
    // The device is built (below) after `mlockall(MCL_CURRENT)`: a region's metadata and table
    // areas are mapped whole but hold memory only where written; locked then, they would be
    // populated whole.
    // A standby has what needs memory done (pinned, its stacks, its queue threads and malloc's
    // heap resident) but its I/O heap: it waits here, until a worker dies, for the
    // supervisor's word. Its I/O heap
    // is committed when it takes over (the refill below, 1 MiB, or 4 MiB with memory short, as
    // a worker's is): held by every standby all along, that step would be 1 MiB of the idle
    // daemon's 10, and a takeover under pressure faults the 3 MiB beyond it then anyway.
    let recover = if args.standby {
        match standby::ready_and_wait(args.reserve_for) {
            Some(go) => Some((go.id, go.restarts, go.cause)),
            None => std::process::exit(0),
        }
    } else {
        args.recover
            .map(|id| (id, args.restarts, args.last_restart.clone()))
    };
    watchdog::step(watchdog::Step::Device);
    let (device, adopted) = device_for(args, recover.as_ref(), setup, disksize)?;
    // The marks before any request is served (see `Loaded::attach`).
    let slot_free = slot_free.and_then(|probe| probe.attach(&device).map(|()| probe));
    if let (Some(probe), Err(why)) = (&inherited, &slot_free) {
        disown_probe(probe, why)?;
    }
    drop(inherited);
    // Whatever building or adopting the device allocated from malloc after `mlockall`, faulted
    // in now: an I/O thread that wrote a page of it first would fault while memory is short.
    watchdog::step(watchdog::Step::Heap);
    if let Err(e) = pin::populate_heap() {
        log(&format!(
            "warning: malloc's heap could not be made resident ({e}): a page fault on the I/O path may wait for memory"
        ));
    }
    let device = Arc::new(device);
    let in_region = device.region().is_some();
    // A regular backing file: the I/O threads never write to it (its filesystem may wait for
    // swap); the policy thread evicts for them.
    device.set_evict_hand_off(device.backing().is_some_and(|b| !b.all_block_devices()));
    // Sized for the memory as it is now: a daemon started under pressure starts with the whole
    // reserve and margin, not a second later.
    // (Not yet known as swap: the swap watcher has not looked.)
    let short = threads::note_pressure(&device, &mut threads::LastReading::default(), false);
    // In a region: the first leaves and metadata chunks resident before the first write.
    device.prefault_region(short);
    watchdog::step(watchdog::Step::IoHeap);
    if heap::refill() == 0 {
        log("warning: the I/O heap could not be committed; the I/O path allocates from malloc");
    }
    watchdog::step(watchdog::Step::Upkeep);
    threads::memory_thread(Arc::clone(&device))?;
    threads::policy_thread(Arc::clone(&device))?;
    watchdog::progress_log(Arc::clone(&device));
    Ok(Started {
        device,
        in_region,
        adopted,
        recover,
        signals,
        slot_free,
    })
}

/// The backing store's key the supervisor passed (`--worker-key-fd`), if it did.
pub(super) fn inherited_key(
    args: &ServeArgs,
) -> Result<Option<uzram_engine::BackingKey>, ServeError> {
    let Some(fd) = args.worker_key_fd else {
        return Ok(None);
    };
    let what = "take the backing store's key from the supervisor";
    let fd =
        crate::sys::take_inherited_fd(fd).map_err(|source| ServeError::Setup { what, source })?;
    let mut bytes = [0u8; uzram_engine::device::writeback::KEY_LEN];
    let read = crate::sys::read_sealed_secret(std::os::fd::AsFd::as_fd(&fd), &mut bytes);
    let key = read.map(|()| uzram_engine::BackingKey::from_bytes(bytes));
    bytes.fill(0);
    std::hint::black_box(&bytes);
    key.map(Some)
        .map_err(|source| ServeError::Setup { what, source })
}

/// The device: in the memory region the supervisor passed (a new one, or, with `--recover`,
/// the one a dead worker left there, adopted: then also what adopting it found), or in this
/// process's memory.
fn device_for(
    args: &ServeArgs,
    recover: Option<&(u32, u64, String)>,
    mut setup: DeviceSetup,
    disksize: u64,
) -> Result<(Device, Option<String>), ServeError> {
    let Some(fd) = args.worker_region_fd else {
        return Ok((setup.init(disksize)?, None));
    };
    let fd = crate::sys::take_inherited_fd(fd).map_err(|source| ServeError::Setup {
        what: "take the memory region from the supervisor",
        source,
    })?;
    let region = uzram_engine::Region::adopt(fd).map_err(|source| {
        ServeError::Device(uzram_engine::Error::RegionFailed {
            what: "adopting the memory region the supervisor passed",
            source,
        })
    })?;
    setup.set_region(region);
    if let Some(key) = inherited_key(args)? {
        setup.set_backing_key(key);
    }
    match recover {
        None => Ok((setup.init(disksize)?, None)),
        Some(&(id, _, ref cause)) => {
            let started = std::time::Instant::now();
            kmsg(&format!(
                "{}: successor {} adopting the device",
                crate::common::block_path(id),
                std::process::id()
            ));
            let (device, found) = setup.adopt(disksize).inspect_err(|e| {
                kmsg(&format!(
                    "{}: successor {} refuses the device: {e}",
                    crate::common::block_path(id),
                    std::process::id()
                ))
            })?;
            kmsg(&format!(
                "{}: successor {} adopted {} pages in {} ms",
                crate::common::block_path(id),
                std::process::id(),
                found.pages,
                started.elapsed().as_millis()
            ));
            let said = format!(
                "{}: adopted from the worker that ended ({}): {} pages, {} changes undone, {} orphaned objects freed, in {} ms",
                crate::common::block_path(id),
                cause,
                found.pages,
                found.undone,
                found.orphans,
                started.elapsed().as_millis()
            );
            Ok((device, Some(said)))
        }
    }
}

/// Starts freeing the pages of swap's freed slots on `block` as the probe reports them, or
/// says why only discards will.
fn watch_slot_frees(slot_free: Result<slotfree::Loaded, String>, block: &str) {
    match slot_free.and_then(|probe| probe.watch(block)) {
        Ok(()) => {}
        Err(why) => slotfree::discard_only(why),
    }
}

/// Queues a device gets unless told: at most this many, fewer on a machine with fewer CPUs.
/// Each queue is a thread with its own stack, codec streams and buffer, so a queue per CPU
/// would make the daemon's fixed cost grow with the machine; one thread compresses a page in
/// microseconds (lz4 about 0.6 GB/s), faster than swap writes, and two keep a read served
/// while a write compresses.
pub const DEFAULT_QUEUES: u16 = 2;

/// The number of queues: as asked, else [`DEFAULT_QUEUES`] (one on a machine with one CPU).
fn queues(args: &ServeArgs) -> u16 {
    args.queues.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(usize::from(DEFAULT_QUEUES)) as u16
    })
}

/// Turns off writeback throttling (wbt) on the device. zram, being bio-based, has none; on a
/// request-based ublk disk wbt holds reclaim's swap writes to a trickle (khugepaged blocked in
/// `wbt_wait` from `swap_writepage`), and a swap device must take reclaim's writes as fast as it
/// can.
fn disable_writeback_throttling(id: u32) {
    if let Err(e) = set_queue_attr(id, "wbt_lat_usec", "0") {
        log(&format!(
            "warning: cannot turn off writeback throttling ({e})"
        ));
    }
}

/// The block layer's request timeout set on the device, in milliseconds (the kernel's default
/// is 30 s). While a worker lives the ublk driver only rearms the timer when it fires; before
/// Linux 6.15 the timer is also what ends a dead worker's hold on a queue whose every tag it
/// had taken (a swap storm): until it fires, the quiesce the successor waits for cannot finish.
/// The timer is rounded up to a whole second, so half a second gives the kernel's side of a
/// takeover at most 1.5 s.
const REQUEST_TIMEOUT_MS: &str = "500";

/// Sets the device's request timeout to [`REQUEST_TIMEOUT_MS`] (see there).
fn shorten_request_timeout(id: u32) {
    if let Err(e) = set_queue_attr(id, "io_timeout", REQUEST_TIMEOUT_MS) {
        log(&format!(
            "warning: cannot set the request timeout ({e}); a worker's death in a swap storm may hold the device's I/O for 30 s"
        ));
    }
}

/// Writes `value` to the device's `queue/NAME`, unless it holds that already. Linux freezes
/// the queue around such a write (it waits for every request in flight and holds new ones): a
/// successor, which finds the values its predecessor set, must not do that in the middle of a
/// storm for nothing.
fn set_queue_attr(id: u32, name: &str, value: &str) -> Result<(), String> {
    let path = format!("/sys/block/ublkb{id}/queue/{name}");
    if std::fs::read_to_string(&path).is_ok_and(|now| now.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|e| format!("writing {value} to {path}: {e}"))
}

/// Points stdout at /dev/null: `uzram --find` has its answer and waits for its pipe to close.
fn redirect_stdout_to_null() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = crate::sys::redirect_stdout(&null);
    }
}
