//! A class's compaction: objects moved out of its sparsest zspages into its fullest, and its
//! zspages out of an arena that is to go back.

use std::sync::atomic::Ordering;

use super::{entry_pack, entry_unpack, persist_order, ClassState, Shared, FREE_TAG};
use crate::mem::Placement;
use crate::pool::persist::loc_pack;

impl ClassState {
    /// Moves objects from the sparsest zspages into the fullest until no zspage can be freed or
    /// `max_moves` objects moved. Returns zspage pages freed.
    pub(in crate::pool) fn compact(&mut self, max_moves: usize, shared: &Shared<'_>) -> u64 {
        let mut freed = 0;
        let mut moves = 0;
        while moves < max_moves && self.freeable() > 0 {
            let Some(src) = self.sparsest() else { break };
            while moves < max_moves {
                let Some(src_slot) = self.first_used_slot(src) else {
                    break;
                };
                let Some(dst) = self.fullest_partial(Some(src)) else {
                    break;
                };
                let local = self.backptr.row(src as usize).expect("row")[src_slot];
                let (_, _, size) = entry_unpack(self.handles.at(local as usize)).expect("live");
                let dst_slot = self.take_slot(dst, local);
                self.copy_object(src, src_slot, dst, dst_slot, size);
                // The copy lands before the word that points at it.
                persist_order();
                self.handles
                    .set(local as usize, entry_pack(dst, dst_slot, size));
                moves += 1;
                if self.put_slot(src, src_slot) {
                    freed += self.free_zspage(src, shared);
                    break;
                }
            }
            if self.zspages[src as usize].is_some() {
                // No destination left (or out of moves): the class is as compact as it gets.
                break;
            }
        }
        shared.pages_compacted.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    pub(super) fn first_used_slot(&self, zid: u32) -> Option<usize> {
        self.backptr
            .row(zid as usize)
            .expect("row")
            .iter()
            .position(|w| w & FREE_TAG == 0)
    }

    pub(super) fn copy_object(
        &mut self,
        src: u32,
        src_slot: usize,
        dst: u32,
        dst_slot: usize,
        size: usize,
    ) {
        let s = self.spec.size;
        let (src_off, dst_off) = (src_slot * s, dst_slot * s);
        // Take the destination out of the table for a moment to hold both at once.
        let mut b = self.zspages[dst as usize].take().expect("live");
        let a = self.zspages[src as usize].as_ref().expect("live");
        b.run.bytes_mut()[dst_off..dst_off + size]
            .copy_from_slice(&a.run.bytes()[src_off..src_off + size]);
        self.zspages[dst as usize] = Some(b);
    }

    /// Moves every zspage of this class out of arena `victim` into other arenas, at most
    /// `max_moves`. Returns the zspages moved, or `None` when some zspage found no room elsewhere.
    pub(in crate::pool) fn evacuate(
        &mut self,
        victim: u32,
        max_moves: usize,
        shared: &Shared<'_>,
    ) -> Option<usize> {
        let mut moved = 0;
        for zid in 0..self.zspages.len() {
            if moved >= max_moves {
                break;
            }
            let Some(z) = self.zspages[zid].as_mut() else {
                continue;
            };
            if z.run.arena() != victim {
                continue;
            }
            let mut arenas = shared.arenas.lock();
            let mut dst = arenas
                .alloc_run(z.run.pages(), Placement::AwayFrom(victim))
                .ok()?;
            dst.bytes_mut().copy_from_slice(z.run.bytes());
            if let Some(locs) = &mut self.locations {
                // The copy lands, then the location moves, then the old pages go back.
                persist_order();
                locs.set(zid, loc_pack(&dst));
                persist_order();
            }
            arenas.free_run(std::mem::replace(&mut z.run, dst));
            moved += 1;
        }
        Some(moved)
    }
}
