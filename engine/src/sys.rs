//! The engine's system calls that std does not wrap (on a backing file the engine opened), and
//! the one view of shared memory as slots.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Adds `O_NOATIME` to `file`'s status flags, if the kernel allows it (it needs the file's owner
/// or CAP_FOWNER); silently keeps atime updates otherwise.
pub(crate) fn set_noatime(file: &File) {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an fd that `file` keeps open for the duration of the call, with plain
    // integer arguments; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME);
        }
    }
}

/// Allocates the blocks of `file`'s first `bytes` bytes (`fallocate` mode 0).
pub(crate) fn allocate(file: &File, bytes: u64) -> std::io::Result<()> {
    let len =
        libc::off_t::try_from(bytes).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fallocate on an fd that `file` keeps open for the duration of the call, with plain
    // integer arguments; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The process's effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid takes no argument, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Takes `flock(LOCK_EX | LOCK_NB)` on `file`: `Ok(false)` when another open file holds it (a
/// backing file another uzram device is using). Released when `file` is closed.
pub(crate) fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on an fd that `file` keeps open for the duration of the call, with plain
    // integer arguments; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The alignment `file` (open `O_DIRECT`) needs of a direct read's offset and length: what
/// `statx` reports (`STATX_DIOALIGN`: Linux 6.1 for files, 6.11 for block devices), else a block
/// device's logical block size (`BLKSSZGET`); `None` where neither says.
pub(crate) fn dio_offset_align(file: &File) -> Option<usize> {
    let fd = file.as_raw_fd();
    // SAFETY: an all-zero statx is a valid value of the plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx on an fd that `file` keeps open for the call, with an empty path and
    // AT_EMPTY_PATH (the fd itself), writing only into `stx`, which outlives the call.
    let rc = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
        return usize::try_from(stx.stx_dio_offset_align).ok();
    }
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int into `size`, which outlives the call; on a file that
    // is not a block device it fails (ENOTTY) and writes nothing.
    let rc = unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut size) };
    (rc == 0 && size > 0).then(|| usize::try_from(size).ok())?
}

/// A region's table words as slots: two words a slot, `words.len() / 2` of them.
pub(crate) fn slots_of(words: &[std::sync::atomic::AtomicU64]) -> &[crate::device::slot::Slot] {
    // SAFETY: `Slot` is `repr(C)` of two `AtomicU64` (16 bytes, 8-aligned: asserted where it is
    // defined), so `n` slots are exactly `2n` aligned atomics; the result borrows `words` for
    // its whole life and, like `words`, is only reached through atomics.
    unsafe {
        std::slice::from_raw_parts(
            words.as_ptr().cast::<crate::device::slot::Slot>(),
            words.len() / 2,
        )
    }
}
