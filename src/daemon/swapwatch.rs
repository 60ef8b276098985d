//! The swap watcher: logs failed requests (an I/O thread never does), tells the memory thread
//! whether the device is swap, and, after a swapoff, frees the pages the swap area left behind.
//! Also the device's exclusive claim, which a reset holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use uzram_engine::{Device, PageIndex, PAGE_SIZE};

use super::io::NON_SWAP_WRITES;
use super::{log, mailbox};
use crate::common::{block_path, is_swap, mount_point, swap_state};

/// Whether the device was swap at the watcher's last look (once a second).
static IN_USE_AS_SWAP: AtomicBool = AtomicBool::new(false);

/// Whether the device is swap now (as of the swap watcher's last look, at most a second ago).
pub(super) fn in_use_as_swap() -> bool {
    IN_USE_AS_SWAP.load(Ordering::Relaxed)
}

/// Logs failed requests (see [`mailbox::report_failures`]) and watches whether the device is swap
/// (`/proc/swaps`, once a second) and, when a swapoff has
/// ended, frees the swap area's old pages (not the header, nothing written since): the kernel tells a ublk disk nothing when swap
/// slots are freed (kernel zram has a private hook for it), and clusters freed during swapoff are
/// not discarded either, so without this a swapped-off device would keep every page it ever held.
/// The kernel has read every page back in before it drops the device from /proc/swaps. The
/// reclaim takes no claim on the device (a `swapoff && mkfs` must not find it busy): it runs
/// only if nothing but swap wrote since the device was last seen as swap, and keeps whatever
/// is written meanwhile by its access second (see [`reclaim_after_swapoff`]).
pub(super) fn swap_watch_thread(id: u32, device: Arc<Device>) {
    let spawned = std::thread::Builder::new()
        .name("uzram-swapwatch".into())
        .spawn(move || {
            // An I/O flusher though it serves no I/O, as every thread of the daemon is (see
            // `super::io_flusher`).
            let path = block_path(id);
            // Whether the device was swap at the last look (a swapoff came between), and how
            // many writes not from swap it had had by then.
            let mut was_swap = false;
            let mut writes_seen = 0;
            // Failed requests, logged from here (an I/O thread never logs).
            let (mut reported, mut last_report) = (0, None);
            loop {
                mailbox::report_failures(&mut reported, &mut last_report, Duration::from_secs(10));
                // The count first: one taken after a sighting of swap could hold a new user's
                // writes (the sighting is the older fact).
                let writes = NON_SWAP_WRITES.load(Ordering::SeqCst);
                let swap = is_swap(&path);
                IN_USE_AS_SWAP.store(swap, Ordering::Relaxed);
                let (reclaim, writes_seen_before) = (was_swap && !swap, writes_seen);
                (was_swap, writes_seen) = (swap, writes);
                if reclaim {
                    // Read after /proc/swaps: swapoff's last reads came before. Looked at again
                    // at once after it: the device may be swap again by then.
                    reclaim_after_swapoff(id, &device, device.clock_secs(), writes_seen_before);
                    continue;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    if let Err(e) = spawned {
        log(&format!("cannot start the swap watcher: {e}"));
    }
}

/// Frees the pages swap left behind, once the device was found no longer swap at the clock's
/// second `found`: swapoff read (and so stamped) every page before the device left
/// /proc/swaps, so every page of the swap area was last touched no later than `found`. Nothing
/// but swap may have written since the device was last seen as swap (when `writes_seen` writes
/// not from swap had come): a new user's data is never freed. The reclaim waits for the clock
/// to pass `found` and a second more, so that whatever is written from then on carries a later
/// second and is kept (each slot's second is checked under its lock), then counts the writes
/// not from swap again: any since, and it leaves the contents alone (mkfs and the like discard
/// or overwrite them). It holds no claim on the device while it frees: a `swapoff && mkfs`
/// does not find it busy.
fn reclaim_after_swapoff(id: u32, device: &Device, found: u32, writes_seen: u64) {
    let path = block_path(id);
    // A second more than needed: a writer's clock read may land a hair before this one's.
    while device.clock_secs() <= found.saturating_add(1) {
        if is_swap(&path) {
            IN_USE_AS_SWAP.store(true, Ordering::Relaxed);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if NON_SWAP_WRITES.load(Ordering::SeqCst) != writes_seen {
        return log(&format!(
            "{path}: swapoff: written since by someone other than swap; leaving the old swap pages to them"
        ));
    }
    // The last gate, for a /proc/swaps that said "not swap" wrongly (unreadable, or a line
    // missed): swap holds the device exclusively. Taken and let go at once, so a mkfs starting
    // now finds the device busy for microseconds at most, never for the free.
    if let Err(why) = claim_unused(id) {
        return log(&format!(
            "{path}: swapoff: not freeing the old swap pages: {why}"
        ));
    }
    let mut page = vec![0u8; PAGE_SIZE];
    let signed = device
        .context()
        .and_then(|mut ctx| Ok(device.read(&mut ctx, 0, &mut page)?))
        .is_ok()
        && page[PAGE_SIZE - 10..] == *b"SWAPSPACE2";
    if !signed {
        return log(&format!(
            "{path}: swapoff: page 0 is no longer a swap header; leaving the contents alone"
        ));
    }
    let freed = device.free_pages_older_than(PageIndex(1), found.saturating_add(1));
    log(&format!("{path}: swapoff: freed {freed} old swap pages"));
}

/// Why `/dev/ublkb{id}` cannot be reset now, if it cannot: it is swap, mounted, or held open
/// exclusively by someone. Returns the exclusive claim it took when free, to hold while the
/// device is stopped (no one can swapon or mount it meanwhile).
pub(super) fn claim_unused(id: u32) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = block_path(id);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&path);
    let err = match file {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    if err.raw_os_error() != Some(libc::EBUSY) {
        return Err(format!("{path}: {err}"));
    }
    if swap_state(&path) == Ok(true) {
        return Err(format!("{path} is in use as swap: swapoff {path} first"));
    }
    if let Some(point) = mount_point(&path) {
        return Err(format!("{path} is mounted on {point}: umount it first"));
    }
    Err(format!(
        "{path} is in use (held open exclusively by another program)"
    ))
}
