//! A device that outlives its process: its settings, slot table and pool in a memfd
//! region ([`DeviceConfig::region`]), adopted by a successor ([`Device::adopt`]) or handed over
//! ([`Device::leave`]). See docs/design/surviving-the-daemon.md.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uzram_allocator::{
    Chunk, Handle, Pool, PoolConfig, Region, RegionSize, ARENA_PAGES, USER_CHUNK_TAG,
};

use super::group;
use super::slot::{Held, SlotFlags, SlotTable};
use super::writeback::{BackingStore, FileIdentity};
use super::{Device, DeviceConfig, PAGE_SIZE};
use crate::Error;

/// The chunk of the device's settings.
const SETTINGS_TAG: u64 = USER_CHUNK_TAG | (2 << 32);
/// "uzramdev", little endian.
const SETTINGS_MAGIC: u64 = u64::from_le_bytes(*b"uzramdev");
/// 2: written-back slots may be adopted (`SlotFlags::ADOPTED`, a packed word a binary that
/// knows only 1 would misread). 3: stored slots may be marked `SlotFlags::PROMOTED` (bit 6,
/// which a binary that knows only 2 would carry into a written-back slot as `ADOPTED`). An
/// older region is taken over and marked 3.
const SETTINGS_VERSION: u64 = 3;
const SETTINGS_VERSIONS_READ: [u64; 3] = [1, 2, 3];

// Settings words.
const S_MAGIC: usize = 0;
const S_VERSION: usize = 1;
const S_DISKSIZE: usize = 2;
const S_ZSPAGE: usize = 3;
const S_CREATED: usize = 4;
const S_CODECS: usize = 5;
const S_WORDS: usize = 6;

/// The chunk of the device's backing store (the `B_` words below), and one chunk per file
/// ([`BACKING_FILE_TAG`] with the file's place in the low 32 bits) with its identity.
const BACKING_TAG: u64 = USER_CHUNK_TAG | (3 << 32);
const BACKING_FILE_TAG: u64 = USER_CHUNK_TAG | (4 << 32);
/// "uzrambkg", little endian.
const BACKING_MAGIC: u64 = u64::from_le_bytes(*b"uzrambkg");
// Backing words.
const B_MAGIC: usize = 0;
const B_FILES: usize = 1;
/// Two words: the key's check value.
const B_KEY: usize = 2;
/// The nonce epoch the last process sealed records under.
const B_EPOCH: usize = 4;

/// Writes a new device's backing store (its files' identities, its key's check value and its
/// nonce epoch) into `region`, for a successor to check what it is given against.
pub(super) fn write_backing(region: &Region, store: &BackingStore) -> Result<(), Error> {
    let region_err = |source| Error::RegionFailed {
        what: "claiming a chunk for the backing store's record",
        source,
    };
    let ids = store.identities()?;
    for (i, id) in ids.iter().enumerate() {
        let mut chunk = region
            .claim_chunk(BACKING_FILE_TAG | i as u64)
            .map_err(region_err)?;
        chunk[..4].copy_from_slice(&id.words());
    }
    let mut head = region.claim_chunk(BACKING_TAG).map_err(region_err)?;
    head[B_FILES] = ids.len() as u64;
    head[B_KEY..B_KEY + 2].copy_from_slice(&store.key_check());
    head[B_EPOCH] = u64::from(store.epoch());
    head[B_MAGIC] = BACKING_MAGIC;
    Ok(())
}

/// A predecessor's backing store as its region records it.
struct FoundBacking {
    /// Its chunk: a successor writes its epoch there.
    head: Chunk,
    /// The epoch to seal under now.
    epoch: u32,
    /// Its files' identities, in stripe order.
    files: Vec<FileIdentity>,
}

/// What a predecessor's backing store was, checked against `config` before anything is opened
/// (its files' identities read from their paths): `None` when neither has one.
fn check_backing(region: &Region, config: &DeviceConfig) -> Result<Option<FoundBacking>, String> {
    let mut heads = region.take_adopted_chunks(|t| t == BACKING_TAG);
    let mut files = region.take_adopted_chunks(|t| t >> 32 == BACKING_FILE_TAG >> 32);
    let given = config.backing_devs.len();
    let head = match (heads.len(), given) {
        (0, 0) if files.is_empty() => return Ok(None),
        (0, 0) => return Err("the region holds backing files but no backing store".into()),
        (0, n) => {
            return Err(format!(
                "the device in the region has no backing store, and {n} backing device(s) are given here"
            ))
        }
        (1, 0) => {
            return Err(
                "the device in the region has a backing store: give its backing devices to adopt it"
                    .into(),
            )
        }
        (1, _) => heads.pop().expect("one").1,
        (n, _) => return Err(format!("the region holds {n} backing stores, not one")),
    };
    if head[B_MAGIC] != BACKING_MAGIC {
        return Err(format!(
            "the backing store's magic is {:#x} in the region",
            head[B_MAGIC]
        ));
    }
    let n = head[B_FILES];
    if n != given as u64 {
        return Err(format!(
            "the device in the region stripes over {n} backing file(s), and {given} are given here"
        ));
    }
    let Some(key) = &config.backing_key else {
        return Err(
            "no key for the backing store was given: its written-back pages could not be read"
                .into(),
        );
    };
    if key.check_value()[..] != head[B_KEY..B_KEY + 2] {
        return Err(
            "the key given is not the one the backing store's records were sealed with".into(),
        );
    }
    files.sort_by_key(|(tag, _)| *tag);
    if files.len() != given
        || files
            .iter()
            .enumerate()
            .any(|(i, (tag, _))| *tag != BACKING_FILE_TAG | i as u64)
    {
        return Err(format!(
            "the region holds {} backing file records for {n} files",
            files.len()
        ));
    }
    let files: Vec<FileIdentity> = files
        .iter()
        .map(|(_, chunk)| FileIdentity::from_words(&chunk[..4]))
        .collect();
    for (want, path) in files.iter().zip(&config.backing_devs) {
        let found = FileIdentity::at(path).map_err(|e| e.to_string())?;
        if let Some(why) = identity_differs(want, found.as_ref()) {
            return Err(format!(
                "{} is not the backing file the device wrote to: {why}",
                path.display()
            ));
        }
    }
    let epoch = u32::try_from(head[B_EPOCH])
        .ok()
        .and_then(|e| e.checked_add(1))
        .ok_or_else(|| format!("the backing store's epoch is {:#x}", head[B_EPOCH]))?;
    Ok(Some(FoundBacking { head, epoch, files }))
}

/// How `found` differs from `want`, in words; `None` when it is the same file.
fn identity_differs(want: &FileIdentity, found: Option<&FileIdentity>) -> Option<String> {
    let kind = |k: u64| match k {
        1 => "a regular file",
        2 => "a block device",
        _ => "unknown",
    };
    let Some(found) = found else {
        return Some("it does not exist".into());
    };
    if found.kind != want.kind {
        return Some(format!(
            "it is {}, the region says {}",
            kind(found.kind),
            kind(want.kind)
        ));
    }
    if (found.dev, found.ino) != (want.dev, want.ino) {
        return Some(format!(
            "it is device {:#x} inode {}, the region says device {:#x} inode {}",
            found.dev, found.ino, want.dev, want.ino
        ));
    }
    if found.bytes != want.bytes {
        return Some(format!(
            "it is {} bytes, the region says {}",
            found.bytes, want.bytes
        ));
    }
    None
}

/// What [`Device::adopt`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Pages that hold data (same-filled included).
    pub pages: u64,
    /// Slot changes the predecessor died in the middle of, put back to what they were.
    pub undone: u64,
    /// Objects no page named (a write the predecessor died in the middle of), freed.
    pub orphans: u64,
}

/// FNV-1a 64 of the codecs a device decompresses with, by priority: algorithm, level,
/// dictionary. A successor with other codecs would misread every page.
fn codecs_fingerprint(config: &DeviceConfig) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    let primary = Some((config.algorithm, config.params.clone()));
    for codec in std::iter::once(&primary).chain(config.secondary.iter()) {
        match codec {
            None => eat(&[0]),
            Some((algorithm, params)) => {
                eat(&[1]);
                eat(algorithm.name().as_bytes());
                eat(&[0]);
                match params.level {
                    Some(l) => eat(&i64::from(l).to_le_bytes()),
                    None => eat(&u64::MAX.to_le_bytes()),
                }
                let dict = params.dict.as_deref().unwrap_or(&[]);
                eat(&(dict.len() as u64).to_le_bytes());
                eat(dict);
            }
        }
    }
    h
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn settings(config: &DeviceConfig, disksize: u64, created: u64) -> [u64; S_WORDS] {
    let mut w = [0u64; S_WORDS];
    w[S_MAGIC] = SETTINGS_MAGIC;
    w[S_VERSION] = SETTINGS_VERSION;
    w[S_DISKSIZE] = disksize;
    w[S_ZSPAGE] = config.pool.max_pages_per_zspage as u64;
    w[S_CREATED] = created;
    w[S_CODECS] = codecs_fingerprint(config);
    w
}

/// Writes a new device's settings into `region`, for a successor to check its own against.
pub(super) fn write_settings(
    region: &Region,
    config: &DeviceConfig,
    disksize: u64,
) -> Result<(), Error> {
    let mut chunk = region
        .claim_chunk(SETTINGS_TAG)
        .map_err(|source| Error::RegionFailed {
            what: "claiming the settings chunk",
            source,
        })?;
    chunk[..S_WORDS].copy_from_slice(&settings(config, disksize, unix_now()));
    Ok(())
}

/// The predecessor's settings, checked against `config` and `disksize`; returns when it was
/// created (seconds since the Unix epoch) and the settings' chunk, whose version a caller that
/// takes the device over marks as this one's once the adoption has succeeded (a refused one
/// leaves a region an older binary can still take back). Writes nothing.
fn check_settings(
    region: &Region,
    config: &DeviceConfig,
    disksize: u64,
) -> Result<(u64, Chunk), String> {
    let mut found = region.take_adopted_chunks(|t| t == SETTINGS_TAG);
    let chunk = match found.len() {
        1 => found.pop().expect("one").1,
        n => return Err(format!("the region holds {n} device settings, not one")),
    };
    let created = chunk[S_CREATED];
    let want = settings(config, disksize, created);
    let names = [
        "the settings' magic",
        "the settings' version",
        "the disksize",
        "the longest zspage",
        "the creation time",
        "the codecs' fingerprint (algorithms, levels, dictionaries)",
    ];
    for (i, name) in names.iter().enumerate() {
        let read = i == S_VERSION && SETTINGS_VERSIONS_READ.contains(&chunk[i]);
        if chunk[i] != want[i] && !read {
            return Err(format!(
                "{name} is {:#x} in the region, {:#x} here",
                chunk[i], want[i]
            ));
        }
    }
    Ok((created, chunk))
}

impl Device {
    /// Whether a device of `config` and `disksize` could take over the device kept in the
    /// region `fd` holds: the region's header and metadata descriptors, the device's settings
    /// (disksize, zspage length, the codecs' fingerprint) and the codecs themselves, checked as
    /// [`Device::adopt`] checks them first. Changes nothing: it maps the region to read it and
    /// writes no byte. For a new binary asked to take a device over from a running one (an
    /// upgrade): a refusal here leaves the old one serving. (The tables and slots are checked
    /// only by the adoption itself, which needs the running one gone.)
    pub fn check_adoptable(
        config: &DeviceConfig,
        disksize: u64,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), Error> {
        let not = |reason: String| Error::NotAdopted { reason };
        if disksize == 0 {
            return Err(Error::InvalidSize { text: "0".into() });
        }
        Region::check(fd).map_err(|e| not(e.to_string()))?;
        let fd = fd
            .try_clone_to_owned()
            .map_err(|e| not(format!("cannot open the region again: {e}")))?;
        let region = Region::adopt(fd).map_err(|e| not(e.to_string()))?;
        let disksize = disksize.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        check_settings(&region, config, disksize).map_err(not)?;
        check_backing(&region, config).map_err(not)?;
        Self::codecs(config)?;
        Ok(())
    }

    /// The objects the slots name, sorted, once every slot is checked against the pool: a
    /// stored page's object is live and of its slot's size, a grouped page's group is whole
    /// ([`group::Members::adopt`]), and no object is named twice. A written-back page's record
    /// is taken into `backing`'s space map (it lies in its file and over no other's); without a
    /// backing store none may be. Also returns the groups, for the device's table.
    fn named_objects(
        slots: &SlotTable,
        pool: &Pool,
        backing: Option<&BackingStore>,
    ) -> Result<(Vec<u64>, group::Adopted), String> {
        let mut named: Vec<u64> = Vec::new();
        let mut members = group::Members::default();
        for (i, slot) in slots.iter() {
            let s = slot.peek();
            if s.flags.contains(SlotFlags::WB) {
                let Some(backing) = backing else {
                    return Err(format!(
                        "page {i} is written back, and this device has no backing store"
                    ));
                };
                let (_, location) = super::writeback::record_of(super::PageIndex(i), &s);
                backing
                    .adopt_record(location, usize::from(s.size))
                    .map_err(|why| format!("page {i}: {why}"))?;
                continue;
            }
            if let Held::Member { head, member } = s.held() {
                members.note(i, &s, head, member)?;
            } else if s.flags.contains(SlotFlags::STORED) {
                let size = Handle::from_raw(s.word)
                    .and_then(|h| pool.object_size(h).ok())
                    .ok_or_else(|| {
                        format!("page {i} names object {:#x}, which is not live", s.word)
                    })?;
                if size != usize::from(s.size) {
                    return Err(format!(
                        "page {i}: its slot says {} bytes, its object has {size}",
                        s.size
                    ));
                }
                named.push(s.word);
            }
        }
        let groups = members.adopt(pool, slots.len())?;
        named.extend(&groups.objects);
        named.sort_unstable();
        if named.windows(2).any(|w| w[0] == w[1]) {
            return Err("two pages or groups name one object".into());
        }
        Ok((named, groups))
    }

    /// What a region must hold for a device of `disksize` bytes: its slot table, arena places
    /// for a pool as large as the device with room for fragmentation and the reserve, and
    /// metadata chunks for the pool's tables (16 B a page at most) and the device's own. All
    /// of it is address space until written.
    pub fn region_size(disksize: u64) -> Result<RegionSize, Error> {
        let pages = disksize.div_ceil(PAGE_SIZE as u64);
        let too_large = || Error::Region {
            reason: format!("a device of {disksize} bytes does not fit a region"),
        };
        let table_bytes = SlotTable::region_bytes(pages).ok_or_else(too_large)?;
        let arenas = pages
            .div_ceil(ARENA_PAGES as u64)
            .checked_mul(5)
            .map(|a| a / 4 + 16)
            .and_then(|a| u32::try_from(a).ok())
            .ok_or_else(too_large)?;
        let meta_bytes = usize::try_from(pages)
            .ok()
            .and_then(|p| p.checked_mul(16))
            .and_then(|b| b.checked_add(512 << 10))
            .and_then(|b| b.checked_mul(33))
            .map(|b| b / 32)
            .ok_or_else(too_large)?;
        Ok(RegionSize {
            arenas,
            meta_bytes,
            table_bytes,
        })
    }

    /// The device a predecessor process left in `config.region` (dead at any instruction, or
    /// handed over with [`Device::leave`]): every page reads as it did. `config` and
    /// `disksize` must be the predecessor's (they are checked against what it wrote). Slot
    /// changes it died in the middle of are put back (the kernel reissues the writes that were
    /// in flight), objects no page names are freed, and the statistics are counted again from
    /// the slots. Anything that does not add up is refused with [`Error::NotAdopted`], naming
    /// the value; a refusal changes nothing an adoption reads.
    ///
    /// A device with a backing store needs its files (the same ones: their identities are
    /// checked before they are opened) and its key (`config.backing_key`); the space maps are
    /// rebuilt from the slots that name records, so a record whose batch the predecessor died
    /// writing is free again, and its page still in RAM.
    pub fn adopt(config: DeviceConfig, disksize: u64) -> Result<(Device, Adopted), Error> {
        let not = |reason: String| Error::NotAdopted { reason };
        let Some(region) = config.region.clone() else {
            return Err(not("no region was given".into()));
        };
        if disksize == 0 {
            return Err(Error::InvalidSize { text: "0".into() });
        }
        let disksize = disksize.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        let pages = disksize / PAGE_SIZE as u64;
        let (created, mut settings_chunk) =
            check_settings(&region, &config, disksize).map_err(not)?;
        let codecs = Self::codecs(&config)?;
        let backing_head = check_backing(&region, &config).map_err(not)?;
        let pool = Pool::adopt(PoolConfig {
            region: Some(region.clone()),
            ..config.pool.clone()
        })
        .map_err(|e| not(e.to_string()))?;
        // From here a refusal hands the pool back untouched (`leave`): dropping it would close
        // the region and give the predecessor's pages away.
        // The files are opened (uzram's label checked, nothing written; their identities
        // checked once more, open) once the slot table is adopted, and their sector maps
        // rebuilt from its slots.
        let open_backing = |found: FoundBacking| -> Result<_, Error> {
            let key = config
                .backing_key
                .as_ref()
                .ok_or_else(|| not("no key for the backing store was given".into()))?;
            let store = BackingStore::open_keyed(
                &config.backing_devs,
                disksize,
                config.backing_force,
                key,
                Some(found.epoch),
            )?;
            let now = store.identities()?;
            for ((want, have), path) in found.files.iter().zip(&now).zip(&config.backing_devs) {
                if let Some(why) = identity_differs(want, Some(have)) {
                    return Err(not(format!(
                        "{} is not the backing file the device wrote to: {why}",
                        path.display()
                    )));
                }
            }
            Ok((store, found))
        };
        let checked = SlotTable::adopt(pages, region.clone())
            .map_err(not)
            .and_then(|(slots, undone)| {
                let backing = backing_head.map(open_backing).transpose()?;
                let store = backing.as_ref().map(|(store, _)| store);
                let (named, groups) = Self::named_objects(&slots, &pool, store).map_err(not)?;
                Ok((slots, undone, named, groups, backing))
            });
        let (slots, undone, named, groups, backing) = match checked {
            Ok(c) => c,
            Err(e) => {
                pool.leave();
                return Err(e);
            }
        };
        // Taken over: a region of an older version this one reads is this version's now.
        settings_chunk[S_VERSION] = SETTINGS_VERSION;
        // Before this process seals a record: its nonces are of the new epoch.
        let backing = backing.map(|(store, mut found)| {
            found.head[B_EPOCH] = u64::from(found.epoch);
            store
        });
        let mut orphans = 0;
        for h in pool.handles() {
            if named.binary_search(&h.to_raw()).is_err() {
                // A live handle the pool itself listed: freeing it cannot fail.
                if pool.free(h).is_ok() {
                    orphans += 1;
                }
            }
        }
        pool.set_limit(config.mem_limit);
        let age = Duration::from_secs(unix_now().saturating_sub(created));
        let now = Instant::now();
        let epoch = now.checked_sub(age).unwrap_or(now);
        let device = Self::assemble(&config, disksize, slots, pool, codecs, backing, epoch);
        device.groups.adopt(&groups);
        let mut found = Adopted {
            undone,
            orphans,
            ..Adopted::default()
        };
        for (_, slot) in device.slots.iter() {
            let s = slot.peek();
            if !s.is_empty() {
                found.pages += 1;
                device.counters.add(0, &s);
            }
        }
        Ok((device, found))
    }

    /// Test seam: what a process killed while a write stored page `index` leaves: the new
    /// object (`page`, stored raw) in the pool and the slot's change half done (its word, not
    /// its meta), with the slot's lock held. Only [`Device::leave`] or leaking the device
    /// makes sense after it.
    #[cfg(feature = "testing")]
    pub fn die_in_write(
        &self,
        index: super::PageIndex,
        page: &[u8; PAGE_SIZE],
    ) -> Result<(), Error> {
        let h = self.pool.store(page).map_err(crate::IoError::OutOfMemory)?;
        let slot = self.slot_for_write(index)?;
        slot.lock().die_in_set(super::SlotState {
            word: h.to_raw(),
            flags: SlotFlags::STORED | SlotFlags::HUGE,
            prio: 0,
            size: PAGE_SIZE as u16,
            atime: 0,
        });
        Ok(())
    }

    /// In a region: makes the next slot-table leaves and metadata chunks resident ahead of the
    /// writes that will take them (64 leaves and 512 chunks, 256 KiB and 128 KiB; 256 and 4096,
    /// 1 MiB each, while `memory_short`), so that an I/O thread's first write of a new page of
    /// shared memory does not fault: a fault there waits for reclaim, and while memory is short
    /// reclaim waits for swap writes to this very device (the I/O path's heap keeps 4 MiB
    /// ahead for the same reason). For the thread that keeps the pool's reserve (it may wait
    /// for reclaim). Returns the leaves and chunks made resident now; nothing outside a region.
    pub fn prefault_region(&self, memory_short: bool) -> (usize, u32) {
        let Some(region) = self.region() else {
            return (0, 0);
        };
        let (leaves, chunks) = if memory_short { (256, 4096) } else { (64, 512) };
        let leaves = self.slots.prefault(leaves);
        self.pool.note_progress(leaves as u64);
        let chunks = region.prefault_chunks(chunks);
        // 16 chunks (and their descriptors) a page.
        self.pool.note_progress(u64::from(chunks).div_ceil(16));
        (leaves, chunks)
    }

    /// In a region: makes the slot-table leaves not yet resident resident, 1024 (4 MiB) a
    /// call, if all of them take at most `most_bytes` (4 KiB a leaf, a leaf 1 MiB of device:
    /// what kernel zram's table takes from the start); otherwise nothing. Call it until it
    /// returns 0. For a swap device while memory is short: swap writes land anywhere on a
    /// device, and a storm takes new leaves faster than a margin ahead is kept while the thread
    /// keeping it waits for memory. Returns the leaves made resident now.
    pub fn prefault_table(&self, most_bytes: u64) -> usize {
        if self.region().is_none() {
            return 0;
        }
        let left = self.slots.leaves_not_ready();
        if left as u64 * 4096 > most_bytes {
            return 0;
        }
        let leaves = self.slots.prefault_more(1024);
        self.pool.note_progress(leaves as u64);
        leaves
    }

    /// In a region: slot-table leaves and metadata chunks a write took before
    /// [`Device::prefault_region`] made them resident (its first write of them faulted).
    pub fn region_unready(&self) -> (u64, u64) {
        match self.region() {
            None => (0, 0),
            Some(region) => (self.slots.unready_leaves(), region.unready_chunks()),
        }
    }

    /// The region the device lives in, if it does.
    pub fn region(&self) -> Option<&Region> {
        self.pool.region()
    }

    /// Hands the device over: this process lets go of it without giving its memory back, so
    /// that another process can [`Device::adopt`] it from the same region. (A device merely
    /// dropped gives its pool's memory back, and its region can no longer be adopted.) A device
    /// not in a region is dropped.
    pub fn leave(self) {
        let Device { pool, .. } = self;
        pool.leave();
    }
}
