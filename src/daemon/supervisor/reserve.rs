//! The supervisor's side of a reserve (see `daemon::standby`): the reserve it keeps outside its
//! service while one of its own workers serves and, in a supervisor systemd restarted, finding
//! a reserve that took the device over and keeping it as its worker ([`Worker::Adopted`]).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a restarted supervisor waits for a reserve that took its device over to serve it
/// (the reserve adopts the region and the kernel requeues the held requests).
const RESERVE_WAIT: Duration = Duration::from_secs(60);

/// The reserve this supervisor started: killed (and reaped) when the supervisor ends the
/// device or gives it up; left running ([`Reserve::leave`]) only when the device is handed to
/// the supervisor systemd starts next, for which it then serves.
#[derive(Default)]
pub(super) struct Reserve(Option<Child>);

impl Reserve {
    pub(super) fn new(child: Option<Child>) -> Reserve {
        Reserve(child)
    }

    /// Replaced by `child` (the old one ended first).
    pub(super) fn replace(&mut self, child: Option<Child>) {
        self.end();
        self.0 = child;
    }

    fn end(&mut self) {
        if let Some(mut r) = self.0.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }

    /// Whether there is none (or it ended: a reserve that could not leave the service exits).
    pub(super) fn is_none(&mut self) -> bool {
        self.0
            .as_mut()
            .map_or(true, |r| r.try_wait().is_ok_and(|ended| ended.is_some()))
    }

    /// Left running: it takes the device over once this supervisor has ended.
    pub(super) fn leave(mut self) {
        self.0 = None;
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.end();
    }
}

/// A reserve that took the device over, found by a supervisor systemd restarted.
pub(super) struct Found {
    pub(super) pid: u32,
    pidfd: OwnedFd,
}

/// The process whose arguments say it is a reserve for device `id` (`--standby --reserve-for
/// ID`), if there is one, as a pidfd checked after it was opened (so that a pid taken
/// meanwhile by another program is never signalled). Only processes named `uzram` have their
/// arguments read (another's may be in swap, on this very device); a uzram worker's are
/// locked in memory.
pub(super) fn find(id: u32) -> Option<Found> {
    let own = std::process::id();
    let dir = std::fs::read_dir("/proc").ok()?;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if pid == own || comm.trim_end() != "uzram" || !is_reserve_for(pid, id) {
            continue;
        }
        let Ok(pidfd) = crate::sys::pidfd_open(pid) else {
            continue;
        };
        if is_reserve_for(pid, id) {
            return Some(Found { pid, pidfd });
        }
    }
    None
}

/// Whether process `pid`'s arguments hold `--reserve-for ID` for this `id`.
fn is_reserve_for(pid: u32, id: u32) -> bool {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/cmdline"));
    // (not UTF-8, or longer than any uzram's: not a reserve)
    let Ok(args) = crate::common::read_text(&path, 1 << 16) else {
        return false;
    };
    has_reserve_args(args.as_bytes(), id)
}

/// Whether the NUL-separated arguments `args` hold `--standby` and `--reserve-for ID`.
fn has_reserve_args(args: &[u8], id: u32) -> bool {
    let want = id.to_string();
    let standby = args.split(|&b| b == 0).any(|w| w == b"--standby");
    let mut words = args.split(|&b| b == 0);
    while let Some(w) = words.next() {
        if w == b"--reserve-for" {
            return standby && words.next() == Some(want.as_bytes());
        }
    }
    false
}

impl Found {
    /// Whether it has ended (an error of poll reads as not yet).
    fn ended(&self) -> bool {
        crate::sys::wait_readable(self.pidfd.as_fd(), Duration::ZERO).unwrap_or(false)
    }

    /// Kills it and waits for its end (the region is then written by no one): why not, if it
    /// could not be killed or did not end within [`RESERVE_WAIT`].
    pub(super) fn stop(self) -> Result<(), String> {
        if let Err(e) = crate::sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL) {
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(format!("cannot end reserve {}: {e}", self.pid));
            }
        }
        match crate::sys::wait_readable(self.pidfd.as_fd(), RESERVE_WAIT) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "reserve {} did not end within {} s of SIGKILL",
                self.pid,
                RESERVE_WAIT.as_secs()
            )),
            Err(e) => Err(format!("waiting for reserve {} to end: {e}", self.pid)),
        }
    }

    /// Waits until it serves device `id` (the kernel names it the device's daemon and the
    /// device is not quiesced): `true`; `false` if it ended first, the device went, or
    /// [`RESERVE_WAIT`] passed.
    pub(super) fn wait_serving(&self, id: u32) -> bool {
        let start = Instant::now();
        while start.elapsed() < RESERVE_WAIT && !self.ended() {
            match crate::daemon::ublk::served_by(id) {
                Some((false, pid)) if u32::try_from(pid) == Ok(self.pid) => return true,
                Some(_) => std::thread::sleep(Duration::from_millis(20)),
                None => return false,
            }
        }
        false
    }

    /// Duplicates of the slot-free probe's descriptors it holds, if it holds them and speaks
    /// this binary's probe protocol (its arguments say so). Whoever closes the probe's link
    /// last detaches the probe, which waits for an RCU-tasks grace period, seconds in a swap
    /// storm: in a worker's exit that wait comes before its device is closed, so the device
    /// stays held for it. The supervisor holds the probe (and hands it to its workers) so that
    /// no worker's exit is the last.
    pub(super) fn take_probe(&self) -> Option<crate::daemon::slotfree::Descriptors> {
        let args = crate::common::read_text(
            std::path::Path::new(&format!("/proc/{}/cmdline", self.pid)),
            1 << 16,
        )
        .ok()?;
        let protocol = args
            .split('\0')
            .skip_while(|w| *w != "--worker-probe-protocol")
            .nth(1);
        if protocol != Some(crate::daemon::slotfree::PROTOCOL) {
            crate::daemon::log(&format!(
                "slot-free: reserve {} has no probe of protocol {}: its workers will free only what swap discards",
                self.pid,
                crate::daemon::slotfree::PROTOCOL
            ));
            return None;
        }
        // A worker takes the probe over at other numbers and closes those it was given, which
        // later opens reuse: its descriptors are found by what they are, one link and one map.
        let take = |what: &str| {
            let Some(fd) = self.only_fd(what) else {
                crate::daemon::log(&format!(
                    "slot-free: reserve {} holds no {what}, or two different ones (its anonymous descriptors: {}): its workers will free only what swap discards",
                    self.pid,
                    self.anon_fds()
                ));
                return None;
            };
            crate::sys::pidfd_getfd(self.pidfd.as_fd(), fd)
                .inspect_err(|e| {
                    crate::daemon::log(&format!(
                        "slot-free: cannot take the probe from reserve {} ({e}): its workers will free only what swap discards",
                        self.pid
                    ));
                })
                .ok()
        };
        let probe = crate::daemon::slotfree::Descriptors {
            link: take("anon_inode:bpf_link")?,
            map: take("anon_inode:bpf-map")?,
        };
        crate::daemon::log(&format!(
            "slot-free: the probe reserve {} holds is kept here too and handed to each worker",
            self.pid
        ));
        Some(probe)
    }

    /// A descriptor whose link in /proc reads `what`, where all such name one object (a
    /// worker may hold a probe's map twice); `None` if it has none, or two objects.
    fn only_fd(&self, what: &str) -> Option<i32> {
        let dir = std::fs::read_dir(format!("/proc/{}/fd", self.pid)).ok()?;
        let mut found = dir.flatten().filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            if target.as_os_str() != what {
                return None;
            }
            let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
            Some((fd, self.object_id(fd)))
        });
        let (first, id) = found.next()?;
        let id = id?;
        found
            .all(|(_, other)| other.as_deref() == Some(id.as_str()))
            .then_some(first)
    }

    /// Its descriptors on anonymous inodes, as `FD=TARGET ID` (for the log).
    fn anon_fds(&self) -> String {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return "unreadable".to_string();
        };
        let fds: Vec<String> = dir
            .flatten()
            .filter_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                let target = target.to_str()?.strip_prefix("anon_inode:")?.to_string();
                let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
                let id = self.object_id(fd).unwrap_or_default();
                Some(format!("{fd}={target} {id}").trim_end().to_string())
            })
            .collect();
        if fds.is_empty() {
            "none".to_string()
        } else {
            fds.join(", ")
        }
    }

    /// The kernel's id of the BPF map or link behind descriptor `fd` (its `map_id:` or
    /// `link_id:` line in /proc, the kernel's own record: nothing of the process's memory is
    /// read).
    fn object_id(&self, fd: i32) -> Option<String> {
        let info = std::fs::read_to_string(format!("/proc/{}/fdinfo/{fd}", self.pid)).ok()?;
        info.lines()
            .find(|l| l.starts_with("map_id:") || l.starts_with("link_id:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    /// Waits for its end.
    fn wait_end(&self) {
        // (an error of poll is retried, never read as the end)
        while !crate::sys::wait_readable(self.pidfd.as_fd(), Duration::from_secs(3600))
            .unwrap_or_else(|_| {
                std::thread::sleep(Duration::from_millis(100));
                false
            })
        {}
    }
}

/// The worker a supervisor waits for: one it started, or a reserve of its predecessor's that
/// took the device over and serves it (not its child: its end is seen through a pidfd, and its
/// exit status is not known).
pub(super) enum Worker {
    Own(Child),
    Adopted(Found),
}

impl Worker {
    pub(super) fn id(&self) -> u32 {
        match self {
            Worker::Own(c) => c.id(),
            Worker::Adopted(f) => f.pid,
        }
    }

    pub(super) fn is_own(&self) -> bool {
        matches!(self, Worker::Own(_))
    }

    /// Waits for its end, and says how it ended. An adopted one's status is read from its
    /// device `id`: a clean exit when the device is gone (it deleted it, as on SIGTERM or a
    /// reset), else a SIGKILL (it left the device to a successor).
    pub(super) fn wait(&mut self, id: u32) -> std::io::Result<ExitStatus> {
        match self {
            Worker::Own(c) => c.wait(),
            Worker::Adopted(f) => {
                f.wait_end();
                let gone = !crate::daemon::ublk::exists(id);
                Ok(ExitStatus::from_raw(if gone { 0 } else { libc::SIGKILL }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_reserve_for_that_device_is_found_by_its_arguments() {
        let args = |s: &str| s.replace(' ', "\0").into_bytes();
        assert!(has_reserve_args(
            &args("uzram serve --standby --reserve-for 3 --size 1G"),
            3
        ));
        assert!(has_reserve_args(
            &args("uzram --standby --reserve-for 12"),
            12
        ));
        assert!(!has_reserve_args(&args("uzram --reserve-for 12"), 12));
        assert!(!has_reserve_args(
            &args("uzram --standby --reserve-for 12"),
            1
        ));
        assert!(!has_reserve_args(
            &args("uzram --standby --reserve-for 1"),
            12
        ));
        assert!(!has_reserve_args(
            &args("uzram serve --standby --size 1G"),
            3
        ));
        assert!(!has_reserve_args(&args("uzram --standby --reserve-for"), 3));
        assert!(!has_reserve_args(b"", 0));
    }

    #[test]
    fn a_reserve_left_is_not_killed_and_one_dropped_is() {
        let sleeper = || {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep runs")
        };
        let left = sleeper();
        let left_pid = left.id();
        Reserve::new(Some(left)).leave();
        let alive = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        assert!(alive(left_pid));
        crate::sys::kill(left_pid, libc::SIGKILL);
        let dropped = sleeper();
        let dropped_pid = dropped.id();
        drop(Reserve::new(Some(dropped)));
        assert!(!alive(dropped_pid));
    }
}
