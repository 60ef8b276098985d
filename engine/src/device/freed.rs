//! Pages the device's user let go of without a request: swap's freed slots. The kernel tells
//! zram the moment swap frees a slot (`swap_slot_free_notify`, a private hook); a ublk disk is
//! told nothing, so someone else (the daemon's eBPF probe on the kernel's free path) marks those
//! pages in a bitmap the device was given ([`FreedPages`], [`Device::set_freed_pages`]), and the
//! device frees them as zram would.
//!
//! The marks come asynchronously: a mark for page `p` may still be unread when a write stores new
//! data at `p` (swap reused the slot). Two rules make that safe, both under `p`'s slot lock:
//! a write that stores a page takes its mark (its old data was dead, and it is replaced anyway),
//! and [`Device::reclaim_freed`] frees a page only if it takes the page's mark. So whichever comes
//! first, the new data is never freed. The one ordering the marker must keep: a page is marked
//! before anyone can write it again (the probe marks under the swap area's lock, before the slot
//! can be handed out again).
//!
//! Until it is taken, a marked page stays what it was: reads return its old bytes (swap never
//! reads a slot it freed) and recompression sees it as any other page; writeback passes it by.
//!
//! The bitmap's words, as the marker writes them: `summary` words (bit `w`: word `w` of the page
//! bits may have bits set), then the page bits (bit `p % 64` of word `p / 64`: page `p`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::tier::Tiering;
use super::{Device, Field, PageIndex, SlotState};
use crate::Error;

/// Memory that holds the marks' words, owned by whoever marks them (the daemon: a BPF map
/// mapped into its address space). `words()` must return the same words for as long as the
/// value lives.
pub trait FreeMarks: Send + Sync {
    /// The words: [`FreedPages::summary_words`] of summary, then [`FreedPages::page_words`] of
    /// page bits (more are ignored).
    fn words(&self) -> &[AtomicU64];
}

impl FreeMarks for Box<[AtomicU64]> {
    fn words(&self) -> &[AtomicU64] {
        self
    }
}

/// Which of a device's pages its user freed, marked by someone else: see the module docs.
pub struct FreedPages {
    marks: Box<dyn FreeMarks>,
    /// The pages of the device the marks are for (their words follow from it).
    pages: u64,
}

impl std::fmt::Debug for FreedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreedPages")
            .field("pages", &self.pages)
            .finish_non_exhaustive()
    }
}

impl FreedPages {
    /// Words of page bits for a device of `pages` pages: one bit a page.
    pub fn page_words(pages: u64) -> usize {
        pages.div_ceil(64) as usize
    }

    /// Words of summary for a device of `pages` pages: one bit a word of page bits.
    pub fn summary_words(pages: u64) -> usize {
        (Self::page_words(pages) as u64).div_ceil(64) as usize
    }

    /// The words marks for a device of `pages` pages take: summary, then page bits.
    fn words_for(pages: u64) -> usize {
        Self::summary_words(pages) + Self::page_words(pages)
    }

    /// Marks in `marks` for a device of `pages` pages; refused if `marks` has too few words.
    pub fn new(marks: Box<dyn FreeMarks>, pages: u64) -> Result<FreedPages, Error> {
        let have = marks.words().len();
        if have < Self::words_for(pages) {
            return Err(Error::FreeMarksTooShort {
                pages,
                words: have,
                needed: Self::words_for(pages),
            });
        }
        Ok(FreedPages { marks, pages })
    }

    /// Marks for a device of `pages` pages in memory of their own (for embedders that learn
    /// of freed pages themselves, and for tests).
    pub fn in_memory(pages: u64) -> FreedPages {
        let marks: Box<[AtomicU64]> = (0..Self::words_for(pages))
            .map(|_| AtomicU64::new(0))
            .collect();
        FreedPages::new(Box::new(marks), pages).expect("sized for the device")
    }

    fn summary(&self) -> &[AtomicU64] {
        &self.marks.words()[..Self::summary_words(self.pages)]
    }

    fn bits(&self) -> &[AtomicU64] {
        &self.marks.words()[Self::summary_words(self.pages)..Self::words_for(self.pages)]
    }

    /// Marks `count` pages from `first` as freed, as the kernel's probe does: the page bits,
    /// then the summary. Pages past the device are ignored.
    pub fn mark(&self, first: PageIndex, count: u64) {
        let (bits, summary) = (self.bits(), self.summary());
        let end = first.0.saturating_add(count).min(bits.len() as u64 * 64);
        for p in first.0..end {
            let w = (p / 64) as usize;
            bits[w].fetch_or(1 << (p % 64), Ordering::AcqRel);
            summary[w / 64].fetch_or(1 << (w % 64), Ordering::AcqRel);
        }
    }

    /// Whether page `index` is marked (a hint: only [`FreedPages::take`] decides).
    pub fn is_marked(&self, index: PageIndex) -> bool {
        let w = (index.0 / 64) as usize;
        self.bits()
            .get(w)
            .is_some_and(|b| b.load(Ordering::Relaxed) & (1 << (index.0 % 64)) != 0)
    }

    /// Clears page `index`'s mark; whether it was set. The caller holds the page's slot lock.
    pub(super) fn take(&self, index: PageIndex) -> bool {
        let (w, bit) = ((index.0 / 64) as usize, 1u64 << (index.0 % 64));
        match self.bits().get(w) {
            // One load first: the mark is nearly always clear, and a load does not take the
            // cache line from the marker.
            Some(b) if b.load(Ordering::Relaxed) & bit != 0 => {
                b.fetch_and(!bit, Ordering::AcqRel) & bit != 0
            }
            _ => false,
        }
    }

    /// Pages whose marks may be set: the page bits' words the summary names (each summary bit
    /// is cleared as it is read, before its word is read). After each word of page bits, stops
    /// if `stop` says so, putting the summary bits it has not read back (a later call reads
    /// them); returns whether it stopped with some left to read.
    fn pending(&self, mut each: impl FnMut(PageIndex), mut stop: impl FnMut() -> bool) -> bool {
        let (bits, summary) = (self.bits(), self.summary());
        for (s, sw) in summary.iter().enumerate() {
            if sw.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut words = sw.swap(0, Ordering::AcqRel);
            while words != 0 {
                let w = s * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                let mut marks = bits.get(w).map_or(0, |b| b.load(Ordering::Acquire));
                while marks != 0 {
                    let b = marks.trailing_zeros() as u64;
                    marks &= marks - 1;
                    each(PageIndex(w as u64 * 64 + b));
                }
                if stop() {
                    // The words named by the bits left are still to be read: their marks stay
                    // set (only `take` clears one), so naming them again loses nothing.
                    sw.fetch_or(words, Ordering::AcqRel);
                    return words != 0
                        || summary[s + 1..]
                            .iter()
                            .any(|w| w.load(Ordering::Relaxed) != 0);
                }
            }
        }
        false
    }
}

impl Tiering {
    /// Takes the marks of a device of `pages` pages (see [`Device::set_freed_pages`]).
    pub(super) fn set_freed_pages(&self, pages: u64, freed: FreedPages) -> Result<(), Error> {
        if freed.pages < pages {
            return Err(Error::FreeMarksTooShort {
                pages,
                words: FreedPages::words_for(freed.pages),
                needed: FreedPages::words_for(pages),
            });
        }
        self.freed.set(freed).map_err(|_| Error::Busy {
            what: "the freed-page marks",
        })
    }

    /// [`Device::reclaim_freed_until`] on `dev`.
    pub(super) fn reclaim_freed_until(
        &self,
        dev: &Device,
        stop: impl FnMut() -> bool,
    ) -> (u64, bool) {
        let Some(freed) = self.freed.get() else {
            return (0, false);
        };
        let mut taken = 0;
        let more = freed.pending(
            |index| {
                if index.0 >= dev.pages() {
                    return;
                }
                let took = match dev.slot(index) {
                    // Never written: nothing to free (a write that comes meanwhile takes the mark
                    // itself, under the slot's lock).
                    None => freed.take(index),
                    Some(slot) => {
                        let mut g = slot.lock();
                        let took = freed.take(index);
                        if took && !g.get().is_empty() {
                            dev.replace(index, &mut g, SlotState::default());
                            dev.bump(index, Field::NoticeFreed);
                        }
                        took
                    }
                };
                if took {
                    dev.bump(index, Field::NotifyFree);
                    taken += 1;
                }
            },
            stop,
        );
        (taken, more)
    }
}

#[cfg(test)]
mod tests;
