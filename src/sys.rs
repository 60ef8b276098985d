//! Every libc call of the `uzram` binary that needs `unsafe`, each behind a safe function with its
//! `SAFETY:` reason. With `daemon::heap` (the global allocator), the only module of the binary
//! allowed `unsafe` (see ARCHITECTURE.md).

use std::io;
use std::os::fd::AsRawFd;

mod bpf;
mod process;
pub use bpf::{bpf_array_store, SharedWords};
pub use process::{pidfd_send_signal, pipe};

/// `prctl(PR_SET_IO_FLUSHER)`; libc has no constant for it.
const PR_SET_IO_FLUSHER: libc::c_int = 57;
/// `prctl(PR_GET_IO_FLUSHER)`.
const PR_GET_IO_FLUSHER: libc::c_int = 58;

/// Marks the calling thread an I/O flusher (`PR_SET_IO_FLUSHER`: its allocations never start
/// I/O, so reclaim cannot make it wait for the swap it serves), or clears the mark; setting is
/// checked by reading it back.
pub fn set_io_flusher(on: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; the result is checked.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, libc::c_ulong::from(on), 0, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if on && unsafe { libc::prctl(PR_GET_IO_FLUSHER, 0, 0, 0, 0) } != 1 {
        return Err(io::Error::other("PR_GET_IO_FLUSHER does not read back 1"));
    }
    Ok(())
}

/// The calling thread's id (as /proc/self/task lists it).
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::gettid() }
}

/// Locks every page the process has now, and every page it touches later (`MCL_ONFAULT`: new
/// mappings are locked as they are faulted in, not populated by `mmap` itself, which would hold
/// the process's `mmap_lock` while the kernel allocates).
pub fn lock_all_memory() -> io::Result<()> {
    for flags in [libc::MCL_CURRENT, libc::MCL_FUTURE | libc::MCL_ONFAULT] {
        // SAFETY: mlockall takes flags only; the result is checked.
        if unsafe { libc::mlockall(flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes `len` bytes of this process's private memory at `start` resident, as a write would
/// (`MADV_POPULATE_WRITE`, Linux 5.14), without changing a byte. The caller passes a range of
/// one of its own private writable mappings (as /proc/self/maps lists it).
pub fn populate_write(start: u64, len: u64) -> io::Result<()> {
    let (Ok(start), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let at = start as *mut libc::c_void;
    // SAFETY: madvise on a range of this process's own private mapping (the caller's contract);
    // populating changes no byte of it (a page already present is left as it is, one not yet
    // is faulted in as a write would, zero-filled).
    if unsafe { libc::madvise(at, len, libc::MADV_POPULATE_WRITE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reserves `len` bytes of address space: mapped `PROT_NONE` and not locked (a mapping made
/// under `mlockall(MCL_FUTURE)` is locked whole, and would count against `RLIMIT_MEMLOCK` and
/// in `VmLck` though it holds nothing), so it holds no memory until [`commit_and_touch`] makes
/// part of it usable. Never unmapped.
pub fn reserve_address_space(len: usize) -> io::Result<*mut u8> {
    // SAFETY: an anonymous mapping at an address the kernel picks; no existing memory is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the mapping just made, whole; unlocking changes no memory.
    if unsafe { libc::munlock(ptr, len) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the mapping just made, which nothing uses.
        unsafe { libc::munmap(ptr, len) };
        return Err(e);
    }
    Ok(ptr.cast())
}

/// Makes `len` bytes at `at` (page aligned, inside a [`reserve_address_space`] span, not yet in
/// use) readable and writable, locks them if `lock` (`MLOCK_ONFAULT`: each page as it is
/// faulted in, which does not populate under the `mmap_lock`), and writes every page, so that
/// each is faulted in (and locked) now rather than on first use.
///
/// Calls `touched` with the pages faulted in, every [`TOUCH_REPORT`] pages: under pressure each
/// fault may wait for reclaim, and whoever waits for the caller can tell slow from stuck.
///
/// # Safety
/// `at..at + len` lies inside a span from [`reserve_address_space`] that nothing uses yet.
pub unsafe fn commit_and_touch(
    at: *mut u8,
    len: usize,
    lock: bool,
    touched: &mut dyn FnMut(u64),
) -> io::Result<()> {
    // SAFETY: `at..at + len` is part of a reserved span that nothing uses yet (the caller's
    // contract); changing its protection and locking affect no live memory.
    unsafe {
        if libc::mprotect(at.cast(), len, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lock && libc::mlock2(at.cast(), len, libc::MLOCK_ONFAULT) != 0 {
            let e = io::Error::last_os_error();
            libc::mprotect(at.cast(), len, libc::PROT_NONE);
            return Err(e);
        }
    }
    for (n, offset) in (0..len).step_by(4096).enumerate() {
        // SAFETY: inside the range just made writable, and no one else's yet.
        unsafe { at.add(offset).write_volatile(0) };
        if (n + 1) % TOUCH_REPORT == 0 {
            touched(TOUCH_REPORT as u64);
        }
    }
    let rest = len / 4096 % TOUCH_REPORT;
    if rest > 0 {
        touched(rest as u64);
    }
    Ok(())
}

/// How many pages [`commit_and_touch`] faults in between two reports.
pub const TOUCH_REPORT: usize = 16;

/// Gives back `len` bytes at `at` (page aligned, inside a [`reserve_address_space`] span, no
/// longer in use) that [`commit_and_touch`] made usable: unlocked, their pages dropped, and
/// `PROT_NONE` again, so they count in neither `VmRSS` nor `VmLck`.
///
/// # Safety
/// `at..at + len` lies inside a span from [`reserve_address_space`] and nothing uses it any
/// more (its contents are lost).
pub unsafe fn decommit(at: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: `at..at + len` is part of a reserved span that nothing uses (the caller's
    // contract): unlocking, dropping its pages and removing access affect no live memory.
    unsafe {
        if libc::munlock(at.cast(), len) != 0
            || libc::madvise(at.cast(), len, libc::MADV_DONTNEED) != 0
            || libc::mprotect(at.cast(), len, libc::PROT_NONE) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A `File` of its own (a `dup`) for `fd`, a descriptor that stays open across the call.
pub fn dup_fd(fd: std::os::fd::RawFd) -> io::Result<std::fs::File> {
    // SAFETY: the caller's `fd` is open for the duration of this call (libublk's /dev/ublkcN,
    // open for the `UblkDev`'s life); it is borrowed only to be duplicated, and the duplicate is
    // an owned descriptor of its own.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    Ok(std::fs::File::from(borrowed.try_clone_to_owned()?))
}

/// Marks descriptor `fd`, inherited from the process that started this one, close-on-exec
/// (checking that it is open), without taking it over yet: so that no program this process
/// starts before [`take_inherited_fd`] inherits it.
pub fn keep_inherited_fd(fd: std::os::fd::RawFd) -> io::Result<()> {
    if fd < 3 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: fcntl with integer arguments on a descriptor number; a closed one fails (EBADF).
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Has the kernel SIGKILL this process when the thread that started it ends
/// (`PR_SET_PDEATHSIG`), and checks that `parent` still is its parent: an error if it ended
/// before.
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    let kill = libc::SIGKILL as libc::c_ulong;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, kill, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid has no preconditions and cannot fail.
    let now = unsafe { libc::getppid() };
    if u32::try_from(now) != Ok(parent) {
        return Err(io::Error::other(format!(
            "its supervisor (pid {parent}) ended before it started (parent now {now})"
        )));
    }
    Ok(())
}

/// Takes over descriptor `fd`, inherited from the process that started this one (the daemon's
/// supervisor hands its worker the device's memory region so), checking that it is open, and
/// marks it close-on-exec so that no further program inherits it.
pub fn take_inherited_fd(fd: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    keep_inherited_fd(fd)?;
    // SAFETY: `fd` is open (checked above) and, by the protocol between supervisor and worker,
    // nothing else in this process owns it: this is its one owner from here on.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The seals a secret's memfd carries: no byte of it may change, nor its size, nor its seals.
const SECRET_SEALS: libc::c_int =
    libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A memfd holding `bytes`, sealed against any change, mapped into this process (read-only,
/// made resident; under `mlockall(MCL_FUTURE)` locked, so never swapped out), for a secret a
/// process passes to the programs it starts and never writes to a file. The mapping is private
/// (before Linux 6.7 a shared mapping of a write-sealed memfd is refused, read-only or not); a
/// read-only private mapping maps the memfd's own pages, so locking it locks them. It stays for
/// the process's life. Close-on-exec.
pub fn sealed_secret(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: a valid C string and flags; the result is checked.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let file = std::fs::File::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    file.write_all_at(bytes, 0)?;
    // SAFETY: fcntl with integer arguments on a descriptor `file` keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SECRET_SEALS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if !bytes.is_empty() {
        // SAFETY: a new private, read-only mapping of `file` at an address the kernel picks;
        // nothing existing is touched, and it is never unmapped (nothing refers to it).
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes.len(),
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(file.into())
}

/// Reads the secret in `fd` (made by [`sealed_secret`]) into `out`: refused (`EINVAL`) unless
/// the memfd is sealed against changes and holds exactly `out.len()` bytes.
pub fn read_sealed_secret(fd: std::os::fd::BorrowedFd<'_>, out: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    // SAFETY: fcntl with integer arguments on a descriptor `fd` keeps open across the call.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(io::Error::last_os_error());
    }
    let want = SECRET_SEALS & !libc::F_SEAL_SEAL;
    let file = std::fs::File::from(fd.try_clone_to_owned()?);
    let len = file.metadata()?.len();
    if seals & want != want || len != out.len() as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a sealed secret of {} bytes (seals {seals:#x}, {len} bytes)",
                out.len()
            ),
        ));
    }
    file.read_exact_at(out, 0)
}

/// Lets programs this process starts inherit `fd` (clears close-on-exec).
pub fn set_inheritable(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments on a descriptor `fd` keeps open across the call.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Keeps `fd` from programs this process starts (sets close-on-exec).
pub fn set_cloexec(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments on a descriptor `fd` keeps open across the call.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `signal` to process `pid` (errors ignored: it may have exited meanwhile).
pub fn kill(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill takes integers only; a pid that no longer exists fails harmlessly (ESRCH).
    unsafe { libc::kill(pid, signal) };
}

/// Sends `signal` to every process of group `pgid` (errors ignored: it may be gone).
pub fn kill_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill takes integers only; a negative pid names a process group, never this
    // process's own unless it leads it (a child made with process_group(0) leads its own).
    unsafe { libc::kill(-pgid, signal) };
}

/// Takes `flock(LOCK_EX | LOCK_NB)` on `file`: `Ok(false)` when another open file holds it.
/// Released when `file` is closed (or its process ends).
pub fn try_flock(file: &std::fs::File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor `file` keeps open for the call, with integer arguments
    // only; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Sends `signal` to process `pid`; the kernel's error if it refuses (ESRCH, EPERM).
pub fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill takes integers only; the result is checked.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points fd 2 at `fd`, which it then owns (the caller's `fd` is closed).
pub fn redirect_stderr(fd: std::os::fd::OwnedFd) -> io::Result<()> {
    // SAFETY: dup2 of a valid fd (owned here, open across the call) onto fd 2; no memory is
    // passed.
    if unsafe { libc::dup2(fd.as_raw_fd(), 2) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points fd 1 at `file` (the caller has flushed stdout's buffer).
pub fn redirect_stdout(file: &std::fs::File) -> io::Result<()> {
    // SAFETY: dup2 of a valid fd (`file` lives across the call) onto fd 1; no memory is passed.
    if unsafe { libc::dup2(file.as_raw_fd(), 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A set of signals blocked in the thread that made it and every thread created after.
#[derive(Clone, Copy)]
pub struct BlockedSignals(libc::sigset_t);

impl BlockedSignals {
    /// Blocks `signals` in the calling thread (threads it starts inherit the mask).
    pub fn block(signals: &[libc::c_int]) -> io::Result<BlockedSignals> {
        // SAFETY: sigset manipulation on a local, zero-initialised set (a valid empty set for
        // sigemptyset to initialise), then blocking those signals for this thread; the result of
        // pthread_sigmask is checked.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            Ok(BlockedSignals(set))
        }
    }

    /// Waits until one of the signals is pending and takes it; returns its number.
    pub fn wait(&self) -> libc::c_int {
        let mut sig = 0;
        // SAFETY: the set was initialised by `block`; `sig` is a valid out-pointer.
        unsafe { libc::sigwait(&self.0, &mut sig) };
        sig
    }
}

/// Tunes glibc's malloc: one arena, no trimming, no `mmap` below 32 MiB (see `daemon::pin`).
pub fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt takes integer parameters only; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

/// Who is on the other end of a Unix socket, from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
}

/// The peer's credentials (`SO_PEERCRED`).
pub fn peer(stream: &std::os::unix::net::UnixStream) -> io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the fd is a live socket.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// Whether descriptor 1 was closed when the process started (see [`stdout_was_closed`]).
static STDOUT_CLOSED_AT_START: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Records whether descriptor 1 is closed, before Rust's runtime points a closed standard
/// descriptor at /dev/null (which it does before `main`): run by the C runtime from
/// `.init_array`, ahead of the Rust runtime's own start.
extern "C" fn record_stdout_at_start() {
    // SAFETY: F_GETFD on descriptor 1 only reads the process's descriptor table.
    if unsafe { libc::fcntl(1, libc::F_GETFD) } < 0 {
        STDOUT_CLOSED_AT_START.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The C runtime calls each function in `.init_array` before `main`; this one takes no
/// arguments and touches only an atomic.
#[used]
#[link_section = ".init_array"]
static RECORD_STDOUT_AT_START: extern "C" fn() = record_stdout_at_start;

/// Whether the program was started with its stdout closed (`uzram >&-`): Rust's runtime then
/// points descriptor 1 at /dev/null and takes a write to it for a success, so what was there at
/// start is recorded before that (a /dev/null a parent opened for it is not a closed stdout).
pub fn stdout_was_closed() -> bool {
    // Named, so that the linker keeps the record with this function.
    std::hint::black_box(&RECORD_STDOUT_AT_START);
    STDOUT_CLOSED_AT_START.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `path` is on procfs or sysfs, by its file system's type wherever it is mounted
/// (`statfs`): files there look regular but are the kernel's interfaces.
pub fn on_kernel_fs(path: &std::path::Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is writable memory of
    // the type statfs fills; the result is checked.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type's type differs between C libraries and targets; the magic numbers fit 32 bits.
    #[allow(clippy::unnecessary_cast)]
    // SAFETY: statfs succeeded, so it filled `st` (zeroed before, so every byte is initialised).
    let kind = unsafe { st.assume_init() }.f_type as i64;
    Ok(matches!(kind, PROC_SUPER_MAGIC | SYSFS_MAGIC))
}

/// The real user id of the process.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Makes `cmd`'s child start a new session (`setsid`) before it runs, so it outlives the
/// terminal it was started from.
pub fn start_in_new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; setsid is async-signal-safe and
    // touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Changes the calling thread's user ids (all three) to `uid`, for that thread alone (the raw
/// syscall, not glibc's process-wide `setresuid`). For tests that need an unprivileged client.
#[cfg(test)]
pub fn set_thread_uid(uid: u32) -> io::Result<()> {
    // SAFETY: changes this thread's credentials only; no memory is involved.
    let r = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for process `pid` (`pidfd_open`, Linux 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<std::os::fd::OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a system call with integer arguments only; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    owned_fd(fd)
}

/// A duplicate, in this process, of descriptor `target` of the process `pidfd` names
/// (`pidfd_getfd`, Linux 5.6; the caller must be allowed to ptrace it).
pub fn pidfd_getfd(
    pidfd: std::os::fd::BorrowedFd<'_>,
    target: i32,
) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: a system call with integer arguments only (a descriptor borrowed for the call);
    // the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    owned_fd(fd)
}

/// The descriptor a system call returned (or its error).
fn owned_fd(ret: libc::c_long) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let fd = libc::c_int::try_from(ret).map_err(|_| io::Error::other("bad descriptor"))?;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `fd`, a new descriptor this process owns and nothing
    // else refers to.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Waits until `fd` has something to read (or its writer closed it), at most `timeout`;
/// whether it has.
pub fn wait_readable(
    fd: std::os::fd::BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: one valid pollfd, on the stack for the call, of a descriptor borrowed for it.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The kernel's page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf takes an integer and has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_and_sysfs_are_told_by_their_type() {
        assert!(on_kernel_fs(std::path::Path::new("/proc/self/status")).unwrap());
        assert!(!on_kernel_fs(&std::env::temp_dir()).unwrap());
        assert!(on_kernel_fs(std::path::Path::new("/nonexistent/x")).is_err());
    }

    #[test]
    fn commit_and_touch_reports_its_pages_as_it_goes() {
        let pages = 2 * TOUCH_REPORT + 3;
        let at = reserve_address_space(pages * 4096).unwrap();
        let mut reports = Vec::new();
        // SAFETY: the span just reserved, which nothing uses.
        unsafe { commit_and_touch(at, pages * 4096, false, &mut |n| reports.push(n)) }.unwrap();
        assert_eq!(
            reports,
            [TOUCH_REPORT as u64, TOUCH_REPORT as u64, 3],
            "{reports:?}"
        );
        // SAFETY: committed above and writable; nothing else uses it.
        unsafe { at.add(pages * 4096 - 1).write_volatile(7) };
    }

    #[test]
    fn a_sealed_secret_reads_back_and_cannot_change() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        let secret: Vec<u8> = (0..32u8).collect();
        let fd = sealed_secret(c"uzram-test-secret", &secret).unwrap();
        let mut out = [0u8; 32];
        read_sealed_secret(fd.as_fd(), &mut out).unwrap();
        assert_eq!(&out[..], &secret[..]);
        // The wrong length is refused; the memfd can neither be written nor resized.
        let mut short = [0u8; 16];
        assert!(read_sealed_secret(fd.as_fd(), &mut short).is_err());
        let file = std::fs::File::from(fd.try_clone().unwrap());
        assert!(file.write_at(b"x", 0).is_err());
        assert!(file.set_len(64).is_err());
        // A memfd without the seals is refused.
        // SAFETY: a valid C string and flags; the result is checked.
        let raw = unsafe { libc::memfd_create(c"uzram-test-open".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let open = std::fs::File::from(unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw)
        });
        open.write_all_at(&secret, 0).unwrap();
        assert!(read_sealed_secret(open.as_fd(), &mut out).is_err());
    }
}
