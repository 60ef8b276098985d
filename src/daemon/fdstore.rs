//! systemd's file descriptor store: a supervisor run as a `Type=notify` service with
//! `FileDescriptorStoreMax=` (`contrib/systemd/uzram@.service`) hands systemd a duplicate of
//! the device's memory region, and of the backing store's key, once its first worker serves.
//! When the supervisor dies (a bug, `kill -9`), its workers die with it (`--die-with-supervisor`:
//! `PR_SET_PDEATHSIG`), the kernel holds the device's I/O, and systemd, restarting the service,
//! passes the descriptors back (`LISTEN_FDS`, named `uzram-region-N` and `uzram-key-N`): the
//! new supervisor starts a successor that adopts device N from the region, as after a worker's
//! death. `systemctl restart` hands the device over the same way ([`restarting`]). Outside
//! such a service (no `NOTIFY_SOCKET`, or no `UZRAM_FDSTORE=1`) none of this happens.

use std::os::fd::{AsFd, OwnedFd};

use sd_notify::NotifyState;

/// What a restarted supervisor got back from systemd: device `id`'s region and key.
pub struct Stored {
    pub id: u32,
    pub region: OwnedFd,
    pub key: Option<OwnedFd>,
}

const REGION: &str = "uzram-region-";
const KEY: &str = "uzram-key-";

/// Whether this process runs as a service that systemd listens to (`NOTIFY_SOCKET`).
fn notified() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

/// Whether this process keeps the device in its service's descriptor store: a notify service
/// (`NOTIFY_SOCKET`) whose unit says it has a store (`UZRAM_FDSTORE=1`, as uzram@.service
/// sets; systemd 254 and later say `FDSTORE=`). Then its workers die with it, and [`store`]
/// hands systemd the region. A notify service without a store must not: its supervisor's death
/// would leave the device with no holder.
pub fn under_systemd() -> bool {
    let set = |name| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0");
    notified() && (set("UZRAM_FDSTORE") || set("FDSTORE"))
}

/// The descriptors systemd passed this process (`LISTEN_FDS`, for this pid), as a device's
/// region and key; `Ok(None)` when there are none. Takes them over (close-on-exec) and unsets
/// the variables, so no worker sees them; call it before any thread starts.
///
/// On an error (descriptors that do not make one device's) it asks systemd to drop every
/// descriptor of uzram's it passed, so that the next start does not fail the same way.
pub fn take_stored() -> Result<Option<Stored>, String> {
    let passed = sd_notify::listen_fds_with_names(true)
        .map_err(|e| format!("the descriptors systemd passed (LISTEN_FDS): {e}"))?;
    let mut taken = Vec::new();
    let mut failed = None;
    for (raw, name) in passed {
        match crate::sys::take_inherited_fd(raw) {
            Ok(fd) => taken.push((name, fd)),
            Err(e) => {
                failed.get_or_insert(format!("descriptor {raw} ({name}) systemd passed: {e}"));
            }
        }
    }
    let names: Vec<String> = taken.iter().map(|(name, _)| name.clone()).collect();
    let sorted = match failed {
        Some(why) => Err(why),
        None => sort(taken),
    };
    if sorted.is_err() {
        for name in names.iter().filter(|n| n.starts_with("uzram-")) {
            remove(name);
        }
    }
    sorted.map(|found| found.map(|(id, region, key)| Stored { id, region, key }))
}

/// Device `id`, its region and its key among `passed` (named as [`store`] names them). Others
/// are dropped (another program's, a socket unit's); a key without its region, a name without a
/// device number, two of one name, or a key of another device are an error naming them.
fn sort<T>(passed: Vec<(String, T)>) -> Result<Option<(u32, T, Option<T>)>, String> {
    let mut region = None;
    let mut key = None;
    for (name, fd) in passed {
        let (number, slot) = if let Some(n) = name.strip_prefix(REGION) {
            (n, &mut region)
        } else if let Some(n) = name.strip_prefix(KEY) {
            (n, &mut key)
        } else {
            continue;
        };
        let id = number.parse::<u32>().map_err(|_| {
            format!("systemd passed a descriptor named {name:?}: {number:?} is no device number")
        })?;
        if slot.replace((id, fd)).is_some() {
            return Err(format!("systemd passed two descriptors named {name:?}"));
        }
    }
    match (region, key) {
        (None, None) => Ok(None),
        (None, Some((id, _))) => Err(format!(
            "systemd passed the key of device {id} ({KEY}{id}) without its region ({REGION}{id})"
        )),
        (Some((id, _)), Some((kid, _))) if kid != id => Err(format!(
            "systemd passed the region of device {id} and the key of device {kid}"
        )),
        (Some((id, region)), key) => Ok(Some((id, region, key.map(|(_, fd)| fd)))),
    }
}

/// Hands systemd duplicates of device `id`'s region and key (`FDSTORE=1`), then says the
/// service is ready. Without `NOTIFY_SOCKET`, nothing. systemd refuses a store it has no room
/// for (`FileDescriptorStoreMax=` 0) only in its own log: so the unit must set it.
pub fn store(id: u32, region: &OwnedFd, key: Option<&OwnedFd>) -> std::io::Result<()> {
    if !under_systemd() {
        return ready(id);
    }
    // Ready whatever the store says: a start that never says so is stopped, deleting the device.
    let stored = store_fds(id, region, key);
    ready(id)?;
    stored
}

fn store_fds(id: u32, region: &OwnedFd, key: Option<&OwnedFd>) -> std::io::Result<()> {
    let name = format!("{REGION}{id}");
    sd_notify::notify_with_fds(
        false,
        &[NotifyState::FdStore, NotifyState::FdName(&name)],
        &[region.as_fd()],
    )?;
    if let Some(key) = key {
        let name = format!("{KEY}{id}");
        sd_notify::notify_with_fds(
            false,
            &[NotifyState::FdStore, NotifyState::FdName(&name)],
            &[key.as_fd()],
        )?;
    }
    Ok(())
}

/// `READY=1` and a status naming the device, to a notify service's manager (else nothing).
fn ready(id: u32) -> std::io::Result<()> {
    if !notified() {
        return Ok(());
    }
    let status = format!("serving /dev/ublkb{id}");
    sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(&status)])
}

/// Whether systemd is restarting this process's service (`systemctl restart`: a `restart` job
/// for its unit) rather than stopping it: asked of `systemctl list-jobs` (of the user manager
/// that started this process, if one did: `MANAGERPID`), within [`ASK_DEADLINE`]. No answer
/// reads as a stop.
pub fn restarting() -> bool {
    if !under_systemd() {
        return false;
    }
    let Some(unit) = own_unit() else {
        return false;
    };
    let mut cmd = std::process::Command::new("systemctl");
    if std::env::var_os("MANAGERPID").is_some() {
        cmd.arg("--user");
    }
    cmd.args(["list-jobs", "--no-legend", "--plain", "--no-pager"])
        .arg(&unit)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let Ok(mut child) = cmd.spawn() else {
        return false;
    };
    let answered = child
        .stdout
        .as_ref()
        .is_some_and(|o| crate::sys::wait_readable(o.as_fd(), ASK_DEADLINE).unwrap_or(true));
    if !answered {
        let _ = child.kill();
        let _ = child.wait();
        return false;
    }
    let Ok(out) = child.wait_with_output() else {
        return false;
    };
    restart_job_for(&String::from_utf8_lossy(&out.stdout), &unit)
}

/// How long [`restarting`] waits for systemctl.
const ASK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `list-jobs` (its plain lines: `ID UNIT TYPE STATE`) names a restart of `unit`.
fn restart_job_for(jobs: &str, unit: &str) -> bool {
    jobs.lines().any(|line| {
        let mut words = line.split_whitespace();
        let _id = words.next();
        words.next() == Some(unit) && words.next() == Some("restart")
    })
}

/// This process's unit: the last part of its cgroup's path, if that names a service.
fn own_unit() -> Option<String> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    unit_of_cgroup(&cgroups)
}

/// [`own_unit`] from `/proc/self/cgroup`'s text (the unified hierarchy's line, `0::/...`).
fn unit_of_cgroup(cgroups: &str) -> Option<String> {
    let path = crate::common::cgroup_v2_path(cgroups)?;
    let last = path.trim_end().rsplit('/').next()?;
    last.ends_with(".service").then(|| last.to_string())
}

/// Asks systemd to drop device `id`'s descriptors (the device is deleted: a restarted
/// supervisor must not find them).
pub fn forget(id: u32) {
    if !under_systemd() {
        return;
    }
    for name in [format!("{REGION}{id}"), format!("{KEY}{id}")] {
        remove(&name);
    }
}

fn remove(name: &str) {
    let _ = sd_notify::notify(
        false,
        &[NotifyState::FdStoreRemove, NotifyState::FdName(name)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(names: &[&str]) -> Vec<(String, usize)> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), i))
            .collect()
    }

    #[test]
    fn sorts_what_systemd_passed() {
        assert_eq!(sort::<usize>(vec![]).unwrap(), None);
        assert_eq!(sort(named(&["stored", "socket"])).unwrap(), None);
        assert_eq!(
            sort(named(&["uzram-region-3"])).unwrap(),
            Some((3, 0, None))
        );
        // In either order, others between.
        assert_eq!(
            sort(named(&["uzram-key-12", "varlink", "uzram-region-12"])).unwrap(),
            Some((12, 2, Some(0)))
        );
    }

    #[test]
    fn finds_its_unit_and_a_restart_of_it() {
        let cg = "0::/system.slice/system-uzram.slice/uzram@swap0.service\n";
        assert_eq!(unit_of_cgroup(cg).as_deref(), Some("uzram@swap0.service"));
        assert_eq!(unit_of_cgroup("0::/user.slice/session-2.scope\n"), None);
        assert_eq!(unit_of_cgroup("9:name=systemd:/\n"), None);
        let unit = "uzram@swap0.service";
        assert!(restart_job_for(
            "1234 uzram@swap0.service restart running\n",
            unit
        ));
        assert!(!restart_job_for(
            "1234 uzram@swap0.service stop running\n",
            unit
        ));
        assert!(!restart_job_for(
            "1234 uzram@swap1.service restart running\n",
            unit
        ));
        assert!(!restart_job_for("", unit));
        assert!(restart_job_for(
            "7 swap.target start waiting\n8 uzram@swap0.service restart running\n",
            unit
        ));
    }

    #[test]
    fn refuses_what_does_not_make_a_device() {
        for (names, says) in [
            (&["uzram-key-1"][..], "without its region"),
            (&["uzram-region-1", "uzram-key-2"][..], "key of device 2"),
            (&["uzram-region-1", "uzram-region-1"][..], "two descriptors"),
            (&["uzram-region-x"][..], "\"x\" is no device number"),
            (&["uzram-region-"][..], "is no device number"),
        ] {
            let err = sort(named(names)).unwrap_err();
            assert!(err.contains(says), "{names:?}: {err}");
        }
    }
}
