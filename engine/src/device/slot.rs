//! The slot table: one 16-byte [`Slot`] per 4 KiB page of the device, allocated in leaves of
//! 256 as pages are first written ([`SlotTable`]).
//!
//! ```text
//! word (64 bits): the pool handle (stored page), the fill word (SAME), a group member's word
//!                 (bit 63, the page's place in its group at bits 56..63, the group's head handle
//!                 below bit 48; see `Held::Member`), a backing-store location (WB), or 0
//!
//! meta (64 bits):
//!  63            32 31    29 28         16 15    11 10 9 8       2 1       0
//! +----------------+--------+-------------+--------+----+---------+-------+------+
//! | access time, s | gen hi | size (13 b) | gen lo |prio| flags   |WAITERS| LOCK |
//! +----------------+--------+-------------+--------+----+---------+-------+------+
//! ```
//! `LOCK` is the per-slot lock; `WAITERS` says a thread is parked on it. The flags are
//! [`SlotFlags`]; `prio` is which codec (0 = primary) compressed the page; `size` is the stored
//! object's length (4096 for a huge page); the access time counts seconds since the device was
//! created, wrapping after 136 years. `gen` (8 bits, low 5 and high 3) counts the slot's
//! changes, wrapping: work that copies a page out, unlocks, and commits later under the lock
//! ([`SlotGuard::generation`], writeback) tells a page rewritten meanwhile from the one it took,
//! even when the new state is equal (a freed handle reused at once, the same size, the same
//! second).

use std::sync::atomic::{AtomicU64, Ordering};

mod journal;
mod table;

pub(crate) use journal::{Journal, JOURNAL_TAG};
pub(crate) use table::SlotTable;

use uzram_allocator::Handle;

/// In a STORED slot's word: the page is a member of a cold group, whose place in the group is
/// at [`MEMBER_SHIFT`] and whose head chunk's handle is below [`HEAD_MASK`]'s top. A pool's
/// handles use 48 bits (the class above bit 32), so no page's own handle has this bit set, and
/// a binary that knows no groups finds no live object under the word.
const GROUPED: u64 = 1 << 63;
const MEMBER_SHIFT: u32 = 56;
const HEAD_MASK: u64 = (1 << 48) - 1;

const LOCK: u64 = 1 << 0;
const WAITERS: u64 = 1 << 1;
const FLAGS_SHIFT: u32 = 2;
const FLAGS_MASK: u64 = 0x7f << FLAGS_SHIFT;
const PRIO_SHIFT: u32 = 9;
const PRIO_MASK: u64 = 0b11 << PRIO_SHIFT;
const SIZE_SHIFT: u32 = 16;
const SIZE_MASK: u64 = 0x1fff << SIZE_SHIFT;
const TIME_SHIFT: u32 = 32;
const GEN_LO_SHIFT: u32 = 11;
const GEN_LO_MASK: u64 = 0x1f << GEN_LO_SHIFT;
const GEN_HI_SHIFT: u32 = 29;
const GEN_HI_MASK: u64 = 0x7 << GEN_HI_SHIFT;

/// The generation a meta word holds.
fn generation(meta: u64) -> u8 {
    (((meta & GEN_LO_MASK) >> GEN_LO_SHIFT) | ((meta & GEN_HI_MASK) >> (GEN_HI_SHIFT - 5))) as u8
}

/// `gen` packed into a meta word's generation bits.
fn pack_generation(gen: u8) -> u64 {
    let gen = u64::from(gen);
    ((gen & 0x1f) << GEN_LO_SHIFT) | ((gen >> 5) << GEN_HI_SHIFT)
}

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
    /// On a written-back slot (never marked idle: only stored pages are): read back since its
    /// writeback, its access time then the last read's. The same bit as [`SlotFlags::IDLE`].
    pub const READ_BACK: SlotFlags = SlotFlags(1 << 2);
    /// Written back to the backing store.
    pub const WB: SlotFlags = SlotFlags(1 << 3);
    /// No codec shrinks this page; recompression skips it.
    pub const INCOMPRESSIBLE: SlotFlags = SlotFlags(1 << 4);
    /// The word is a pool handle.
    pub const STORED: SlotFlags = SlotFlags(1 << 5);
    /// Written back, in a record kept from a page freed earlier with the same content: the
    /// word packs the record's location and the page index it was sealed for
    /// (`writeback::reuse`).
    pub const ADOPTED: SlotFlags = SlotFlags(1 << 6);
    /// On a stored slot (never adopted: only written-back ones are): brought back into the
    /// pool from the backing store and not read since (`policy::read_back` judges promotions
    /// by it). The same bit as [`SlotFlags::ADOPTED`].
    pub const PROMOTED: SlotFlags = SlotFlags(1 << 6);

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

    /// The flags in both sets.
    pub const fn intersection(self, other: SlotFlags) -> SlotFlags {
        SlotFlags(self.0 & other.0)
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

    /// What the slot names, decoded from its flags and word in this one place.
    pub(crate) fn held(&self) -> Held {
        let f = self.flags;
        if f.contains(SlotFlags::SAME) {
            Held::Same(self.word)
        } else if f.contains(SlotFlags::STORED) {
            if self.word & GROUPED != 0 {
                match Handle::from_raw(self.word & HEAD_MASK) {
                    Some(head) => Held::Member {
                        head,
                        member: ((self.word >> MEMBER_SHIFT) & 0x7f) as u8,
                    },
                    None => Held::Broken,
                }
            } else {
                Handle::from_raw(self.word).map_or(Held::Broken, Held::Object)
            }
        } else if f.contains(SlotFlags::WB) {
            Held::WrittenBack
        } else {
            Held::Nothing
        }
    }

    /// Whether the page is held in a cold group (see [`Held::Member`]).
    pub fn is_grouped(&self) -> bool {
        self.flags.contains(SlotFlags::STORED) && self.word & GROUPED != 0
    }

    /// The word of page `member` of the group whose head chunk is `head`; `None` for a handle
    /// that does not fit below the member's place (a pool's handles use 48 bits).
    pub(crate) fn member_word(head: Handle, member: u8) -> Option<u64> {
        let raw = head.to_raw();
        (raw & !HEAD_MASK == 0 && member < 0x80)
            .then(|| GROUPED | u64::from(member) << MEMBER_SHIFT | raw)
    }

    /// Whether the slot holds nothing (reads as zeros, costs nothing).
    pub fn is_empty(&self) -> bool {
        !self
            .flags
            .intersects(SlotFlags::SAME | SlotFlags::STORED | SlotFlags::WB)
    }
}

/// What a slot names: [`SlotState::held`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Empty: reads as zeros.
    Nothing,
    /// Same-filled with this word.
    Same(u64),
    /// Its own object in the pool (compressed, or raw when HUGE).
    Object(Handle),
    /// Page `member` of the cold group whose head chunk is `head` (see `group.rs`); the slot's
    /// size is 0, as the group's bytes are counted once, by the group table.
    Member {
        /// The group's head chunk.
        head: Handle,
        /// The page's place in the group.
        member: u8,
    },
    /// A record in the backing store (the word is its location).
    WrittenBack,
    /// STORED with a word that names no object (0): a bug or a damaged region.
    Broken,
}

/// One page's entry. 16 bytes, by design (see `ARCHITECTURE.md`); `repr(C)`, so that a
/// region's table words can be seen as slots (`sys::slots_of`).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Slot {
    word: AtomicU64,
    meta: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);
const _: () = assert!(std::mem::align_of::<Slot>() == 8);

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
                    return SlotGuard {
                        slot: self,
                        journal: None,
                    };
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
        .then_some(SlotGuard {
            slot: self,
            journal: None,
        })
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
/// A slot, where it is in its table: what a change of it needs to be undone after a crash.
#[derive(Clone, Copy)]
pub(crate) struct SlotRef<'a> {
    slot: &'a Slot,
    index: u64,
    journal: Option<&'a Journal>,
}

impl<'a> SlotRef<'a> {
    /// Locks the slot: see [`Slot::lock`].
    pub fn lock(self) -> SlotGuard<'a> {
        let mut g = self.slot.lock();
        g.journal = self.journal.map(|j| (j, self.index));
        g
    }

    /// Locks the slot if nobody holds it: see [`Slot::try_lock`].
    pub fn try_lock(self) -> Option<SlotGuard<'a>> {
        let mut g = self.slot.try_lock()?;
        g.journal = self.journal.map(|j| (j, self.index));
        Some(g)
    }

    /// The state without the lock: see [`Slot::peek`].
    pub fn peek(self) -> SlotState {
        self.slot.peek()
    }

    /// The slot itself.
    #[cfg(test)]
    pub fn slot(self) -> &'a Slot {
        self.slot
    }
}

/// A locked slot; unlocks on drop.
pub struct SlotGuard<'a> {
    slot: &'a Slot,
    /// In a region: the table's journal and the slot's index, so that a change is undone if
    /// the process dies in its middle.
    journal: Option<(&'a Journal, u64)>,
}

impl SlotGuard<'_> {
    /// What the slot holds.
    pub fn get(&self) -> SlotState {
        SlotState::unpack(
            self.slot.word.load(Ordering::Relaxed),
            self.slot.meta.load(Ordering::Relaxed),
        )
    }

    /// The slot's generation: it changes with every [`SlotGuard::set`] (wrapping at 256).
    pub fn generation(&self) -> u8 {
        generation(self.slot.meta.load(Ordering::Relaxed))
    }

    /// Replaces what the slot holds, keeping the lock and moving the generation on; returns
    /// the old state.
    pub fn set(&mut self, new: SlotState) -> SlotState {
        let old = self.get();
        let entry = self.journal.map(|(journal, index)| {
            let meta = self.slot.meta.load(Ordering::Relaxed) & !(LOCK | WAITERS);
            (journal, journal.begin(index, (old.word, meta)))
        });
        self.slot.word.store(new.word, Ordering::Relaxed);
        // Keep LOCK, and a WAITERS bit that a thread about to park may set meanwhile.
        let packed = new.pack_meta();
        let _ = self
            .slot
            .meta
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                let gen = pack_generation(generation(m).wrapping_add(1));
                Some(packed | gen | (m & (LOCK | WAITERS)))
            });
        if let Some((journal, e)) = entry {
            journal.end(e);
        }
        old
    }
}

impl SlotGuard<'_> {
    /// Test seam: what a process killed in the middle of [`SlotGuard::set`] leaves: the journal
    /// entry published, the new word stored, the meta not, the lock held (the guard is
    /// forgotten, never dropped).
    #[cfg(feature = "testing")]
    pub(crate) fn die_in_set(self, new: SlotState) {
        if let Some((journal, index)) = self.journal {
            let meta = self.slot.meta.load(Ordering::Relaxed) & !(LOCK | WAITERS);
            let old = self.slot.word.load(Ordering::Relaxed);
            journal.begin(index, (old, meta));
        }
        self.slot.word.store(new.word, Ordering::Relaxed);
        std::mem::forget(self);
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slot.unlock();
    }
}

#[cfg(test)]
mod tests;
