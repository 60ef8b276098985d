//! One size class's state: its zspages, fullness groups, handle table and back-pointers, and
//! what is done under its lock (alloc, free, compaction, the consistency check).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::persist::{loc_pack, loc_unpack, loc_word, Kind, SharedWords, Words};
use super::{ClassStats, Handle, ReserveSignal};
use crate::class::ClassSpec;
use crate::mem::{ArenaSet, MapError, PageRun, Placement, Region, ARENA_PAGES, PAGE_SIZE};
use crate::table::Table;
use crate::Error;

mod compact;

/// Orders the words a successor reads (see `persist`): the store before it lands before the
/// store after it, for the compiler and the CPU alike.
fn persist_order() {
    std::sync::atomic::fence(Ordering::Release);
}

/// Partial groups `< 10 %` .. `< 100 %`, then full.
pub const FULLNESS_GROUPS: usize = 11;
const FULL_GROUP: usize = FULLNESS_GROUPS - 1;

/// Objects moved per automatic compaction step (bounds the work a free may do).
pub(super) const AUTO_COMPACT_MOVES: usize = 64;
/// Zspage moves per automatic arena defragmentation step.
pub(super) const AUTO_DEFRAG_MOVES: usize = 8;

// Back-pointer words: an allocated slot holds its handle's local index; a free one holds the next
// free slot (or FREE_END) with FREE_TAG set.
const FREE_TAG: u32 = 1 << 31;
const FREE_END: u16 = 0xffff;

// Handle table words. Allocated: bit 63 | size << 43 | slot << 32 | zspage id. Free: next free
// local index + 1 (0 = end).
const ENTRY_LIVE: u64 = 1 << 63;

/// A back-pointer word while a class is adopted: no handle has claimed the slot yet.
const UNCLAIMED: u32 = FREE_TAG | FREE_END as u32;

pub(super) fn entry_pack(zspage: u32, slot: usize, size: usize) -> u64 {
    ENTRY_LIVE | ((size as u64) << 43) | ((slot as u64) << 32) | u64::from(zspage)
}

pub(super) fn entry_unpack(e: u64) -> Option<(u32, usize, usize)> {
    (e & ENTRY_LIVE != 0).then_some({
        (
            e as u32,
            ((e >> 32) & 0x7ff) as usize,
            ((e >> 43) & 0x1fff) as usize,
        )
    })
}

pub(super) struct Zspage {
    pub(super) run: PageRun,
    pub(super) inuse: u16,
    /// First free slot, or FREE_END.
    pub(super) free_head: u16,
    /// Position in `groups[group_of(inuse)]` (the group is implied by `inuse`).
    pub(super) group_pos: u32,
}

const _: () = assert!(std::mem::size_of::<Option<Zspage>>() <= 24);

pub(super) struct ClassState {
    pub(super) spec: ClassSpec,
    pub(super) index: usize,
    pub(super) zspages: Table<Option<Zspage>>,
    pub(super) free_zspage_ids: Vec<u32>,
    /// `objs_per_zspage` words per zspage id.
    pub(super) backptr: Table<u32>,
    pub(super) groups: [Vec<u32>; FULLNESS_GROUPS],
    pub(super) handles: Words,
    /// In a region: each zspage id's location, for a successor (see `persist`).
    pub(super) locations: Option<SharedWords>,
    pub(super) free_handle: u64,
    pub(super) obj_used: usize,
    pub(super) object_bytes: usize,
    pub(super) live_zspages: usize,
}

pub(super) struct Shared<'a> {
    pub(super) arenas: &'a Mutex<ArenaSet>,
    /// `Some` in [`Growth::Reserve`] mode: whom to ask for more arenas, and below how many empty
    /// ones to ask.
    pub(super) reserve: Option<&'a ReserveSignal>,
    pub(super) pages_used: &'a AtomicU64,
    pub(super) max_pages_used: &'a AtomicU64,
    pub(super) limit_pages: &'a AtomicU64,
    pub(super) pages_compacted: &'a AtomicU64,
}

impl ClassState {
    pub(super) fn new(index: usize, spec: ClassSpec, region: Option<&Region>) -> ClassState {
        let (handles, locations) = match region {
            None => (Words::Local(Table::new(1, 32)), None),
            Some(r) => (
                Words::Shared(SharedWords::new(r.clone(), Kind::Handles, index)),
                Some(SharedWords::new(r.clone(), Kind::Zspages, index)),
            ),
        };
        ClassState {
            spec,
            index,
            // Small fixed segments: a class's slack stays under a KiB or so (many classes hold
            // few objects), and growing never copies.
            zspages: Table::new(1, 4),
            free_zspage_ids: Vec::new(),
            backptr: Table::new(spec.objs_per_zspage, 2),
            groups: Default::default(),
            handles,
            locations,
            free_handle: 0,
            obj_used: 0,
            object_bytes: 0,
            live_zspages: 0,
        }
    }

    /// A class's state rebuilt from what a predecessor left in `region` (see `persist`): its
    /// handle table and zspage locations. The zspages' arenas are in `arenas` already. Objects
    /// must be `min_size..=spec.size` bytes. Returns why, naming the value, on any doubt. It
    /// writes nothing to the region and gives no pages back: zspages with no object stay, and
    /// free handles stay unlinked, until [`ClassState::finish_adopt`], once every class passed;
    /// the runs taken from `arenas` stay marked there (the caller drops the whole set on a
    /// refusal).
    pub(super) fn adopt(
        index: usize,
        spec: ClassSpec,
        region: &Region,
        handles: SharedWords,
        locations: SharedWords,
        min_size: usize,
        arenas: &mut ArenaSet,
    ) -> Result<ClassState, String> {
        let mut c = ClassState::new(index, spec, Some(region));
        let objs = spec.objs_per_zspage;
        for zid in 0..locations.len() {
            c.zspages.push_row();
            c.backptr.push_row();
            c.backptr
                .row_mut(zid)
                .expect("row just pushed")
                .fill(UNCLAIMED);
            let w = locations.at(zid);
            match loc_unpack(w) {
                Some((arena, first)) if loc_word(arena, first) == w => {
                    let run = arenas
                        .adopt_run(arena, first, spec.pages_per_zspage)
                        .map_err(|e| format!("zspage {zid}: {e}"))?;
                    c.zspages[zid] = Some(Zspage {
                        run,
                        inuse: 0,
                        free_head: FREE_END,
                        group_pos: 0,
                    });
                }
                None if w == 0 => {}
                _ => return Err(format!("zspage {zid}: location word {w:#x}")),
            }
        }
        for local in 0..handles.len() {
            let e = handles.at(local);
            let Some((zid, slot, size)) = entry_unpack(e) else {
                continue;
            };
            let live = c.zspages.get(zid as usize).is_some_and(|z| z.is_some());
            if entry_pack(zid, slot, size) != e
                || !live
                || slot >= objs
                || !(min_size..=spec.size).contains(&size)
            {
                return Err(format!(
                    "handle {local}: entry {e:#x} (zspage {zid}, slot {slot}, {size} bytes) does not fit the class's {} zspages of {objs} slots of {min_size}..={} bytes",
                    locations.len(),
                    spec.size
                ));
            }
            let w = &mut c.backptr.row_mut(zid as usize).expect("row of a zspage id")[slot];
            if *w != UNCLAIMED {
                return Err(format!(
                    "handles {} and {local} both name slot {slot} of zspage {zid}",
                    *w
                ));
            }
            *w = local as u32;
            c.zspages[zid as usize].as_mut().expect("live").inuse += 1;
            c.obj_used += 1;
            c.object_bytes += size;
        }
        c.handles = Words::Shared(handles);
        c.locations = Some(locations);
        Ok(c)
    }

    /// The second half of [`ClassState::adopt`], once every class passed: links the free
    /// handles, gives back the pages of zspages with no object (a predecessor's allocation that
    /// never got its handle, or a crash while one was freed), builds the zspages' free lists and
    /// fullness groups. Writes to the region only what no object depends on.
    pub(super) fn finish_adopt(&mut self, arenas: &mut ArenaSet) {
        let objs = self.spec.objs_per_zspage;
        for local in (0..self.handles.len()).rev() {
            if self.handles.at(local) & ENTRY_LIVE == 0 {
                self.handles.set(local, self.free_handle);
                self.free_handle = local as u64 + 1;
            }
        }
        for zid in 0..self.zspages.len() {
            let Some(z) = self.zspages[zid].as_mut() else {
                self.free_zspage_ids.push(zid as u32);
                continue;
            };
            if z.inuse == 0 {
                let z = self.zspages[zid].take().expect("live");
                if let Some(locs) = &mut self.locations {
                    // Cleared before the pages go back, as `free_zspage` does.
                    locs.set(zid, 0);
                    persist_order();
                }
                arenas.free_run(z.run);
                self.free_zspage_ids.push(zid as u32);
                continue;
            }
            let row = self.backptr.row_mut(zid).expect("row of a zspage id");
            let mut head = FREE_END;
            for slot in (0..objs).rev() {
                if row[slot] == UNCLAIMED {
                    row[slot] = FREE_TAG | u32::from(head);
                    head = slot as u16;
                }
            }
            self.zspages[zid].as_mut().expect("live").free_head = head;
            self.live_zspages += 1;
            self.group_insert(zid as u32);
        }
        // Lowest ids are reused first, as a fresh class would.
        self.free_zspage_ids.reverse();
    }

    pub(super) fn group_of(&self, inuse: usize) -> usize {
        let objs = self.spec.objs_per_zspage;
        if inuse == objs {
            FULL_GROUP
        } else {
            (inuse * 10 / objs).min(9)
        }
    }

    pub(super) fn group_insert(&mut self, zid: u32) {
        let inuse = self.zspages[zid as usize]
            .as_ref()
            .expect("live zspage")
            .inuse;
        let g = self.group_of(usize::from(inuse));
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        z.group_pos = self.groups[g].len() as u32;
        self.groups[g].push(zid);
    }

    /// Takes `zid` out of group `g`, the group its `inuse` implied when it was inserted.
    pub(super) fn group_remove(&mut self, zid: u32, g: usize) {
        let z = self.zspages[zid as usize].as_ref().expect("live zspage");
        let pos = z.group_pos as usize;
        let removed = self.groups[g].swap_remove(pos);
        debug_assert_eq!(removed, zid);
        if let Some(&moved) = self.groups[g].get(pos) {
            self.zspages[moved as usize]
                .as_mut()
                .expect("grouped zspage is live")
                .group_pos = pos as u32;
        }
    }

    /// Moves `zid` to the group its `inuse` implies, from the one `old_inuse` implied.
    pub(super) fn regroup(&mut self, zid: u32, old_inuse: u16) {
        let z = self.zspages[zid as usize].as_ref().expect("live zspage");
        let old = self.group_of(usize::from(old_inuse));
        if self.group_of(usize::from(z.inuse)) != old {
            self.group_remove(zid, old);
            self.group_insert(zid);
        }
    }

    /// The fullest zspage with a free slot, other than `except`.
    pub(super) fn fullest_partial(&self, except: Option<u32>) -> Option<u32> {
        (0..FULL_GROUP)
            .rev()
            .flat_map(|g| self.groups[g].iter().rev())
            .copied()
            .find(|&z| Some(z) != except)
    }

    /// The emptiest zspage.
    pub(super) fn sparsest(&self) -> Option<u32> {
        (0..FULL_GROUP)
            .flat_map(|g| self.groups[g].iter().rev())
            .copied()
            .next()
    }

    pub(super) fn new_zspage(&mut self, shared: &Shared<'_>) -> Result<u32, Error> {
        let pages = self.spec.pages_per_zspage as u64;
        // Reserve the pages only if they fit: a compare-and-swap, so neither a reader nor a
        // racing allocation in another class ever sees the pool past its limit.
        let limit = shared.limit_pages.load(Ordering::Relaxed);
        let reserve =
            shared
                .pages_used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                    (limit == 0 || used + pages <= limit).then_some(used + pages)
                });
        let before = match reserve {
            Ok(before) => before,
            Err(used) => {
                return Err(Error::LimitExceeded {
                    limit_bytes: limit * PAGE_SIZE as u64,
                    used_bytes: used * PAGE_SIZE as u64,
                })
            }
        };
        shared
            .max_pages_used
            .fetch_max(before + pages, Ordering::Relaxed);
        let zid = match self.free_zspage_ids.pop() {
            Some(id) => id,
            None => {
                if let Some(locs) = &mut self.locations {
                    if let Err(e) = locs.push() {
                        shared.pages_used.fetch_sub(pages, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                let id = self.zspages.push_row();
                let row = self.backptr.push_row();
                debug_assert_eq!(id, row);
                id as u32
            }
        };
        let (run, empty_left) = {
            let mut arenas = shared.arenas.lock();
            let run = arenas.alloc_run(self.spec.pages_per_zspage, Placement::Any);
            (run, arenas.empty_arenas())
        };
        if let Some(signal) = shared.reserve {
            if run.is_err() {
                // Before the ask, so the round it wakes sees the draw (a reserve kept at 0
                // is never drawn below its target).
                signal.dry.store(true, Ordering::Relaxed);
            }
            if empty_left < signal.target() || run.is_err() {
                signal.ask();
            }
        }
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                shared.pages_used.fetch_sub(pages, Ordering::Relaxed);
                self.free_zspage_ids.push(zid);
                return Err(match e {
                    MapError::Map(errno) => Error::OutOfMemory {
                        bytes: (ARENA_PAGES * PAGE_SIZE) as u64,
                        errno,
                    },
                    MapError::NoRoom => Error::ReserveExhausted { waited_ms: 0 },
                });
            }
        };
        let objs = self.spec.objs_per_zspage;
        for (i, w) in self
            .backptr
            .row_mut(zid as usize)
            .expect("row of a zspage id")
            .iter_mut()
            .enumerate()
        {
            *w = FREE_TAG
                | if i + 1 < objs {
                    (i + 1) as u32
                } else {
                    u32::from(FREE_END)
                };
        }
        if let Some(locs) = &mut self.locations {
            locs.set(zid as usize, loc_pack(&run));
        }
        self.zspages[zid as usize] = Some(Zspage {
            run,
            inuse: 0,
            free_head: 0,
            group_pos: 0,
        });
        self.live_zspages += 1;
        self.group_insert(zid);
        Ok(zid)
    }

    pub(super) fn free_zspage(&mut self, zid: u32, shared: &Shared<'_>) -> u64 {
        // An empty zspage sits in the group of 0 objects in use.
        self.group_remove(zid, self.group_of(0));
        let z = self.zspages[zid as usize].take().expect("live zspage");
        debug_assert_eq!(z.inuse, 0);
        self.free_zspage_ids.push(zid);
        self.live_zspages -= 1;
        let pages = z.run.pages() as u64;
        shared.pages_used.fetch_sub(pages, Ordering::Relaxed);
        if let Some(locs) = &mut self.locations {
            // After the handle word that freed the last object (a successor must not see a live
            // handle in a dead zspage), and before the pages go back (nor a live zspage whose
            // pages were given away).
            persist_order();
            locs.set(zid as usize, 0);
            persist_order();
        }
        shared.arenas.lock().free_run(z.run);
        pages
    }

    /// Takes a free slot of `zid` and points it at handle `local`.
    pub(super) fn take_slot(&mut self, zid: u32, local: u32) -> usize {
        let objs = self.spec.objs_per_zspage;
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        let slot = z.free_head as usize;
        debug_assert!(slot < objs, "zspage with a free slot");
        let w = &mut self.backptr.row_mut(zid as usize).expect("row")[slot];
        z.free_head = (*w & !FREE_TAG) as u16;
        *w = local;
        let old = z.inuse;
        z.inuse += 1;
        self.regroup(zid, old);
        slot
    }

    /// Gives back slot `slot` of `zid`; returns whether the zspage is now empty.
    pub(super) fn put_slot(&mut self, zid: u32, slot: usize) -> bool {
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        self.backptr.row_mut(zid as usize).expect("row")[slot] = FREE_TAG | u32::from(z.free_head);
        z.free_head = slot as u16;
        let old = z.inuse;
        z.inuse -= 1;
        let empty = z.inuse == 0;
        self.regroup(zid, old);
        empty
    }

    pub(super) fn alloc(&mut self, size: usize, shared: &Shared<'_>) -> Result<Handle, Error> {
        // The handle first: a region's table may be full, and then nothing has changed.
        let local = match self.free_handle.checked_sub(1) {
            Some(l) => {
                self.free_handle = self.handles.at(l as usize);
                l as u32
            }
            None => self.handles.push()? as u32,
        };
        let zid = match self.fullest_partial(None) {
            Some(z) => z,
            None => match self.new_zspage(shared) {
                Ok(z) => z,
                Err(e) => {
                    self.handles.set(local as usize, self.free_handle);
                    self.free_handle = u64::from(local) + 1;
                    return Err(e);
                }
            },
        };
        let slot = self.take_slot(zid, local);
        // After the zspage's location (`new_zspage` wrote it before this).
        persist_order();
        self.handles
            .set(local as usize, entry_pack(zid, slot, size));
        self.obj_used += 1;
        self.object_bytes += size;
        Ok(Handle::new(self.index, local))
    }

    /// Appends the handle of every live object of the class.
    pub(super) fn live_handles(&self, out: &mut Vec<Handle>) {
        out.extend(
            self.handles
                .iter()
                .enumerate()
                .filter(|(_, e)| e & ENTRY_LIVE != 0)
                .map(|(local, _)| Handle::new(self.index, local as u32)),
        );
    }

    pub(super) fn lookup(&self, h: Handle) -> Result<(u32, usize, usize), Error> {
        h.local()
            .and_then(|l| self.handles.get(l as usize))
            .and_then(entry_unpack)
            .ok_or(Error::InvalidHandle { raw: h.to_raw() })
    }

    pub(super) fn object(&self, h: Handle) -> Result<&[u8], Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let z = self.zspages[zid as usize]
            .as_ref()
            .expect("a live handle's zspage is live");
        let off = slot * self.spec.size;
        Ok(&z.run.bytes()[off..off + size])
    }

    pub(super) fn object_mut(&mut self, h: Handle) -> Result<&mut [u8], Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let z = self.zspages[zid as usize]
            .as_mut()
            .expect("a live handle's zspage is live");
        let off = slot * self.spec.size;
        Ok(&mut z.run.bytes_mut()[off..off + size])
    }

    /// Frees the object; returns the zspage pages freed (0 unless its zspage emptied).
    pub(super) fn free(&mut self, h: Handle, shared: &Shared<'_>) -> Result<u64, Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let local = h.local().expect("looked up");
        self.handles.set(local as usize, self.free_handle);
        self.free_handle = u64::from(local) + 1;
        self.obj_used -= 1;
        self.object_bytes -= size;
        if self.put_slot(zid, slot) {
            return Ok(self.free_zspage(zid, shared));
        }
        Ok(0)
    }

    /// Zspages' worth of free slots: what compaction could free at best.
    pub(super) fn freeable(&self) -> usize {
        let allocated = self.live_zspages * self.spec.objs_per_zspage;
        (allocated - self.obj_used) / self.spec.objs_per_zspage
    }

    pub(super) fn fragmented(&self) -> bool {
        let f = self.freeable();
        f >= 2 && f * 8 >= self.live_zspages
    }

    pub(super) fn metadata_bytes(&self) -> usize {
        self.zspages.bytes()
            + self.free_zspage_ids.capacity() * 4
            + self.backptr.bytes()
            + self.groups.iter().map(|g| g.capacity() * 4).sum::<usize>()
            + self.handles.bytes()
            + self.locations.as_ref().map_or(0, SharedWords::bytes)
    }

    pub(super) fn stats(&self) -> ClassStats {
        let mut by_fullness = [0u64; FULLNESS_GROUPS];
        for (g, n) in self.groups.iter().zip(by_fullness.iter_mut()) {
            *n = g.len() as u64;
        }
        ClassStats {
            index: self.index,
            size: self.spec.size,
            by_fullness,
            obj_allocated: (self.live_zspages * self.spec.objs_per_zspage) as u64,
            obj_used: self.obj_used as u64,
            pages_used: (self.live_zspages * self.spec.pages_per_zspage) as u64,
            pages_per_zspage: self.spec.pages_per_zspage,
            freeable: self.freeable() as u64,
        }
    }

    pub(super) fn check(&self, arenas: &ArenaSet) -> Result<(), String> {
        let objs = self.spec.objs_per_zspage;
        let ctx = |m: String| format!("class {} (size {}): {m}", self.index, self.spec.size);
        let mut live = 0;
        let mut used_total = 0;
        for (zid, z) in self.zspages.iter().enumerate() {
            let Some(z) = z else { continue };
            live += 1;
            if z.run.pages() != self.spec.pages_per_zspage || !arenas.run_is_marked(&z.run) {
                return Err(ctx(format!(
                    "zspage {zid}: run not marked used in its arena"
                )));
            }
            let words = self.backptr.row(zid).expect("row of a live zspage");
            let used = words.iter().filter(|w| *w & FREE_TAG == 0).count();
            if used != usize::from(z.inuse) || used == 0 {
                return Err(ctx(format!(
                    "zspage {zid}: inuse {} but {used} slots used",
                    z.inuse
                )));
            }
            used_total += used;
            // The free list visits exactly the free slots.
            let mut seen = 0;
            let mut cur = z.free_head;
            while cur != FREE_END {
                let w = words.get(cur as usize).copied().unwrap_or(0);
                if w & FREE_TAG == 0 || seen > objs {
                    return Err(ctx(format!("zspage {zid}: free list broken at {cur}")));
                }
                seen += 1;
                cur = (w & !FREE_TAG) as u16;
            }
            if seen != objs - used {
                return Err(ctx(format!(
                    "zspage {zid}: free list has {seen} of {} free",
                    objs - used
                )));
            }
            for (slot, &local) in words.iter().enumerate().filter(|(_, w)| *w & FREE_TAG == 0) {
                match self.handles.get(local as usize).and_then(entry_unpack) {
                    Some((hz, hs, size))
                        if hz as usize == zid && hs == slot && size <= self.spec.size => {}
                    other => {
                        return Err(ctx(format!(
                            "zspage {zid} slot {slot}: handle {local} -> {other:?}"
                        )))
                    }
                }
            }
            let group = self.group_of(usize::from(z.inuse));
            if self.groups[group].get(z.group_pos as usize) != Some(&(zid as u32)) {
                return Err(ctx(format!(
                    "zspage {zid}: not at {} of group {group}",
                    z.group_pos
                )));
            }
        }
        let grouped: usize = self.groups.iter().map(Vec::len).sum();
        if live != self.live_zspages || grouped != live || used_total != self.obj_used {
            return Err(ctx(format!(
                "counters: live {} (found {live}), grouped {grouped}, obj_used {} (found {used_total})",
                self.live_zspages, self.obj_used
            )));
        }
        let live_handles = self.handles.iter().filter(|&e| e & ENTRY_LIVE != 0).count();
        if live_handles != self.obj_used {
            return Err(ctx(format!(
                "{live_handles} live handles for {} objects",
                self.obj_used
            )));
        }
        let sizes: usize = self
            .handles
            .iter()
            .filter_map(entry_unpack)
            .map(|(_, _, s)| s)
            .sum();
        if sizes != self.object_bytes {
            return Err(ctx(format!(
                "object bytes {} but handles sum to {sizes}",
                self.object_bytes
            )));
        }
        Ok(())
    }
}
