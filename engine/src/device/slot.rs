//! The slot table: one 16-byte [`Slot`] per 4 KiB page of the device.
//!
//! ```text
//! word (64 bits): the pool handle (stored page), the fill word (SAME), or 0 (empty)
//!
//! meta (64 bits):
//!  63            32 31    29 28         16 15  11 10 9 8       2 1       0
//! +----------------+--------+-------------+------+----+---------+-------+------+
//! | access time, s | unused | size (13 b) | ---- |prio| flags   |WAITERS| LOCK |
//! +----------------+--------+-------------+------+----+---------+-------+------+
//! ```
//! `LOCK` is the per-slot lock; `WAITERS` says a thread is parked on it. The flags are
//! [`SlotFlags`]; `prio` is which codec (0 = primary) compressed the page; `size` is the stored
//! object's length (4096 for a huge page); the access time counts seconds since the device was
//! created, wrapping after 136 years.

use std::sync::atomic::{AtomicU64, Ordering};

const LOCK: u64 = 1 << 0;
const WAITERS: u64 = 1 << 1;
const FLAGS_SHIFT: u32 = 2;
const FLAGS_MASK: u64 = 0x7f << FLAGS_SHIFT;
const PRIO_SHIFT: u32 = 9;
const PRIO_MASK: u64 = 0b11 << PRIO_SHIFT;
const SIZE_SHIFT: u32 = 16;
const SIZE_MASK: u64 = 0x1fff << SIZE_SHIFT;
const TIME_SHIFT: u32 = 32;

/// Spins before a locker parks.
const SPINS: u32 = 64;

/// Flags of a slot, zram's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotFlags(u8);

impl SlotFlags {
    /// The page is one 8-byte word repeated; the word is in the slot, nothing in the pool.
    pub const SAME: SlotFlags = SlotFlags(1 << 0);
    /// The page is stored uncompressed (it did not compress below the huge threshold).
    pub const HUGE: SlotFlags = SlotFlags(1 << 1);
    /// Marked idle and not accessed since.
    pub const IDLE: SlotFlags = SlotFlags(1 << 2);
    /// Written back to the backing store.
    pub const WB: SlotFlags = SlotFlags(1 << 3);
    /// No codec shrinks this page; recompression skips it.
    pub const INCOMPRESSIBLE: SlotFlags = SlotFlags(1 << 4);
    /// The word is a pool handle.
    pub const STORED: SlotFlags = SlotFlags(1 << 5);

    /// No flags.
    pub const fn empty() -> SlotFlags {
        SlotFlags(0)
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: SlotFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub const fn intersects(self, other: SlotFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// These flags without those of `other`.
    pub const fn difference(self, other: SlotFlags) -> SlotFlags {
        SlotFlags(self.0 & !other.0)
    }

    /// Both sets.
    pub const fn union(self, other: SlotFlags) -> SlotFlags {
        SlotFlags(self.0 | other.0)
    }
}

impl std::ops::BitOr for SlotFlags {
    type Output = SlotFlags;
    fn bitor(self, rhs: SlotFlags) -> SlotFlags {
        self.union(rhs)
    }
}

/// What a slot holds, read under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotState {
    /// Handle word or fill word.
    pub word: u64,
    /// Flags.
    pub flags: SlotFlags,
    /// Codec priority that compressed the page.
    pub prio: u8,
    /// Stored object length in bytes.
    pub size: u16,
    /// Last access, seconds since the device's creation.
    pub atime: u32,
}

impl SlotState {
    fn pack_meta(&self) -> u64 {
        (u64::from(self.flags.0) << FLAGS_SHIFT)
            | ((u64::from(self.prio) << PRIO_SHIFT) & PRIO_MASK)
            | ((u64::from(self.size) << SIZE_SHIFT) & SIZE_MASK)
            | (u64::from(self.atime) << TIME_SHIFT)
    }

    fn unpack(word: u64, meta: u64) -> SlotState {
        SlotState {
            word,
            flags: SlotFlags(((meta & FLAGS_MASK) >> FLAGS_SHIFT) as u8),
            prio: ((meta & PRIO_MASK) >> PRIO_SHIFT) as u8,
            size: ((meta & SIZE_MASK) >> SIZE_SHIFT) as u16,
            atime: (meta >> TIME_SHIFT) as u32,
        }
    }

    /// Whether the slot holds nothing (reads as zeros, costs nothing).
    pub fn is_empty(&self) -> bool {
        !self
            .flags
            .intersects(SlotFlags::SAME | SlotFlags::STORED | SlotFlags::WB)
    }
}

/// One page's entry. 16 bytes, by design (see `ARCHITECTURE.md`).
#[derive(Debug, Default)]
pub struct Slot {
    word: AtomicU64,
    meta: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

impl Slot {
    /// Locks the slot: spins briefly, then parks until the holder unlocks.
    pub fn lock(&self) -> SlotGuard<'_> {
        let mut spins = 0;
        loop {
            let m = self.meta.load(Ordering::Relaxed);
            if m & LOCK == 0 {
                if self
                    .meta
                    .compare_exchange_weak(m, m | LOCK, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return SlotGuard { slot: self };
                }
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if m & WAITERS == 0
                && self
                    .meta
                    .compare_exchange_weak(m, m | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            super::park::wait(self as *const Slot as usize, &self.meta, LOCK | WAITERS);
            spins = 0;
        }
    }

    /// Locks the slot if nobody holds it. For background work that takes other pages' locks
    /// while its caller may hold one (eviction inside a write): it skips a busy page rather than
    /// wait, so two threads can never wait on each other.
    pub fn try_lock(&self) -> Option<SlotGuard<'_>> {
        let m = self.meta.load(Ordering::Relaxed);
        (m & LOCK == 0
            && self
                .meta
                .compare_exchange(m, m | LOCK, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        .then_some(SlotGuard { slot: self })
    }

    fn unlock(&self) {
        let prev = self.meta.fetch_and(!(LOCK | WAITERS), Ordering::Release);
        if prev & WAITERS != 0 {
            super::park::wake_all(self as *const Slot as usize);
        }
    }

    /// The state without the lock: for statistics and scans that tolerate a racing update.
    pub fn peek(&self) -> SlotState {
        SlotState::unpack(
            self.word.load(Ordering::Relaxed),
            self.meta.load(Ordering::Relaxed),
        )
    }
}

/// A locked slot; unlocks on drop.
pub struct SlotGuard<'a> {
    slot: &'a Slot,
}

impl SlotGuard<'_> {
    /// What the slot holds.
    pub fn get(&self) -> SlotState {
        SlotState::unpack(
            self.slot.word.load(Ordering::Relaxed),
            self.slot.meta.load(Ordering::Relaxed),
        )
    }

    /// Replaces what the slot holds, keeping the lock; returns the old state.
    pub fn set(&mut self, new: SlotState) -> SlotState {
        let old = self.get();
        self.slot.word.store(new.word, Ordering::Relaxed);
        // Keep LOCK, and a WAITERS bit that a thread about to park may set meanwhile.
        let packed = new.pack_meta();
        let _ = self
            .slot
            .meta
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some(packed | (m & (LOCK | WAITERS)))
            });
        old
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slot.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn state_round_trips_through_the_packed_words() {
        let slot = Slot::default();
        let state = SlotState {
            word: 0xdead_beef_0000_0001,
            flags: SlotFlags::STORED | SlotFlags::HUGE | SlotFlags::IDLE,
            prio: 3,
            size: 4096,
            atime: u32::MAX,
        };
        let mut g = slot.lock();
        assert!(g.get().is_empty());
        g.set(state);
        assert_eq!(g.get(), state);
        drop(g);
        assert_eq!(slot.peek(), state);
        assert_eq!(slot.meta.load(Ordering::Relaxed) & (LOCK | WAITERS), 0);
    }

    #[test]
    fn lock_excludes_other_threads() {
        let slot = Arc::new(Slot::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let slot = Arc::clone(&slot);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = slot.lock();
                        let mut s = g.get();
                        // A non-atomic read-modify-write: lost updates if the lock leaked.
                        s.word += 1;
                        std::hint::black_box(&s);
                        g.set(s);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(slot.peek().word, 80_000);
    }
}
