//! The memory thread's kernel stack while it stalls, for the progress log: a write that finds
//! the pool's reserve dry waits for that thread, and what it waits for in the kernel (reclaim,
//! a lock, a throttle) is what a fix has to know. Sampled a few times a second only while the
//! thread has spent [`STALL_MS`] or more in one phase, logged when it changed, at most
//! [`MAX_LOGGED`] times in a process's life; never on the I/O path.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, Ordering};

use super::threads::Phase;

/// How long the memory thread must have been in one phase before its stack is sampled: a
/// write put off by a dry reserve waits 2 s at most for its progress.
pub(super) const STALL_MS: u64 = 300;

/// Stacks logged in a process's life at most (a long stall would fill the console).
const MAX_LOGGED: u32 = 24;

/// The memory thread's id (0 until it runs).
static MEMORY_TID: AtomicU32 = AtomicU32::new(0);

/// Records the calling thread as the memory thread.
pub(super) fn note_memory_thread() {
    let tid = u32::try_from(crate::sys::gettid()).unwrap_or(0);
    MEMORY_TID.store(tid, Ordering::Release);
}

/// Function names of a stack kept for a record: a /dev/kmsg record longer than the kernel's
/// limit (1024 bytes from Linux 6.2, 976 before with the caller's id) is refused with EINVAL,
/// and the line's words around them take 120 bytes at most.
const NAMES: usize = 820;

/// Samples and logs the memory thread's stack. Its file is opened and read once, and its
/// buffers touched, before any stall (a stall is when memory is short, and an allocation or a
/// first touch of a page would wait for it then): a sample allocates nothing in the daemon and
/// faults nothing in (the kernel allocates a little for each read of the stack).
pub(super) struct StallStacks {
    file: Option<std::fs::File>,
    /// The open was tried (it is not tried again: a kernel without stack traces, or no root).
    tried: bool,
    raw: [u8; 4096],
    names: [u8; NAMES],
    last: [u8; NAMES],
    last_len: usize,
    line: [u8; 1024],
    logged: u32,
}

impl StallStacks {
    pub(super) fn new() -> StallStacks {
        StallStacks {
            file: None,
            tried: false,
            raw: [0; 4096],
            names: [0; NAMES],
            last: [0; NAMES],
            last_len: 0,
            line: [0; 1024],
            logged: 0,
        }
    }

    /// Opens the memory thread's stack file once the thread has said who it is: call it on
    /// every look, stalled or not (it does nothing once it has tried).
    pub(super) fn prepare(&mut self) {
        if self.tried {
            return;
        }
        let tid = MEMORY_TID.load(Ordering::Acquire);
        if tid != 0 {
            self.tried = true;
            self.file = std::fs::File::open(format!("/proc/self/task/{tid}/stack")).ok();
            // A first read sets up the kernel's side of the file (its buffer stays while open).
            if let Some(f) = &self.file {
                let _ = f.read_at(&mut self.raw, 0);
            }
        }
    }

    /// With the memory thread in `phase` for `ms` milliseconds: reads its kernel stack and,
    /// if it differs from the last one logged, writes it to `kmsg` as one line of function
    /// names (innermost first).
    pub(super) fn sample(&mut self, kmsg: &mut std::fs::File, phase: Phase, ms: u64) {
        if phase == Phase::Waiting || ms < STALL_MS || self.logged >= MAX_LOGGED {
            return;
        }
        let Some(file) = self.file.as_ref() else {
            return;
        };
        let Ok(n) = file.read_at(&mut self.raw, 0) else {
            return;
        };
        let len = function_names(&self.raw[..n], &mut self.names);
        if len == 0 || self.names[..len] == self.last[..self.last_len] {
            return;
        }
        let mut w = std::io::Cursor::new(&mut self.line[..]);
        let _ = write!(
            w,
            "<3>uzram: memory thread {} for {ms} ms, in the kernel: ",
            phase.name()
        );
        let _ = w.write_all(&self.names[..len]);
        let _ = w.write_all(b"\n");
        let end = w.position() as usize;
        // Not written (refused, or a full log): the next sample tries again.
        if kmsg.write_all(&self.line[..end]).is_ok() {
            self.last[..len].copy_from_slice(&self.names[..len]);
            self.last_len = len;
            self.logged += 1;
        }
    }
}

/// The function names of a /proc/PID/stack text ("[<0>] name+0x1f/0x80" a line), joined by
/// " < " into `out`; the length written. Names that do not fit are left out.
fn function_names(stack: &[u8], out: &mut [u8]) -> usize {
    let mut len = 0;
    for line in stack.split(|&b| b == b'\n') {
        let name = line
            .iter()
            .position(|&b| b == b' ')
            .map_or(line, |i| &line[i + 1..]);
        let name = name
            .iter()
            .position(|&b| b == b'+')
            .map_or(name, |i| &name[..i]);
        if name.is_empty() {
            continue;
        }
        let sep: &[u8] = if len == 0 { b"" } else { b" < " };
        if len + sep.len() + name.len() > out.len() {
            break;
        }
        out[len..len + sep.len()].copy_from_slice(sep);
        len += sep.len();
        out[len..len + name.len()].copy_from_slice(name);
        len += name.len();
    }
    len
}

#[cfg(test)]
mod tests {
    use super::{function_names, note_memory_thread, StallStacks};
    use crate::daemon::threads::Phase;
    use std::os::unix::fs::FileExt;

    /// A thread asleep in the kernel stands in for the memory thread: its stack is logged once
    /// it has been in a phase long enough, and not again while it stays the same. Reading a
    /// thread's stack takes root; without it the test says so and checks nothing more.
    #[test]
    fn a_stalled_thread_s_kernel_stack_is_logged_once() {
        if std::fs::read("/proc/self/stack").is_err() {
            eprintln!("not root: /proc/self/stack cannot be read here, nothing to sample");
            return;
        }
        let (told, said) = std::sync::mpsc::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let waiter = std::thread::spawn(move || {
            note_memory_thread();
            told.send(()).unwrap();
            // Blocked in the kernel (a futex) until the test lets it go.
            let _ = held.recv();
        });
        said.recv().unwrap();
        let mut stacks = StallStacks::new();
        stacks.prepare();
        let file = stacks.file.as_ref().expect("the thread's stack file");
        // Until the thread is in its wait (a loaded machine may take a while to get it there).
        let mut raw = [0u8; 4096];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let n = file.read_at(&mut raw, 0).unwrap();
            if String::from_utf8_lossy(&raw[..n]).contains("futex_wait") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never in futex_wait");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let path = std::env::temp_dir().join(format!("uzram-stallstack-{}", std::process::id()));
        let mut log = std::fs::File::create(&path).unwrap();
        // Not yet a stall, and waiting is never one.
        stacks.sample(&mut log, Phase::MappingArena, 100);
        stacks.sample(&mut log, Phase::Waiting, 5000);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        stacks.sample(&mut log, Phase::MappingArena, 400);
        stacks.sample(&mut log, Phase::MappingArena, 500);
        release.send(()).unwrap();
        waiter.join().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with("<3>uzram: memory thread mapping an arena")
                && text.contains("for 400 ms, in the kernel: ")
                && text.contains("futex_wait"),
            "{text}"
        );
    }

    #[test]
    fn a_stack_reads_as_its_function_names_innermost_first() {
        let stack = b"[<0>] folio_wait_bit_common+0x13a/0x310\n[<0>] shmem_fault+0x9e/0x230\n[<0>] __do_fault+0x33/0x140\n";
        let mut out = [0u8; 64];
        let n = function_names(stack, &mut out);
        assert_eq!(
            &out[..n],
            b"folio_wait_bit_common < shmem_fault < __do_fault"
        );
        let mut small = [0u8; 30];
        let n = function_names(stack, &mut small);
        assert_eq!(&small[..n], b"folio_wait_bit_common");
        assert_eq!(function_names(b"", &mut out), 0);
    }
}
