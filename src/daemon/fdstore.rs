//! systemd's file descriptor store (issue 15): a supervisor run as a `Type=notify` service with
//! `FileDescriptorStoreMax=` (`contrib/systemd/uzram@.service`) hands systemd a duplicate of
//! the device's memory region, and of the backing store's key, once its first worker serves.
//! When the supervisor dies (a bug, `kill -9`), its workers die with it (`--die-with-supervisor`:
//! `PR_SET_PDEATHSIG`), the kernel holds the device's I/O, and systemd, restarting the service,
//! passes the descriptors back (`LISTEN_FDS`, named `uzram-region-N` and `uzram-key-N`): the
//! new supervisor starts a successor that adopts device N from the region, as after a worker's
//! death. Outside such a service (no `NOTIFY_SOCKET`) nothing here does anything.

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

/// Whether this process runs as a service that systemd listens to (`NOTIFY_SOCKET`): then
/// its workers die with it, and [`store`] hands systemd the region.
pub fn under_systemd() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

/// The descriptors systemd passed this process (`LISTEN_FDS`, for this pid), as a device's
/// region and key; `Ok(None)` when there are none. Takes them over (close-on-exec) and unsets
/// the variables, so no worker sees them; call it before any thread starts.
pub fn take_stored() -> Result<Option<Stored>, String> {
    let passed = sd_notify::listen_fds_with_names(true)
        .map_err(|e| format!("the descriptors systemd passed (LISTEN_FDS): {e}"))?;
    let mut taken = Vec::new();
    for (raw, name) in passed {
        let fd = crate::sys::take_inherited_fd(raw)
            .map_err(|e| format!("descriptor {raw} ({name}) systemd passed: {e}"))?;
        taken.push((name, fd));
    }
    Ok(sort(taken)?.map(|(id, region, key)| Stored { id, region, key }))
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
        return Ok(());
    }
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
    let status = format!("serving /dev/ublkb{id}");
    sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(&status)])
}

/// Asks systemd to drop device `id`'s descriptors (the device is deleted: a restarted
/// supervisor must not find them).
pub fn forget(id: u32) {
    if !under_systemd() {
        return;
    }
    for name in [format!("{REGION}{id}"), format!("{KEY}{id}")] {
        let _ = sd_notify::notify(
            false,
            &[NotifyState::FdStoreRemove, NotifyState::FdName(&name)],
        );
    }
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
