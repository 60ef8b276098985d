//! Starting a worker: what it inherits from the supervisor across its predecessors' deaths
//! ([`Held`]: the region, the key, the slot-free probe), how it starts ([`Role`]), its first
//! line (serving, or why not), and the check a new binary answers before an upgrade or a
//! systemd restart hands it the device (`--check-region`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use uzram_engine::Device;

use super::cause;
use crate::daemon::{self, fdstore, slotfree, ServeArgs, ServeError};

/// How a worker starts.
pub(super) enum Role<'a> {
    /// The first: it adds the device.
    First,
    /// A successor ahead of need: it waits, pinned, for `go` on its stdin (a pipe).
    Standby,
    /// A successor started after the death (when no standby was there).
    Successor(u32, u64, &'a str),
    /// A standby for device N outside the service (see `daemon::standby`), its stdin the
    /// lifeline's read end.
    Reserve(u32, OwnedFd),
}

/// What the supervisor holds for its workers across their deaths: the device's memory region
/// and, for a device with a backing store, the key of its records (a sealed memfd, mapped and
/// locked here: never written to a file, never swapped out).
pub(super) struct Held {
    pub(super) region: OwnedFd,
    pub(super) key: Option<OwnedFd>,
    /// The slot-free probe, loaded before the first worker: a successor takes it over as it
    /// is, marks and all, instead of loading one while the device waits for it.
    pub(super) probe: Option<slotfree::Descriptors>,
}

impl Held {
    pub(super) fn try_clone(&self) -> std::io::Result<Held> {
        Ok(Held {
            region: self.region.try_clone()?,
            key: self.key.as_ref().map(OwnedFd::try_clone).transpose()?,
            probe: self
                .probe
                .as_ref()
                .map(|p| -> std::io::Result<_> {
                    Ok(slotfree::Descriptors {
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
                .arg(slotfree::PROTOCOL);
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
/// stdout is a pipe: its first line says the device it serves, or why it could not. Every
/// worker but a reserve holds the `lifeline`'s write end, where there is one.
pub(super) fn spawn(
    exe: &Path,
    held: &Held,
    log: &OwnedFd,
    lifeline: Option<&OwnedFd>,
    role: Role<'_>,
) -> Result<Child, ServeError> {
    let setup = |what, source| ServeError::Setup { what, source };
    let own: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd = Command::new(exe);
    cmd.args(own);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut reserve = false;
    let successor = match role {
        Role::First => false,
        Role::Reserve(id, lifeline_end) => {
            reserve = true;
            cmd.arg("--standby")
                .args(["--reserve-for", &id.to_string()])
                .stdin(Stdio::from(lifeline_end))
                .stdout(Stdio::null());
            true
        }
        Role::Standby => {
            cmd.arg("--standby")
                .stdin(Stdio::piped())
                .env(daemon::standby::STANDBY_READY_ENV, "1");
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
    let lifeline = lifeline.filter(|_| !reserve);
    if let Some(fd) = lifeline {
        cmd.env(daemon::standby::LIFELINE_ENV, fd.as_raw_fd().to_string());
    } else {
        cmd.env_remove(daemon::standby::LIFELINE_ENV);
    }
    if reserve {
        // Outlives this process (that is what it is for), and is no part of the service.
        cmd.env_remove("NOTIFY_SOCKET");
    } else if fdstore::under_systemd() {
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
    if let Some(fd) = lifeline {
        if let Err(e) = crate::sys::set_inheritable(fd.as_fd()) {
            held.keep();
            return Err(setup("pass the lifeline on", e));
        }
    }
    let child = cmd.spawn().map_err(|e| setup("start the worker", e));
    held.keep();
    if let Some(fd) = lifeline {
        let _ = crate::sys::set_cloexec(fd.as_fd());
    }
    let _ = crate::sys::set_cloexec(log.as_fd());
    child
}

/// How long a successor may take to serve again before the supervisor gives up on it (and on
/// the device): adopting a large pool under emulation takes seconds, and the kernel may hold
/// `START_USER_RECOVERY` off for up to 30 s while it requeues the dead worker's requests.
pub(super) const SUCCESSOR_DEADLINE: Duration = Duration::from_secs(120);

/// The worker's first line: the device it serves (`/dev/ublkbN`), or its error; within
/// `deadline` if one is given (else an error saying so).
pub(super) fn first_line(
    child: &mut Child,
    deadline: Option<Duration>,
) -> Result<(String, u32), String> {
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let end = deadline.map(|d| std::time::Instant::now() + d);
        let late = || {
            format!(
                "it did not serve within {} s",
                deadline.unwrap_or_default().as_secs()
            )
        };
        let mut out = BufReader::new(out);
        loop {
            if let Some(end) = end {
                let left = end.saturating_duration_since(std::time::Instant::now());
                // An error of poll reads as ready: the read below reports what is wrong.
                let ready = !out.buffer().is_empty()
                    || crate::sys::wait_readable(out.get_ref().as_fd(), left).unwrap_or(true);
                if !ready {
                    return Err(late());
                }
            }
            line.clear();
            // A standby's ready line comes first, when it was not read at the death.
            if !out.read_line(&mut line).is_ok_and(|n| n > 0)
                || line.trim_end() != daemon::standby::STANDBY_READY
            {
                break;
            }
            // Nothing but ready lines until the deadline: no answer.
            if end.is_some_and(|end| std::time::Instant::now() >= end) {
                return Err(late());
            }
        }
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

/// Whether standby `s` is alive and has said it is ready ([`daemon::standby::STANDBY_READY`]): its
/// stdout has something to read. The line is left for [`first_line`].
pub(super) fn standby_ready(s: &mut Child) -> bool {
    s.try_wait().is_ok_and(|ended| ended.is_none())
        && s.stdout
            .as_ref()
            .is_some_and(|o| crate::sys::wait_readable(o.as_fd(), Duration::ZERO).unwrap_or(false))
}

/// How long a new binary may take to say whether it could take the device over.
const CHECK_DEADLINE: Duration = Duration::from_secs(30);

/// Asks the binary at `exe` (`--check-region`) whether it could take the device in `region`
/// over: its answer, or why not. It changes nothing; the worker keeps serving either way.
/// `probe`: passed the slot-free probe's descriptors too, as its workers would be.
pub(super) fn check_binary(exe: &Path, held: &Held, probe: bool) -> Result<(), String> {
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
    let why = if why.is_empty() {
        "it printed nothing".to_string()
    } else {
        why
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
    let (mut setup, disksize) = daemon::configure(args)?;
    if let Some(key) = daemon::inherited_key(args)? {
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

/// Held while a program is started with the region's (and key's) descriptors inheritable
/// ([`Held::pass_on`] to [`Held::keep`]): the main thread starts workers, the signal thread
/// asks binaries and systemctl, and neither may start a program while the other has the
/// descriptors open to inheritance (or closed to it).
pub(super) static SPAWNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh runs")
    }

    #[test]
    fn a_ready_line_before_the_answer_is_skipped() {
        let mut c = sh("echo standby; echo /dev/ublkb3");
        let got = first_line(&mut c, Some(Duration::from_secs(10)));
        assert_eq!(got, Ok(("/dev/ublkb3".to_string(), 3)));
        let _ = c.wait();
        let mut c = sh("echo /dev/ublkb4");
        assert_eq!(first_line(&mut c, None).map(|(_, id)| id), Ok(4));
        let _ = c.wait();
        let mut c = sh("echo 'error: no room'");
        assert_eq!(first_line(&mut c, None), Err("no room".to_string()));
        let _ = c.wait();
    }

    #[test]
    fn ready_lines_alone_are_no_answer() {
        let mut c = sh("echo standby; exec sleep 10");
        let got = first_line(&mut c, Some(Duration::from_millis(300)));
        assert!(
            got.as_ref().is_err_and(|e| e.contains("did not serve")),
            "{got:?}"
        );
        let _ = c.kill();
        let _ = c.wait();
        let mut c = sh("echo standby");
        let got = first_line(&mut c, Some(Duration::from_secs(10)));
        assert!(
            got.as_ref().is_err_and(|e| e.contains("without serving")),
            "{got:?}"
        );
        let _ = c.wait();
    }

    #[test]
    fn a_standby_is_ready_once_it_says_so_and_never_once_dead() {
        let mut c = sh("sleep 0.3; echo standby; exec sleep 10");
        assert!(!standby_ready(&mut c));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(standby_ready(&mut c));
        let _ = c.kill();
        let _ = c.wait();
        let mut c = sh("echo standby");
        std::thread::sleep(Duration::from_millis(500));
        assert!(!standby_ready(&mut c));
    }
}
