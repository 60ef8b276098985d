//! `uzram serve` as a supervisor: it makes the device's memory region (a memfd, see
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
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uzram_engine::{Device, Region};

use super::{kmsg, log, ServeArgs, ServeError};
use crate::common::block_path;

pub(super) mod cgroup;
mod reserve;
mod signals;
mod workers;

pub(super) use cgroup::leave_service;
use reserve::{Reserve, Worker};
use signals::Flags;
pub use workers::check_region;
use workers::{first_line, spawn, Held, Role, SUCCESSOR_DEADLINE};

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
    if args.detached && args.log.is_none() {
        super::log::open_syslog();
    }
    // The options first: a bad one is named on any machine, the driver's absence only then. A
    // device taken over from the descriptor store keeps the options it was made with.
    if stored.is_none() {
        super::check_new(args)?;
    }
    let (setup, disksize) = super::configure(args)?;
    if !crate::common::have_ublk_driver() {
        return Err(ServeError::NoDriver);
    }
    match cgroup::protect_from_swap() {
        Ok(None) => {}
        Ok(Some(there)) => log(&format!(
            "moved into {there}, where its memory cannot be swapped (memory.swap.max 0)"
        )),
        Err(why) => log(&format!(
            "warning: {why}: while no worker maps the device's memory, reclaim could swap it out to the device itself, and a successor would wait for it forever; run uzram with memory.swap.max=0 (systemd: MemorySwapMax=0)"
        )),
    }
    let had_stored = stored.is_some();
    let stored = still_waiting(stored)?;
    if had_stored && stored.is_none() {
        // The stored device is gone: a new one is made, and checked as one.
        super::check_new(args)?;
    }
    let started = Instant::now();
    let size = Device::region_size(disksize)?;
    let (stored_id, stored_region, stored_key, reserve) = match stored {
        Some((s, reserve)) => (Some(s.id), Some(s.region), s.key, reserve),
        None => (None, None, None, None),
    };
    let region = match stored_region {
        Some(region) => region,
        None => new_region(size)?,
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
    super::pin::pin_memory()?;
    let key = match stored_id {
        // The predecessor's (a successor without it refuses the region, saying so).
        Some(_) => stored_key,
        None => new_key(&setup)?,
    };
    // The slot-free probe, for a new device: loaded now, while nothing waits for this process
    // (a successor started when a worker dies could not load one without memory). Where it
    // cannot be had, the first worker tries and says why; its successors go without.
    let probe = match (stored_id, args.device.slot_free) {
        (None, super::options::SlotFree::Probe) => {
            super::slotfree::load_fds(disksize.div_ceil(uzram_engine::PAGE_SIZE as u64))
                .inspect_err(|why| {
                    log(&format!(
                        "slot-free: the supervisor could not load the probe ({why}); a successor will free only what swap discards"
                    ));
                })
                .ok()
        }
        // A reserve that took over holds the probe the last supervisor loaded: kept here too,
        // so that the reserve's end is never the probe's (see `reserve::Found::take_probe`).
        _ => reserve.as_ref().and_then(reserve::Found::take_probe),
    };
    let held = Held { region, key, probe };
    let flags = Arc::new(Flags::default());
    let for_signals = held.try_clone().map_err(|source| ServeError::Setup {
        what: "hold the memory region",
        source,
    })?;
    signals::start(signals, Arc::clone(&flags), exe.clone(), for_signals)?;
    // The supervisor's stderr, for successors (see `spawn`).
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| ServeError::Setup {
            what: "keep stderr for successors",
            source,
        })?;
    let sup = Supervised {
        exe,
        held,
        stderr,
        flags,
        lifeline: new_lifeline(),
    };
    let (child, path, id) = sup.start_first(stored_id, reserve, started)?;
    // Under systemd: the region (and key) into the service's descriptor store, for a
    // supervisor systemd restarts should this one die.
    if let Err(e) = super::fdstore::store(id, &sup.held.region, sup.held.key.as_ref()) {
        log(&format!(
            "{path}: cannot hand systemd the device's memory region (FDSTORE): {e}; should this supervisor die, the device's I/O waits until `uzram --reset`"
        ));
    }
    // `uzram --find` may have gone: serving goes on without its answer.
    let _ = crate::common::output::outln(&path);
    if args.detached {
        super::redirect_stdout_to_null();
    }
    sup.restart_loop(child, &path, id, u64::from(stored_id.is_some()))
}

/// The device of the region systemd passed, if it still waits for a worker (quiesced), or if
/// the last supervisor's reserve serves it (then with that reserve); `None` (forgotten) if it
/// is gone; an error if something else still serves it.
fn still_waiting(
    stored: Option<super::fdstore::Stored>,
) -> Result<Option<(super::fdstore::Stored, Option<reserve::Found>)>, ServeError> {
    // A supervisor systemd restarted (this one's predecessor died; its workers with it) gets
    // the device's region back from the service's descriptor store, if the device is still
    // there (its I/O waits, or the reserve serves it): a successor takes it over. One deleted
    // meanwhile is forgotten.
    let Some(s) = stored else {
        return Ok(None);
    };
    // (looked for only where the unit asks for reserves: other processes are not looked at
    // while the device is held)
    if let Some(found) = reserve_enabled().then(|| reserve::find(s.id)).flatten() {
        if found.wait_serving(s.id) {
            return Ok(Some((s, Some(found))));
        }
        // Not serving in time: ended, so that no successor adopts the region beside it.
        if let Err(why) = found.stop() {
            return Err(ServeError::Worker(format!("{}: {why}", block_path(s.id))));
        }
    }
    match wait_quiesced(s.id) {
        Some(true) => Ok(Some((s, None))),
        // Served still (a worker of the last supervisor that did not die with it): adopting
        // the region under it would write into what it serves.
        Some(false) => Err(ServeError::Worker(format!(
            "systemd passed the region of {}, but the device is still served (not quiesced after {} s): not taking it over",
            block_path(s.id),
            QUIESCE_WAIT.as_secs()
        ))),
        None => {
            log(&format!(
                "systemd passed the region of {}, which is gone: a new device",
                block_path(s.id)
            ));
            super::fdstore::forget(s.id);
            Ok(None)
        }
    }
}

/// A new memory region for the device, as its descriptor: the supervisor maps nothing of it
/// (locked, a mapping would be populated whole).
fn new_region(size: uzram_engine::RegionSize) -> Result<OwnedFd, ServeError> {
    let region = Region::create("uzram", size).map_err(|source| {
        ServeError::Device(uzram_engine::Error::RegionFailed {
            what: "creating the device's memory region",
            source,
        })
    })?;
    region
        .fd()
        .try_clone_to_owned()
        .map_err(|source| ServeError::Setup {
            what: "hold the memory region",
            source,
        })
    // `region` (its mappings) goes here; the descriptor stays.
}

/// The backing store's key for a new device with one, drawn here (locked: after
/// `pin_memory`) so that every worker seals and opens records with the same one; it lives only
/// in memory.
fn new_key(setup: &uzram_engine::DeviceSetup) -> Result<Option<OwnedFd>, ServeError> {
    if setup.config().backing_devs.is_empty() {
        return Ok(None);
    }
    let key = uzram_engine::BackingKey::generate();
    crate::sys::sealed_secret(c"uzram-backing-key", key.as_bytes())
        .map(Some)
        .map_err(|source| ServeError::Setup {
            what: "keep the backing store's key in a sealed memfd",
            source,
        })
}

/// A supervisor past its start: what it starts workers with.
struct Supervised {
    exe: PathBuf,
    held: Held,
    /// The supervisor's stderr, for successors (see `spawn`).
    stderr: OwnedFd,
    flags: Arc<Flags>,
    /// The lifeline's read and write ends (see `daemon::standby`), under systemd with a
    /// descriptor store.
    lifeline: Option<(OwnedFd, OwnedFd)>,
}

/// Set (to 1) in a unit's environment to have its supervisor keep a reserve (opt-in while a
/// reserve's first writes can still fail for memory: docs/design/surviving-the-daemon.md).
const RESERVE_ENV: &str = "UZRAM_RESERVE";

/// Whether the unit asks for a reserve ([`RESERVE_ENV`]).
fn reserve_enabled() -> bool {
    std::env::var_os(RESERVE_ENV).is_some_and(|v| v == "1")
}

/// The lifeline for a reserve, where the device outlives this process in systemd's
/// descriptor store (elsewhere its workers outlive it: there is nothing for a reserve to do)
/// and the unit asks for one ([`RESERVE_ENV`]).
fn new_lifeline() -> Option<(OwnedFd, OwnedFd)> {
    if !super::fdstore::under_systemd() || !reserve_enabled() {
        return None;
    }
    crate::sys::pipe()
        .inspect_err(|e| {
            log(&format!(
                "no reserve (a pipe for its lifeline: {e}): should this supervisor die, the device waits for the one systemd starts next"
            ));
        })
        .ok()
}

impl Supervised {
    /// The first worker (a successor, for a device systemd passed back: `stored_id`; the
    /// last supervisor's reserve, where it serves that device), once it serves: it, its
    /// device's path and number.
    fn start_first(
        &self,
        stored_id: Option<u32>,
        reserve: Option<reserve::Found>,
        started: Instant,
    ) -> Result<(Worker, String, u32), ServeError> {
        if let (Some(id), Some(found)) = (stored_id, reserve) {
            // It serves on, as this supervisor's worker: nothing stops the device's I/O.
            let path = block_path(id);
            log(&format!(
                "{path}: its supervisor ended, its reserve (pid {}) took the device over, and systemd started this one with the device's memory region from its descriptor store: the reserve serves on as its worker, {} ms after this supervisor started",
                found.pid,
                started.elapsed().as_millis()
            ));
            self.flags.worker.store(found.pid, Ordering::SeqCst);
            self.flags.serving.store(found.pid, Ordering::SeqCst);
            return Ok((Worker::Adopted(found), path, id));
        }
        let role = match stored_id {
            Some(id) => Role::Successor(id, 1, "supervisor_restarted"),
            None => Role::First,
        };
        let mut child = match self.spawn(role) {
            Ok(child) => child,
            Err(e) => {
                if let Some(id) = stored_id {
                    give_up(id, &format!("no successor could be started: {e}"));
                }
                return Err(e);
            }
        };
        self.flags.worker.store(child.id(), Ordering::SeqCst);
        if self.flags.stopping.load(Ordering::SeqCst) {
            // A SIGTERM came before there was a worker to pass it to.
            crate::sys::kill(child.id(), libc::SIGTERM);
        }
        let deadline = stored_id.map(|_| SUCCESSOR_DEADLINE);
        let (path, id) = match first_line(&mut child, deadline) {
            Ok(served) => served,
            Err(msg) => {
                if let Some(id) = stored_id {
                    end(Some(child));
                    give_up(id, &format!("its successor failed: {msg}"));
                    return Err(ServeError::Worker(format!("{}: {msg}", block_path(id))));
                }
                // A first worker that could not add the device says so and exits.
                let _ = child.wait();
                return Err(ServeError::Worker(msg));
            }
        };
        self.flags.serving.store(child.id(), Ordering::SeqCst);
        if stored_id.is_some() {
            log(&format!(
                "{path}: its supervisor ended and systemd started this one with the device's memory region from its descriptor store; a successor (pid {}) serves it again, {} ms after this supervisor started",
                child.id(),
                started.elapsed().as_millis()
            ));
        }
        Ok((Worker::Own(child), path, id))
    }

    /// Waits for each worker's end, and starts its successor, until the device is deleted, handed
    /// over, or given up.
    fn restart_loop(
        &self,
        mut child: Worker,
        path: &str,
        id: u32,
        mut restarts: u64,
    ) -> Result<(), ServeError> {
        let flags = &self.flags;
        // A successor waits, started and pinned, so that taking over needs little new memory:
        // when a worker dies the device's I/O (swap's too) waits, and memory may be short.
        let mut standby = self.spawn(Role::Standby).ok();
        // And one outside the service, for this supervisor's own death (a reserve serving
        // as the worker outlives it: then none).
        let mut reserve = Reserve::new(None);
        if child.is_own() {
            reserve.replace(self.spawn_reserve(id));
        }
        let mut deaths: VecDeque<Instant> = VecDeque::new();
        loop {
            let status = child.wait(id).map_err(|source| ServeError::Setup {
                what: "wait for the worker",
                source,
            })?;
            flags.worker.store(0, Ordering::SeqCst);
            flags.serving.store(0, Ordering::SeqCst);
            // Whether the standby was ready when the worker died (looked at before anything
            // else, so that one that became ready meanwhile is not taken for ready then).
            let unready = standby.as_mut().is_some_and(|s| !workers::standby_ready(s));
            let Some((why, died)) =
                self.after_death(status, path, id, &mut standby, &mut deaths)?
            else {
                if flags.handing_over.load(Ordering::SeqCst) {
                    // It serves the device until the supervisor systemd starts next, which
                    // keeps it as its worker.
                    reserve.leave();
                }
                return Ok(());
            };
            restarts += 1;
            let dead = child.id();
            let mut next = self.successor(standby.take(), id, restarts, &why)?;
            kmsg(&format!(
                "{path}: worker {dead} ended ({why}); successor {} started",
                next.id()
            ));
            flags.worker.store(next.id(), Ordering::SeqCst);
            if flags.stopping.load(Ordering::SeqCst) {
                crate::sys::kill(next.id(), libc::SIGTERM);
            }
            if let Err(msg) = first_line(&mut next, Some(SUCCESSOR_DEADLINE)) {
                end(Some(next));
                give_up(id, &format!("its successor failed: {msg}"));
                return Err(ServeError::Worker(format!("{path}: {msg}")));
            }
            child = Worker::Own(next);
            log(&format!(
                "{path}: its worker (pid {dead}) ended ({why}); a successor (pid {}, restart {restarts}) serves it again, {} ms after the last one ended{}",
                child.id(),
                died.elapsed().as_millis(),
                if unready {
                    " (the standby was still starting: it finished starting while the device waited)"
                } else {
                    ""
                }
            ));
            flags.upgrading.store(false, Ordering::SeqCst);
            flags.serving.store(child.id(), Ordering::SeqCst);
            standby = self.spawn(Role::Standby).ok();
            if why == "upgrade" || reserve.is_none() {
                // The old binary's reserve makes way for the new one's; a reserve that served
                // as the worker is replaced.
                reserve.replace(self.spawn_reserve(id));
            }
        }
    }

    /// What a worker's end (`status`) calls for: why it ended and when (seen), when a successor
    /// is wanted; `None` when the supervisor is done (the device deleted, handed over, or given up after
    /// a stop); an error when workers keep dying.
    fn after_death(
        &self,
        status: ExitStatus,
        path: &str,
        id: u32,
        standby: &mut Option<Child>,
        deaths: &mut VecDeque<Instant>,
    ) -> Result<Option<(String, Instant)>, ServeError> {
        let flags = &self.flags;
        if status.success() {
            // The worker deleted the device (a reset, SIGTERM): nothing left to hold.
            super::fdstore::forget(id);
            return Ok(None);
        }
        if flags.handing_over.load(Ordering::SeqCst) {
            // `systemctl restart`: the device waits, its I/O held, for the supervisor systemd
            // starts next with the region from the descriptor store. The standby goes (it
            // would die with this process anyway).
            end(standby.take());
            log(&format!(
                "{path}: its worker ended ({}); the device waits for the supervisor systemd starts next",
                cause(status)
            ));
            return Ok(None);
        }
        if flags.stopping.load(Ordering::SeqCst) {
            // Asked to stop, but the worker did not delete the device (it was killed, or
            // crashed, first): no successor is wanted, and its I/O must not wait for one.
            give_up(
                id,
                &format!(
                    "the supervisor was stopping and the worker ended ({})",
                    cause(status)
                ),
            );
            return Ok(None);
        }
        let died = Instant::now();
        let why = if flags.upgrading.load(Ordering::SeqCst) {
            // The standby runs the old binary: the new one takes over.
            end(standby.take());
            "upgrade".to_string()
        } else {
            deaths.push_back(died);
            cause(status)
        };
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
        Ok(Some((why, died)))
    }

    /// The successor of a dead worker: the standby, told to go (nothing between the death and
    /// the successor serving may wait for the device: not even a log line, whose file's pages
    /// may be in swap on it), else one started now.
    fn successor(
        &self,
        standby: Option<Child>,
        id: u32,
        restarts: u64,
        why: &str,
    ) -> Result<Child, ServeError> {
        let told = standby.and_then(|mut s| {
            use std::io::Write;
            let told = s
                .stdin
                .take()
                .is_some_and(|mut pipe| writeln!(pipe, "go {id} {restarts} {why}").is_ok());
            if told {
                Some(s)
            } else {
                // A standby that cannot be told (it died): reaped, not left a zombie.
                end(Some(s));
                None
            }
        });
        match told {
            Some(s) => Ok(s),
            None => self
                .spawn(Role::Successor(id, restarts, why))
                .inspect_err(|e| give_up(id, &format!("no successor could be started: {e}"))),
        }
    }

    fn spawn(&self, role: Role<'_>) -> Result<Child, ServeError> {
        let lifeline = self.lifeline.as_ref().map(|(_, write)| write);
        spawn(&self.exe, &self.held, &self.stderr, lifeline, role)
    }

    /// A reserve for device `id` (see `daemon::standby`), where there is a lifeline.
    fn spawn_reserve(&self, id: u32) -> Option<Child> {
        let (read, _) = self.lifeline.as_ref()?;
        let started = read
            .try_clone()
            .map_err(|source| ServeError::Setup {
                what: "pass the lifeline on",
                source,
            })
            .and_then(|end| self.spawn(Role::Reserve(id, end)));
        match started {
            Ok(child) => Some(child),
            Err(e) => {
                log(&format!(
                    "{}: no reserve ({e}): should this supervisor die, the device waits for the one systemd starts next",
                    block_path(id)
                ));
                None
            }
        }
    }
}

/// Kills and reaps a worker that is not wanted (a standby).
fn end(worker: Option<Child>) {
    if let Some(mut w) = worker {
        let _ = w.kill();
        let _ = w.wait();
    }
}
