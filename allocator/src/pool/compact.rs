//! Compaction: objects moved out of the sparsest zspages, zspages out of the sparsest arenas.

use std::sync::atomic::Ordering;

use super::class_state::AUTO_DEFRAG_MOVES;
use super::{CompactStats, Growth, Pool};
use crate::mem::ARENA_PAGES;

impl Pool {
    /// Compacts every class (moving objects out of the sparsest zspages), then moves zspages out of
    /// sparse arenas so that whole arenas go back to the OS. Takes one class lock at a time.
    pub fn compact(&self) -> CompactStats {
        let shared = self.shared();
        let mut pages_freed = 0;
        for class in self.classes.iter() {
            pages_freed += class.lock().compact(usize::MAX, &shared);
        }
        let mut pages_released = self.defrag(usize::MAX);
        if self.growth != Growth::OnDemand {
            // In reserve mode frees leave empty arenas mapped; a compaction gives them back.
            let unmapped = (self.unmap_empty(self.reserve_target()) * ARENA_PAGES) as u64;
            self.pages_released.fetch_add(unmapped, Ordering::Relaxed);
            pages_released += unmapped;
        }
        CompactStats {
            pages_freed,
            pages_released,
        }
    }

    pub(super) fn maybe_defrag(&self) {
        let fragmented = {
            let a = self.arenas.lock();
            // Free pages inside partly used arenas; empty ones are the reserve, not fragmentation.
            let in_use = a.mapped_pages() - a.empty_arenas() * ARENA_PAGES;
            let slack = in_use - a.used_pages();
            slack >= 2 * ARENA_PAGES && slack * 8 >= in_use
        };
        if fragmented {
            self.defrag(AUTO_DEFRAG_MOVES);
        }
    }

    /// Empties the sparsest arenas into the others, moving at most `max_moves` zspages. Returns arena
    /// pages unmapped.
    fn defrag(&self, max_moves: usize) -> u64 {
        if self.defrag_running.swap(true, Ordering::Acquire) {
            return 0;
        }
        let shared = self.shared();
        let released_before = self.arenas.lock().released_arenas();
        let mut moves = 0;
        // Each round empties one arena or stops, so this bounds the rounds.
        let mut rounds = self.arenas.lock().mapped_pages() / ARENA_PAGES;
        'outer: while moves < max_moves && rounds > 0 {
            rounds -= 1;
            let Some(victim) = self.arenas.lock().sparsest() else {
                break;
            };
            // Zspages do not record back to arenas: scan each class for the victim's zspages.
            for class in self.classes.iter() {
                if self.arenas.lock().arena_used_pages(victim) == 0 {
                    break;
                }
                match class.lock().evacuate(victim, max_moves - moves, &shared) {
                    Some(n) => moves += n,
                    None => break 'outer,
                }
                if moves >= max_moves {
                    break 'outer;
                }
            }
            if self.arenas.lock().arena_used_pages(victim) > 0 {
                // The victim did not empty (new runs landed in it): stop rather than spin.
                break;
            }
        }
        let released =
            (self.arenas.lock().released_arenas() - released_before) * ARENA_PAGES as u64;
        self.pages_released.fetch_add(released, Ordering::Relaxed);
        self.defrag_running.store(false, Ordering::Release);
        released
    }
}
