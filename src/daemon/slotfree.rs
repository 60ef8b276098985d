//! The slot-free probe: how the daemon learns that swap freed a slot, as kernel zram does.
//!
//! The kernel calls zram's `swap_slot_free_notify` the moment swap frees a slot; a ublk disk is
//! told nothing but the discards of whole free clusters (`swapon --discard=pages`). So the
//! daemon loads a small eBPF program (`slotfree.bpf.c`, built by build.rs) on the function the
//! kernel's free path calls right beside that hook (`clear_shadow_from_swap_cache`, Linux 5.9
//! and later): for a free on this device's swap area it marks the freed pages in a BPF array
//! the daemon maps (`sys::SharedWords`) and hands to the engine as [`FreedPages`]; the memory
//! thread frees marked pages each round ([`uzram_engine::Device::reclaim_freed`]). See the
//! engine's `freed` module for why a late mark never frees a page swap wrote again.
//!
//! Where the probe cannot be had (no such function, no BTF, symbol addresses hidden, no eBPF,
//! `--slot-free discard`), the device frees only what swap discards, and says so: in the log,
//! the listing (`SLOT-FREE`) and `uzram_stat` (`slot_free_probe 0`).
//!
//! The only module that talks to aya. It loads before the daemon pins its memory: reading the
//! kernel's BTF to relocate the program takes megabytes, given back before `mlockall`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use uzram_engine::FreedPages;

use crate::sys::SharedWords;

/// The words ahead of the marks in the map (`HEADER_WORDS` in slotfree.bpf.c): the device's
/// dev_t to watch, then the program's counters.
const HEADER_WORDS: usize = 8;
/// Header word: the kernel's dev_t of the device whose swap area is watched (0: none).
const H_TARGET: usize = 0;
/// Header word: frees of the device's slots the program saw.
const H_CALLS: usize = 1;
/// Header word: pages it marked that were not marked already.
const H_PAGES: usize = 2;
/// Header word: pages of frees it could not mark (a range longer than it takes).
const H_DROPPED: usize = 3;

/// The kernel function the program attaches to: called by `swap_range_free()` with the swap
/// area's type and the first and last slot freed, beside `swap_slot_free_notify()`.
pub const PROBED: &str = "clear_shadow_from_swap_cache";

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
        self.header(H_PAGES)
    }

    /// Frees of the device's slots the probe saw.
    pub fn calls(&self) -> u64 {
        self.header(H_CALLS)
    }

    /// Pages of frees the probe could not mark.
    pub fn dropped(&self) -> u64 {
        self.header(H_DROPPED)
    }

    fn header(&self, word: usize) -> u64 {
        self.words
            .as_ref()
            .map_or(0, |w| w.words()[word].load(Ordering::Relaxed))
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

/// The probe, loaded and attached, marking nothing until [`Loaded::watch`] names the device.
pub struct Loaded {
    /// The program's attachment (aya's link, which holds the program, which holds its map):
    /// dropped, the probe is gone. Everything else aya parsed is freed once it is loaded.
    link: Box<dyn std::any::Any + Send + Sync>,
    words: Arc<SharedWords>,
    pages: u64,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("pages", &self.pages)
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
    /// Starts marking the freed slots of the swap area on `block` (`/dev/ublkbN`, made by this
    /// daemon) for `device`: the device gets the marks, then the program the device's dev_t.
    pub fn watch(self, block: &str, device: &uzram_engine::Device) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(block)
            .map_err(|e| format!("{block}: {e}"))?
            .rdev();
        // The kernel's own encoding (MKDEV): what the program reads from the swap file's inode.
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        let kdev = u64::from(major) << 20 | u64::from(minor);
        FreedPages::new(Box::new(Marks(Arc::clone(&self.words))), self.pages)
            .and_then(|f| device.set_freed_pages(f))
            .map_err(|e| e.to_string())?;
        self.words.words()[H_TARGET].store(kdev, Ordering::Release);
        super::log(&format!(
            "slot-free: probe on {PROBED}: {block} frees each page as swap frees its slot"
        ));
        // The program stays attached for the daemon's life (the kernel detaches it when the
        // process goes).
        std::mem::forget(self.link);
        let _ = STATUS.set(Status {
            mode: Mode::Probe,
            words: Some(self.words),
        });
        Ok(())
    }
}

/// From the kernel's symbols (`/proc/kallsyms`): the address of `swap_info`, the array of swap
/// areas by type, and whether [`PROBED`] is there (a function of the kernel's own, not a
/// module's).
fn kallsyms(symbols: impl std::io::BufRead) -> Result<(u64, bool), String> {
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
            (n, "t" | "T") if n == PROBED => probed = true,
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

/// Loads and attaches the probe for a device of `pages` pages; why not, when it cannot.
#[cfg(feature = "ublk")]
pub fn load(pages: u64) -> Result<Loaded, String> {
    aya_probe::load(pages)
}

/// Without the `ublk` feature there is no daemon and nothing to load.
#[cfg(not(feature = "ublk"))]
pub fn load(_pages: u64) -> Result<Loaded, String> {
    Err("built without the ublk feature".into())
}

#[cfg(feature = "ublk")]
mod aya_probe {
    use std::sync::Arc;

    use aya::maps::Map;
    use aya::programs::KProbe;
    use aya::EbpfLoader;
    use uzram_engine::FreedPages;

    use super::{Loaded, HEADER_WORDS, PROBED};
    use crate::sys::SharedWords;

    /// The program build.rs compiled (aligned, as the ELF reader wants).
    static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/slotfree.bpf.o"));

    /// The program's name in the object.
    const PROGRAM: &str = "uzram_slot_free";

    pub(super) fn load(pages: u64) -> Result<Loaded, String> {
        if OBJECT.is_empty() {
            return Err("built without an eBPF target for this architecture".into());
        }
        let file =
            std::fs::File::open("/proc/kallsyms").map_err(|e| format!("/proc/kallsyms: {e}"))?;
        let (swap_info, probed) = super::kallsyms(std::io::BufReader::new(file))?;
        if !probed {
            return Err(format!("this kernel has no {PROBED}"));
        }
        let summary = FreedPages::summary_words(pages);
        let words = HEADER_WORDS + summary + FreedPages::page_words(pages);
        let entries = u32::try_from(words).map_err(|_| format!("{pages} pages is too many"))?;
        let summary = summary as u64;
        let mut ebpf = EbpfLoader::new()
            .override_global("swap_info_addr", &swap_info, true)
            .override_global("device_pages", &pages, true)
            .override_global("summary_words", &summary, true)
            .map_max_entries("marks", entries)
            .load(OBJECT)
            .map_err(|e| format!("loading the eBPF program: {e}"))?;
        let program: &mut KProbe = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| format!("the eBPF object has no program {PROGRAM}"))?
            .try_into()
            .map_err(|e| format!("{PROGRAM}: {e}"))?;
        program
            .load()
            .map_err(|e| format!("the kernel refused the eBPF program: {e}"))?;
        let id = program
            .attach(PROBED, 0)
            .map_err(|e| format!("attaching to {PROBED}: {e}"))?;
        // The link, taken from the program, keeps it attached once the rest of aya's state is
        // dropped (with it the program's and map's descriptors: the link holds the program,
        // the program and the mapping below hold the map).
        let link = program
            .take_link(id)
            .map_err(|e| format!("attaching to {PROBED}: {e}"))?;
        let map = match ebpf.map("marks") {
            Some(Map::Array(data)) => data,
            _ => return Err("the eBPF object has no array map \"marks\"".into()),
        };
        let shared = SharedWords::map(std::os::fd::AsFd::as_fd(map.fd()), words)
            .map_err(|e| format!("mapping the marks: {e}"))?;
        drop(ebpf);
        Ok(Loaded {
            link: Box::new(link),
            words: Arc::new(shared),
            pages,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::kallsyms;

    #[test]
    fn kallsyms_gives_swap_info_and_the_probed_function() {
        let text = "ffffffff915dc470 T clear_shadow_from_swap_cache\n\
                    ffffffffc0a01000 t swap_info\t[some_module]\n\
                    ffffffff915dff60 t swap_entry_range_free\n\
                    ffffffff939d56a0 b swap_info\n";
        assert_eq!(kallsyms(text.as_bytes()), Ok((0xffff_ffff_939d_56a0, true)));
        // A module's symbol of the same name is not the kernel's.
        let module_only = "ffffffffc0a01000 T clear_shadow_from_swap_cache\t[m]\n\
                           ffffffff939d56a0 b swap_info\n";
        assert_eq!(
            kallsyms(module_only.as_bytes()),
            Ok((0xffff_ffff_939d_56a0, false))
        );
        // What an unprivileged reader, or kptr_restrict, sees.
        let hidden = "0000000000000000 T clear_shadow_from_swap_cache\n\
                      0000000000000000 b swap_info\n";
        assert!(kallsyms(hidden.as_bytes())
            .unwrap_err()
            .contains("kptr_restrict"));
        assert!(kallsyms("".as_bytes())
            .unwrap_err()
            .contains("no swap_info"));
    }
}
