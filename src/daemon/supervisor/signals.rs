//! The supervisor's signal thread: SIGTERM or SIGINT ends the device as one to the worker does
//! (the worker deletes it and exits, and the supervisor with it), unless systemd restarts the
//! service and the binary it will run can take the device over; SIGUSR1 (`uzram upgrade`)
//! hands the device to the binary now at this program's path: checked first, then the worker
//! is stopped, and the main loop starts that binary as its successor.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use super::workers::{check_binary, Held, SPAWNING};
use crate::common::{upgrade_note_path, RUN_DIR, UPGRADE_ACCEPTED, UPGRADE_REFUSED};
use crate::daemon::{fdstore, log, ServeError};

/// What the signal thread and the main loop share.
#[derive(Debug, Default)]
pub(super) struct Flags {
    /// The running worker (0 between two), for signals.
    pub worker: AtomicU32,
    /// The worker that serves (0 while one starts), for upgrades.
    pub serving: AtomicU32,
    /// Asked to stop: no successor is wanted.
    pub stopping: AtomicBool,
    /// Set on SIGTERM while systemd restarts the service: the device is handed to the
    /// supervisor systemd starts next (see `fdstore`), not deleted.
    pub handing_over: AtomicBool,
    /// An upgrade stopped the worker: the binary at this program's path takes over.
    pub upgrading: AtomicBool,
}

/// Starts the thread that waits for `signals` (blocked in every thread).
pub(super) fn start(
    signals: crate::sys::BlockedSignals,
    flags: Arc<Flags>,
    exe: PathBuf,
    held: Held,
) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-signals".into())
        .spawn(move || loop {
            let sig = signals.wait();
            if sig == libc::SIGUSR1 {
                upgrade(&flags, &exe, &held);
            } else {
                stop(sig, &flags, &exe, &held);
            }
        })
        .map(drop)
        .map_err(|source| ServeError::Setup {
            what: "start the signal thread",
            source,
        })
}

/// SIGTERM or SIGINT: passed to the worker, which deletes the device; on `systemctl restart`
/// of a uzram@ service, the device goes to the supervisor systemd starts next, with its pages,
/// if the binary it will run can take it over (as `uzram upgrade` checks); else it is deleted,
/// as a stop deletes it.
fn stop(sig: libc::c_int, flags: &Flags, exe: &std::path::Path, held: &Held) {
    let pid = flags.serving.load(Ordering::SeqCst);
    if sig == libc::SIGTERM
        && pid != 0
        && !flags.stopping.load(Ordering::SeqCst)
        && !flags.upgrading.load(Ordering::SeqCst)
        && {
            let _one = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
            fdstore::restarting()
        }
    {
        match check_binary(exe, held, false) {
            Ok(()) if flags.serving.load(Ordering::SeqCst) == pid => {
                log(&format!(
                    "systemd restarts the service: handing the device over to the supervisor it starts next ({} can take it over); stopping worker {pid}",
                    exe.display()
                ));
                flags.handing_over.store(true, Ordering::SeqCst);
                flags.stopping.store(true, Ordering::SeqCst);
                crate::sys::kill(pid, libc::SIGKILL);
                return;
            }
            Ok(()) => log("systemd restarts the service, but the worker changed meanwhile: deleting the device"),
            Err(why) => log(&format!(
                "systemd restarts the service, but the binary it will run cannot take the device over ({why}): deleting the device"
            )),
        }
    }
    flags.stopping.store(true, Ordering::SeqCst);
    crate::sys::kill(flags.worker.load(Ordering::SeqCst), sig);
}

/// SIGUSR1: only a worker that serves is stopped for an upgrade (one still starting, a
/// successor adopting the device, is left to finish), and only once the new binary says it
/// can take the device over.
fn upgrade(flags: &Flags, exe: &std::path::Path, held: &Held) {
    let pid = flags.serving.load(Ordering::SeqCst);
    if pid == 0 || flags.upgrading.load(Ordering::SeqCst) || flags.stopping.load(Ordering::SeqCst) {
        refuse("not now: a worker is starting, the device is stopping, or an upgrade is under way; try again in a few seconds");
        return;
    }
    match check_binary(exe, held, true) {
        // The same worker still serves (it did not die, and no other took over, while the new
        // binary was asked).
        Ok(()) if flags.serving.load(Ordering::SeqCst) == pid => {
            log(&format!(
                "upgrade: {} can take the device over; stopping worker {pid}",
                exe.display()
            ));
            flags.upgrading.store(true, Ordering::SeqCst);
            if let Err(e) = crate::sys::send_signal(pid, libc::SIGKILL) {
                flags.upgrading.store(false, Ordering::SeqCst);
                refuse(&format!("cannot stop worker {pid}: {e}"));
            } else {
                answer(UPGRADE_ACCEPTED);
            }
        }
        Ok(()) => refuse(&format!(
            "not now: worker {pid} ended while the new binary was asked"
        )),
        Err(why) => refuse(&why),
    }
}

/// Logs why an upgrade is refused, and answers `uzram upgrade` so.
fn refuse(why: &str) {
    log(&format!(
        "upgrade refused, the worker goes on serving: {why}"
    ));
    // One line, short enough for the command to read whole (a new binary's whole stderr may
    // be the reason).
    let mut why = why.replace('\n', " ");
    if why.len() > 1024 {
        let mut end = 1024;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push_str(" ...");
    }
    answer(&format!("{UPGRADE_REFUSED}: {why}"));
}

/// Answers `uzram upgrade` (see `common::upgrade_note_path`): one line, written beside and
/// renamed, so that the command never reads half of it. A failure is only logged: the command
/// then waits for a new worker as it would for an older supervisor.
fn answer(line: &str) {
    let path = upgrade_note_path(std::process::id());
    let tmp = path.with_extension("tmp");
    let written = std::fs::create_dir_all(RUN_DIR)
        .and_then(|()| std::fs::write(&tmp, format!("{line}\n")))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        log(&format!(
            "upgrade: cannot answer in {}: {e}",
            path.display()
        ));
    }
}
