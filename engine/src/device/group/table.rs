//! The live groups: which members of each group still hold their page, so that a write or
//! discard of a member can tell when the group's last page has left (its chunks are freed then)
//! and when fewer than half are left (it is worth splitting). In memory only: it can be rebuilt
//! from the slots, which name their group and their place in it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use uzram_allocator::Handle;

use crate::device::GroupFigures;

/// One live group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// A bit per member still holding its page.
    pub(crate) live: u16,
    /// Pages the group was made with.
    pub(crate) pages: u8,
    /// The page index of its first member (member `m` is page `first + m`).
    pub(crate) first: u64,
    /// Its frame's length: the compressed bytes it holds, counted once for all its members.
    pub(crate) frame_len: u32,
}

impl Entry {
    /// Fewer than half its pages left: worth splitting.
    pub(crate) fn sparse(&self) -> bool {
        (self.live.count_ones() as usize) * 2 < usize::from(self.pages)
    }
}

/// What dropping a member left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Other members still hold their pages.
    Kept,
    /// That was the last member: the caller frees the group's chunks.
    Last,
    /// The table does not know that member live: a bug, counted by the caller.
    Unknown,
}

/// The live groups and their counters (see `policy_stat`).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// By the head chunk's raw handle. Taken after a slot's lock, never before one. A B-tree:
    /// it grows a node at a time, where a hash table would rehash (and hold the lock while it
    /// did) and leave its old tables free in a heap that is not trimmed.
    live: Mutex<BTreeMap<u64, Entry>>,
    /// Compressed bytes the live groups hold: `compr_data_size` adds it.
    pub(crate) bytes: AtomicU64,
    /// Members' pages held in groups.
    pub(crate) pages: AtomicU64,
    /// Groups made since the device was created.
    pub(crate) made: AtomicU64,
    /// Reads that decompressed a group (a read served from an I/O context's copy is not one).
    pub(crate) decompressions: AtomicU64,
    /// Groups split back into single pages.
    pub(crate) split: AtomicU64,
    /// The next group's stamp.
    stamp: AtomicU32,
}

impl Groups {
    /// Registers a group just stored, every member live (the pass counts it made once a page
    /// has committed to it).
    pub(crate) fn insert(&self, head: Handle, first: u64, pages: u8, frame_len: u32) {
        let live = if pages >= 16 {
            u16::MAX
        } else {
            (1u16 << pages) - 1
        };
        let entry = Entry {
            live,
            pages,
            first,
            frame_len,
        };
        self.live.lock().insert(head.to_raw(), entry);
        self.bytes
            .fetch_add(u64::from(frame_len), Ordering::Relaxed);
        self.pages.fetch_add(u64::from(pages), Ordering::Relaxed);
    }

    /// Takes over the groups an adopted region's slots name ([`super::Members::adopt`]).
    pub(crate) fn adopt(&self, found: &super::Adopted) {
        self.stamp.store(found.next_stamp, Ordering::Relaxed);
        let mut live = self.live.lock();
        for &(head, e) in &found.entries {
            live.insert(head.to_raw(), e);
            self.bytes
                .fetch_add(u64::from(e.frame_len), Ordering::Relaxed);
            self.pages
                .fetch_add(u64::from(e.live.count_ones()), Ordering::Relaxed);
        }
    }

    /// Member `member` of the group at `head` no longer holds its page (its slot was replaced
    /// under its lock, or it never took it). At the last member the group leaves the table.
    pub(crate) fn drop_member(&self, head: Handle, member: u8) -> Dropped {
        let mut live = self.live.lock();
        let Some(e) = live.get_mut(&head.to_raw()) else {
            return Dropped::Unknown;
        };
        let bit = 1u16.checked_shl(u32::from(member)).unwrap_or(0);
        if e.live & bit == 0 {
            return Dropped::Unknown;
        }
        e.live &= !bit;
        self.pages.fetch_sub(1, Ordering::Relaxed);
        if e.live != 0 {
            return Dropped::Kept;
        }
        let frame_len = e.frame_len;
        live.remove(&head.to_raw());
        self.bytes
            .fetch_sub(u64::from(frame_len), Ordering::Relaxed);
        Dropped::Last
    }

    /// A stamp for the next group: tells its decompressed copy from an earlier group's whose
    /// head had the same handle (wrapping after 2^32 groups).
    pub(crate) fn next_stamp(&self) -> u32 {
        self.stamp.fetch_add(1, Ordering::Relaxed)
    }

    /// The live groups' compressed bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The pool bytes a grouped page stands for, on average: its group's frame shared among
    /// the pages in groups now (no lock; the two figures may be a moment apart).
    pub(crate) fn member_share(&self) -> u64 {
        self.bytes() / self.pages.load(Ordering::Relaxed).max(1)
    }

    /// The figures `DeviceStats` reports.
    pub(crate) fn figures(&self) -> GroupFigures {
        let live = self.live.lock().len() as u64;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GroupFigures {
            live,
            pages: load(&self.pages),
            bytes: load(&self.bytes),
            made: load(&self.made),
            decompressions: load(&self.decompressions),
            split: load(&self.split),
        }
    }

    /// The group at `head`, if live.
    pub(crate) fn get(&self, head: Handle) -> Option<Entry> {
        self.live.lock().get(&head.to_raw()).copied()
    }

    /// The heads of the groups with fewer than half their pages left.
    pub(crate) fn sparse(&self) -> Vec<u64> {
        let live = self.live.lock();
        live.iter()
            .filter(|(_, e)| e.sparse())
            .map(|(&h, _)| h)
            .collect()
    }

    /// Every live group, by head (for checks).
    pub(crate) fn snapshot(&self) -> Vec<(u64, Entry)> {
        self.live.lock().iter().map(|(&h, &e)| (h, e)).collect()
    }
}
