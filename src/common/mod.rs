//! What the daemon and the command line both need: the names of a device's files, what the host
//! uses a block device for, the control socket's protocol and the one definition of a device's
//! options. Neither `daemon` nor `cli` is imported from here.

pub mod control;
pub mod options;
pub mod output;

use std::path::{Path, PathBuf};

/// Where the daemons' control sockets live.
pub const RUN_DIR: &str = "/run/uzram";

/// The kernel's ublk control device: present when the driver is loaded.
pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// The block device of device `id`: `/dev/ublkbN`.
pub fn block_path(id: u32) -> String {
    format!("/dev/ublkb{id}")
}

/// The control socket of device `id`.
pub fn socket_path(id: u32) -> PathBuf {
    Path::new(RUN_DIR).join(format!("ublkb{id}.sock"))
}

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

/// Whether `dev` is active swap (listed in /proc/swaps).
pub fn is_swap(dev: &str) -> bool {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().next() == Some(dev))
}

/// Where block device `dev` is mounted, if it is: found by its device number in
/// /proc/self/mountinfo.
pub fn mount_point(dev: &str) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(dev)
        .ok()
        .filter(|m| m.file_type().is_block_device())?;
    let want = format!("{}:{}", libc::major(meta.rdev()), libc::minor(meta.rdev()));
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
