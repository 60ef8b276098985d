//! Records kept for reuse: a page written to the backing store is written there once.
//!
//! Swap reads a page back from the backing store and, once swap is more than half full, frees
//! its slot at once (the kernel's `vm_swap_full()` on swap-in). The page lives on in RAM,
//! unchanged if it was only read, and the kernel swaps it out again when it is cold again,
//! into a new slot. Freeing its record with the slot would make that second swap-out a second
//! write of the same bytes to the disk, every time the workload walks its pages: kernel zram +
//! disk swap never pays it, because its disk swap keeps the slots of pages it read back while
//! swap is not full.
//!
//! So a record whose page was read shortly before its slot was freed is *kept*, found by a
//! digest of the page's content, instead of freed; a whole-page write with the same content
//! takes the record over (the slot becomes written back and [`SlotFlags::ADOPTED`]) instead of
//! storing the page in the pool or writing it anew. A page changed since (a different digest)
//! misses, and its kept record is dropped in time: the table holds [`BUCKETS`] x [`WAYS`]
//! records, a new one replacing the oldest of its bucket, and every kept record is dropped when
//! the store has no room for a batch.
//!
//! The digest is Poly1305 under a key drawn when the store opens and never shown: a keyed
//! universal hash, so nobody without the key can make two pages collide (a collision would
//! hand one page's bytes to another), and the odds of an accidental one are about 2^-90 per
//! comparison (64 bits find the entry, 32 more must match).
//!
//! A record is sealed for the page index it was written from; an adopted slot's word packs that
//! index with the record's location ([`pack`]), so it opens as before, and a successor that
//! takes the device over finds the record through the slot as any other. Kept records are not
//! in any slot: a successor's space map leaves them free.
//!
//! Lock order: a slot's lock, then a bucket's (or the recent table's entry), then a file's
//! space map. Nothing here takes a slot lock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use parking_lot::Mutex;
use poly1305::universal_hash::KeyInit;
use poly1305::Poly1305;

use super::BackingStore;
use crate::device::tier::Tiering;
use crate::device::{PageIndex, SlotFlags, SlotState, PAGE_SIZE};

/// Buckets of the kept-record table, and records per bucket: 32 Ki records (128 MiB of pages)
/// in 1.1 MiB, made when the store opens (the I/O path must not allocate it under pressure).
const BUCKETS: usize = 8192;
const WAYS: usize = 4;
/// Entries of the table of recent reads, by page index: a read's digest waits here until the
/// slot is freed (on swap-in that is at once; the memory thread frees it within a second).
const RECENT: usize = 4096;

/// An adopted slot's word: the record's file (4 bits) and sector (28 bits), then the page
/// index it was sealed for (32 bits).
const FILE_BITS: u32 = 4;
const SECTOR_BITS: u32 = 28;
const INDEX_BITS: u32 = 32;

/// `location` and the page index `sealed_for` packed into an adopted slot's word, if they fit
/// (a record past 128 GiB of its file, or of a page past 16 TiB of device, is not kept).
pub(super) fn pack(location: u64, sealed_for: PageIndex) -> Option<u64> {
    let (file, sector) = BackingStore::split(location);
    (file < 1 << FILE_BITS && sector < 1 << SECTOR_BITS && sealed_for.0 < 1 << INDEX_BITS)
        .then_some(
            (file as u64) << (SECTOR_BITS + INDEX_BITS) | sector << INDEX_BITS | sealed_for.0,
        )
}

/// The record a written-back slot `s` of page `index` names: the page index it was sealed for,
/// and its location.
pub(in crate::device) fn record_of(index: PageIndex, s: &SlotState) -> (PageIndex, u64) {
    if !s.flags.contains(SlotFlags::ADOPTED) {
        return (index, s.word);
    }
    let w = s.word;
    let file = (w >> (SECTOR_BITS + INDEX_BITS)) as usize;
    let sector = (w >> INDEX_BITS) & ((1 << SECTOR_BITS) - 1);
    (
        PageIndex(w & ((1 << INDEX_BITS) - 1)),
        BackingStore::location(file, sector),
    )
}

/// A page's content digest: the key (never 0: 0 marks an empty entry) and a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Digest {
    key: u64,
    check: u32,
}

/// A record kept after its page was freed.
#[derive(Debug, Clone, Copy, Default)]
struct Kept {
    digest: Digest,
    /// Age stamp: the oldest of a full bucket goes.
    stamp: u32,
    location: u64,
    sealed_for: u32,
    size: u16,
    prio: u8,
    /// HUGE and INCOMPRESSIBLE, as the page's slot had them.
    flags: SlotFlags,
}

/// A read from the store: page `index` (stored + 1, 0 empty) from `location`, with its digest.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    index_plus_1: u64,
    location: u64,
    digest: Digest,
}

/// The kept records of one store.
pub(crate) struct Reuse {
    mac: Poly1305,
    /// The key came from the OS (reuse stays off otherwise).
    keyed: bool,
    on: AtomicBool,
    buckets: Box<[Mutex<[Kept; WAYS]>]>,
    recent: Box<[Mutex<Recent>]>,
    stamp: AtomicU32,
    /// Records kept now (a write looks them up only when there are some), and their sectors.
    held: AtomicU64,
    held_sectors: AtomicU64,
}

impl std::fmt::Debug for Reuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reuse")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Reuse {
    pub(super) fn new() -> Reuse {
        let mut key = [0u8; 32];
        // Without a secret key the digests could be made to collide: no reuse then.
        let keyed = OsRng.try_fill_bytes(&mut key).is_ok();
        let mac = Poly1305::new(&key.into());
        key.fill(0);
        Reuse {
            mac,
            keyed,
            on: AtomicBool::new(keyed),
            buckets: (0..BUCKETS).map(|_| Mutex::default()).collect(),
            recent: (0..RECENT).map(|_| Mutex::default()).collect(),
            stamp: AtomicU32::new(0),
            held: AtomicU64::new(0),
            held_sectors: AtomicU64::new(0),
        }
    }

    fn hold(&self, k: &Kept, n: i64) {
        let sectors = BackingStore::sectors_for(usize::from(k.size));
        if n > 0 {
            self.held.fetch_add(1, Ordering::Relaxed);
            self.held_sectors.fetch_add(sectors, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(1, Ordering::Relaxed);
            self.held_sectors.fetch_sub(sectors, Ordering::Relaxed);
        }
    }

    fn digest(&self, page: &[u8; PAGE_SIZE]) -> Digest {
        let tag = self.mac.clone().compute_unpadded(page);
        let t: [u8; 16] = tag.into();
        let key = u64::from_le_bytes(t[..8].try_into().expect("8 bytes"));
        Digest {
            key: key.max(1),
            check: u32::from_le_bytes(t[8..12].try_into().expect("4 bytes")),
        }
    }

    fn bucket(&self, d: Digest) -> &Mutex<[Kept; WAYS]> {
        &self.buckets[(d.key % BUCKETS as u64) as usize]
    }
}

impl BackingStore {
    /// Records kept for reuse now, and the bytes (sector-rounded) they hold on the store: not
    /// pages of the device (not in [`BackingStore::pages`]), but not free either.
    pub fn kept(&self) -> (u64, u64) {
        (
            self.reuse.held.load(Ordering::Relaxed),
            self.reuse.held_sectors.load(Ordering::Relaxed) * super::SECTOR,
        )
    }
}

impl Tiering {
    /// Turns reuse on or off (the policy's `reuse`); off drops every kept record.
    pub(in crate::device) fn set_reuse(&self, on: bool) {
        if let Some(b) = &self.backing {
            b.reuse.on.store(on && b.reuse.keyed, Ordering::Relaxed);
            if !on {
                self.drop_kept();
                for recent in b.reuse.recent.iter() {
                    *recent.lock() = Recent::default();
                }
            }
        }
    }

    /// After page `index` (slot state `s`) was read from the store into `page`: notes its
    /// digest, in case swap frees the slot now (see the module docs).
    pub(in crate::device) fn note_read_back(
        &self,
        index: PageIndex,
        s: &SlotState,
        page: &[u8; PAGE_SIZE],
    ) {
        let Some(b) = &self.backing else { return };
        let r = &b.reuse;
        if !r.on.load(Ordering::Relaxed) {
            return;
        }
        let (_, location) = record_of(index, s);
        let digest = r.digest(page);
        *r.recent[(index.0 % RECENT as u64) as usize].lock() = Recent {
            index_plus_1: index.0 + 1,
            location,
            digest,
        };
    }

    /// Page `index` no longer holds the written-back state `old` (its slot is locked): keeps
    /// the record if the page was read from it lately, else frees it.
    pub(in crate::device) fn free_written_back(&self, index: PageIndex, old: &SlotState) {
        let Some(b) = &self.backing else { return };
        let (sealed_for, location) = record_of(index, old);
        if !self.keep(b, index, sealed_for, location, old) {
            b.free(location, usize::from(old.size));
        }
    }

    fn keep(
        &self,
        b: &BackingStore,
        index: PageIndex,
        sealed_for: PageIndex,
        location: u64,
        old: &SlotState,
    ) -> bool {
        let r = &b.reuse;
        // The note is taken whatever is decided: a note left behind could match a later
        // record of other content at the same place.
        let digest = {
            let mut recent = r.recent[(index.0 % RECENT as u64) as usize].lock();
            if recent.index_plus_1 != index.0 + 1 || recent.location != location {
                return false;
            }
            let d = recent.digest;
            *recent = Recent::default();
            d
        };
        if pack(location, sealed_for).is_none() {
            return false;
        }
        let new = Kept {
            digest,
            stamp: r.stamp.fetch_add(1, Ordering::Relaxed),
            location,
            sealed_for: sealed_for.0 as u32,
            size: old.size,
            prio: old.prio,
            flags: old
                .flags
                .intersection(SlotFlags::HUGE | SlotFlags::INCOMPRESSIBLE),
        };
        let victim = {
            let mut bucket = r.bucket(digest).lock();
            // Under the bucket's lock: `drop_kept` takes every bucket's after reuse is off.
            if !r.on.load(Ordering::Relaxed) {
                return false;
            }
            // An empty way, else the same content kept twice, else the oldest.
            let way = (0..WAYS)
                .find(|&w| bucket[w].digest.key == 0)
                .or_else(|| (0..WAYS).find(|&w| bucket[w].digest == digest))
                .unwrap_or_else(|| {
                    (0..WAYS)
                        .max_by_key(|&w| new.stamp.wrapping_sub(bucket[w].stamp))
                        .unwrap_or(0)
                });
            // Counted before it can be taken: the gauges never go below zero.
            r.hold(&new, 1);
            std::mem::replace(&mut bucket[way], new)
        };
        // The page is off the store as far as bd_stat goes; its sectors stay taken.
        b.counters.count.fetch_sub(1, Ordering::Relaxed);
        self.policy.count_kept(1);
        if victim.digest.key != 0 {
            self.release_kept(b, &victim);
        }
        true
    }

    /// Frees a kept record's sectors (it is no longer in the table).
    fn release_kept(&self, b: &BackingStore, k: &Kept) {
        b.reuse.hold(k, -1);
        let (file, sector) = BackingStore::split(k.location);
        b.release(file, sector, BackingStore::sectors_for(usize::from(k.size)));
        self.policy.count_kept_dropped(1);
    }

    /// For a whole-page write of `page`: the written-back state that takes over a kept record
    /// of the same content, if there is one (it is no longer kept then), accessed at `now()`.
    pub(in crate::device) fn adopt_kept(
        &self,
        page: &[u8; PAGE_SIZE],
        now: impl FnOnce() -> u32,
    ) -> Option<SlotState> {
        let b = self.backing.as_ref()?;
        let r = &b.reuse;
        if r.held.load(Ordering::Relaxed) == 0 || !r.on.load(Ordering::Relaxed) {
            return None;
        }
        // A same-filled page is never written back, so never kept: spare it the digest.
        if crate::device::same_filled(page).is_some() {
            return None;
        }
        let digest = r.digest(page);
        let k = {
            let mut bucket = r.bucket(digest).lock();
            let way = (0..WAYS).find(|&w| bucket[w].digest == digest)?;
            let k = std::mem::take(&mut bucket[way]);
            r.hold(&k, -1);
            k
        };
        let Some(word) = pack(k.location, PageIndex(u64::from(k.sealed_for))) else {
            // Never: only packable records are kept.
            r.hold(&k, 1);
            self.release_kept(b, &k);
            return None;
        };
        b.counters.count.fetch_add(1, Ordering::Relaxed);
        self.policy.count_reused(1);
        Some(SlotState {
            word,
            flags: k.flags | SlotFlags::WB | SlotFlags::ADOPTED,
            prio: k.prio,
            size: k.size,
            atime: now(),
        })
    }

    /// Drops every kept record (the store needs the room, or reuse was turned off). Returns
    /// how many.
    pub(in crate::device) fn drop_kept(&self) -> u64 {
        let Some(b) = &self.backing else { return 0 };
        let r = &b.reuse;
        if r.held.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut dropped = 0;
        for bucket in r.buckets.iter() {
            let mut bucket = bucket.lock();
            for k in bucket.iter_mut().filter(|k| k.digest.key != 0) {
                let k = std::mem::take(k);
                self.release_kept(b, &k);
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests;
