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

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use uzram_allocator::{AtomicChunk, Region, CHUNK_WORDS, USER_CHUNK_TAG};

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

    /// Whether the slot holds nothing (reads as zeros, costs nothing).
    pub fn is_empty(&self) -> bool {
        !self
            .flags
            .intersects(SlotFlags::SAME | SlotFlags::STORED | SlotFlags::WB)
    }
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

/// Slots a leaf of the [`SlotTable`] holds: 4 KiB of entries, 1 MiB of the device.
pub const LEAF_SLOTS: usize = 256;

/// One leaf: [`LEAF_SLOTS`] slots, allocated whole.
type Leaf = [Slot; LEAF_SLOTS];

/// A leaf's bytes: one page.
const LEAF_BYTES: usize = LEAF_SLOTS * std::mem::size_of::<Slot>();

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
    chunks: Vec<AtomicChunk>,
}

impl Journal {
    fn word(&self, entry: usize, k: usize) -> &AtomicU64 {
        let w = entry * ENTRY_WORDS + k;
        &self.chunks[w / CHUNK_WORDS].words()[w % CHUNK_WORDS]
    }

    /// A new journal in `region`'s chunks.
    fn create(region: &Region) -> Result<Journal, uzram_allocator::Error> {
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
    fn begin(&self, index: u64, old: (u64, u64)) -> usize {
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
    fn end(&self, entry: usize) {
        fence(Ordering::Release);
        self.word(entry, 0).store(ENTRY_FREE, Ordering::Release);
    }

    /// Takes over the journal a predecessor left in `chunks` (in place order) and undoes every
    /// change it was in the middle of, on `table`'s slots. Returns how many it undid, or why
    /// the journal cannot be trusted.
    fn adopt(chunks: Vec<AtomicChunk>, table: &SlotTable) -> Result<(Journal, u64), String> {
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

/// Where a table's leaves live.
enum Leaves {
    /// In the process, each allocated when a page in it is first written.
    Local(Box<[OnceLock<Box<Leaf>>]>),
    /// In a region's table area, where a successor finds them: a directory of one word a leaf
    /// (its page's number + 1, 0 while it has none), then the leaves' pages, handed out in
    /// order as leaves are first written (see [`SharedLeaves`]).
    Shared(SharedLeaves),
}

/// The leaves of a table in a region. Pages are handed out in order, so that the memory thread
/// can make the next ones resident ahead of the writes that take them
/// ([`SlotTable::prefault`]): the first write of a page of shared memory is a page fault,
/// which an I/O thread must not take while memory is short.
struct SharedLeaves {
    region: Region,
    /// Leaves the table has (and leaf pages the area holds).
    leaves: usize,
    /// Words before the first leaf page (the directory, rounded up to a page).
    first_page_word: usize,
    /// The next leaf page to hand out, and the lock of handing one out.
    next: parking_lot::Mutex<usize>,
    /// Leaf pages below this one are resident.
    ready: AtomicUsize,
    /// Leaf pages handed out before they were made resident (their first write faulted).
    unready: AtomicU64,
    journal: Journal,
}

impl SharedLeaves {
    fn directory(&self) -> &[AtomicU64] {
        &self.region.table()[..self.leaves]
    }

    fn page(&self, p: usize) -> Option<&Leaf> {
        let start = self.first_page_word + p * LEAF_BYTES / 8;
        let words = self.region.table().get(start..start + LEAF_BYTES / 8)?;
        crate::sys::slots_of(words).try_into().ok()
    }

    fn leaf(&self, n: usize) -> Option<&Leaf> {
        match self.directory().get(n)?.load(Ordering::Acquire) {
            0 => None,
            d => self.page(usize::try_from(d - 1).ok()?),
        }
    }

    fn leaf_or_alloc(&self, n: usize) -> Option<(&Leaf, bool)> {
        if let Some(l) = self.leaf(n) {
            return Some((l, false));
        }
        let mut next = self.next.lock();
        // Another writer may have given it a page meanwhile.
        if let Some(l) = self.leaf(n) {
            return Some((l, false));
        }
        let p = *next;
        let leaf = self.page(p)?;
        *next += 1;
        if p >= self.ready.load(Ordering::Relaxed) {
            self.unready.fetch_add(1, Ordering::Relaxed);
        }
        // The page was never handed out, so it holds zeros: empty slots. Published with
        // release ordering, after which a successor finds it.
        self.directory()[n].store(p as u64 + 1, Ordering::Release);
        Some((leaf, true))
    }
}

/// The device's slots, allocated a leaf of [`LEAF_SLOTS`] at a time when a page in it is first
/// written. A page never written costs nothing: kernel zram allocates its whole table (16 B a
/// page) at `disksize`, this table only the leaves that hold pages (a swap area fills from its
/// start, a file system writes its metadata in a few places), plus 16 B of directory a leaf
/// (8 B in a region).
///
/// A leaf, once there, stays until the table is dropped, so a `&Slot` is good for the table's
/// life. Reads of a page whose leaf is not there see an empty slot and allocate nothing.
pub(crate) struct SlotTable {
    pages: u64,
    leaves: Leaves,
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
            leaves: Leaves::Local(leaves.into_boxed_slice()),
            allocated: AtomicUsize::new(0),
        })
    }

    /// (leaves, words of directory rounded up to a page) of a table of `pages`.
    fn shape(pages: u64) -> Option<(usize, usize)> {
        let leaves = usize::try_from(pages.div_ceil(LEAF_SLOTS as u64)).ok()?;
        let dir_words = leaves.checked_next_multiple_of(LEAF_BYTES / 8)?;
        Some((leaves, dir_words))
    }

    /// Bytes of a region's table area that a table of `pages` needs: its directory (8 B a
    /// leaf, rounded up to a page) and a page a leaf.
    pub fn region_bytes(pages: u64) -> Option<usize> {
        let (leaves, dir_words) = Self::shape(pages)?;
        leaves.checked_mul(LEAF_BYTES)?.checked_add(dir_words * 8)
    }

    fn shared(
        pages: u64,
        region: &Region,
        journal: Journal,
        next: usize,
    ) -> Result<SharedLeaves, String> {
        let need = Self::region_bytes(pages).ok_or("the table's size overflows")?;
        if region.table_bytes() < need {
            return Err(format!(
                "the region's table area has {} bytes, the table needs {need}",
                region.table_bytes()
            ));
        }
        let (leaves, first_page_word) = Self::shape(pages).ok_or("the table's size overflows")?;
        Ok(SharedLeaves {
            region: region.clone(),
            leaves,
            first_page_word,
            next: parking_lot::Mutex::new(next),
            ready: AtomicUsize::new(next),
            unready: AtomicU64::new(0),
            journal,
        })
    }

    /// A table of `pages` empty slots in `region`'s table area, with its journal.
    pub fn in_region(pages: u64, region: Region) -> Result<SlotTable, String> {
        Self::region_bytes(pages)
            .filter(|&need| region.table_bytes() >= need)
            .ok_or_else(|| {
                format!(
                    "the region's table area has {} bytes, too few for {pages} pages",
                    region.table_bytes()
                )
            })?;
        let journal = Journal::create(&region).map_err(|e| e.to_string())?;
        Ok(SlotTable {
            pages,
            leaves: Leaves::Shared(Self::shared(pages, &region, journal, 0)?),
            allocated: AtomicUsize::new(0),
        })
    }

    /// The table of `pages` a predecessor left in `region`, with every slot change it died in
    /// the middle of undone and every lock it held released. Returns the table and the changes
    /// undone, or why not (a leaf page out of range or given to two leaves).
    pub fn adopt(pages: u64, region: Region) -> Result<(SlotTable, u64), String> {
        let found = region
            .take_adopted_chunks(|t| t & !0xffff_ffff == JOURNAL_TAG)
            .into_iter()
            .map(|(t, c)| ((t & 0xffff_ffff) as usize, c))
            .collect();
        let chunks: Vec<AtomicChunk> = uzram_allocator::in_place_order(found)
            .map_err(|(seq, i)| {
                format!("the slot journal has chunk {seq} where chunk {i} belongs")
            })?
            .into_iter()
            .map(uzram_allocator::Chunk::into_atomic)
            .collect();
        // The directory first, with an empty journal: it decides which slots there are.
        let mut shared = Self::shared(pages, &region, Journal { chunks: Vec::new() }, 0)?;
        let mut used = vec![false; shared.leaves];
        let mut allocated = 0;
        let mut next = 0;
        for (n, d) in shared.directory().iter().enumerate() {
            let d = d.load(Ordering::Acquire);
            if d == 0 {
                continue;
            }
            let p = usize::try_from(d - 1).unwrap_or(usize::MAX);
            match used.get_mut(p) {
                Some(u) if !*u => *u = true,
                Some(_) => return Err(format!("leaf {n}'s page {p} is another leaf's too")),
                None => {
                    return Err(format!(
                        "leaf {n} names page {p}, past the table's {} leaf pages",
                        shared.leaves
                    ))
                }
            }
            allocated += 1;
            next = next.max(p + 1);
        }
        shared.next = parking_lot::Mutex::new(next);
        shared.ready = AtomicUsize::new(next);
        let mut table = SlotTable {
            pages,
            leaves: Leaves::Shared(shared),
            allocated: AtomicUsize::new(allocated),
        };
        let (journal, undone) = Journal::adopt(chunks, &table)?;
        // No thread holds a lock any more: the dead ones' lock bits go.
        for (_, slot) in table.iter() {
            slot.slot
                .meta
                .fetch_and(!(LOCK | WAITERS), Ordering::Relaxed);
        }
        if let Leaves::Shared(s) = &mut table.leaves {
            s.journal = journal;
        }
        Ok((table, undone))
    }

    /// In a region: makes the next `ahead` leaf pages resident (each page read once, which
    /// faults it in without changing it), so that the writes that take them do not fault.
    /// Returns the pages faulted in now. Nothing to do outside a region.
    pub fn prefault(&self, ahead: usize) -> usize {
        let Leaves::Shared(s) = &self.leaves else {
            return 0;
        };
        let next = *s.next.lock();
        let from = s.ready.load(Ordering::Relaxed).max(next);
        let to = next.saturating_add(ahead).min(s.leaves);
        let mut done = 0;
        for p in from..to {
            if let Some(leaf) = s.page(p) {
                std::hint::black_box(leaf[0].meta.load(Ordering::Relaxed));
                done += 1;
            }
        }
        s.ready.fetch_max(to, Ordering::Relaxed);
        done
    }

    /// In a region: leaf pages a write took before they were made resident (0 outside one).
    pub fn unready_leaves(&self) -> u64 {
        match &self.leaves {
            Leaves::Local(_) => 0,
            Leaves::Shared(s) => s.unready.load(Ordering::Relaxed),
        }
    }

    /// The number of slots (pages).
    pub fn len(&self) -> u64 {
        self.pages
    }

    fn journal(&self) -> Option<&Journal> {
        match &self.leaves {
            Leaves::Local(_) => None,
            Leaves::Shared(s) => Some(&s.journal),
        }
    }

    fn leaf(&self, n: usize) -> Option<&Leaf> {
        match &self.leaves {
            Leaves::Local(leaves) => leaves.get(n)?.get().map(|b| &**b),
            Leaves::Shared(s) => s.leaf(n),
        }
    }

    fn at<'a>(&'a self, leaf: &'a Leaf, index: u64) -> SlotRef<'a> {
        SlotRef {
            slot: &leaf[(index % LEAF_SLOTS as u64) as usize],
            index,
            journal: self.journal(),
        }
    }

    /// Slot `index`, if its leaf is there.
    pub fn get(&self, index: u64) -> Option<SlotRef<'_>> {
        if index >= self.pages {
            return None;
        }
        let leaf = self.leaf(usize::try_from(index / LEAF_SLOTS as u64).ok()?)?;
        Some(self.at(leaf, index))
    }

    /// Slot `index`, allocating its leaf if need be; `None` if `index` is beyond the table or
    /// the leaf cannot be allocated (out of memory).
    pub fn get_or_alloc(&self, index: u64) -> Option<SlotRef<'_>> {
        if index >= self.pages {
            return None;
        }
        let n = usize::try_from(index / LEAF_SLOTS as u64).ok()?;
        match &self.leaves {
            Leaves::Local(leaves) => {
                let cell = leaves.get(n)?;
                if cell.get().is_none() {
                    let mut slots = Vec::new();
                    slots.try_reserve_exact(LEAF_SLOTS).ok()?;
                    slots.resize_with(LEAF_SLOTS, Slot::default);
                    let new: Box<Leaf> = slots.into_boxed_slice().try_into().ok()?;
                    // Another thread may have set it meanwhile: then theirs stays, and ours
                    // is dropped.
                    if cell.set(new).is_ok() {
                        self.allocated.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let leaf = cell.get()?;
                Some(self.at(leaf, index))
            }
            Leaves::Shared(s) => {
                let (leaf, new) = s.leaf_or_alloc(n)?;
                if new {
                    self.allocated.fetch_add(1, Ordering::Relaxed);
                }
                Some(self.at(leaf, index))
            }
        }
    }

    /// The state of slot `index` without its lock (empty if its leaf is not there).
    pub fn peek(&self, index: u64) -> SlotState {
        self.get(index).map(SlotRef::peek).unwrap_or_default()
    }

    /// Every slot whose leaf is there, with its index, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, SlotRef<'_>)> {
        let leaves = self.pages.div_ceil(LEAF_SLOTS as u64) as usize;
        (0..leaves)
            .filter_map(move |n| self.leaf(n).map(|l| (n, l)))
            .flat_map(move |(n, l)| {
                let first = (n * LEAF_SLOTS) as u64;
                (0..LEAF_SLOTS)
                    .map(move |i| first + i as u64)
                    .take_while(move |&index| index < self.pages)
                    .map(move |index| (index, self.at(l, index)))
            })
    }

    /// Bytes the table holds: its directory and the leaves allocated.
    pub fn bytes(&self) -> u64 {
        let directory = match &self.leaves {
            Leaves::Local(leaves) => leaves.len() * std::mem::size_of::<OnceLock<Box<Leaf>>>(),
            Leaves::Shared(s) => s.leaves * 8,
        };
        (directory + self.allocated.load(Ordering::Relaxed) * LEAF_BYTES) as u64
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

    fn region_for(pages: u64) -> Region {
        Region::create(
            "uzram-slot-test",
            uzram_allocator::RegionSize {
                arenas: 1,
                meta_bytes: 64 << 10,
                table_bytes: SlotTable::region_bytes(pages).unwrap(),
            },
        )
        .unwrap()
    }

    /// A table in a region, against a model: a successor finds every slot written (leaves
    /// taken out of order), and refuses a directory that gives one page to two leaves.
    #[test]
    fn a_table_in_a_region_is_adopted_against_a_model() {
        let pages = 4 * LEAF_SLOTS as u64;
        let region = region_for(pages);
        let table = SlotTable::in_region(pages, region.clone()).unwrap();
        let mut model = std::collections::HashMap::new();
        for (step, index) in [700u64, 3, 900, 260, 701, 1023].into_iter().enumerate() {
            let state = SlotState {
                word: step as u64 + 1,
                flags: SlotFlags::SAME,
                ..SlotState::default()
            };
            table.get_or_alloc(index).unwrap().lock().set(state);
            model.insert(index, state);
        }
        assert_eq!(table.bytes(), 4 * 8 + 4 * 4096);
        drop(table);
        let again = |r: &Region| Region::adopt(r.fd().try_clone_to_owned().unwrap()).unwrap();
        let (adopted, undone) = SlotTable::adopt(pages, again(&region)).unwrap();
        assert_eq!(undone, 0);
        for i in 0..pages {
            assert_eq!(
                adopted.peek(i),
                model.get(&i).copied().unwrap_or_default(),
                "slot {i}"
            );
        }
        assert_eq!(
            adopted.iter().count() as u64,
            pages,
            "all four leaves are there"
        );
        // Leaf 1's directory word now names leaf 0's page.
        let first = region.table()[0].load(Ordering::Relaxed);
        region.table()[1].store(first, Ordering::Relaxed);
        drop(adopted);
        let err = SlotTable::adopt(pages, again(&region)).err().unwrap();
        assert!(err.contains("another leaf's"), "{err}");
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
                    std::ptr::from_ref(table.get_or_alloc(0).unwrap().slot()) as usize
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
