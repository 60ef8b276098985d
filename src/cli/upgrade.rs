//! `uzram upgrade DEV`: asks the device's supervisor to hand the device to the uzram binary now
//! at its path (after a package upgrade), and waits until a new worker serves it, or until the
//! supervisor answers that it will not (its answer file, see [`upgrade_note_path`]).

use std::path::Path;
use std::time::{Duration, Instant};

use super::ctl::{kernel_knows, CtlError};
use super::listing::DeviceRow;
use crate::common::control::{self, CallError, Request};
use crate::common::{block_path, upgrade_note_path, UPGRADE_ACCEPTED, UPGRADE_REFUSED};

/// How long `uzram upgrade` waits for the new worker to serve (a supervisor that answers
/// nothing is one of an older uzram).
const UPGRADE_PATIENCE: Duration = Duration::from_secs(180);

fn err(msg: impl Into<String>) -> CtlError {
    CtlError(msg.into())
}

/// Hands device `id` over to the binary now at its supervisor's path. What it says on success
/// names both workers; a refusal is the supervisor's reason.
pub fn upgrade(id: u32) -> Result<String, CtlError> {
    let dev = block_path(id);
    let row = |what: &str| -> Result<DeviceRow, CtlError> {
        let info = control::call(id, &Request::Info).map_err(|e| match e {
            CallError::NoDaemon { .. } if kernel_knows(id) => err(format!(
                "{dev}: its daemon is dead (killed?): nothing to upgrade"
            )),
            CallError::NoDaemon { .. } => err(format!("{dev}: no such device")),
            e => err(format!("{dev}: {what}: {e}")),
        })?;
        DeviceRow::parse(&info).map_err(|e| err(format!("{dev}: {what}: {e}")))
    };
    let before = row("ask its daemon")?;
    let sup = supervisor_of(&dev, before.pid)?;
    // One upgrade of a supervisor at a time: two signals may come as one, and each command
    // would take the other's answer. Held until this command ends.
    let note = upgrade_note_path(sup);
    let _one = lock(&dev, &note)?;
    // An answer of an earlier request is not this one's.
    remove_note(&note);
    crate::sys::send_signal(sup, libc::SIGUSR1)
        .map_err(|e| err(format!("{dev}: cannot signal its supervisor {sup}: {e}")))?;
    let deadline = Instant::now() + UPGRADE_PATIENCE;
    let mut accepted = false;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        if !accepted {
            match read_note(&note) {
                Some(Answer::Refused(why)) => {
                    remove_note(&note);
                    return Err(err(format!(
                        "{dev}: its supervisor (pid {sup}) refused the upgrade, worker {} goes on serving: {why}",
                        before.pid
                    )));
                }
                Some(Answer::Accepted) => {
                    remove_note(&note);
                    accepted = true;
                }
                None => {}
            }
        }
        // A daemon between workers does not answer: asked again.
        let Ok(now) = row("ask its daemon") else {
            continue;
        };
        if now.pid != before.pid && now.restarts > before.restarts {
            return Ok(format!(
                "{dev}: upgraded: worker {} handed the device over to worker {} ({} restarts, the last: {})",
                before.pid, now.pid, now.restarts, now.last_restart
            ));
        }
    }
    remove_note(&note);
    Err(err(format!(
        "{dev}: no new worker serves it after {} s: its daemon's log says why{}",
        UPGRADE_PATIENCE.as_secs(),
        if accepted {
            " (the supervisor stopped the old worker for the new binary)"
        } else {
            " (its supervisor did not answer: an older uzram, or see its log)"
        }
    )))
}

/// Takes the lock of the supervisor whose answer file is `note` (the same name with `.lock`),
/// or says that another `uzram upgrade` of `dev` holds it.
fn lock(dev: &str, note: &Path) -> Result<std::fs::File, CtlError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = note.with_extension("lock");
    let file = std::fs::create_dir_all(crate::common::RUN_DIR)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
        })
        .map_err(|e| err(format!("{dev}: {}: {e}", path.display())))?;
    match crate::sys::try_flock(&file) {
        Ok(true) => Ok(file),
        Ok(false) => Err(err(format!(
            "{dev}: another uzram upgrade of it is under way"
        ))),
        Err(e) => Err(err(format!("{dev}: lock {}: {e}", path.display()))),
    }
}

/// The supervisor of worker `pid`: its parent, if that runs `uzram serve` without
/// `--worker-region-fd` and the worker runs with one. A daemon without one (an older uzram
/// served a device with a backing store so) has no successor to hand over to.
fn supervisor_of(dev: &str, pid: u32) -> Result<u32, CtlError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| err(format!("{dev}: its worker {pid}: {e}")))?;
    let sup = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let args_of = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let has = |cmdline: &[u8], arg: &[u8]| cmdline.split(|&b| b == 0).any(|a| a == arg);
    let (worker_args, sup_args) = (args_of(pid), args_of(sup));
    let supervised = sup > 1
        && has(&worker_args, b"--worker-region-fd")
        && has(&sup_args, b"serve")
        && !has(&sup_args, b"--worker-region-fd");
    if supervised {
        Ok(sup)
    } else {
        Err(err(format!(
            "{dev}: its daemon (pid {pid}) has no supervisor to hand the device over (uzram before 2026-12 served a device with a backing store by one process: it does not survive it)"
        )))
    }
}

/// What a supervisor answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Accepted,
    Refused(String),
}

/// The supervisor's answer at `path`, once it is there whole (it is renamed into place).
fn read_note(path: &Path) -> Option<Answer> {
    let text = crate::common::read_text(path, 64 << 10).ok()?;
    parse_note(&text)
}

fn parse_note(text: &str) -> Option<Answer> {
    let line = text.strip_suffix('\n')?;
    if line == UPGRADE_ACCEPTED {
        return Some(Answer::Accepted);
    }
    line.strip_prefix(UPGRADE_REFUSED)
        .map(|why| Answer::Refused(why.trim_start_matches(": ").to_string()))
}

/// Removes an answer file (only a regular file: anything else there is not uzram's).
fn remove_note(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_only_when_whole() {
        assert_eq!(parse_note("accepted\n"), Some(Answer::Accepted));
        assert_eq!(
            parse_note("refused: the new binary cannot read the region\n"),
            Some(Answer::Refused(
                "the new binary cannot read the region".into()
            ))
        );
        // No newline yet, or not an answer.
        assert_eq!(parse_note("refused: half"), None);
        assert_eq!(parse_note("accepted"), None);
        assert_eq!(parse_note("\n"), None);
        assert_eq!(parse_note("maybe\n"), None);
    }
}
