//! The slot table: the device's slots in leaves of [`LEAF_SLOTS`], in the process or in a
//! region's table area.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use uzram_allocator::{AtomicChunk, Region};

use super::{Journal, Slot, SlotRef, SlotState, JOURNAL_TAG, LOCK, WAITERS};

/// Slots a leaf of the [`SlotTable`] holds: 4 KiB of entries, 1 MiB of the device.
pub const LEAF_SLOTS: usize = 256;

/// One leaf: [`LEAF_SLOTS`] slots, allocated whole.
pub(super) type Leaf = [Slot; LEAF_SLOTS];

/// A leaf's bytes: one page.
const LEAF_BYTES: usize = LEAF_SLOTS * std::mem::size_of::<Slot>();

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
    pub fn in_region(pages: u64, region: Region) -> Result<SlotTable, crate::Error> {
        let refused = |reason| crate::Error::Region { reason };
        Self::region_bytes(pages)
            .filter(|&need| region.table_bytes() >= need)
            .ok_or_else(|| {
                refused(format!(
                    "the region's table area has {} bytes, too few for {pages} pages",
                    region.table_bytes()
                ))
            })?;
        let journal = Journal::create(&region).map_err(|source| crate::Error::RegionFailed {
            what: "claiming the slot journal's chunk",
            source,
        })?;
        let shared = Self::shared(pages, &region, journal, 0).map_err(refused)?;
        // The directory made resident whole now, while the device is new (a word a leaf: 8 KiB
        // a GiB of device). Every request reads its leaf's entry, and swap writes its first
        // pages at random places of a device: a read of a directory page never touched faults
        // it in (shared memory is allocated on a read too), and in a swap storm both queue
        // threads waited there in reclaim, which waited for their own writes. Made resident
        // here, a successor's `adopt`, which reads it all before the successor serves (the
        // kernel holding the device's I/O), finds it resident and allocates nothing for it.
        for word in shared.directory().iter().step_by(4096 / 8) {
            std::hint::black_box(word.load(Ordering::Relaxed));
        }
        Ok(SlotTable {
            pages,
            leaves: Leaves::Shared(shared),
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

    /// In a region: makes the next `pages` leaf pages resident after those made resident
    /// already (whatever was handed out), so that a caller can make the whole table resident
    /// in steps. Returns the pages faulted in now; nothing outside a region.
    pub fn prefault_more(&self, pages: usize) -> usize {
        let Leaves::Shared(s) = &self.leaves else {
            return 0;
        };
        let next = *s.next.lock();
        let from = s.ready.load(Ordering::Relaxed).max(next);
        self.prefault(from.saturating_add(pages).saturating_sub(next))
    }

    /// In a region: leaf pages not yet made resident, none of them handed out (0 outside one).
    pub fn leaves_not_ready(&self) -> usize {
        match &self.leaves {
            Leaves::Local(_) => 0,
            Leaves::Shared(s) => {
                let from = s.ready.load(Ordering::Relaxed).max(*s.next.lock());
                s.leaves.saturating_sub(from)
            }
        }
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
