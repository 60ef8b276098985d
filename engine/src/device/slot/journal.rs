//! The slot journal: the slot changes in flight, in a region, so that a successor can undo one
//! the process died in the middle of.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use uzram_allocator::{AtomicChunk, Region, CHUNK_WORDS, USER_CHUNK_TAG};

use super::{SlotTable, LOCK, WAITERS};

/// Chunk tags of the engine in a region (the pool's are below [`USER_CHUNK_TAG`]).
pub(crate) const JOURNAL_TAG: u64 = USER_CHUNK_TAG | (1 << 32);

/// Slot changes in flight that a successor can undo: see [`Journal`].
const JOURNAL_ENTRIES: usize = 64;
const ENTRY_WORDS: usize = 4;
const JOURNAL_CHUNKS: usize = JOURNAL_ENTRIES * ENTRY_WORDS / CHUNK_WORDS;
/// An entry's first word: free, taken but not yet published, or the slot's index + 1.
const ENTRY_FREE: u64 = 0;
const ENTRY_CLAIMED: u64 = u64::MAX;

/// The slot changes in flight, in a region, so that a successor can undo one the process died
/// in the middle of: a slot's two words are stored one after the other, and a process killed
/// between them leaves a new word beside an old meta. Before a change, the changing thread
/// takes an entry, writes the slot's old words into it and then the slot's index (each store
/// ordered before the next); after the change, it frees the entry. A successor puts every slot
/// named by an entry back to the entry's old words: the old object is freed only after the
/// change (and the entry's freeing), so it is still there.
pub(crate) struct Journal {
    pub(super) chunks: Vec<AtomicChunk>,
}

impl Journal {
    fn word(&self, entry: usize, k: usize) -> &AtomicU64 {
        let w = entry * ENTRY_WORDS + k;
        &self.chunks[w / CHUNK_WORDS].words()[w % CHUNK_WORDS]
    }

    /// A new journal in `region`'s chunks.
    pub(super) fn create(region: &Region) -> Result<Journal, uzram_allocator::Error> {
        let chunks = (0..JOURNAL_CHUNKS)
            .map(|seq| {
                region
                    .claim_chunk(JOURNAL_TAG | seq as u64)
                    .map(uzram_allocator::Chunk::into_atomic)
            })
            .collect::<Result<_, _>>()?;
        Ok(Journal { chunks })
    }

    /// Records that slot `index`, holding `old` (word, meta without the lock bits), is being
    /// changed; returns the entry to [`Journal::end`].
    pub(super) fn begin(&self, index: u64, old: (u64, u64)) -> usize {
        let start = (index % JOURNAL_ENTRIES as u64) as usize;
        loop {
            for off in 0..JOURNAL_ENTRIES {
                let e = (start + off) % JOURNAL_ENTRIES;
                if self
                    .word(e, 0)
                    .compare_exchange(
                        ENTRY_FREE,
                        ENTRY_CLAIMED,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    self.word(e, 1).store(old.0, Ordering::Relaxed);
                    self.word(e, 2).store(old.1, Ordering::Relaxed);
                    // The old words land before the index that makes them count, and the index
                    // before any store to the slot.
                    self.word(e, 0).store(index + 1, Ordering::Release);
                    fence(Ordering::Release);
                    return e;
                }
            }
            // Every entry is in use (more threads changing slots than entries): wait for one.
            std::hint::spin_loop();
        }
    }

    /// The change is whole: the entry is free again.
    pub(super) fn end(&self, entry: usize) {
        fence(Ordering::Release);
        self.word(entry, 0).store(ENTRY_FREE, Ordering::Release);
    }

    /// Takes over the journal a predecessor left in `chunks` (in place order) and undoes every
    /// change it was in the middle of, on `table`'s slots. Returns how many it undid, or why
    /// the journal cannot be trusted.
    pub(super) fn adopt(
        chunks: Vec<AtomicChunk>,
        table: &SlotTable,
    ) -> Result<(Journal, u64), String> {
        if chunks.len() != JOURNAL_CHUNKS {
            return Err(format!(
                "the slot journal has {} chunks, not {JOURNAL_CHUNKS}",
                chunks.len()
            ));
        }
        let journal = Journal { chunks };
        let mut undone = 0;
        for e in 0..JOURNAL_ENTRIES {
            let first = journal.word(e, 0).load(Ordering::Acquire);
            if first == ENTRY_FREE || first == ENTRY_CLAIMED {
                journal.word(e, 0).store(ENTRY_FREE, Ordering::Relaxed);
                continue;
            }
            let index = first - 1;
            let Some(slot) = table.get(index) else {
                return Err(format!(
                    "slot journal entry {e} names page {index}, which the table does not hold"
                ));
            };
            let (word, meta) = (
                journal.word(e, 1).load(Ordering::Relaxed),
                journal.word(e, 2).load(Ordering::Relaxed),
            );
            slot.slot.word.store(word, Ordering::Relaxed);
            slot.slot
                .meta
                .store(meta & !(LOCK | WAITERS), Ordering::Relaxed);
            fence(Ordering::Release);
            journal.word(e, 0).store(ENTRY_FREE, Ordering::Release);
            undone += 1;
        }
        Ok((journal, undone))
    }
}
