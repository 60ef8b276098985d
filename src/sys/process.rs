//! Process calls of the supervisor and its reserve: a pidfd's signal and the lifeline's pipe.

use std::io;
use std::os::fd::AsRawFd;

/// Sends `signal` to the process `pidfd` names (`pidfd_send_signal`, Linux 5.1): never to
/// another that took its pid after it ended (then ESRCH).
pub fn pidfd_send_signal(
    pidfd: std::os::fd::BorrowedFd<'_>,
    signal: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a system call with integer arguments only (a descriptor borrowed for the call, no
    // siginfo); the result is checked.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given, which lives on the
    // stack for the call; the result is checked.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned both descriptors, new ones this process owns alone.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}
