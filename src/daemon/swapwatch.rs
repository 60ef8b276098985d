//! The swap watcher: logs failed requests (an I/O thread never does), tells the memory thread
//! whether the device is swap, and, after a swapoff, frees the pages the swap area left behind.
//! Also the device's exclusive claim, which a reset and that reclaim hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use uzram_engine::{Device, PageIndex, PAGE_SIZE};

use super::{log, mailbox};
use crate::common::{block_path, is_swap, mount_point};

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
/// The kernel has read every page back in before it drops the device from /proc/swaps; the
/// reclaim holds the device's exclusive claim (no mkfs, mount or swapon meanwhile) and checks
/// that page 0 still carries the swap signature.
pub(super) fn swap_watch_thread(id: u32, device: Arc<Device>) {
    let spawned = std::thread::Builder::new()
        .name("uzram-swapwatch".into())
        .spawn(move || {
            // An I/O flusher though it serves no I/O, as every thread of the daemon is (see
            // `super::io_flusher`).
            let path = block_path(id);
            // The device clock's second when the device was last seen as swap: every page the
            // swap area wrote is older; anything written after the swapoff is not.
            let mut last_seen_swap: Option<u32> = None;
            // Failed requests, logged from here (an I/O thread never logs).
            let (mut reported, mut last_report) = (0, None);
            loop {
                mailbox::report_failures(&mut reported, &mut last_report, Duration::from_secs(10));
                let now = device.clock_secs();
                let swap = is_swap(&path);
                IN_USE_AS_SWAP.store(swap, Ordering::Relaxed);
                match (swap, last_seen_swap) {
                    (true, _) => last_seen_swap = Some(now),
                    (false, Some(seen)) => {
                        reclaim_after_swapoff(id, &device, seen);
                        last_seen_swap = None;
                    }
                    (false, None) => {}
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    if let Err(e) = spawned {
        log(&format!("cannot start the swap watcher: {e}"));
    }
}

/// Frees the pages swap left behind: those last written or read no later than the second after
/// `seen` (the clock's second when the device was last seen as swap; the watcher samples once a
/// second), keeping the swap header and anything written later. Holds the device's exclusive
/// claim meanwhile and requires the swap signature on page 0.
fn reclaim_after_swapoff(id: u32, device: &Device, seen: u32) {
    let claim = match claim_unused(id) {
        Ok(c) => c,
        Err(why) => {
            return log(&format!(
                "after swapoff: not freeing the old swap pages: {why}"
            ))
        }
    };
    let mut page = vec![0u8; PAGE_SIZE];
    let signed = device
        .context()
        .and_then(|mut ctx| Ok(device.read(&mut ctx, 0, &mut page)?))
        .is_ok()
        && page[PAGE_SIZE - 10..] == *b"SWAPSPACE2";
    if !signed {
        return log("after swapoff: page 0 is no longer a swap header; leaving the contents alone");
    }
    // Swapoff reads (and so stamps) every page before the device leaves /proc/swaps, and it
    // ended before the next sample, at most a second after the last sighting: pages stamped up to
    // the second after `seen` are swap's. A write in that window by someone who neither holds the
    // device exclusively nor touches page 0 is the one case not told apart.
    let freed = device.free_pages_older_than(PageIndex(1), seen.saturating_add(2));
    log(&format!(
        "{}: swapoff: freed {freed} old swap pages",
        block_path(id)
    ));
    drop(claim);
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
    if is_swap(&path) {
        return Err(format!("{path} is in use as swap: swapoff {path} first"));
    }
    if let Some(point) = mount_point(&path) {
        return Err(format!("{path} is mounted on {point}: umount it first"));
    }
    Err(format!(
        "{path} is in use (held open exclusively by another program)"
    ))
}
