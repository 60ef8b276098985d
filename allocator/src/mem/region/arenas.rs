//! A region's arenas: claimed, mapped at their own offsets, punched out when given back.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use super::{errno, io, map_shared, refused, Region, ARENA_BYTES};
use crate::mem::{Mapping, Prefault};
use crate::Error;

impl Region {
    pub(super) fn arena_offset(&self, slot: u32) -> usize {
        self.inner.layout.arena_offset + slot as usize * ARENA_BYTES
    }

    /// Claims the lowest free arena place, or `None` when all are mapped.
    fn claim(&self) -> Option<u32> {
        let mut slots = self.inner.slots.lock();
        for (w, word) in slots.iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = (!*word).trailing_zeros();
                let slot = w as u32 * 64 + bit;
                if slot >= self.inner.layout.arenas {
                    return None;
                }
                *word |= 1 << bit;
                return Some(slot);
            }
        }
        None
    }

    /// Claims arena place `slot` (one the predecessor used); false if it is taken or out of range.
    fn claim_at(&self, slot: u32) -> bool {
        if slot >= self.inner.layout.arenas {
            return false;
        }
        let mut slots = self.inner.slots.lock();
        let (w, bit) = (slot as usize / 64, slot % 64);
        if slots[w] & (1 << bit) != 0 {
            return false;
        }
        slots[w] |= 1 << bit;
        true
    }

    /// Maps a new arena at the lowest free place, its pages emptied and made resident as
    /// `prefault` says. ENOSPC when every place is mapped.
    pub(in crate::mem) fn map_new(
        &self,
        prefault: Prefault,
        touched: &std::sync::atomic::AtomicU64,
    ) -> Result<Mapping, i32> {
        let slot = self.claim().ok_or(libc::ENOSPC)?;
        // A place is punched out when it is given back, and a predecessor's leftovers once its
        // pool is adopted, so it usually reads as zeros. Where it does not (a punch that failed,
        // a place taken before the leftovers went), its old bytes are as harmless as an
        // anonymous arena's free pages: the pool reads only objects it wrote.
        match self.map_slot(slot) {
            Ok(ptr) => Ok(Mapping::from_region(
                ptr,
                prefault,
                touched,
                self.clone(),
                slot,
            )),
            Err(e) => {
                self.release(slot, false);
                Err(e)
            }
        }
    }

    /// Maps arena `slot` as the predecessor left it, reading each page in (never writing).
    pub fn map_existing(&self, slot: u32) -> Result<Mapping, Error> {
        if !self.claim_at(slot) {
            return Err(refused(format!(
                "arena {slot} is taken or past the region's {} arenas",
                self.inner.layout.arenas
            )));
        }
        let ptr = match self.map_slot(slot) {
            Ok(p) => p,
            Err(e) => {
                self.release(slot, false);
                return Err(io("mmap", e));
            }
        };
        Ok(Mapping::from_existing(ptr, self.clone(), slot))
    }

    fn map_slot(&self, slot: u32) -> Result<NonNull<u8>, i32> {
        map_shared(self.fd(), self.arena_offset(slot), ARENA_BYTES)
    }

    /// Gives arena place `slot` back; with `punch`, its pages leave the file first (the caller
    /// has unmapped them).
    pub(in crate::mem) fn release(&self, slot: u32, punch: bool) {
        if punch {
            self.punch(slot);
        }
        let mut slots = self.inner.slots.lock();
        slots[slot as usize / 64] &= !(1 << (slot % 64));
    }

    /// Punches arena place `slot` out of the file. A failure leaves the pages held, never wrong:
    /// a place is only reused through [`Region::map_new`], whose pages are then written anyway.
    fn punch(&self, slot: u32) {
        let (Ok(off), Ok(len)) = (
            libc::off_t::try_from(self.arena_offset(slot)),
            libc::off_t::try_from(ARENA_BYTES),
        ) else {
            return;
        };
        // SAFETY: a plain call on a descriptor we own; a failure only leaves memory held.
        unsafe {
            libc::fallocate(
                self.inner.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            );
        }
    }

    /// Punches every arena place this process has not mapped: what a predecessor left in places
    /// the adopted pool does not use. Call once, after adopting the live arenas.
    pub fn punch_unclaimed(&self) {
        for slot in 0..self.inner.layout.arenas {
            let taken = {
                let slots = self.inner.slots.lock();
                slots[slot as usize / 64] & (1 << (slot % 64)) != 0
            };
            if !taken {
                self.punch(slot);
            }
        }
    }

    /// Bytes of the file that hold memory (`st_blocks`), header and metadata included.
    pub fn resident_bytes(&self) -> Result<u64, Error> {
        // SAFETY: an fstat into a zeroed struct on a descriptor we own; result checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.inner.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io("fstat", errno()));
        }
        Ok(u64::try_from(st.st_blocks).unwrap_or(0) * 512)
    }
}
