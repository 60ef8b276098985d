//! The slot table: one 16-byte [`Slot`] per 4 KiB page of the device, allocated in leaves of
//! 256 as pages are first written ([`SlotTable`]).
//!
//! ```text
//! word (64 bits): the pool handle (stored page), the fill word (SAME), or 0 (empty)
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

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

/// Slots a leaf of the [`SlotTable`] holds: 4 KiB of entries, 1 MiB of the device.
pub const LEAF_SLOTS: usize = 256;

/// One leaf: [`LEAF_SLOTS`] slots, allocated whole.
type Leaf = [Slot; LEAF_SLOTS];

/// The device's slots, allocated a leaf of [`LEAF_SLOTS`] at a time when a page in it is first
/// written. A page never written costs nothing: kernel zram allocates its whole table (16 B a
/// page) at `disksize`, this table only the leaves that hold pages (a swap area fills from its
/// start, a file system writes its metadata in a few places), plus 16 B of directory a leaf.
///
/// A leaf, once there, stays until the table is dropped, so a `&Slot` is good for the table's
/// life. Reads of a page whose leaf is not there see an empty slot and allocate nothing.
pub(crate) struct SlotTable {
    pages: u64,
    leaves: Box<[OnceLock<Box<Leaf>>]>,
    /// Leaves allocated.
    allocated: AtomicUsize,
}

impl SlotTable {
    /// A table of `pages` empty slots; `None` if its directory cannot be allocated.
    pub fn new(pages: u64) -> Option<SlotTable> {
        let n = usize::try_from(pages.div_ceil(LEAF_SLOTS as u64)).ok()?;
        let mut leaves = Vec::new();
        leaves.try_reserve_exact(n).ok()?;
        leaves.resize_with(n, OnceLock::new);
        Some(SlotTable {
            pages,
            leaves: leaves.into_boxed_slice(),
            allocated: AtomicUsize::new(0),
        })
    }

    /// The number of slots (pages).
    pub fn len(&self) -> u64 {
        self.pages
    }

    fn split(&self, index: u64) -> Option<(&OnceLock<Box<Leaf>>, usize)> {
        if index >= self.pages {
            return None;
        }
        let leaf = self
            .leaves
            .get(usize::try_from(index / LEAF_SLOTS as u64).ok()?)?;
        Some((leaf, (index % LEAF_SLOTS as u64) as usize))
    }

    /// Slot `index`, if its leaf is there.
    pub fn get(&self, index: u64) -> Option<&Slot> {
        let (leaf, i) = self.split(index)?;
        leaf.get().map(|l| &l[i])
    }

    /// Slot `index`, allocating its leaf if need be; `None` if `index` is beyond the table or
    /// the leaf cannot be allocated (out of memory).
    pub fn get_or_alloc(&self, index: u64) -> Option<&Slot> {
        let (leaf, i) = self.split(index)?;
        if let Some(l) = leaf.get() {
            return Some(&l[i]);
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(LEAF_SLOTS).ok()?;
        slots.resize_with(LEAF_SLOTS, Slot::default);
        let new: Box<Leaf> = slots.into_boxed_slice().try_into().ok()?;
        // Another thread may have set it meanwhile: then theirs stays, and ours is dropped.
        if leaf.set(new).is_ok() {
            self.allocated.fetch_add(1, Ordering::Relaxed);
        }
        leaf.get().map(|l| &l[i])
    }

    /// The state of slot `index` without its lock (empty if its leaf is not there).
    pub fn peek(&self, index: u64) -> SlotState {
        self.get(index).map(Slot::peek).unwrap_or_default()
    }

    /// Every slot whose leaf is there, with its index, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Slot)> {
        self.leaves
            .iter()
            .enumerate()
            .filter_map(|(n, leaf)| leaf.get().map(|l| (n, l)))
            .flat_map(move |(n, l)| {
                let first = (n * LEAF_SLOTS) as u64;
                l.iter()
                    .enumerate()
                    .map(move |(i, s)| (first + i as u64, s))
                    .take_while(move |&(index, _)| index < self.pages)
            })
    }

    /// Bytes the table holds: its directory and the leaves allocated.
    pub fn bytes(&self) -> u64 {
        (self.leaves.len() * std::mem::size_of::<OnceLock<Box<Leaf>>>()
            + self.allocated.load(Ordering::Relaxed) * std::mem::size_of::<Leaf>()) as u64
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

    /// The slot's generation: it changes with every [`SlotGuard::set`] (wrapping at 256).
    pub fn generation(&self) -> u8 {
        generation(self.slot.meta.load(Ordering::Relaxed))
    }

    /// Replaces what the slot holds, keeping the lock and moving the generation on; returns
    /// the old state.
    pub fn set(&mut self, new: SlotState) -> SlotState {
        let old = self.get();
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
    fn every_set_moves_the_generation_and_leaves_the_state_alone() {
        let slot = Slot::default();
        let state = SlotState {
            word: 7,
            flags: SlotFlags::STORED | SlotFlags::HUGE,
            prio: 1,
            size: 4096,
            atime: u32::MAX,
        };
        let mut g = slot.lock();
        let first = g.generation();
        for i in 1..=300u32 {
            g.set(state);
            assert_eq!(g.get(), state, "set {i}");
            assert_eq!(g.generation(), first.wrapping_add(i as u8), "set {i}");
        }
        drop(g);
        assert_eq!(slot.peek(), state);
        assert!(slot.try_lock().is_some(), "the lock bits survive");
    }

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

    /// A table of 3 leaves and a bit, against a model of which slots hold what: slots come
    /// into being as they are first asked for by a write, reads of the others see empty slots
    /// and allocate nothing, iteration visits exactly the slots of the leaves there, and the
    /// bytes counted are the directory plus the leaves.
    #[test]
    fn table_allocates_leaves_as_written_against_a_model() {
        let pages = 3 * LEAF_SLOTS as u64 + 10;
        let table = SlotTable::new(pages).unwrap();
        let directory = 4 * std::mem::size_of::<OnceLock<Box<Leaf>>>() as u64;
        assert_eq!(table.len(), pages);
        assert_eq!(table.bytes(), directory);
        let mut model = std::collections::HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for step in 0..4000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let index = rng % (pages + 3);
            if rng & 0x100 == 0 {
                // A write: allocates the leaf; refused only beyond the table.
                match table.get_or_alloc(index) {
                    Some(slot) => {
                        assert!(index < pages, "step {step}: slot {index} beyond {pages}");
                        let state = SlotState {
                            word: step + 1,
                            flags: SlotFlags::STORED,
                            ..SlotState::default()
                        };
                        slot.lock().set(state);
                        model.insert(index, state);
                    }
                    None => assert!(index >= pages, "step {step}: slot {index} refused"),
                }
            } else {
                let want = model.get(&index).copied().unwrap_or_default();
                assert_eq!(table.peek(index), want, "step {step}: slot {index}");
            }
            let leaves: std::collections::HashSet<u64> =
                model.keys().map(|i| i / LEAF_SLOTS as u64).collect();
            assert_eq!(
                table.bytes(),
                directory + leaves.len() as u64 * 4096,
                "step {step}"
            );
        }
        // Leaves 0..=3 all written by now; the last holds only 10 slots of the device.
        let seen: Vec<(u64, SlotState)> = table.iter().map(|(i, s)| (i, s.peek())).collect();
        assert_eq!(seen.len() as u64, pages);
        assert!(seen.iter().enumerate().all(|(n, &(i, _))| n as u64 == i));
        for (i, state) in seen {
            assert_eq!(
                state,
                model.get(&i).copied().unwrap_or_default(),
                "slot {i}"
            );
        }
    }

    #[test]
    fn iteration_skips_leaves_never_written() {
        let table = SlotTable::new(4 * LEAF_SLOTS as u64).unwrap();
        assert_eq!(table.iter().count(), 0);
        assert!(table.get(600).is_none());
        table.get_or_alloc(600).unwrap();
        let visited: Vec<u64> = table.iter().map(|(i, _)| i).collect();
        assert_eq!(visited, (512..768).collect::<Vec<_>>());
        assert!(table.get(600).is_some() && table.get(300).is_none());
    }

    /// Threads racing to write into one missing leaf all get the same slots, and one leaf is
    /// allocated and counted.
    #[test]
    fn racing_writers_share_one_leaf() {
        let table = Arc::new(SlotTable::new(LEAF_SLOTS as u64).unwrap());
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (table, barrier) = (Arc::clone(&table), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let slot = table.get_or_alloc(t).unwrap();
                    slot.lock().set(SlotState {
                        word: t + 1,
                        ..SlotState::default()
                    });
                    std::ptr::from_ref(table.get_or_alloc(0).unwrap()) as usize
                })
            })
            .collect();
        let firsts: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(firsts.windows(2).all(|w| w[0] == w[1]));
        let directory = std::mem::size_of::<OnceLock<Box<Leaf>>>() as u64;
        assert_eq!(table.bytes(), directory + 4096);
        for t in 0..4 {
            assert_eq!(table.peek(t).word, t + 1, "thread {t}'s write was lost");
        }
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
