//! The model and the harness that holds the device beside it: each operation applied to both
//! and the results compared.

use std::collections::{BTreeSet, HashMap};

use uzram_codecs::{Algorithm, Codec, CodecParams, Stream, MAX_COMPRESSED_LEN};

use super::checks::check_slot;

mod ops;
use super::{same_word, DeviceOp, PageKind, Tally, WildOp, DEVICE_PAGES, MAX_SECTORS, SECTOR_SPAN};
use crate::{
    Device, DeviceConfig, DeviceStats, IoContext, IoError, IoStat, PageIndex, SlotFlags, SlotState,
    PAGE_SIZE, SECTOR_SIZE,
};

/// How the engine must store a page's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// In the slot: the fill word.
    Same(u64),
    /// In the pool: compressed to this many bytes.
    Compressed(usize),
    /// In the pool: raw.
    Huge,
    /// On the backing file: this many stored bytes (compressed, or 4096 raw).
    Backing(usize),
    /// In a cold group with its neighbours.
    Grouped,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) struct ModelPage {
    pub(super) data: Box<[u8; PAGE_SIZE]>,
    pub(super) stored: Stored,
}

impl std::fmt::Debug for ModelPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({:02x?}..)", self.stored, &self.data[..8])
    }
}

/// The bytes a request covers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) offset: u64,
    pub(super) len_bytes: u64,
}

impl Span {
    pub(super) fn sectors(sector: u16, sectors: u8) -> Span {
        Span {
            offset: u64::from(sector % SECTOR_SPAN) * SECTOR_SIZE,
            len_bytes: u64::from(sectors % (MAX_SECTORS + 1)) * SECTOR_SIZE,
        }
    }

    /// Per-page pieces: (page, offset in page, length), computed independently of the engine.
    pub(super) fn pieces(self) -> Vec<(PageIndex, usize, usize)> {
        let page = PAGE_SIZE as u64;
        let end = self.offset + self.len_bytes;
        let mut out = Vec::new();
        let mut pos = self.offset;
        while pos < end {
            let in_page = pos % page;
            let n = (page - in_page).min(end - pos);
            out.push((PageIndex(pos / page), in_page as usize, n as usize));
            pos += n;
        }
        out
    }
}

/// What a request on a bad range must fail with.
pub(super) fn span_error(r: Span, disksize: u64) -> Option<IoError> {
    if r.offset % SECTOR_SIZE != 0 || r.len_bytes % SECTOR_SIZE != 0 {
        return Some(IoError::Misaligned {
            offset: r.offset,
            len_bytes: r.len_bytes,
        });
    }
    match r.offset.checked_add(r.len_bytes) {
        Some(end) if end <= disksize => None,
        _ => Some(IoError::OutOfRange {
            offset: r.offset,
            len_bytes: r.len_bytes,
            disksize,
        }),
    }
}

pub(super) fn assert_span_error(got: Result<(), IoError>, want: &IoError, what: &str) {
    let same = match (&got, want) {
        (
            Err(IoError::Misaligned { offset, len_bytes }),
            IoError::Misaligned {
                offset: o,
                len_bytes: l,
            },
        ) => (offset, len_bytes) == (o, l),
        (
            Err(IoError::OutOfRange {
                offset,
                len_bytes,
                disksize,
            }),
            IoError::OutOfRange {
                offset: o,
                len_bytes: l,
                disksize: d,
            },
        ) => (offset, len_bytes, disksize) == (o, l, d),
        _ => false,
    };
    assert!(same, "{what}: got {got:?}, want Err({want:?})");
}

/// Panics with the first differing byte rather than two 4 KiB dumps.
pub(super) fn assert_bytes(got: &[u8], want: &[u8], what: impl std::fmt::Display) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    // One slice comparison (a memcmp) first: a byte loop costs the fuzzer a traced comparison
    // per byte, which was most of its time.
    if got == want {
        return;
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: differs first at byte {i} of {}: got {:#04x}, want {:#04x}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// The device, the model, and the streams the model sizes pages with.
pub(super) struct Harness {
    /// In a memfd region, with a backing file and a key of its own, so that
    /// [`DeviceOp::Restart`] can hand it to a successor.
    pub(super) device: Device,
    /// What the device was made with (its region, backing file and key): a successor adopts
    /// it with the same.
    config: DeviceConfig,
    /// The backing file, removed when the harness goes.
    backing: std::path::PathBuf,
    /// Lends contexts made for another device, for [`DeviceOp::SwitchContext`].
    pub(super) foreign: Device,
    pub(super) ctxs: [IoContext; 2],
    pub(super) current: usize,
    /// The model's own stream of the device's codec: compressed sizes, independently.
    pub(super) sizer: Stream,
    /// The same for the secondary (recompression) codec.
    pub(super) sizer2: Stream,
    pub(super) scratch: Vec<u8>,
    pub(super) pages: HashMap<PageIndex, ModelPage>,
    /// Pages marked freed whose marks no write or reclaim has taken yet.
    pub(super) marked: BTreeSet<PageIndex>,
    pub(super) io: IoStat,
    pub(super) huge_pages_since: u64,
    pub(super) limit_pages: u64,
    /// Stats after the previous operation.
    pub(super) last: DeviceStats,
    /// Which operation runs, for messages.
    pub(super) step: usize,
    pub(super) tally: Tally,
}

/// The codecs' parameters the harness uses: zstd at level 1, which compresses a page several
/// times faster than the default 3 (each write, recompression and full check runs the codec
/// twice, once in the device and once in the model), with the same code paths.
fn fast(algorithm: Algorithm) -> CodecParams {
    match algorithm {
        Algorithm::Zstd => CodecParams::default().with_level(1),
        _ => CodecParams::default(),
    }
}

impl Harness {
    pub(super) fn new(algorithm: Algorithm) -> Harness {
        let other = if algorithm == Algorithm::Lz4 {
            Algorithm::Zstd
        } else {
            Algorithm::Lz4
        };
        // A backing file of its own, kept at its path (a successor reopens it) until the
        // harness goes.
        static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // In memory where there is a tmpfs: a written-back page read from a disk costs a direct
        // read, milliseconds, which would bound the fuzzer's executions per second.
        let dir = Some(std::path::Path::new("/dev/shm"))
            .filter(|d| d.is_dir())
            .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf);
        let backing = dir.join(format!(
            "uzram-device-ops-{}-{}",
            std::process::id(),
            FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        // Made here, empty, for the store to size: the store makes no files under /dev.
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&backing)
                .expect("the harness's backing file");
        }
        let config = DeviceConfig {
            algorithm,
            params: fast(algorithm),
            secondary: [Some((other, fast(other))), None, None],
            backing_devs: vec![backing.clone()],
            // The model is zram's: a write past mem_limit fails. Eviction (which writes pages
            // back instead) has its own model tests in device::policy.
            // Promotion on zstd's runs only: read requests come a second apart, so with it a
            // written-back page read twice would rarely stay on the store long enough for the
            // other operations to meet it.
            // Groups are the `Group` op's: a recompression recompresses page by page, as the
            // model's recompression check expects.
            policy: crate::PolicyConfig {
                evict: false,
                promote: algorithm == Algorithm::Zstd,
                groups: None,
                ..crate::PolicyConfig::default()
            },
            backing_key: Some(crate::BackingKey::generate()),
            region: Some(
                Device::region_size(DEVICE_PAGES * PAGE_SIZE as u64)
                    .and_then(|size| {
                        crate::Region::create("uzram-device-ops", size).map_err(|source| {
                            crate::Error::RegionFailed {
                                what: "creating the harness's region",
                                source,
                            }
                        })
                    })
                    .expect("the harness's region"),
            ),
            ..DeviceConfig::default()
        };
        let device = Device::new(config.clone(), DEVICE_PAGES * PAGE_SIZE as u64).expect("device");
        device
            .set_freed_pages(crate::FreedPages::in_memory(DEVICE_PAGES))
            .expect("marks for the device");
        let foreign = Device::new(
            DeviceConfig {
                algorithm: other,
                ..DeviceConfig::default()
            },
            PAGE_SIZE as u64,
        )
        .expect("foreign device");
        let ctxs = [
            device.context().expect("context"),
            foreign.context().expect("context"),
        ];
        let sizer = Codec::new(algorithm, fast(algorithm))
            .and_then(|c| c.stream())
            .expect("model stream");
        let sizer2 = Codec::new(other, fast(other))
            .and_then(|c| c.stream())
            .expect("model stream");
        let last = device.stats();
        Harness {
            device,
            config,
            backing,
            foreign,
            ctxs,
            current: 0,
            sizer,
            sizer2,
            scratch: vec![0; MAX_COMPRESSED_LEN],
            pages: HashMap::new(),
            marked: BTreeSet::new(),
            io: IoStat::default(),
            huge_pages_since: 0,
            limit_pages: 0,
            last,
            step: 0,
            tally: Tally::default(),
        }
    }

    /// [`DeviceOp::Restart`]: the device is handed over ([`Device::leave`]) and a successor
    /// adopts it from the region, reopening the backing file with the same key. Every page and
    /// slot must be as the model has them (checked in full); what lived only in the process
    /// starts again: the I/O counters, `mem_used_max` and `pages_compacted` (from what the pool
    /// holds), `huge_pages_since` (the huge pages held), the marks of freed pages (the pages keep
    /// their data), and the memory limit (set again, as a daemon's configuration would).
    pub(super) fn restart(&mut self) {
        let stand_in = Device::new(DeviceConfig::default(), PAGE_SIZE as u64).expect("device");
        let old = std::mem::replace(&mut self.device, stand_in);
        // The successor's view of the region is its own, from the descriptor alone, as a new
        // process's would be.
        let fd = self
            .config
            .region
            .take()
            .and_then(|r| r.fd().try_clone_to_owned().ok())
            .expect("the harness's region");
        old.leave();
        let region = crate::Region::adopt(fd)
            .unwrap_or_else(|e| panic!("step {}: the region: {e}", self.step));
        self.config.region = Some(region);
        let (device, found) = Device::adopt(self.config.clone(), DEVICE_PAGES * PAGE_SIZE as u64)
            .unwrap_or_else(|e| panic!("step {}: the successor refused: {e}", self.step));
        assert_eq!(
            (found.pages, found.undone, found.orphans),
            (self.pages.len() as u64, 0, 0),
            "step {}: (pages, undone, orphans) the successor found",
            self.step
        );
        device
            .set_freed_pages(crate::FreedPages::in_memory(DEVICE_PAGES))
            .expect("marks for the device");
        if self.limit_pages != 0 {
            device.set_mem_limit(Some(self.limit_pages * PAGE_SIZE as u64));
        }
        self.device = device;
        self.marked.clear();
        self.io = IoStat::default();
        self.huge_pages_since = self
            .pages
            .values()
            .filter(|p| p.stored == Stored::Huge)
            .count() as u64;
        self.last = self.device.stats();
        self.tally.restarts += 1;
        self.check_all();
    }

    /// Makes a harness whose run ended (every page discarded, the pool empty, every check
    /// passed) ready for the next run: the device is as a fresh one for the model, whose
    /// counters (io_stat, huge_pages_since, mem_used_max) simply go on from where they are.
    pub(super) fn reuse(&mut self) {
        debug_assert!(self.pages.is_empty() && self.marked.is_empty());
        // Records the last input left kept for reuse must not serve this one: each input
        // runs as if alone.
        for policy in ["reuse=0", "reuse=1"] {
            self.device.set_policy(policy).expect("a valid policy");
        }
        self.current = 0;
        self.limit_pages = 0;
        self.device.set_mem_limit(None);
        self.last = self.device.stats();
        self.step = 0;
        self.tally = super::Tally::default();
    }

    /// The model's bytes of `index`.
    pub(super) fn data(&self, index: PageIndex) -> Box<[u8; PAGE_SIZE]> {
        self.pages
            .get(&index)
            .map_or_else(|| Box::new([0; PAGE_SIZE]), |p| p.data.clone())
    }

    /// A model page for `data`, with how the engine must store it.
    pub(super) fn page(&mut self, data: Box<[u8; PAGE_SIZE]>) -> ModelPage {
        let stored = match same_word(&data[..]) {
            Some(word) => Stored::Same(word),
            // Stored whole without a compression, as the engine's write does.
            None if !self.sizer.worth_compressing(&data) => Stored::Huge,
            None => {
                let n = self
                    .sizer
                    .compress(&data, &mut self.scratch)
                    .expect("a page compresses into MAX_COMPRESSED_LEN");
                if n >= self.device.huge_threshold() {
                    Stored::Huge
                } else {
                    Stored::Compressed(n)
                }
            }
        };
        ModelPage { data, stored }
    }

    /// Whether storing `page` must fail with [`IoError::MemLimit`] given the pool as it is now: its
    /// size class has no free slot and a new zspage would pass the limit.
    pub(super) fn must_fail(&self, page: &ModelPage) -> bool {
        let len = match page.stored {
            Stored::Same(_) => return false,
            Stored::Compressed(n) => n,
            Stored::Huge => PAGE_SIZE,
            Stored::Backing(_) | Stored::Grouped => {
                unreachable!("a page being written is never on the backing file or in a group")
            }
        };
        let pool = self.device.pool();
        let class = pool
            .classes()
            .iter()
            .position(|c| c.size >= len)
            .expect("a class for every size");
        let cs = pool.class_stats()[class];
        let ps = pool.stats();
        cs.obj_used == cs.obj_allocated
            && ps.limit_pages != 0
            && ps.pages_used + cs.pages_per_zspage as u64 > ps.limit_pages
    }

    pub(super) fn set(&mut self, index: PageIndex, page: Option<ModelPage>) {
        match page {
            Some(p) => {
                match p.stored {
                    Stored::Huge => {
                        self.huge_pages_since += 1;
                        self.tally.huge_pages += 1;
                    }
                    Stored::Same(_) => self.tally.same_pages += 1,
                    Stored::Compressed(_) | Stored::Backing(_) | Stored::Grouped => {}
                }
                self.pages.insert(index, p);
            }
            None => {
                self.pages.remove(&index);
            }
        }
    }

    /// Whether the device's page `index` is `want` (None: empty), in contents and slot.
    pub(super) fn holds(&mut self, index: PageIndex, want: Option<&ModelPage>) -> bool {
        let state = self.device.slot_state(index).expect("page in range");
        let mut buf = vec![0u8; PAGE_SIZE];
        let offset = index.0 * PAGE_SIZE as u64;
        let ctx = &mut self.ctxs[self.current];
        self.device.read(ctx, offset, &mut buf).expect("read");
        // Only where the model has the page as `want` (the page a write failed on): a page
        // written before the failure is not in the model yet.
        if self.pages.get(&index) == want {
            self.follow_promotion(index);
        }
        match want {
            None => state.is_empty() && buf.iter().all(|&b| b == 0),
            Some(p) => !state.is_empty() && buf[..] == p.data[..],
        }
    }

    /// Reads page `index` and compares it and its slot with the model.
    pub(super) fn check_page(&mut self, index: PageIndex) {
        let offset = index.0 * PAGE_SIZE as u64;
        let mut buf = vec![0xa5u8; PAGE_SIZE];
        let ctx = &mut self.ctxs[self.current];
        self.device
            .read(ctx, offset, &mut buf)
            .unwrap_or_else(|e| panic!("step {}: read of page {index}: {e}", self.step));
        let want = self.pages.get(&index);
        let zeros = [0u8; PAGE_SIZE];
        let want_data = want.map_or(&zeros, |p| &p.data);
        assert_bytes(
            &buf,
            &want_data[..],
            format_args!("step {}: page {index}", self.step),
        );
        self.follow_promotion(index);
        let want = self.pages.get(&index);
        let state = self.device.slot_state(index).expect("page in range");
        check_slot(state, want.map(|p| p.stored))
            .unwrap_or_else(|e| panic!("step {}: page {index}: {e}", self.step));
    }

    /// Compares the pages of `r` that lie on the device with the model.
    pub(super) fn check_pages(&mut self, r: Span) {
        for (index, _, _) in r.pieces() {
            if index.0 < DEVICE_PAGES {
                self.check_page(index);
            }
        }
    }

    pub(super) fn slots(&self) -> Vec<SlotState> {
        (0..DEVICE_PAGES)
            .map(|i| self.device.slot_state(PageIndex(i)).expect("in range"))
            .collect()
    }

    pub(super) fn read(&mut self, r: Span) {
        let disksize = self.device.disksize();
        let mut buf = vec![0xa5u8; r.len_bytes as usize];
        let slots = self.slots();
        let ctx = &mut self.ctxs[self.current];
        let got = self.device.read(ctx, r.offset, &mut buf);
        if let Some(want) = span_error(r, disksize) {
            assert_span_error(got, &want, &format!("step {}: read {r:?}", self.step));
            assert!(
                buf.iter().all(|&b| b == 0),
                "a failed read left bytes in the buffer"
            );
            assert_eq!(slots, self.slots(), "a failed read changed slots");
            self.io.failed_reads += 1;
            return;
        }
        got.unwrap_or_else(|e| panic!("step {}: read {r:?}: {e}", self.step));
        let mut done = 0;
        for (index, in_page, n) in r.pieces() {
            let want = self.data(index);
            assert_bytes(
                &buf[done..done + n],
                &want[in_page..in_page + n],
                format_args!("step {}: read {r:?}, page {index}", self.step),
            );
            done += n;
        }
        for (index, _, _) in r.pieces() {
            self.follow_promotion(index);
        }
    }

    /// After a read of page `index`: a written-back page read a second time soon comes back
    /// into the pool (the policy's `promote`), stored as it was written; the model follows.
    fn follow_promotion(&mut self, index: PageIndex) {
        let Some(Stored::Backing(n)) = self.pages.get(&index).map(|p| p.stored) else {
            return;
        };
        let s = self.device.slot_state(index).expect("page in range");
        if !s.flags.contains(SlotFlags::STORED) {
            return;
        }
        let stored = if n == PAGE_SIZE {
            self.huge_pages_since += 1;
            Stored::Huge
        } else {
            Stored::Compressed(n)
        };
        if let Some(p) = self.pages.get_mut(&index) {
            p.stored = stored;
        }
        self.tally.promoted_pages += 1;
    }

    /// Checks a request on a bad range failed as it should and changed no slot.
    pub(super) fn refused(
        &mut self,
        r: Span,
        got: Result<(), IoError>,
        slots: &[SlotState],
        what: &str,
    ) {
        let want = span_error(r, self.device.disksize()).expect("a bad range");
        assert_span_error(got, &want, &format!("step {}: {what} {r:?}", self.step));
        assert_eq!(slots, self.slots(), "a refused {what} changed slots");
        self.tally.refused += 1;
    }

    /// Whether the first page of a planned request must fail, judged on the pool as it is now.
    pub(super) fn first_must_fail(&self, plan: &[(PageIndex, Option<ModelPage>)]) -> bool {
        plan.first()
            .and_then(|(_, p)| p.as_ref())
            .is_some_and(|p| self.must_fail(p))
    }

    /// The record size of page `index`, if its slot took over a record kept for reuse.
    fn adopted_size(&self, index: PageIndex) -> Option<usize> {
        let s = self.device.slot_state(index).expect("page in range");
        // Bit 6 is PROMOTED on a stored slot.
        s.flags
            .contains(SlotFlags::WB | SlotFlags::ADOPTED)
            .then_some(usize::from(s.size))
    }

    fn adopted(&self, index: PageIndex) -> bool {
        self.adopted_size(index).is_some()
    }

    /// Handles the end of a write-like request that was planned as `plan` (the state each page
    /// must reach, in request order): all of it on success; on [`IoError::MemLimit`], the pages
    /// before the one that failed. `first_must_fail` was judged before the request.
    pub(super) fn settle(
        &mut self,
        what: &str,
        r: Span,
        got: Result<(), IoError>,
        plan: Vec<(PageIndex, Option<ModelPage>)>,
        first_must_fail: bool,
    ) {
        let step = self.step;
        let limit = self.limit_pages * PAGE_SIZE as u64;
        let applied = match got {
            Ok(()) => {
                assert!(
                    !first_must_fail || self.adopted(plan[0].0),
                    "step {step}: {what} {r:?} succeeded past the limit"
                );
                plan.len()
            }
            Err(IoError::MemLimit {
                index: failed,
                limit_bytes,
            }) => {
                self.io.failed_writes += 1;
                assert!(
                    limit_bytes != 0 && limit_bytes == limit,
                    "step {step}: {what} {r:?}: MemLimit of {limit_bytes} with limit {limit}"
                );
                // The engine names the page that did not fit: the pages before it were written,
                // it and the pages after it keep their old state (checked after). (Content alone
                // cannot tell: a page rewritten with the bytes it held looks written either way.)
                let applied = plan
                    .iter()
                    .position(|(index, _)| *index == failed)
                    .unwrap_or_else(|| panic!("step {step}: {what} {r:?}: MemLimit names page {failed}, not in the request"));
                for (index, want) in &plan[..applied] {
                    assert!(
                        self.holds(*index, want.as_ref()),
                        "step {step}: {what} {r:?}: page {index} before the failed {failed} was not written"
                    );
                }
                // A failed write leaves the slot as it was, so whether it holds a record it
                // took over says nothing of this write: only a first page that was stored
                // tells (past the limit, it must have taken one over).
                if applied == 0 {
                    let (index, _) = plan[0];
                    assert!(
                        first_must_fail,
                        "step {step}: {what} {r:?}: MemLimit on page {index} with room for it"
                    );
                    let old = self.pages.get(&index).cloned();
                    assert!(
                        self.holds(index, old.as_ref()),
                        "step {step}: {what} {r:?}: page {index} changed although it failed"
                    );
                } else {
                    assert!(
                        !first_must_fail || self.adopted(plan[0].0),
                        "step {step}: {what} {r:?}: page {} stored past the limit",
                        plan[0].0
                    );
                }
                // Some page up to the stop must have needed pool memory.
                let needs_memory = plan.iter().take(applied + 1).any(|(_, p)| {
                    p.as_ref()
                        .is_some_and(|p| !matches!(p.stored, Stored::Same(_)))
                });
                assert!(
                    needs_memory,
                    "step {step}: {what} {r:?}: MemLimit though no page needs memory"
                );
                if applied == 0 {
                    self.tally.mem_limit_first += 1;
                } else {
                    self.tally.mem_limit_later += 1;
                }
                applied
            }
            Err(e) => panic!("step {step}: {what} {r:?}: {e}"),
        };
        let pieces = r.pieces();
        for (i, (index, page)) in plan.into_iter().take(applied).enumerate() {
            if page.is_none() {
                // zram counts every whole page zeroed, held data or not.
                self.io.notify_free += 1;
                if self.pages.contains_key(&index) {
                    self.tally.freed_pages += 1;
                }
            }
            if pieces[i].2 < PAGE_SIZE {
                self.tally.partial_pages += 1;
            }
            // A write that stores a page takes its freed mark (each mark counts once).
            if page.is_some() && self.marked.remove(&index) {
                self.io.notify_free += 1;
            }
            // A whole page written with the content of a record kept for reuse takes the
            // record over instead of the pool (the engine's `writeback::reuse`).
            let page = page.map(|mut p| {
                if let Some(n) = self.adopted_size(index) {
                    p.stored = Stored::Backing(n);
                    self.tally.reused_pages += 1;
                }
                p
            });
            self.set(index, page);
        }
        self.check_pages(r);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.backing);
    }
}
