//! Tiering as one component: the policy's state ([`policy::Tier`]), the backing store
//! ([`writeback`]) and the marks of freed pages ([`FreedPages`]), owned by the device as one
//! [`Tiering`].
//!
//! The device's own paths (write, read, discard) call tiering only through the hooks below;
//! tiering reaches the device's slots and pool only through the device's methods (a slot and
//! its lock, [`Device::replace`], the pool). So a store of one page reads as zram's
//! `zram_write_page`: compress, [`Tiering::over_ceiling`], store in the pool or
//! [`Tiering::no_room`] and retry, then under the slot's lock [`Device::replace`] (which calls
//! [`Tiering::replaced`]), [`Tiering::take_freed`], and [`Tiering::stored`]. A read of a
//! written-back page goes through [`Tiering::load_written_back`] and, for a read the policy
//! judges, [`Tiering::after_read_back`].
//!
//! The public settings and statistics of tiering ([`Device::policy`], [`Device::writeback`],
//! [`Device::set_freed_pages`] and the rest) are the device's methods, defined here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::policy::{self, PolicyConfig, PolicyStats};
use super::writeback::{self, BackingStore, Batch, WritebackRequest, WritebackStats};
use super::{Device, FreedPages, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::Error;

/// The tiering component of a [`Device`].
#[derive(Debug)]
pub(super) struct Tiering {
    /// The policy's settings, budget, counters and requests.
    pub(super) policy: policy::Tier,
    /// Where written-back pages live.
    pub(super) backing: Option<BackingStore>,
    /// Pages the device's user freed without a request, marked by someone else (swap's freed
    /// slots): see [`FreedPages`].
    pub(super) freed: OnceLock<FreedPages>,
    /// zram's `writeback_batch_size`: pages a `writeback` pass writes at a time.
    pub(super) wb_batch: AtomicUsize,
}

impl Tiering {
    pub(super) fn new(config: PolicyConfig, backing: Option<BackingStore>) -> Tiering {
        let t = Tiering {
            policy: policy::Tier::new(config),
            backing,
            freed: OnceLock::new(),
            wb_batch: AtomicUsize::new(writeback::BATCH),
        };
        t.set_reuse(config.reuse);
        t
    }

    /// Before a page of `size` stored bytes goes into the pool: past the pool's ceiling under
    /// host pressure, asks for room without waiting if the store would take a new pool page
    /// (see `policy::spill`).
    pub(super) fn over_ceiling(&self, dev: &Device, batch: Option<&mut Batch<'_>>, size: usize) {
        if self.backing.is_some() && self.past_ceiling(dev) && !dev.pool().has_room_for(size) {
            self.ask_room(dev, batch, size);
        }
    }

    /// The pool had no room for `size` bytes: makes room by evicting cold pages (see
    /// [`Tiering::make_room`]), unless `tries` (counted here) reached [`policy::EVICT_TRIES`] or
    /// the device has no backing store. Whether the store is worth retrying.
    pub(super) fn no_room(
        &self,
        dev: &Device,
        batch: Option<&mut Batch<'_>>,
        size: usize,
        tries: &mut usize,
    ) -> bool {
        if *tries >= policy::EVICT_TRIES || self.backing.is_none() {
            return false;
        }
        *tries += 1;
        self.make_room(dev, batch, size)
    }

    /// A store failed after eviction was tried.
    pub(super) fn evict_failed(&self) {
        self.policy.count_evict_failed();
    }

    /// After page `index` was stored with `flags` (its slot lock released): while spill is on,
    /// queues a stored page for the policy thread to write through.
    pub(super) fn stored(&self, index: PageIndex, flags: SlotFlags) {
        self.policy.note_stored(index, flags);
    }

    /// Page `index` (its slot locked) no longer holds `old`: a written-back page's record is
    /// freed, or kept for reuse.
    pub(super) fn replaced(&self, index: PageIndex, old: &SlotState) {
        if old.flags.contains(SlotFlags::WB) {
            self.free_written_back(index, old);
        }
    }

    /// For a whole-page write of `page`: the written-back state that takes a kept record of the
    /// same content over, if there is one (see `writeback::reuse`).
    pub(super) fn take_kept(&self, dev: &Device, page: &[u8; PAGE_SIZE]) -> Option<SlotState> {
        self.adopt_kept(page, || dev.now())
    }

    /// A write is storing new data at page `index` (its slot locked): takes the page's freed
    /// mark, so a late mark cannot free the new data. Whether there was one.
    pub(super) fn take_freed(&self, index: PageIndex) -> bool {
        self.freed.get().is_some_and(|f| f.take(index))
    }

    /// A promoted page was read again `age` seconds after its promotion.
    pub(super) fn promoted_read(&self, age: u32) {
        self.policy.note_promoted_read(age);
    }
}

impl Device {
    /// The tiering component, for the policy thread's and the tiering modules' use.
    pub(super) fn tiering(&self) -> &Tiering {
        &self.tier
    }

    /// The policy's settings.
    pub fn policy(&self) -> PolicyConfig {
        self.tier.policy.config()
    }

    /// Changes the policy's settings (`key=value ...`, see [`PolicyConfig::update`]).
    pub fn set_policy(&self, text: &str) -> Result<(), Error> {
        self.tier.set_policy(self, text)
    }

    /// What the policy and eviction have done.
    pub fn policy_stats(&self) -> PolicyStats {
        let mut s = self.tier.policy.stats();
        // The groups' figures are the device's, whoever made the groups.
        let g = self.groups.figures();
        (
            s.groups_made,
            s.grouped_pages,
            s.group_reads,
            s.groups_split,
        ) = (g.made, g.pages, g.decompressions, g.split);
        s
    }

    /// Hand-off mode: a write that finds no room asks the policy thread (which must be running
    /// [`policy::Policy::serve_evictions`]) to evict, instead of writing to the backing store
    /// itself. The daemon turns it on when a backing file is a regular file.
    pub fn set_evict_hand_off(&self, on: bool) {
        self.tier.policy.set_hand_off(on);
    }

    /// The backing store, if the device has one.
    pub fn backing(&self) -> Option<&BackingStore> {
        self.tier.backing.as_ref()
    }

    /// zram's `writeback_batch_size`: as set (a pass writes at most 256 pages at a time).
    pub fn writeback_batch_size(&self) -> usize {
        self.tier.wb_batch.load(Ordering::Relaxed)
    }

    /// Sets zram's `writeback_batch_size` (at least 1).
    pub fn set_writeback_batch_size(&self, pages: usize) {
        self.tier.wb_batch.store(pages.max(1), Ordering::Relaxed);
    }

    /// zram's `writeback`: moves the pages `req` selects to the backing store, compressed and
    /// sealed, in batches written with one `pwrite` each; then compacts the pool. A failed write
    /// leaves its pages in RAM; a full store or the writeback limit ends the pass cleanly.
    pub fn writeback(
        &self,
        ctx: &mut IoContext,
        req: WritebackRequest,
    ) -> Result<WritebackStats, Error> {
        self.tier.writeback(self, ctx, req)
    }

    /// Gives the device the marks of pages its user frees (see [`FreedPages`]); once: a second
    /// call is refused with [`Error::Busy`].
    pub fn set_freed_pages(&self, freed: FreedPages) -> Result<(), Error> {
        self.tier.set_freed_pages(self.pages(), freed)
    }

    /// The marks of freed pages, if the device has them.
    pub fn freed_pages(&self) -> Option<&FreedPages> {
        self.tier.freed.get()
    }

    /// Frees every marked page (zram's `swap_slot_free_notify`, late): takes each mark under its
    /// page's slot lock and frees what the page holds. Returns the marks taken; each counts in
    /// `notify_free`, as zram counts each notification.
    pub fn reclaim_freed(&self) -> u64 {
        self.reclaim_freed_until(|| false).0
    }

    /// [`Device::reclaim_freed`] in steps: after each 64 pages' marks, stops if `stop` says so
    /// (for a thread with other work that must not wait behind a long reclaim: the daemon's
    /// memory thread keeps the pool's reserve filled). Returns the marks taken, and whether
    /// some pages may still be marked (it stopped before it read them all).
    pub fn reclaim_freed_until(&self, stop: impl FnMut() -> bool) -> (u64, bool) {
        self.tier.reclaim_freed_until(self, stop)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The tiering modules' sources (tests included: they may use the device's fields).
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("the source tree") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.to_string_lossy().ends_with("tests.rs")
            {
                out.push(path);
            }
        }
    }

    /// The boundary the module docs state: tiering's own files name no `Device { .. }` (an
    /// impl block, a literal, a pattern) and read none of its fields through a binding; they
    /// reach it through its methods. Matched with each run of whitespace read as one space and
    /// none around a `.`, so a chain rustfmt broke over lines is read as one.
    #[test]
    fn tiering_reaches_the_device_only_through_its_methods() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/device");
        let mut files = vec![root.join("freed.rs"), root.join("tier.rs")];
        for dir in ["freed", "policy", "writeback"] {
            sources(&root.join(dir), &mut files);
        }
        assert!(files.len() > 10, "found {files:?}");
        let fields = [
            "id",
            "disksize",
            "slots",
            "pool",
            "codecs",
            "huge_threshold",
            "epoch",
            "clock_skew",
            "tier",
            "counters",
            "next_shard",
        ];
        let ident = |c: char| c == '_' || c.is_alphanumeric();
        for file in &files {
            let text = std::fs::read_to_string(file)
                .expect("a source file")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(" .", ".")
                .replace(". ", ".");
            let name = file.display();
            let own = file.ends_with("tier.rs");
            for pattern in ["Device {", "Device{"] {
                for (i, _) in text.match_indices(pattern) {
                    let before = text[..i].chars().next_back().unwrap_or(' ');
                    assert!(own || ident(before), "{name} names `Device {{ .. }}`");
                }
            }
            for binding in ["dev", "device", "d", "this"] {
                for field in fields {
                    let at = format!("{binding}.{field}");
                    for (i, _) in text.match_indices(&at) {
                        let before = text[..i].chars().next_back().unwrap_or(' ');
                        let next = text[i + at.len()..].chars().next().unwrap_or(' ');
                        assert!(
                            ident(before) || next == '(' || ident(next),
                            "{name} reads the device's field `{field}` ({at})"
                        );
                    }
                }
            }
        }
    }
}
