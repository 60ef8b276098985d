//! The slot-free probe: how the daemon learns that swap freed a slot, as kernel zram does.
//!
//! The kernel calls zram's `swap_slot_free_notify` the moment swap frees a slot; a ublk disk is
//! told nothing but the discards of whole free clusters (`swapon --discard=pages`). So the
//! daemon has a small eBPF program (`slotfree.bpf.c`, built by build.rs) attached to a
//! function the kernel's free path calls right beside that hook (the [`Hook`] that
//! [`VERIFIED_KERNELS`] names for the running kernel): for a free on this device's swap area it marks
//! the freed pages in a BPF array the daemon maps (`sys::SharedWords`) and hands to the engine
//! as [`FreedPages`]; the memory thread frees marked pages each round
//! ([`uzram_engine::Device::reclaim_freed`]). See the engine's `freed` module for why a late
//! mark never frees a page swap wrote again.
//!
//! The program is loaded by a helper, `uzram-probe` (installed beside `uzram`; [`helper`], the
//! only code that talks to aya): relocating it reads the kernel's BTF (megabytes) and aya's
//! code is over half a megabyte, and the daemon locks all of its own code and memory. The
//! helper loads and attaches the program and waits; the daemon takes the attachment's and the
//! map's descriptors from it (`pidfd_getfd`), maps the map, and lets it exit. Under a
//! supervisor it is the supervisor that loads it, once, and holds both descriptors across its
//! workers' deaths; each worker maps the marks ([`adopt`]). The attachment lives as long as a
//! process holds its descriptor.
//!
//! Where the probe cannot be had (no helper, no such function, no BTF, symbol addresses
//! hidden, no eBPF, `--slot-free discard`), the device frees only what swap discards, and says
//! so: in the log, the listing (`SLOT-FREE`) and `uzram_stat` (`slot_free_probe 0`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use uzram_engine::FreedPages;

use crate::sys::SharedWords;

/// The words ahead of the marks in the map (`HEADER_WORDS` in slotfree.bpf.c): the device's
/// dev_t to watch, then the program's counters (`H_*` there: frees seen, pages newly marked,
/// pages of frees it could not mark).
const HEADER_WORDS: usize = 8;
/// Header word: the kernel's dev_t of the device whose swap area is watched (0: none). Word 0
/// in every [`PROTOCOL`]: a worker stops a probe of another version with it ([`disown`]).
const H_TARGET: usize = 0;
/// Header word: pages the program marked that were not marked already.
const H_PAGES: usize = 2;

/// Where the probe attaches on one form of the kernel's free path: a kernel function that
/// `swap_range_free()` calls beside `swap_slot_free_notify()`, and the program of
/// slotfree.bpf.c that reads its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hook {
    /// The kernel function.
    pub function: &'static str,
    /// The program's name in the object.
    program: &'static str,
    /// Why a kernel of that form may lack the function, for the log ("" where none).
    absent_when: &'static str,
}

/// Linux 6.0-6.12: `clear_shadow_from_swap_cache(type, begin, end)`, once a range, under the
/// swap area's lock.
const CLEAR_SHADOW: Hook = Hook {
    function: "clear_shadow_from_swap_cache",
    program: "uzram_slot_free",
    absent_when: "",
};

/// Linux 6.18 and later: `zswap_invalidate(entry)`, once a slot, under the slot's cluster lock
/// (there only with CONFIG_ZSWAP, as distributions build it).
const ZSWAP_INVALIDATE: Hook = Hook {
    function: "zswap_invalidate",
    program: "uzram_slot_free_entry",
    absent_when: " (a kernel built without zswap, CONFIG_ZSWAP, has none)",
};

/// How swap's freed slots reach the device.
#[derive(Debug)]
pub enum Mode {
    /// The probe marks them as the kernel frees them.
    Probe,
    /// Only discards of whole free clusters free pages; why the probe is not there.
    DiscardOnly(String),
}

/// What the listing and `uzram_stat` show of it.
#[derive(Debug)]
pub struct Status {
    /// The mechanism.
    pub mode: Mode,
    /// The probe's map, for its counters.
    words: Option<Arc<SharedWords>>,
}

impl Status {
    /// Pages the probe marked freed (0 without the probe).
    pub fn marked(&self) -> u64 {
        self.words
            .as_ref()
            .map_or(0, |w| w.words()[H_PAGES].load(Ordering::Relaxed))
    }
}

static STATUS: OnceLock<Status> = OnceLock::new();

/// The daemon's slot-free mechanism, once [`Loaded::watch`] or [`discard_only`] set it.
pub fn status() -> Option<&'static Status> {
    STATUS.get()
}

/// Records that this daemon frees only what swap discards, and why.
pub fn discard_only(why: String) {
    super::log(&format!(
        "slot-free: discard only ({why}): swap's freed slots keep their pages until swap \
         discards their cluster or writes them again"
    ));
    let _ = STATUS.set(Status {
        mode: Mode::DiscardOnly(why),
        words: None,
    });
}

/// The probe, loaded and attached. One this process loaded marks nothing until
/// [`Loaded::watch`] names the device; one adopted from the supervisor may already mark it
/// (a dead worker watched).
pub struct Loaded {
    /// The program's attachment (a BPF link, which holds the program, which holds its map):
    /// closed, the probe is gone.
    link: std::os::fd::OwnedFd,
    /// The map's descriptor, unused here but held for the process's life (see
    /// [`Loaded::watch`]): a supervisor systemd restarts finds the probe of a reserve that
    /// took the device over by its descriptors (`pidfd_getfd`), and a mapping is no descriptor.
    map: std::os::fd::OwnedFd,
    /// The map, mapped (the mapping holds the map too).
    words: Arc<SharedWords>,
    pages: u64,
    /// Where it is attached.
    hook: Hook,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("pages", &self.pages)
            .field("hook", &self.hook.function)
            .finish_non_exhaustive()
    }
}

/// The engine's view of the map: the words after the header.
struct Marks(Arc<SharedWords>);

impl uzram_engine::FreeMarks for Marks {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        &self.0.words()[HEADER_WORDS..]
    }
}

impl Loaded {
    /// Gives `device` the marks, before it serves any request: a probe a successor adopted may
    /// hold marks already (made before the worker died, or while none ran), and a write takes
    /// its page's mark only on a device that has them. A write served before this would keep
    /// its page's stale mark, and the memory thread would free what it stored.
    pub fn attach(&self, device: &uzram_engine::Device) -> Result<(), String> {
        FreedPages::new(Box::new(Marks(Arc::clone(&self.words))), self.pages)
            .and_then(|f| device.set_freed_pages(f))
            .map_err(|e| e.to_string())
    }

    /// Points the probe at `block`'s swap area (its device number), once it serves; call
    /// [`Loaded::attach`] first.
    pub fn watch(self, block: &str) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(block)
            .map_err(|e| format!("{block}: {e}"))?
            .rdev();
        // The kernel's own encoding (MKDEV): what the program reads from the swap file's inode.
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let kdev = u64::from(major) << 20 | u64::from(minor);
        self.words.words()[H_TARGET].store(kdev, Ordering::Release);
        super::log(&format!(
            "slot-free: probe on {}: {block} frees each page as swap frees its slot",
            self.hook.function
        ));
        // The program stays attached for this process's life (the kernel lets go of this
        // process's hold when it goes; a supervisor's copy keeps it attached for the next
        // worker).
        std::mem::forget(self.link);
        std::mem::forget(self.map);
        let _ = STATUS.set(Status {
            mode: Mode::Probe,
            words: Some(self.words),
        });
        Ok(())
    }
}

/// From the kernel's symbols (`/proc/kallsyms`): the address of `swap_info`, the array of swap
/// areas by type, and whether the function `probed` is there (the kernel's own, not a
/// module's).
fn kallsyms(symbols: impl std::io::BufRead, probed_fn: &str) -> Result<(u64, bool), String> {
    let (mut swap_info, mut probed) = (None, false);
    for line in symbols.lines() {
        let line = line.map_err(|e| format!("/proc/kallsyms: {e}"))?;
        let mut f = line.split_ascii_whitespace();
        let (Some(addr), Some(kind), Some(name), None) = (f.next(), f.next(), f.next(), f.next())
        else {
            // Four fields: a module's symbol.
            continue;
        };
        match (name, kind) {
            ("swap_info", "b" | "B" | "d" | "D") => swap_info = u64::from_str_radix(addr, 16).ok(),
            (n, "t" | "T") if n == probed_fn => probed = true,
            _ => {}
        }
        if swap_info.is_some() && probed {
            break;
        }
    }
    match swap_info {
        None => Err("no swap_info in /proc/kallsyms".into()),
        Some(0) => Err("kernel symbol addresses are hidden (kernel.kptr_restrict)".into()),
        Some(a) => Ok((a, probed)),
    }
}

/// The helper's name, beside the running binary.
pub const HELPER: &str = "uzram-probe";

/// Where the helper is: beside the binary (a build tree, `/usr/local/bin`), else in the
/// prefix's `libexec/uzram/` (the package: `/usr/bin/uzram`, `/usr/libexec/uzram/uzram-probe`).
fn helper_path(exe: &std::path::Path) -> std::path::PathBuf {
    let beside = exe.with_file_name(HELPER);
    if beside.exists() {
        return beside;
    }
    match exe.parent().and_then(std::path::Path::parent) {
        Some(prefix) => {
            let libexec = prefix.join("libexec/uzram").join(HELPER);
            if libexec.exists() {
                libexec
            } else {
                beside
            }
        }
        None => beside,
    }
}

/// What the daemon and its helper must agree on (the map's layout, the answer's form): the
/// daemon passes it, the helper answers with its own, and a mismatch (a helper left from
/// another version of uzram) is refused rather than trusted with the daemon's pages.
pub const PROTOCOL: &str = "uzram-probe/2";

/// A kernel release line, (major, minor).
pub type Release = (u32, u32);

/// The kernels whose free and allocation paths were read for the probe's one ordering rule (a
/// freed slot is marked before it can be handed out again; see slotfree.bpf.c) and that ran
/// the VM's swap and churn checks with it, each range's oldest and newest as (major, minor),
/// with the hook for that form of the path. Elsewhere the probe is not trusted with the
/// daemon's pages: discards only. 6.13-6.17 moved both paths under the cluster lock and
/// were not read.
pub const VERIFIED_KERNELS: [(Release, Release, Hook); 3] = [
    ((6, 0), (6, 12), CLEAR_SHADOW),
    ((6, 18), (6, 18), ZSWAP_INVALIDATE),
    ((7, 3), (7, 3), ZSWAP_INVALIDATE),
];

/// The hook for the kernel `release` (`uname -r`), where the probe was verified on it, or why
/// not.
pub fn kernel_verified(release: &str) -> Result<Hook, String> {
    let version = crate::common::release_line(release)
        .ok_or_else(|| format!("cannot read the kernel release {release:?}"))?;
    if let Some(&(_, _, hook)) = VERIFIED_KERNELS
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&version))
    {
        return Ok(hook);
    }
    let ranges: Vec<String> = VERIFIED_KERNELS
        .iter()
        .map(|((a, b), (c, d), _)| format!("{a}.{b} to {c}.{d}"))
        .collect();
    Err(format!(
        "the probe's ordering on the kernel's swap free path was verified on Linux {}, and \
         this kernel is {release}",
        ranges.join(" and ")
    ))
}

/// The hook for the running kernel (`/proc/sys/kernel/osrelease`), or why there is none.
fn running_kernel_hook() -> Result<Hook, String> {
    kernel_verified(&crate::common::running_release()?)
}

/// How long the helper may take to load and attach the program.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The words of the map for a device of `pages` pages: the header, the summary, the page bits.
pub fn map_words(pages: u64) -> usize {
    HEADER_WORDS + FreedPages::summary_words(pages) + FreedPages::page_words(pages)
}

/// Has the helper beside this binary load and attach the probe for a device of `pages` pages,
/// and takes it over; why not, when it cannot.
pub fn load(pages: u64) -> Result<Loaded, String> {
    adopt(&load_fds(pages)?, pages, PROTOCOL)
}

/// The probe's attachment and map as descriptors, to hand to a worker (see [`adopt`]).
#[derive(Debug)]
pub struct Descriptors {
    /// The BPF link: closed in every process, the probe is gone.
    pub link: std::os::fd::OwnedFd,
    /// The BPF array of marks: a worker maps it.
    pub map: std::os::fd::OwnedFd,
}

/// A probe loaded by another process (a worker's supervisor, which holds it across its workers'
/// deaths, so that a successor needs no memory for it while the device waits): maps its marks.
/// `protocol`: the [`PROTOCOL`] of the binary that loaded it (an upgrade may have another).
///
/// The marks a dead worker's probe made stay, and are this process's to free (see the engine's
/// `freed` module: a mark never frees a page written after it), unless the probe marks nothing
/// (its target 0): then a worker served without its marks ([`disown`]), or none has pointed it
/// at the device yet, and whatever marks it holds may be older than a write since; they are
/// cleared. That leaks the pages they stood for until swap writes or discards them; it frees
/// nothing it should not.
pub fn adopt(probe: &Descriptors, pages: u64, protocol: &str) -> Result<Loaded, String> {
    use std::os::fd::AsFd;
    if protocol != PROTOCOL {
        return Err(format!(
            "the supervisor's probe speaks {protocol:?}, this binary {PROTOCOL:?} (restart \
             the device to load this binary's)"
        ));
    }
    let hook = running_kernel_hook()?;
    let link = probe
        .link
        .try_clone()
        .map_err(|e| format!("taking the probe's link: {e}"))?;
    let map = probe
        .map
        .try_clone()
        .map_err(|e| format!("taking the probe's map: {e}"))?;
    let words = map_words(pages);
    let shared = SharedWords::map_bpf_array(probe.map.as_fd(), words)
        .map_err(|e| format!("mapping the marks: {e}"))?;
    clear_unwatched(shared.words());
    Ok(Loaded {
        link,
        map,
        words: Arc::new(shared),
        pages,
        hook,
    })
}

/// Clears the marks in `words` (a probe's map) if the probe marks nothing (see [`adopt`]);
/// whether it did.
fn clear_unwatched(words: &[std::sync::atomic::AtomicU64]) -> bool {
    if words[H_TARGET].load(Ordering::Acquire) != 0 {
        return false;
    }
    for word in &words[HEADER_WORDS..] {
        word.store(0, Ordering::Relaxed);
    }
    true
}

/// Stops the probe whose map is `map` marking (its target 0), for a worker that was given it
/// and serves without its marks: that worker's writes take no marks, so a mark made before or
/// while it serves could free a page it stored, once a later worker adopted them. [`adopt`]
/// clears the marks of a probe that marks nothing. Header word 0 is the target in every
/// protocol, so this holds across versions.
pub fn disown(map: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    crate::sys::bpf_array_store(map, H_TARGET as u32, 0)
}

/// [`load`], but only the descriptors: no mapping in this process.
pub fn load_fds(pages: u64) -> Result<Descriptors, String> {
    use std::os::unix::fs::MetadataExt;
    use std::process::{Command, Stdio};

    running_kernel_hook()?;
    // Swap offsets are the kernel's pages; the probe marks them as the device's 4 KiB pages.
    let page = crate::sys::page_size();
    if page != uzram_engine::PAGE_SIZE as u64 {
        return Err(format!(
            "the kernel's pages are {page} bytes, not the device's {}",
            uzram_engine::PAGE_SIZE
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding the {HELPER} helper: {e}"))?;
    let helper = helper_path(&exe);
    // Run as root, it must be as safe from others as the daemon itself, and so must the
    // directory that holds it.
    let mine = |m: &std::fs::Metadata| {
        m.mode() & 0o022 == 0 && (m.uid() == 0 || m.uid() == crate::sys::uid())
    };
    let meta = std::fs::metadata(&helper).map_err(|e| format!("{}: {e}", helper.display()))?;
    let dir = helper.parent().map(std::fs::metadata);
    if !meta.is_file() || !mine(&meta) || !matches!(dir, Some(Ok(ref d)) if mine(d)) {
        return Err(format!(
            "{} is not a file that only root may change, in a directory only root may change",
            helper.display()
        ));
    }
    let mut child = Command::new(&helper)
        .arg(pages.to_string())
        .arg(PROTOCOL)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", helper.display()))?;
    let mut stdout = child.stdout.take().ok_or("no pipe from the helper")?;
    // Read on this thread, with a deadline (a thread of its own would leave its 2 MiB stack
    // cached by the C library, which mlockall would then lock whole).
    let taken = read_answer(&mut stdout).and_then(|line| take_over(child.id(), &line));
    if taken.is_err() {
        let _ = child.kill();
    }
    // Its stdin closed, the helper exits.
    drop(child.stdin.take());
    let _ = child.wait();
    let (link, map) = taken?;
    Ok(Descriptors { link, map })
}

/// The helper's one line of answer, read within [`HELPER_TIMEOUT`].
fn read_answer(from: &mut std::process::ChildStdout) -> Result<String, String> {
    use std::io::Read;
    use std::os::fd::AsFd;
    let deadline = std::time::Instant::now() + HELPER_TIMEOUT;
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    while !answer.contains(&b'\n') {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match crate::sys::wait_readable(from.as_fd(), left) {
            Ok(true) => {}
            Ok(false) => return Err(format!("{HELPER} did not answer within {HELPER_TIMEOUT:?}")),
            Err(e) => return Err(format!("waiting for {HELPER}: {e}")),
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if answer.len() < 64 << 10 => answer.extend_from_slice(&buf[..n]),
            Ok(_) => return Err(format!("{HELPER} answered too much")),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading {HELPER}'s answer: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&answer);
    Ok(line.lines().next().unwrap_or_default().to_string())
}

/// The attachment's and the map's descriptors, from the helper's answer `line` ("ok PROTOCOL
/// LINK MAP", its descriptor numbers, or "error WHY").
fn take_over(pid: u32, line: &str) -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), String> {
    use std::os::fd::AsFd;
    let (link, map) = parse_answer(line)?;
    let pidfd = crate::sys::pidfd_open(pid).map_err(|e| format!("pidfd_open: {e}"))?;
    let take = |fd| {
        crate::sys::pidfd_getfd(pidfd.as_fd(), fd)
            .map_err(|e| format!("taking the helper's descriptor {fd}: {e}"))
    };
    Ok((take(link)?, take(map)?))
}

/// The helper's answer ("ok PROTOCOL LINK MAP"): its attachment's and map's descriptor
/// numbers, or why it failed.
fn parse_answer(line: &str) -> Result<(i32, i32), String> {
    let mut words = line.split(' ');
    match words.next() {
        Some("ok") => {
            let theirs = words.next().unwrap_or_default();
            if theirs != PROTOCOL {
                return Err(format!(
                    "{HELPER} speaks {theirs:?}, not {PROTOCOL:?}: it is from another uzram"
                ));
            }
            let mut fd = || words.next().and_then(|w| w.parse::<i32>().ok());
            match (fd(), fd(), words.next()) {
                (Some(link), Some(map), None) => Ok((link, map)),
                _ => Err(format!("{HELPER} answered {line:?}")),
            }
        }
        Some("error") => Err(line["error".len()..].trim().to_string()),
        _ => Err(format!("{HELPER} answered {line:?}")),
    }
}

/// The helper's side (`uzram-probe PAGES PROTOCOL`, cargo feature `ublk`): the only code that
/// talks to aya, linked into the helper alone.
#[cfg(feature = "ublk")]
pub mod helper;

#[cfg(test)]
mod tests {
    use super::kallsyms;

    /// The helper beside the binary wins; without one there, the prefix's libexec/uzram/ (as
    /// the package installs it); with neither, the path beside (which the error then names).
    #[test]
    fn the_helper_is_found_beside_the_binary_else_in_libexec() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let libexec = dir.path().join("libexec/uzram");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("uzram");
        assert_eq!(super::helper_path(&exe), bin.join(super::HELPER));
        std::fs::create_dir_all(&libexec).unwrap();
        std::fs::write(libexec.join(super::HELPER), b"").unwrap();
        assert_eq!(super::helper_path(&exe), libexec.join(super::HELPER));
        std::fs::write(bin.join(super::HELPER), b"").unwrap();
        assert_eq!(super::helper_path(&exe), bin.join(super::HELPER));
    }

    #[test]
    fn kallsyms_gives_swap_info_and_the_probed_function() {
        let text = "ffffffff915dc470 T clear_shadow_from_swap_cache\n\
                    ffffffffc0a01000 t swap_info\t[some_module]\n\
                    ffffffff915dff60 t swap_entry_range_free\n\
                    ffffffff939d56a0 b swap_info\n";
        let probed = "clear_shadow_from_swap_cache";
        assert_eq!(
            kallsyms(text.as_bytes(), probed),
            Ok((0xffff_ffff_939d_56a0, true))
        );
        assert_eq!(
            kallsyms(text.as_bytes(), "zswap_invalidate"),
            Ok((0xffff_ffff_939d_56a0, false))
        );
        // A module's symbol of the same name is not the kernel's.
        let module_only = "ffffffffc0a01000 T clear_shadow_from_swap_cache\t[m]\n\
                           ffffffff939d56a0 b swap_info\n";
        assert_eq!(
            kallsyms(module_only.as_bytes(), probed),
            Ok((0xffff_ffff_939d_56a0, false))
        );
        // What an unprivileged reader, or kptr_restrict, sees.
        let hidden = "0000000000000000 T clear_shadow_from_swap_cache\n\
                      0000000000000000 b swap_info\n";
        assert!(kallsyms(hidden.as_bytes(), probed)
            .unwrap_err()
            .contains("kptr_restrict"));
        assert!(kallsyms("".as_bytes(), probed)
            .unwrap_err()
            .contains("no swap_info"));
    }

    #[test]
    fn only_kernels_whose_free_path_was_read_get_the_probe() {
        use super::{kernel_verified, CLEAR_SHADOW, ZSWAP_INVALIDATE};
        for ok in ["6.12.118+deb12-amd64", "6.0.0", "6.1.0-28-amd64", "6.12"] {
            assert_eq!(kernel_verified(ok), Ok(CLEAR_SHADOW), "{ok}");
        }
        for ok in ["6.18.15+deb13-amd64", "7.3.4+deb13-amd64", "6.18"] {
            assert_eq!(kernel_verified(ok), Ok(ZSWAP_INVALIDATE), "{ok}");
        }
        for no in [
            "5.15.0-91-generic",
            "6.13.2-arch1-1",
            "6.17.1",
            "7.0.1",
            "6.19.0-rc1",
            "7.4.0",
        ] {
            assert!(
                kernel_verified(no)
                    .unwrap_err()
                    .contains("verified on Linux"),
                "{no}"
            );
        }
        assert!(kernel_verified("").unwrap_err().contains("cannot read"));
        assert!(kernel_verified("weird")
            .unwrap_err()
            .contains("cannot read"));
    }

    #[test]
    fn marks_of_a_probe_that_marks_nothing_are_cleared_on_adopt() {
        use super::{clear_unwatched, HEADER_WORDS, H_PAGES, H_TARGET};
        use std::sync::atomic::{AtomicU64, Ordering};
        let map: Vec<AtomicU64> = (0..HEADER_WORDS + 4).map(|_| AtomicU64::new(0)).collect();
        let marked = |m: &[AtomicU64]| -> Vec<u64> {
            m[HEADER_WORDS..]
                .iter()
                .map(|w| w.load(Ordering::Relaxed))
                .collect()
        };
        map[H_PAGES].store(3, Ordering::Relaxed);
        map[HEADER_WORDS].store(1, Ordering::Relaxed);
        map[HEADER_WORDS + 2].store(0b101, Ordering::Relaxed);
        // Watched (the last worker pointed it at its device): the marks are the successor's.
        map[H_TARGET].store(259 << 20, Ordering::Relaxed);
        assert!(!clear_unwatched(&map));
        assert_eq!(marked(&map), [1, 0, 0b101, 0]);
        // Disowned, or never pointed at the device: they may be older than a write since.
        map[H_TARGET].store(0, Ordering::Relaxed);
        assert!(clear_unwatched(&map));
        assert_eq!(marked(&map), [0; 4]);
        // The counters stay.
        assert_eq!(map[H_PAGES].load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_probe_of_another_protocol_is_not_adopted() {
        let null = || std::fs::File::open("/dev/null").unwrap().into();
        let probe = super::Descriptors {
            link: null(),
            map: null(),
        };
        let why = super::adopt(&probe, 1024, "uzram-probe/1").unwrap_err();
        assert!(why.contains("\"uzram-probe/1\""), "{why}");
        assert!(why.contains(super::PROTOCOL), "{why}");
    }

    #[test]
    fn the_helpers_answer_is_read_strictly() {
        use super::parse_answer;
        assert_eq!(parse_answer("ok uzram-probe/2 5 7"), Ok((5, 7)));
        assert!(parse_answer("ok uzram-probe/1 5 7")
            .unwrap_err()
            .contains("another uzram"));
        assert_eq!(
            parse_answer("error this kernel has no clear_shadow_from_swap_cache"),
            Err("this kernel has no clear_shadow_from_swap_cache".into())
        );
        for bad in [
            "",
            "hello",
            "ok uzram-probe/2",
            "ok uzram-probe/2 5",
            "ok uzram-probe/2 x 7",
            "ok uzram-probe/2 5 7 9",
        ] {
            assert!(
                parse_answer(bad).unwrap_err().contains("answered"),
                "{bad:?}"
            );
        }
    }
}
