//! `uzram serve` as a supervisor (issue 15): it makes the device's memory region (a memfd, see
//! `uzram_engine::Region`), starts a worker (`uzram serve --worker-region-fd N ...`, the daemon
//! that serves the device) with the region's descriptor, and holds that descriptor for as long
//! as the device lives. When the worker dies (a bug, `kill -9`), the kernel holds the device's
//! I/O (the worker added it with `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`) and the
//! supervisor starts a successor with `--recover N`: it adopts the device from the region (every
//! page as it was) before it takes the device over, and the held I/O is served, the requests
//! the dead worker had taken reissued.
//!
//! The supervisor serves no I/O and allocates nothing on any I/O path; it is locked in memory
//! and kept from the OOM killer like the worker, because the device's I/O waits for it while no
//! worker runs. It gives up, and deletes the device (its I/O then fails, it never reads
//! wrong), when a successor refuses the region (it says why) or when workers die faster than
//! [`MAX_QUICK_DEATHS`] in [`DEATH_WINDOW`].

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uzram_engine::{Device, Region};

use super::{kmsg, log, ServeArgs, ServeError};
use crate::common::block_path;

/// Worker deaths within [`DEATH_WINDOW`] after which the supervisor stops restarting: a worker
/// that crashes on a request it is reissued after every restart would otherwise hold the
/// device's I/O for good. (A successor that ends before it serves stops the restarts at once.)
/// Ten kills of the worker in half a minute (the VM's `recover10`) stay below it.
const MAX_QUICK_DEATHS: usize = 20;
/// See [`MAX_QUICK_DEATHS`].
const DEATH_WINDOW: Duration = Duration::from_secs(60);

/// Why a worker ended, as one word (for `uzram_stat` and the listing).
fn cause(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit_status_{code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGKILL => "SIGKILL".to_string(),
                libc::SIGSEGV => "SIGSEGV".to_string(),
                libc::SIGABRT => "SIGABRT".to_string(),
                libc::SIGBUS => "SIGBUS".to_string(),
                libc::SIGTERM => "SIGTERM".to_string(),
                n => format!("signal_{n}"),
            };
            format!("killed_by_{name}")
        }
        _ => "unknown".to_string(),
    }
}

/// How a worker starts.
enum Role<'a> {
    /// The first: it adds the device.
    First,
    /// A successor ahead of need: it waits, pinned, for `go` on its stdin (a pipe).
    Standby,
    /// A successor started after the death (when no standby was there).
    Successor(u32, u64, &'a str),
}

/// What the supervisor holds for its workers across their deaths: the device's memory region
/// and, for a device with a backing store, the key of its records (a sealed memfd, mapped and
/// locked here: never written to a file, never swapped out).
struct Held {
    region: OwnedFd,
    key: Option<OwnedFd>,
    /// The slot-free probe, loaded before the first worker: a successor takes it over as it
    /// is, marks and all, instead of loading one while the device waits for it.
    probe: Option<super::slotfree::Descriptors>,
}

impl Held {
    fn try_clone(&self) -> std::io::Result<Held> {
        Ok(Held {
            region: self.region.try_clone()?,
            key: self.key.as_ref().map(OwnedFd::try_clone).transpose()?,
            probe: self
                .probe
                .as_ref()
                .map(|p| -> std::io::Result<_> {
                    Ok(super::slotfree::Descriptors {
                        link: p.link.try_clone()?,
                        map: p.map.try_clone()?,
                    })
                })
                .transpose()?,
        })
    }

    /// The descriptors passed on: the region's, the key's, and with `probe` the probe's.
    fn fds(&self, probe: bool) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        std::iter::once(self.region.as_fd())
            .chain(self.key.as_ref().map(OwnedFd::as_fd))
            .chain(
                self.probe
                    .iter()
                    .filter(move |_| probe)
                    .flat_map(|p| [p.link.as_fd(), p.map.as_fd()]),
            )
    }

    /// Adds the descriptors to `cmd`'s arguments and lets it inherit them; [`Held::keep`]
    /// once it started.
    /// On an error nothing stays inheritable.
    /// `probe`: the slot-free probe's too (not to the binary a supervisor systemd restarts
    /// will run: that supervisor loads none, so its workers are never given one).
    fn pass_on(&self, cmd: &mut Command, probe: bool) -> std::io::Result<()> {
        cmd.arg("--worker-region-fd")
            .arg(self.region.as_raw_fd().to_string());
        if let Some(key) = &self.key {
            cmd.arg("--worker-key-fd").arg(key.as_raw_fd().to_string());
        }
        if let Some(probe) = self.probe.as_ref().filter(|_| probe) {
            cmd.arg("--worker-probe-link-fd")
                .arg(probe.link.as_raw_fd().to_string())
                .arg("--worker-probe-map-fd")
                .arg(probe.map.as_raw_fd().to_string())
                .arg("--worker-probe-protocol")
                .arg(super::slotfree::PROTOCOL);
        }
        let passed = self.fds(probe).try_for_each(crate::sys::set_inheritable);
        if passed.is_err() {
            self.keep();
        }
        passed
    }

    /// Only the program just started inherits them: nothing else this process starts should
    /// hold the region or the key.
    fn keep(&self) {
        for fd in self.fds(true) {
            let _ = crate::sys::set_cloexec(fd);
        }
    }
}

/// Starts a worker: this program with the supervisor's own arguments, the region's descriptor
/// (and the key's), and for a successor the device to take over and the restarts so far. Its
/// stdout is a pipe: its first line says the device it serves, or why it could not.
fn spawn(exe: &Path, held: &Held, log: &OwnedFd, role: Role<'_>) -> Result<Child, ServeError> {
    let setup = |what, source| ServeError::Setup { what, source };
    let own: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd = Command::new(exe);
    cmd.args(own);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let successor = match role {
        Role::First => false,
        Role::Standby => {
            cmd.arg("--standby").stdin(Stdio::piped());
            true
        }
        Role::Successor(id, restarts, last) => {
            cmd.args(["--recover", &id.to_string()])
                .args(["--restarts", &restarts.to_string()])
                .args(["--last-restart", last]);
            true
        }
    };
    if successor {
        // A successor's messages wait until it serves: until then its stderr is /dev/null, and
        // the supervisor's stderr is handed over as --log-fd.
        cmd.arg("--log-fd")
            .arg(log.as_raw_fd().to_string())
            .stderr(Stdio::null());
        crate::sys::set_inheritable(log.as_fd()).map_err(|e| setup("pass stderr on", e))?;
    }
    if super::fdstore::under_systemd() {
        // systemd keeps the region for the supervisor's successor (`fdstore`): a worker that
        // outlived this process would hold the restart up (until the unit's stop timeout,
        // with KillMode=mixed; with the default KillMode it would get SIGTERM, which deletes
        // the device). It dies at once instead, the device quiesced, its I/O waiting.
        cmd.arg("--die-with-supervisor")
            .arg(std::process::id().to_string())
            .env_remove("NOTIFY_SOCKET");
    }
    let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
    held.pass_on(&mut cmd, true)
        .map_err(|e| setup("pass the region on", e))?;
    let child = cmd.spawn().map_err(|e| setup("start the worker", e));
    held.keep();
    let _ = crate::sys::set_cloexec(log.as_fd());
    child
}

/// How long a successor may take to serve again before the supervisor gives up on it (and on
/// the device): adopting a large pool under emulation takes seconds, and the kernel may hold
/// `START_USER_RECOVERY` off for up to 30 s while it requeues the dead worker's requests.
const SUCCESSOR_DEADLINE: Duration = Duration::from_secs(120);

/// The worker's first line: the device it serves (`/dev/ublkbN`), or its error; within
/// `deadline` if one is given (else an error saying so).
fn first_line(child: &mut Child, deadline: Option<Duration>) -> Result<(String, u32), String> {
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        if let Some(d) = deadline {
            // An error of poll reads as ready: the read below reports what is wrong.
            if !crate::sys::wait_readable(out.as_fd(), d).unwrap_or(true) {
                return Err(format!("it did not serve within {} s", d.as_secs()));
            }
        }
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let line = line.trim_end().to_string();
    let id = line
        .strip_prefix("/dev/ublkb")
        .and_then(|n| n.parse::<u32>().ok());
    match id {
        Some(id) => Ok((line, id)),
        None => Err(match line.strip_prefix("error: ") {
            Some(msg) => msg.to_string(),
            None => format!(
                "the worker ended ({}) without serving",
                child
                    .try_wait()
                    .ok()
                    .flatten()
                    .map_or("still running".to_string(), cause)
            ),
        }),
    }
}

/// Whether this process's memory cgroup, or one above it, forbids swap (`memory.swap.max` 0):
/// then the region's pages are never swapped out, also while no worker maps them (locked).
/// Otherwise, why not.
fn swap_forbidden() -> Result<(), String> {
    let cgroups = crate::common::read_text(std::path::Path::new("/proc/self/cgroup"), 1 << 16)
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let Some(own) = cgroups.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Err("it is in no cgroup v2 hierarchy".to_string());
    };
    let mut dir = std::path::PathBuf::from("/sys/fs/cgroup");
    dir.push(own.trim_start_matches('/'));
    loop {
        let max = std::fs::read_to_string(dir.join("memory.swap.max")).unwrap_or_default();
        if max.trim() == "0" {
            return Ok(());
        }
        if dir == std::path::Path::new("/sys/fs/cgroup") || !dir.pop() {
            return Err(format!(
                "its cgroup {own} lets its memory be swapped (memory.swap.max is not 0 there or above)"
            ));
        }
    }
}

/// How long a new binary may take to say whether it could take the device over.
const CHECK_DEADLINE: Duration = Duration::from_secs(30);

/// Asks the binary at `exe` (`--check-region`) whether it could take the device in `region`
/// over: its answer, or why not. It changes nothing; the worker keeps serving either way.
/// `probe`: passed the slot-free probe's descriptors too, as its workers would be.
fn check_binary(exe: &Path, held: &Held, probe: bool) -> Result<(), String> {
    let own: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd = Command::new(exe);
    cmd.args(own)
        .arg("--check-region")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = {
        let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
        held.pass_on(&mut cmd, probe)
            .map_err(|e| format!("cannot pass the region on: {e}"))?;
        let child = cmd.spawn();
        held.keep();
        child
    };
    let mut child = child.map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    // Its answer within CHECK_DEADLINE: the signal thread that asks is also the one that
    // handles SIGTERM.
    let answered = child
        .stdout
        .as_ref()
        .is_some_and(|o| crate::sys::wait_readable(o.as_fd(), CHECK_DEADLINE).unwrap_or(true));
    if !answered {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "{} did not answer within {} s",
            exe.display(),
            CHECK_DEADLINE.as_secs()
        ));
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot hear {}: {e}", exe.display()))?;
    let said = String::from_utf8_lossy(&out.stdout);
    let first = said.lines().next().unwrap_or("");
    if out.status.success() && first == "ok" {
        return Ok(());
    }
    let why = match first.strip_prefix("error: ") {
        Some(msg) => msg.to_string(),
        None => String::from_utf8_lossy(&out.stderr)
            .trim()
            .trim_start_matches("uzram: ")
            .to_string(),
    };
    Err(format!(
        "{} ({}): {why}",
        exe.display(),
        cause(out.status).replace('_', " ")
    ))
}

/// `--check-region` (see [`ServeArgs::check_region`]): whether this binary could take the device
/// in the region over; prints `ok`.
pub fn check_region(args: &ServeArgs) -> Result<(), ServeError> {
    let (mut setup, disksize) = super::configure(args)?;
    if let Some(key) = super::inherited_key(args)? {
        setup.set_backing_key(key);
    }
    let fd = args
        .worker_region_fd
        .ok_or_else(|| ServeError::Worker("--check-region needs --worker-region-fd".to_string()))?;
    let fd = crate::sys::take_inherited_fd(fd).map_err(|source| ServeError::Setup {
        what: "take the memory region from the supervisor",
        source,
    })?;
    Device::check_adoptable(setup.config(), disksize, fd.as_fd())?;
    let _ = crate::common::output::outln("ok");
    Ok(())
}

/// How long a supervisor systemd restarted waits for its device to be quiesced (the last
/// supervisor's workers die with it, and the kernel quiesces the device once their
/// descriptors are closed).
const QUIESCE_WAIT: Duration = Duration::from_secs(10);

/// Whether device `id` is quiesced (its I/O waiting for a daemon), waiting up to
/// [`QUIESCE_WAIT`] for it to be; `None` if it is gone.
fn wait_quiesced(id: u32) -> Option<bool> {
    let start = Instant::now();
    loop {
        let quiesced = super::ublk::is_quiesced(id)?;
        if quiesced || start.elapsed() >= QUIESCE_WAIT {
            return Some(quiesced);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Held while a program is started with the region's (and key's) descriptors inheritable
/// ([`Held::pass_on`] to [`Held::keep`]): the main thread starts workers, the signal thread
/// asks binaries and systemctl, and neither may start a program while the other has the
/// descriptors open to inheritance (or closed to it).
static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The device has to go: its I/O fails from now on (no worker can serve it right).
fn give_up(id: u32, why: &str) {
    // The device first: until it is gone, a log line could wait for it (the log file's pages
    // may be in swap on it).
    let removed = super::ublk::remove_dead(id);
    super::fdstore::forget(id);
    log(&format!(
        "{}: not restarting its worker: {why}; deleted the device (its I/O fails)",
        block_path(id)
    ));
    if let Err(e) = removed {
        log(&format!("{}: {e}", block_path(id)));
    }
}

/// `uzram serve`: supervises workers until the device is deleted (a worker ended cleanly: a
/// reset, SIGTERM) or the supervisor gives up.
pub fn supervise(args: &ServeArgs) -> Result<(), ServeError> {
    // First, before any thread: it unsets LISTEN_FDS and the like. What cannot be one device's
    // is dropped (and systemd asked to drop it too): a new device.
    let stored = super::fdstore::take_stored().unwrap_or_else(|why| {
        log(&format!("{why}: not taking any device over"));
        None
    });
    if !crate::common::have_ublk_driver() {
        return Err(ServeError::NoDriver);
    }
    if args.detached && args.log.is_none() {
        super::log::open_syslog();
    }
    let (setup, disksize) = super::configure(args)?;
    if let Err(why) = swap_forbidden() {
        log(&format!(
            "warning: {why}: while no worker maps the device's memory, reclaim could swap it out to the device itself, and a successor would wait for it forever; run uzram with memory.swap.max=0 (systemd: MemorySwapMax=0, as contrib/systemd/uzram-setup.service has)"
        ));
    }
    // A supervisor systemd restarted (this one's predecessor died; its workers with it) gets
    // the device's region back from the service's descriptor store, if the device is still
    // there (its I/O waits): a successor takes it over. One deleted meanwhile is forgotten.
    let stored = match stored {
        Some(s) => match wait_quiesced(s.id) {
            Some(true) => Some(s),
            Some(false) => {
                // Served still (a worker of the last supervisor that did not die with it):
                // adopting the region under it would write into what it serves.
                return Err(ServeError::Worker(format!(
                    "systemd passed the region of {}, but the device is still served (not quiesced after {} s): not taking it over",
                    block_path(s.id),
                    QUIESCE_WAIT.as_secs()
                )));
            }
            None => {
                log(&format!(
                    "systemd passed the region of {}, which is gone: a new device",
                    block_path(s.id)
                ));
                super::fdstore::forget(s.id);
                None
            }
        },
        None => None,
    };
    let started = Instant::now();
    let size = Device::region_size(disksize)?;
    let (stored_id, stored_region, stored_key) = match stored {
        Some(s) => (Some(s.id), Some(s.region), s.key),
        None => (None, None, None),
    };
    // Only its descriptor is kept: the supervisor maps nothing of it (locked below, a mapping
    // would be populated whole).
    let region: OwnedFd = if let Some(region) = stored_region {
        region
    } else {
        let region = Region::create("uzram", size).map_err(|e| {
            ServeError::Device(uzram_engine::Error::Region {
                reason: e.to_string(),
            })
        })?;
        region
            .fd()
            .try_clone_to_owned()
            .map_err(|source| ServeError::Setup {
                what: "hold the memory region",
                source,
            })?
        // `region` (its mappings) goes here; the descriptor stays.
    };
    // This binary as it was started: after a package upgrade replaced the file, the path names
    // the new one (what `uzram upgrade` and later restarts start), `/proc/self/exe` the old.
    let exe: PathBuf = std::env::current_exe().map_err(|source| ServeError::Setup {
        what: "find my own binary",
        source,
    })?;
    let signals = crate::sys::BlockedSignals::block(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1])
        .map_err(|source| ServeError::Setup {
            what: "block SIGTERM/SIGINT/SIGUSR1",
            source,
        })?;
    // Never waits for the device's I/O to reclaim memory: while no worker runs, that I/O
    // waits for the supervisor (and its signal thread, started below, is one too).
    super::io_flusher()?;
    super::pin_memory()?;
    // The backing store's key, drawn here (locked: `pin_memory` above) so that every worker
    // seals and opens records with the same one; it lives only in memory.
    let key = if stored_id.is_some() {
        // The predecessor's (a successor without it refuses the region, saying so).
        stored_key
    } else if setup.config().backing_devs.is_empty() {
        None
    } else {
        let key = uzram_engine::BackingKey::generate();
        Some(
            crate::sys::sealed_secret(c"uzram-backing-key", key.as_bytes()).map_err(|source| {
                ServeError::Setup {
                    what: "keep the backing store's key in a sealed memfd",
                    source,
                }
            })?,
        )
    };
    // The slot-free probe, for a new device: loaded now, while nothing waits for this process
    // (a successor started when a worker dies could not load one without memory). Where it
    // cannot be had, the first worker tries and says why; its successors go without.
    let probe = match (stored_id, args.device.slot_free) {
        (None, super::options::SlotFree::Probe) => {
            super::slotfree::load_fds(disksize.div_ceil(uzram_engine::PAGE_SIZE as u64)).ok()
        }
        _ => None,
    };
    let held = Held { region, key, probe };
    // The running worker (0 between two), for signals; the one that serves (0 while one starts),
    // for upgrades.
    let worker = Arc::new(AtomicU32::new(0));
    let serving = Arc::new(AtomicU32::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    // Set on SIGTERM while systemd restarts the service: the device is handed to the supervisor
    // systemd starts next (see `fdstore`), not deleted.
    let handing_over = Arc::new(AtomicBool::new(false));
    let upgrading = Arc::new(AtomicBool::new(false));
    {
        let (worker, serving, stopping, upgrading, handing_over) = (
            Arc::clone(&worker),
            Arc::clone(&serving),
            Arc::clone(&stopping),
            Arc::clone(&upgrading),
            Arc::clone(&handing_over),
        );
        let (exe, held) = (
            exe.clone(),
            held.try_clone().map_err(|source| ServeError::Setup {
                what: "hold the memory region",
                source,
            })?,
        );
        // SIGTERM or SIGINT to the supervisor ends the device as one to the worker does: the
        // worker deletes it and exits, and the supervisor with it. SIGUSR1 (`uzram upgrade`)
        // hands the device to the binary now at this program's path: checked first, then the
        // worker is stopped, and the main loop starts that binary as its successor.
        std::thread::Builder::new()
            .name("uzram-signals".into())
            .spawn(move || loop {
                let sig = signals.wait();
                if sig != libc::SIGUSR1 {
                    // `systemctl restart` of a uzram@ service: the device goes to the
                    // supervisor systemd starts next, with its pages, if the binary it will
                    // run can take it over (as `uzram upgrade` checks); else it is deleted, as
                    // a stop deletes it.
                    let pid = serving.load(Ordering::SeqCst);
                    if sig == libc::SIGTERM
                        && pid != 0
                        && !stopping.load(Ordering::SeqCst)
                        && !upgrading.load(Ordering::SeqCst)
                        && {
                            let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
                            super::fdstore::restarting()
                        }
                    {
                        match check_binary(&exe, &held, false) {
                            Ok(()) if serving.load(Ordering::SeqCst) == pid => {
                                log(&format!(
                                    "systemd restarts the service: handing the device over to the supervisor it starts next ({} can take it over); stopping worker {pid}",
                                    exe.display()
                                ));
                                handing_over.store(true, Ordering::SeqCst);
                                stopping.store(true, Ordering::SeqCst);
                                crate::sys::kill(pid, libc::SIGKILL);
                                continue;
                            }
                            Ok(()) => log("systemd restarts the service, but the worker changed meanwhile: deleting the device"),
                            Err(why) => log(&format!(
                                "systemd restarts the service, but the binary it will run cannot take the device over ({why}): deleting the device"
                            )),
                        }
                    }
                    stopping.store(true, Ordering::SeqCst);
                    crate::sys::kill(worker.load(Ordering::SeqCst), sig);
                    continue;
                }
                // Only a worker that serves is stopped for an upgrade: one still starting (a
                // successor adopting the device) is left to finish.
                let pid = serving.load(Ordering::SeqCst);
                if pid == 0 || upgrading.load(Ordering::SeqCst) || stopping.load(Ordering::SeqCst)
                {
                    log("upgrade: not now (a worker is starting, the device is stopping, or an upgrade is under way)");
                    continue;
                }
                match check_binary(&exe, &held, true) {
                    // The same worker still serves (it did not die, and no other took over,
                    // while the new binary was asked).
                    Ok(()) if serving.load(Ordering::SeqCst) == pid => {
                        log(&format!(
                            "upgrade: {} can take the device over; stopping worker {pid}",
                            exe.display()
                        ));
                        upgrading.store(true, Ordering::SeqCst);
                        if let Err(e) = crate::sys::send_signal(pid, libc::SIGKILL) {
                            upgrading.store(false, Ordering::SeqCst);
                            log(&format!("upgrade: cannot stop worker {pid}: {e}"));
                        }
                    }
                    Ok(()) => log(&format!(
                        "upgrade: worker {pid} ended while the new binary was asked; not now"
                    )),
                    Err(why) => log(&format!(
                        "upgrade refused, worker {pid} goes on serving: {why}"
                    )),
                }
            })
            .map_err(|source| ServeError::Setup {
                what: "start the signal thread",
                source,
            })?;
    }

    // The supervisor's stderr, for successors (see `spawn`).
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| ServeError::Setup {
            what: "keep stderr for successors",
            source,
        })?;
    let role = match stored_id {
        Some(id) => Role::Successor(id, 1, "supervisor_restarted"),
        None => Role::First,
    };
    let mut child = match spawn(&exe, &held, &stderr, role) {
        Ok(child) => child,
        Err(e) => {
            if let Some(id) = stored_id {
                give_up(id, &format!("no successor could be started: {e}"));
            }
            return Err(e);
        }
    };
    worker.store(child.id(), Ordering::SeqCst);
    if stopping.load(Ordering::SeqCst) {
        // A SIGTERM came before there was a worker to pass it to.
        crate::sys::kill(child.id(), libc::SIGTERM);
    }
    let deadline = stored_id.map(|_| SUCCESSOR_DEADLINE);
    let (path, id) = match first_line(&mut child, deadline) {
        Ok(served) => served,
        Err(msg) => {
            if let Some(id) = stored_id {
                let _ = child.kill();
                let _ = child.wait();
                give_up(id, &format!("its successor failed: {msg}"));
                return Err(ServeError::Worker(format!("{}: {msg}", block_path(id))));
            }
            let _ = child.wait();
            return Err(ServeError::Worker(msg));
        }
    };
    serving.store(child.id(), Ordering::SeqCst);
    if stored_id.is_some() {
        log(&format!(
            "{path}: its supervisor ended and systemd started this one with the device's memory region from its descriptor store; a successor (pid {}) serves it again, {} ms after this supervisor started",
            child.id(),
            started.elapsed().as_millis()
        ));
    }
    // Under systemd: the region (and key) into the service's descriptor store, for a
    // supervisor systemd restarts should this one die.
    if let Err(e) = super::fdstore::store(id, &held.region, held.key.as_ref()) {
        log(&format!(
            "{path}: cannot hand systemd the device's memory region (FDSTORE): {e}; should this supervisor die, the device's I/O waits until `uzram --reset`"
        ));
    }
    // `uzram --find` may have gone: serving goes on without its answer.
    let _ = crate::common::output::outln(&path);
    if args.detached {
        super::redirect_stdout_to_null();
    }
    // A successor waits, started and pinned, so that taking over needs little new memory: when
    // a worker dies the device's I/O (swap's too) waits, and memory may be short.
    let mut standby = spawn(&exe, &held, &stderr, Role::Standby).ok();
    let mut restarts = u64::from(stored_id.is_some());
    let mut deaths: VecDeque<Instant> = VecDeque::new();
    loop {
        let status = child.wait().map_err(|source| ServeError::Setup {
            what: "wait for the worker",
            source,
        })?;
        worker.store(0, Ordering::SeqCst);
        serving.store(0, Ordering::SeqCst);
        if status.success() {
            // The worker deleted the device (a reset, SIGTERM): nothing left to hold.
            super::fdstore::forget(id);
            return Ok(());
        }
        if handing_over.load(Ordering::SeqCst) {
            // `systemctl restart`: the device waits, its I/O held, for the supervisor systemd
            // starts next with the region from the descriptor store. The standby goes (it
            // would die with this process anyway).
            if let Some(mut old) = standby.take() {
                let _ = old.kill();
                let _ = old.wait();
            }
            log(&format!(
                "{path}: its worker ended ({}); the device waits for the supervisor systemd starts next",
                cause(status)
            ));
            return Ok(());
        }
        if stopping.load(Ordering::SeqCst) {
            // Asked to stop, but the worker did not delete the device (it was killed, or
            // crashed, first): no successor is wanted, and its I/O must not wait for one.
            give_up(
                id,
                &format!(
                    "the supervisor was stopping and the worker ended ({})",
                    cause(status)
                ),
            );
            return Ok(());
        }
        let died = Instant::now();
        let upgrade = upgrading.load(Ordering::SeqCst);
        let why = if upgrade {
            "upgrade".to_string()
        } else {
            cause(status)
        };
        if upgrade {
            // The standby runs the old binary: the new one takes over.
            if let Some(mut old) = standby.take() {
                let _ = old.kill();
                let _ = old.wait();
            }
        } else {
            deaths.push_back(died);
        }
        while deaths
            .front()
            .is_some_and(|&t| died.duration_since(t) > DEATH_WINDOW)
        {
            deaths.pop_front();
        }
        if deaths.len() > MAX_QUICK_DEATHS {
            give_up(
                id,
                &format!(
                    "{} workers ended within {} s, the last {why}",
                    deaths.len(),
                    DEATH_WINDOW.as_secs()
                ),
            );
            return Err(ServeError::Worker(format!(
                "{path}: workers keep dying ({why})"
            )));
        }
        restarts += 1;
        let dead = child.id();
        // Nothing between the death and the successor serving may wait for the device: not even
        // a log line (the log file's pages may be in swap on it). So the successor first.
        let told = standby.take().and_then(|mut s| {
            use std::io::Write;
            let told = s
                .stdin
                .take()
                .is_some_and(|mut pipe| writeln!(pipe, "go {id} {restarts} {why}").is_ok());
            if told {
                Some(s)
            } else {
                // A standby that cannot be told (it died): reaped, not left a zombie.
                let _ = s.kill();
                let _ = s.wait();
                None
            }
        });
        child = match told {
            Some(s) => s,
            None => match spawn(&exe, &held, &stderr, Role::Successor(id, restarts, &why)) {
                Ok(c) => c,
                Err(e) => {
                    give_up(id, &format!("no successor could be started: {e}"));
                    return Err(e);
                }
            },
        };
        kmsg(&format!(
            "{path}: worker {dead} ended ({why}); successor {} started",
            child.id()
        ));
        worker.store(child.id(), Ordering::SeqCst);
        if stopping.load(Ordering::SeqCst) {
            crate::sys::kill(child.id(), libc::SIGTERM);
        }
        match first_line(&mut child, Some(SUCCESSOR_DEADLINE)) {
            Ok(_) => {
                let took = died.elapsed().as_millis();
                log(&format!(
                    "{path}: its worker (pid {dead}) ended ({why}); a successor (pid {}, restart {restarts}) serves it again, {took} ms after the last one ended",
                    child.id()
                ));
                upgrading.store(false, Ordering::SeqCst);
                serving.store(child.id(), Ordering::SeqCst);
                standby = spawn(&exe, &held, &stderr, Role::Standby).ok();
            }
            Err(msg) => {
                let _ = child.kill();
                let _ = child.wait();
                give_up(id, &format!("its successor failed: {msg}"));
                return Err(ServeError::Worker(format!("{path}: {msg}")));
            }
        }
    }
}
