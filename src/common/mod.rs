//! What the daemon and the command line both need: the names of a device's files, what the host
//! uses a block device for, the control socket's protocol and the one definition of a device's
//! options. Neither `daemon` nor `cli` is imported from here.

pub mod control;
pub mod maps;
pub mod options;
pub mod output;

use std::path::{Path, PathBuf};

/// Where the daemons' control sockets live.
pub const RUN_DIR: &str = "/run/uzram";

/// The kernel's ublk control device: present when the driver is loaded.
pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// ublk's limit on device ids (its minor numbers).
pub const MAX_DEVICES: u32 = 1 << 20;

/// The block device of device `id`: `/dev/ublkbN`.
pub fn block_path(id: u32) -> String {
    format!("/dev/ublkb{id}")
}

/// The control socket of device `id`.
pub fn socket_path(id: u32) -> PathBuf {
    Path::new(RUN_DIR).join(format!("ublkb{id}.sock"))
}

/// Where a device's supervisor answers `uzram upgrade` (its pid's file, one line written whole:
/// [`UPGRADE_ACCEPTED`], or [`UPGRADE_REFUSED`] and the reason after ": "), so that a refused
/// upgrade is told at once, not after the command's whole wait.
pub fn upgrade_note_path(supervisor: u32) -> PathBuf {
    Path::new(RUN_DIR).join(format!("upgrade-{supervisor}"))
}

/// The supervisor's answer when it stopped the worker for the new binary.
pub const UPGRADE_ACCEPTED: &str = "accepted";
/// The start of the supervisor's answer when it will not hand the device over now.
pub const UPGRADE_REFUSED: &str = "refused";

/// Removes the control socket at `path` (one a killed daemon left). Anything else there is not
/// uzram's and stays (binding then fails with a message naming the path).
pub fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Most bytes a configuration file may hold.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The unified (cgroup v2) hierarchy's path in a `/proc/PID/cgroup` text: its `0::PATH` line.
pub fn cgroup_v2_path(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Reads a text file of at most `cap` bytes. It must be a regular file, or /dev/null (which
/// reads as empty: systemd masks a file with a symlink to it); a FIFO (which would wait for a
/// writer), another device (which may never end) or a directory is refused before it is opened.
pub fn read_text(path: &Path, cap: u64) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        if std::fs::canonicalize(path).is_ok_and(|p| p == Path::new("/dev/null")) {
            return Ok(String::new());
        }
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut text = String::new();
    // One byte more than allowed tells a file of exactly `cap` bytes from a longer one.
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > cap {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("longer than {cap} bytes"),
        ));
    }
    Ok(text)
}

/// Whether this kernel has the ublk driver.
pub fn have_ublk_driver() -> bool {
    Path::new(UBLK_CONTROL).exists()
}

/// What to tell a user whose kernel has no ublk driver.
pub const NO_DRIVER: &str = "this kernel has no ublk driver (/dev/ublk-control is missing): load ublk_drv, or use Linux >= 6.0 built with CONFIG_BLK_DEV_UBLK";

/// Whether `dev` is active swap, from one read of /proc/swaps: a line names it, or names a
/// block device node with its device number (a swapon through another node or a link); an
/// error when /proc/swaps cannot be read, for each caller to take the way that destroys
/// nothing.
pub fn swap_state(dev: &str) -> Result<bool, String> {
    let swaps = std::fs::read_to_string("/proc/swaps").map_err(|e| format!("/proc/swaps: {e}"))?;
    Ok(swaps_name(&swaps, dev, block_rdev))
}

/// The device number of the block device node `path`; None for anything else.
fn block_rdev(path: &str) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    std::fs::metadata(path)
        .ok()
        .filter(|m| m.file_type().is_block_device())
        .map(|m| m.rdev())
}

/// Whether the /proc/swaps text `swaps` lists `dev`, by its name or by the device number
/// `rdev` gives for a path (None: not a block device).
fn swaps_name(swaps: &str, dev: &str, rdev: impl Fn(&str) -> Option<u64>) -> bool {
    let mut want = None;
    swaps.lines().skip(1).any(|line| {
        let Some(field) = line.split_whitespace().next() else {
            return false;
        };
        // The kernel escapes a space, tab, newline and backslash in the path as \ooo.
        let path = unescape_octal(field);
        path == dev || {
            let want = *want.get_or_insert_with(|| rdev(dev));
            want.is_some() && rdev(&path) == want
        }
    })
}

/// `text` with each `\ooo` (three octal digits) turned into its byte, as /proc/swaps and
/// /proc/self/mountinfo escape paths.
fn unescape_octal(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `dev` is active swap, taken as yes when /proc/swaps cannot be read: for callers
/// about to free, stop or delete what swap may hold.
pub fn is_swap(dev: &str) -> bool {
    swap_state(dev).unwrap_or(true)
}

/// Where block device `dev` is mounted, if it is: found by its device number in
/// /proc/self/mountinfo.
pub fn mount_point(dev: &str) -> Option<String> {
    let rdev = block_rdev(dev)?;
    let want = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&want.as_str())).then(|| f.get(4).copied().unwrap_or("").to_string())
        })
}

/// A kernel release (`uname -r`, such as "6.18.15+deb13-amd64") as its line, (major, minor).
pub fn release_line(release: &str) -> Option<(u32, u32)> {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => Some((major, minor)),
        _ => None,
    }
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`), or why it cannot be read.
pub fn running_release() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .map_err(|e| format!("/proc/sys/kernel/osrelease: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{cgroup_v2_path, release_line, swaps_name, unescape_octal};

    const SWAPS: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                         /dev/ublkb0                             partition\t1048572\t\t0\t\t32767\n\
                         /swap\\040file                           file\t\t1024\t\t0\t\t-2\n";

    #[test]
    fn swaps_are_found_by_name_or_by_device_number() {
        let none = |_: &str| None;
        assert!(swaps_name(SWAPS, "/dev/ublkb0", none));
        assert!(!swaps_name(SWAPS, "/dev/ublkb1", none));
        // The name as the kernel escapes it, and the heading never matches.
        assert!(swaps_name(SWAPS, "/swap file", none));
        assert!(!swaps_name(SWAPS, "Filename", none));
        // Another node of the same device (a link resolved elsewhere, a mknod).
        let rdev = |p: &str| match p {
            "/dev/ublkb0" | "/run/alias" => Some(259 << 8),
            _ => None,
        };
        assert!(swaps_name(SWAPS, "/run/alias", rdev));
        assert!(!swaps_name(SWAPS, "/dev/ublkb1", rdev));
        // Nothing is swap on an empty list, whatever the device numbers.
        assert!(!swaps_name("Filename Type\n", "/run/alias", rdev));
    }

    #[test]
    fn octal_escapes_become_their_bytes() {
        assert_eq!(unescape_octal("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape_octal("/plain"), "/plain");
        // A backslash not followed by three octal digits stays.
        assert_eq!(unescape_octal("\\9\\01x\\"), "\\9\\01x\\");
    }

    #[test]
    fn a_release_gives_its_line() {
        assert_eq!(release_line("6.18.15+deb13-amd64"), Some((6, 18)));
        assert_eq!(release_line("7.3"), Some((7, 3)));
        assert_eq!(release_line("weird"), None);
        assert_eq!(release_line(""), None);
    }

    #[test]
    fn the_unified_hierarchy_line_is_found_among_v1_lines() {
        let cgroups = "12:memory:/user.slice\n0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            cgroup_v2_path(cgroups),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        assert_eq!(cgroup_v2_path("12:memory:/user.slice\n"), None);
    }
}
