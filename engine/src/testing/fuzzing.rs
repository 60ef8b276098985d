//! The `device_ops` fuzz harness: device operations checked against a model of the pages. Shared
//! by the cargo-fuzz target, the corpus replay test and the proptest.
//!
//! The model is a map from page to what the page holds (a missing page was never written or was
//! freed, and reads as zeros), plus zram's counters as they must come out. After every operation
//! the harness compares its result, the pages it touched and [`Device::stats`] with the model;
//! every [`CHECK_EVERY`] operations, and at the end, it reads back every page, compares each
//! slot's flags and stored size, and calls [`Device::check_invariants`].
//!
//! What the model assumes of the engine: a page is same-filled (one 8-byte word repeated, zeros
//! included), compressed (sized by the model's own stream of the same codec), or stored raw when
//! its compressed size reaches [`Device::huge_threshold`]; a page that needs pool memory fails
//! with [`IoError::MemLimit`] exactly when its size class has no free slot and a new zspage would
//! pass the limit; a request is applied page by page and stops at the first page that fails;
//! discard and write-zeroes free whole pages only, and write-zeroes stores its partial pages
//! anew (an empty one becomes a same-filled zero page).
//!
//! [`seeds`] are the files of `fuzz/corpus/device_ops/`, written with [`encode`].

use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use uzram_codecs::{Algorithm, Codec, CodecParams, Stream, MAX_COMPRESSED_LEN};

use super::pages::{fill_noise, fill_text};
pub use super::pages::{mix, same_word};

use crate::{
    Device, DeviceConfig, DeviceStats, IoContext, IoError, IoStat, PageIndex, SlotFlags, SlotState,
    PAGE_SIZE, SECTOR_SIZE,
};

/// Pages of the device under test.
pub const DEVICE_PAGES: u64 = 64;
/// Sectors of the device under test.
pub const DEVICE_SECTORS: u64 = DEVICE_PAGES * PAGE_SIZE as u64 / SECTOR_SIZE;
/// Starting sectors are taken modulo this: one in nine lands past the end of the device.
pub const SECTOR_SPAN: u16 = DEVICE_SECTORS as u16 * 9 / 8;
/// Lengths in sectors are taken modulo `MAX_SECTORS + 1`: up to eight pages per request.
pub const MAX_SECTORS: u8 = 64;
/// [`device_ops`] runs at most this many operations.
pub const MAX_OPS: usize = 500;
/// Operations between full checks.
pub const CHECK_EVERY: usize = 32;

/// What a write puts in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum PageKind {
    /// All zeros: a same-filled page with word 0.
    Zeros,
    /// One non-zero 8-byte word repeated: a same-filled page.
    Same,
    /// Words from a small vocabulary: compresses two to five times.
    Text,
    /// Heap-like 8-byte words: zeros, pointers into one region, small integers.
    Pointers,
    /// Random bytes: does not compress, stored raw as a huge page.
    Noise,
    /// Each sector text, noise or zeros: compressed sizes across the whole class table.
    Mixed,
    /// Zeros with a byte here and there: compresses to a few dozen bytes.
    Sparse,
}

/// The kind of a [`DeviceOp::Wild`] request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum WildOp {
    /// [`Device::read`].
    Read,
    /// [`Device::write`] (of noise).
    Write,
    /// [`Device::discard`].
    Discard,
    /// [`Device::write_zeroes`].
    WriteZeroes,
}

/// One operation on the device. Ranges are `sector % SECTOR_SPAN` for `sectors % (MAX_SECTORS +
/// 1)` sectors, so most fall inside the 64-page device and some start or end past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum DeviceOp {
    /// Writes content of `kind` made from `seed`.
    Write {
        /// First sector.
        sector: u16,
        /// Length in sectors.
        sectors: u8,
        /// What to write.
        kind: PageKind,
        /// Varies the content.
        seed: u8,
    },
    /// Reads and compares with the model.
    Read {
        /// First sector.
        sector: u16,
        /// Length in sectors.
        sectors: u8,
    },
    /// Discards: whole pages are freed, partial pages keep their data.
    Discard {
        /// First sector.
        sector: u16,
        /// Length in sectors.
        sectors: u8,
    },
    /// Zeroes the range: whole pages are freed, partial pages rewritten with zeros.
    WriteZeroes {
        /// First sector.
        sector: u16,
        /// Length in sectors.
        sectors: u8,
    },
    /// A request at a raw byte offset and length: nearly always misaligned or past the end, and
    /// then it must fail and change nothing.
    Wild {
        /// Which request.
        op: WildOp,
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len_bytes: u16,
    },
    /// [`Device::compact`], then a full check.
    Compact,
    /// [`Device::set_mem_limit`] to `pages` pool pages; `None` or 0 for no limit.
    SetMemLimit {
        /// The limit in 4 KiB pages.
        pages: Option<u8>,
    },
    /// [`Device::reset_mem_used_max`].
    ResetMemUsedMax,
    /// Goes on with the other I/O context; with `foreign`, first replaces it with a context made
    /// for another device, which the engine must notice and replace.
    SwitchContext {
        /// Whether the context comes from another device.
        foreign: bool,
    },
    /// [`Device::mark_idle`]: every stored page (`all`), or by an age no page has (none, and
    /// the marks cleared).
    MarkIdle {
        /// `idle all` rather than an age.
        all: bool,
    },
    /// [`Device::recompress`] with the secondary algorithm (the other codec): every page, or
    /// only huge ones. The model predicts each page's new size with its own stream of that codec.
    Recompress {
        /// `type=huge`.
        huge_only: bool,
    },
    /// [`Device::writeback`] of a range of pages to the harness's backing file; with `fail`,
    /// every write fails and every page must stay in RAM.
    Writeback {
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
        /// Make the backing file's writes fail.
        fail: bool,
    },
}

impl PageKind {
    /// Every kind, in declaration order.
    pub const ALL: [PageKind; 7] = [
        PageKind::Zeros,
        PageKind::Same,
        PageKind::Text,
        PageKind::Pointers,
        PageKind::Noise,
        PageKind::Mixed,
        PageKind::Sparse,
    ];

    /// `len_bytes` of this kind for `seed`. A buffer that starts on a page boundary gives whole
    /// pages of the kind (a `Same` page is same-filled, a `Noise` page is huge).
    pub fn content(self, seed: u8, len_bytes: usize) -> Vec<u8> {
        let seed = u64::from(seed);
        let mut out = vec![0u8; len_bytes];
        match self {
            PageKind::Zeros => {}
            PageKind::Same => {
                let word = (mix(seed) | 1).to_ne_bytes();
                for (i, b) in out.iter_mut().enumerate() {
                    *b = word[i % 8];
                }
            }
            PageKind::Text => fill_text(&mut out, seed),
            PageKind::Pointers => {
                let base = 0x7f00_0000_0000 | (mix(seed) & 0xff_ffff_f000);
                for (i, w) in out.chunks_mut(8).enumerate() {
                    let r = mix(seed << 32 | i as u64);
                    let word = match r % 10 {
                        0..=4 => 0,
                        5..=7 => base + (r >> 8) % 0x4000 * 16,
                        _ => (r >> 8) % 256,
                    };
                    w.copy_from_slice(&word.to_le_bytes()[..w.len()]);
                }
            }
            PageKind::Noise => fill_noise(&mut out, seed),
            PageKind::Mixed => {
                for (i, s) in out.chunks_mut(SECTOR_SIZE as usize).enumerate() {
                    let r = mix(seed << 32 | i as u64);
                    match r % 4 {
                        0 => fill_noise(s, r),
                        1 => {}
                        _ => fill_text(s, r),
                    }
                }
            }
            PageKind::Sparse => {
                let step = 64 + seed as usize;
                for i in (seed as usize % step..len_bytes).step_by(step) {
                    out[i] = mix(seed ^ i as u64) as u8 | 1;
                }
            }
        }
        out
    }
}

/// What a run went through, so tests can tell that a corpus reaches the paths it is meant to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests refused for a misaligned or out-of-range span.
    pub refused: u64,
    /// Requests that failed with [`IoError::MemLimit`] on their first page.
    pub mem_limit_first: u64,
    /// Requests that failed with [`IoError::MemLimit`] after writing some pages.
    pub mem_limit_later: u64,
    /// Pages written in part (read-modify-write).
    pub partial_pages: u64,
    /// Pages stored same-filled.
    pub same_pages: u64,
    /// Pages stored raw.
    pub huge_pages: u64,
    /// Pages freed by discard or write-zeroes.
    pub freed_pages: u64,
    /// Pool pages freed by [`Device::compact`].
    pub compacted_pages: u64,
    /// Pages recompressed with the secondary codec.
    pub recompressed_pages: u64,
    /// Pages written back to the backing file.
    pub written_back_pages: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.refused += o.refused;
        self.mem_limit_first += o.mem_limit_first;
        self.mem_limit_later += o.mem_limit_later;
        self.partial_pages += o.partial_pages;
        self.same_pages += o.same_pages;
        self.huge_pages += o.huge_pages;
        self.freed_pages += o.freed_pages;
        self.compacted_pages += o.compacted_pages;
        self.recompressed_pages += o.recompressed_pages;
        self.written_back_pages += o.written_back_pages;
    }
}

/// How the engine must store a page's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// In the slot: the fill word.
    Same(u64),
    /// In the pool: compressed to this many bytes.
    Compressed(usize),
    /// In the pool: raw.
    Huge,
    /// On the backing file: this many stored bytes (compressed, or 4096 raw).
    Backing(usize),
}

#[derive(Clone, PartialEq, Eq)]
struct ModelPage {
    data: Box<[u8; PAGE_SIZE]>,
    stored: Stored,
}

impl std::fmt::Debug for ModelPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({:02x?}..)", self.stored, &self.data[..8])
    }
}

/// The bytes a request covers.
#[derive(Debug, Clone, Copy)]
struct Span {
    offset: u64,
    len_bytes: u64,
}

impl Span {
    fn sectors(sector: u16, sectors: u8) -> Span {
        Span {
            offset: u64::from(sector % SECTOR_SPAN) * SECTOR_SIZE,
            len_bytes: u64::from(sectors % (MAX_SECTORS + 1)) * SECTOR_SIZE,
        }
    }

    /// Per-page pieces: (page, offset in page, length), computed independently of the engine.
    fn pieces(self) -> Vec<(PageIndex, usize, usize)> {
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
fn span_error(r: Span, disksize: u64) -> Option<IoError> {
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

fn assert_span_error(got: Result<(), IoError>, want: &IoError, what: &str) {
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
fn assert_bytes(got: &[u8], want: &[u8], what: impl std::fmt::Display) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
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
struct Harness {
    device: Device,
    /// Lends contexts made for another device, for [`DeviceOp::SwitchContext`].
    foreign: Device,
    ctxs: [IoContext; 2],
    current: usize,
    /// The model's own stream of the device's codec: compressed sizes, independently.
    sizer: Stream,
    /// The same for the secondary (recompression) codec.
    sizer2: Stream,
    scratch: Vec<u8>,
    pages: HashMap<PageIndex, ModelPage>,
    io: IoStat,
    huge_pages_since: u64,
    limit_pages: u64,
    /// Stats after the previous operation.
    last: DeviceStats,
    /// Which operation runs, for messages.
    step: usize,
    tally: Tally,
}

impl Harness {
    fn new(algorithm: Algorithm) -> Harness {
        let other = if algorithm == Algorithm::Lz4 {
            Algorithm::Zstd
        } else {
            Algorithm::Lz4
        };
        // A backing file of its own, unlinked as soon as the device has it open.
        static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let backing = std::env::temp_dir().join(format!(
            "uzram-device-ops-{}-{}",
            std::process::id(),
            FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let config = DeviceConfig {
            algorithm,
            secondary: [Some((other, CodecParams::default())), None, None],
            backing_devs: vec![backing.clone()],
            // The model is zram's: a write past mem_limit fails. Eviction (which writes pages
            // back instead) has its own model tests in device::policy.
            policy: crate::PolicyConfig {
                evict: false,
                ..crate::PolicyConfig::default()
            },
            ..DeviceConfig::default()
        };
        let device = Device::new(config, DEVICE_PAGES * PAGE_SIZE as u64).expect("device");
        let _ = std::fs::remove_file(&backing);
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
        let sizer = Codec::new(algorithm, CodecParams::default())
            .and_then(|c| c.stream())
            .expect("model stream");
        let sizer2 = Codec::new(other, CodecParams::default())
            .and_then(|c| c.stream())
            .expect("model stream");
        let last = device.stats();
        Harness {
            device,
            foreign,
            ctxs,
            current: 0,
            sizer,
            sizer2,
            scratch: vec![0; MAX_COMPRESSED_LEN],
            pages: HashMap::new(),
            io: IoStat::default(),
            huge_pages_since: 0,
            limit_pages: 0,
            last,
            step: 0,
            tally: Tally::default(),
        }
    }

    /// The model's bytes of `index`.
    fn data(&self, index: PageIndex) -> Box<[u8; PAGE_SIZE]> {
        self.pages
            .get(&index)
            .map_or_else(|| Box::new([0; PAGE_SIZE]), |p| p.data.clone())
    }

    /// A model page for `data`, with how the engine must store it.
    fn page(&mut self, data: Box<[u8; PAGE_SIZE]>) -> ModelPage {
        let stored = match same_word(&data[..]) {
            Some(word) => Stored::Same(word),
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
    fn must_fail(&self, page: &ModelPage) -> bool {
        let len = match page.stored {
            Stored::Same(_) => return false,
            Stored::Compressed(n) => n,
            Stored::Huge => PAGE_SIZE,
            Stored::Backing(_) => unreachable!("a page being written is never on the backing file"),
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

    fn set(&mut self, index: PageIndex, page: Option<ModelPage>) {
        match page {
            Some(p) => {
                match p.stored {
                    Stored::Huge => {
                        self.huge_pages_since += 1;
                        self.tally.huge_pages += 1;
                    }
                    Stored::Same(_) => self.tally.same_pages += 1,
                    Stored::Compressed(_) | Stored::Backing(_) => {}
                }
                self.pages.insert(index, p);
            }
            None => {
                self.pages.remove(&index);
            }
        }
    }

    /// Whether the device's page `index` is `want` (None: empty), in contents and slot.
    fn holds(&mut self, index: PageIndex, want: Option<&ModelPage>) -> bool {
        let state = self.device.slot_state(index).expect("page in range");
        let mut buf = vec![0u8; PAGE_SIZE];
        let offset = index.0 * PAGE_SIZE as u64;
        let ctx = &mut self.ctxs[self.current];
        self.device.read(ctx, offset, &mut buf).expect("read");
        match want {
            None => state.is_empty() && buf.iter().all(|&b| b == 0),
            Some(p) => !state.is_empty() && buf[..] == p.data[..],
        }
    }

    /// Reads page `index` and compares it and its slot with the model.
    fn check_page(&mut self, index: PageIndex) {
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
        let state = self.device.slot_state(index).expect("page in range");
        check_slot(state, want.map(|p| p.stored))
            .unwrap_or_else(|e| panic!("step {}: page {index}: {e}", self.step));
    }

    /// Compares the pages of `r` that lie on the device with the model.
    fn check_pages(&mut self, r: Span) {
        for (index, _, _) in r.pieces() {
            if index.0 < DEVICE_PAGES {
                self.check_page(index);
            }
        }
    }

    fn slots(&self) -> Vec<SlotState> {
        (0..DEVICE_PAGES)
            .map(|i| self.device.slot_state(PageIndex(i)).expect("in range"))
            .collect()
    }

    fn read(&mut self, r: Span) {
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
    }

    /// Checks a request on a bad range failed as it should and changed no slot.
    fn refused(&mut self, r: Span, got: Result<(), IoError>, slots: &[SlotState], what: &str) {
        let want = span_error(r, self.device.disksize()).expect("a bad range");
        assert_span_error(got, &want, &format!("step {}: {what} {r:?}", self.step));
        assert_eq!(slots, self.slots(), "a refused {what} changed slots");
        self.tally.refused += 1;
    }

    /// Whether the first page of a planned request must fail, judged on the pool as it is now.
    fn first_must_fail(&self, plan: &[(PageIndex, Option<ModelPage>)]) -> bool {
        plan.first()
            .and_then(|(_, p)| p.as_ref())
            .is_some_and(|p| self.must_fail(p))
    }

    /// Handles the end of a write-like request that was planned as `plan` (the state each page
    /// must reach, in request order): all of it on success; on [`IoError::MemLimit`], the pages
    /// before the one that failed. `first_must_fail` was judged before the request.
    fn settle(
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
                    !first_must_fail,
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
                if first_must_fail {
                    let (index, _) = plan[0];
                    let old = self.pages.get(&index).cloned();
                    assert!(
                        self.holds(index, old.as_ref()),
                        "step {step}: {what} {r:?}: page {index} changed although it failed"
                    );
                } else {
                    assert!(
                        applied > 0,
                        "step {step}: {what} {r:?}: MemLimit on page {} with room for it",
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
            self.set(index, page);
        }
        self.check_pages(r);
    }

    fn write(&mut self, r: Span, buf: &[u8]) {
        if span_error(r, self.device.disksize()).is_some() {
            let slots = self.slots();
            let ctx = &mut self.ctxs[self.current];
            let got = self.device.write(ctx, r.offset, buf);
            self.io.failed_writes += 1;
            return self.refused(r, got, &slots, "write");
        }
        let mut plan = Vec::new();
        let mut done = 0;
        for (index, in_page, n) in r.pieces() {
            let mut data = self.data(index);
            data[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
            plan.push((index, Some(self.page(data))));
        }
        let first_must_fail = self.first_must_fail(&plan);
        let ctx = &mut self.ctxs[self.current];
        let got = self.device.write(ctx, r.offset, buf);
        self.settle("write", r, got, plan, first_must_fail);
    }

    fn discard(&mut self, r: Span) {
        let slots = self.slots();
        let got = self.device.discard(r.offset, r.len_bytes);
        if span_error(r, self.device.disksize()).is_some() {
            return self.refused(r, got, &slots, "discard");
        }
        got.unwrap_or_else(|e| panic!("step {}: discard {r:?}: {e}", self.step));
        for (index, _, n) in r.pieces() {
            if n == PAGE_SIZE {
                // zram counts every whole page discarded, held data or not.
                self.io.notify_free += 1;
                if self.pages.remove(&index).is_some() {
                    self.tally.freed_pages += 1;
                }
            }
        }
        self.check_pages(r);
    }

    fn write_zeroes(&mut self, r: Span) {
        if span_error(r, self.device.disksize()).is_some() {
            let slots = self.slots();
            let ctx = &mut self.ctxs[self.current];
            let got = self.device.write_zeroes(ctx, r.offset, r.len_bytes);
            return self.refused(r, got, &slots, "write_zeroes");
        }
        let mut plan = Vec::new();
        for (index, in_page, n) in r.pieces() {
            let page = if n == PAGE_SIZE {
                None
            } else {
                let mut data = self.data(index);
                data[in_page..in_page + n].fill(0);
                Some(self.page(data))
            };
            plan.push((index, page));
        }
        let first_must_fail = self.first_must_fail(&plan);
        let ctx = &mut self.ctxs[self.current];
        let got = self.device.write_zeroes(ctx, r.offset, r.len_bytes);
        self.settle("write_zeroes", r, got, plan, first_must_fail);
    }

    fn compact(&mut self) {
        let before = self.device.stats();
        let freed = self.device.compact();
        let after = self.device.stats();
        assert_eq!(
            after.mm.pages_compacted,
            before.mm.pages_compacted + freed,
            "pages_compacted counts what compact() freed"
        );
        assert_eq!(
            after.mm.mem_used_total,
            before.mm.mem_used_total - freed * PAGE_SIZE as u64,
            "compaction frees the pages it reports"
        );
        self.tally.compacted_pages += freed;
        self.check_all();
    }

    /// Applies one operation and checks it.
    fn apply(&mut self, op: DeviceOp) {
        match op {
            DeviceOp::Write {
                sector,
                sectors,
                kind,
                seed,
            } => {
                let r = Span::sectors(sector, sectors);
                self.write(r, &kind.content(seed, r.len_bytes as usize));
            }
            DeviceOp::Read { sector, sectors } => self.read(Span::sectors(sector, sectors)),
            DeviceOp::Discard { sector, sectors } => {
                self.discard(Span::sectors(sector, sectors));
            }
            DeviceOp::WriteZeroes { sector, sectors } => {
                self.write_zeroes(Span::sectors(sector, sectors));
            }
            DeviceOp::Wild {
                op,
                offset,
                len_bytes,
            } => {
                let r = Span {
                    offset,
                    len_bytes: u64::from(len_bytes),
                };
                match op {
                    WildOp::Read => self.read(r),
                    WildOp::Write => {
                        self.write(r, &PageKind::Noise.content(0, usize::from(len_bytes)));
                    }
                    WildOp::Discard => self.discard(r),
                    WildOp::WriteZeroes => self.write_zeroes(r),
                }
            }
            DeviceOp::Compact => self.compact(),
            DeviceOp::SetMemLimit { pages } => {
                let pages = pages.map_or(0, u64::from);
                self.device
                    .set_mem_limit((pages > 0).then_some(pages * PAGE_SIZE as u64));
                self.limit_pages = pages;
            }
            DeviceOp::ResetMemUsedMax => {
                self.device.reset_mem_used_max();
                let mm = self.device.stats().mm;
                assert_eq!(mm.mem_used_max, mm.mem_used_total, "reset mem_used_max");
                self.last.mm.mem_used_max = mm.mem_used_max;
            }
            DeviceOp::SwitchContext { foreign } => {
                self.current ^= 1;
                if foreign {
                    self.ctxs[self.current] = self.foreign.context().expect("context");
                }
            }
            DeviceOp::MarkIdle { all } => {
                let marked = self
                    .device
                    .mark_idle(if all { None } else { Some(u32::MAX) });
                let stored = self
                    .pages
                    .values()
                    .filter(|p| matches!(p.stored, Stored::Compressed(_) | Stored::Huge))
                    .count() as u64;
                assert_eq!(
                    marked,
                    if all { stored } else { 0 },
                    "step {}: mark_idle(all={all})",
                    self.step
                );
            }
            DeviceOp::Recompress { huge_only } => self.recompress(huge_only),
            DeviceOp::Writeback { page, pages, fail } => self.writeback(page, pages, fail),
        }
    }

    /// Writes back pages `first..first + n` (clamped to the device) and checks the model: every
    /// stored page of the range is on the backing file afterwards, with its stored size, unless
    /// the writes fail, when every page stays as it was.
    fn writeback(&mut self, first: u8, n: u8, fail: bool) {
        let step = self.step;
        let first = u64::from(first) % DEVICE_PAGES;
        let last = (first + u64::from(n.max(1)) - 1).min(DEVICE_PAGES - 1);
        let backing = self
            .device
            .backing()
            .expect("the harness device has a backing file");
        backing.set_fail_writes(fail);
        let stats = self
            .device
            .writeback(
                &mut self.ctxs[self.current],
                crate::device::writeback::WritebackRequest::Pages { first, last },
            )
            .expect("writeback");
        backing.set_fail_writes(false);
        let mut expected = 0;
        for i in first..=last {
            let index = PageIndex(i);
            let Some(page) = self.pages.get_mut(&index) else {
                continue;
            };
            let len = match page.stored {
                Stored::Compressed(n) => n,
                Stored::Huge => PAGE_SIZE,
                _ => continue,
            };
            expected += 1;
            if !fail {
                page.stored = Stored::Backing(len);
            }
        }
        if fail {
            assert_eq!(
                (stats.written, stats.failed),
                (0, expected),
                "step {step}: {stats:?}"
            );
        } else {
            assert_eq!(
                (stats.written, stats.failed),
                (expected, 0),
                "step {step}: {stats:?}"
            );
            self.tally.written_back_pages += expected;
        }
        self.check_all();
    }

    /// Recompresses, then checks every page against the model: a page the pass could take
    /// (stored, never tried, huge when only huge ones are asked for) is recompressed exactly
    /// when the secondary codec's size lands in a smaller size class (or, with a memory limit,
    /// stays as it was), and then holds exactly that many bytes.
    fn recompress(&mut self, huge_only: bool) {
        let step = self.step;
        let before: HashMap<PageIndex, SlotState> = self
            .pages
            .keys()
            .map(|&i| (i, self.device.slot_state(i).expect("in range")))
            .collect();
        let req = crate::RecompressRequest {
            kind: huge_only.then_some(crate::RecompressType::Huge),
            ..Default::default()
        };
        let stats = self
            .device
            .recompress(&mut self.ctxs[self.current], &req)
            .expect("recompress");
        let pool = self.device.pool();
        let class = |n: usize| pool.class_size(n).expect("a class");
        let threshold = self.device.huge_threshold();
        let mut recompressed = 0;
        let indexes: Vec<PageIndex> = self.pages.keys().copied().collect();
        for index in indexes {
            let page = self.pages.get(&index).expect("listed");
            let old = before[&index];
            let now = self.device.slot_state(index).expect("in range");
            let len = match page.stored {
                Stored::Same(_) => {
                    assert_eq!(
                        now, old,
                        "step {step}: page {index}: same-filled page changed"
                    );
                    continue;
                }
                Stored::Backing(_) => {
                    assert_eq!(
                        now, old,
                        "step {step}: page {index}: written-back page changed"
                    );
                    continue;
                }
                Stored::Compressed(n) => n,
                Stored::Huge => PAGE_SIZE,
            };
            let candidate = old.prio == 0
                && !old.flags.contains(SlotFlags::INCOMPRESSIBLE)
                && (!huge_only || page.stored == Stored::Huge);
            let n2 = self
                .sizer2
                .compress(&page.data, &mut self.scratch)
                .expect("a page compresses into MAX_COMPRESSED_LEN");
            let shrinks = n2 < threshold && class(n2) < class(len);
            if now.prio == 1 && old.prio == 0 {
                assert!(
                    candidate && shrinks,
                    "step {step}: page {index} recompressed: {old:?} -> {now:?}"
                );
                assert_eq!(
                    usize::from(now.size),
                    n2,
                    "step {step}: page {index}: recompressed size"
                );
                recompressed += 1;
                self.pages.get_mut(&index).expect("listed").stored = Stored::Compressed(n2);
            } else {
                assert_eq!(now.prio, old.prio, "step {step}: page {index}");
                assert!(
                    !(candidate && shrinks) || self.limit_pages > 0,
                    "step {step}: page {index} ({len} -> {n2} bytes) was not recompressed: {now:?}"
                );
                if candidate && !shrinks {
                    assert!(
                        now.flags.contains(SlotFlags::INCOMPRESSIBLE),
                        "step {step}: page {index} no codec shrinks is not marked: {now:?}"
                    );
                }
            }
        }
        assert_eq!(stats.recompressed, recompressed, "step {step}: {stats:?}");
        self.tally.recompressed_pages += recompressed;
        self.check_all();
    }

    /// Compares every figure of [`Device::stats`] with the model.
    fn check_stats(&mut self) {
        let s = self.device.stats();
        let step = self.step;
        let mut same = 0;
        let mut huge = 0;
        let mut stored = 0;
        let mut compr = 0;
        let mut written_back = 0u64;
        for p in self.pages.values() {
            match p.stored {
                Stored::Same(_) => same += 1,
                Stored::Compressed(n) => {
                    stored += 1;
                    compr += n as u64;
                }
                Stored::Huge => {
                    stored += 1;
                    huge += 1;
                    compr += PAGE_SIZE as u64;
                }
                // Off RAM: counted in bd_stat, not in mm_stat (zram's rule).
                Stored::Backing(_) => written_back += 1,
            }
        }
        let mm = &s.mm;
        let want = (
            (self.pages.len() as u64 - written_back) * PAGE_SIZE as u64,
            compr,
            same,
            huge,
            self.huge_pages_since,
            stored,
            self.limit_pages * PAGE_SIZE as u64,
        );
        let got = (
            mm.orig_data_size,
            mm.compr_data_size,
            mm.same_pages,
            mm.huge_pages,
            mm.huge_pages_since,
            s.stored_pages,
            mm.mem_limit,
        );
        assert_eq!(
            got, want,
            "step {step}: (orig_data_size, compr_data_size, same_pages, huge_pages, \
             huge_pages_since, stored_pages, mem_limit)"
        );
        assert_eq!(s.io, self.io, "step {step}: io_stat");
        let last = &self.last.mm;
        assert!(
            mm.mem_used_max >= mm.mem_used_total && mm.mem_used_max >= last.mem_used_max,
            "step {step}: mem_used_max {} (was {}) below mem_used_total {}",
            mm.mem_used_max,
            last.mem_used_max,
            mm.mem_used_total
        );
        assert!(
            mm.pages_compacted >= last.pages_compacted,
            "step {step}: pages_compacted went down"
        );
        if mm.mem_limit != 0 && mm.mem_used_total > last.mem_used_total {
            assert!(
                mm.mem_used_total <= mm.mem_limit,
                "step {step}: pool grew to {} past the limit {}",
                mm.mem_used_total,
                mm.mem_limit
            );
        }
        assert!(
            mm.compr_data_size <= mm.mem_used_total,
            "step {step}: {} compressed bytes in {} bytes of pool",
            mm.compr_data_size,
            mm.mem_used_total
        );
        if stored == 0 {
            assert_eq!(
                mm.mem_used_total, 0,
                "step {step}: an empty pool holds pages"
            );
        }
        assert!(s.pool_mapped_bytes >= mm.mem_used_total);
        assert!(
            s.table_bytes >= DEVICE_PAGES * 16,
            "the slot table is counted"
        );
        self.last = s;
    }

    /// Reads back every page, one by one and in one request; checks slots and invariants.
    fn check_all(&mut self) {
        if let Err(e) = self.device.check_invariants() {
            panic!("step {}: invariants: {e}", self.step);
        }
        for i in 0..DEVICE_PAGES {
            self.check_page(PageIndex(i));
        }
        self.read(Span {
            offset: 0,
            len_bytes: self.device.disksize(),
        });
    }
}

/// Checks a slot against how the model says its page is stored (None: empty).
fn check_slot(s: SlotState, want: Option<Stored>) -> Result<(), String> {
    let ok = match want {
        None => s.is_empty(),
        Some(Stored::Same(word)) => s.flags.contains(SlotFlags::SAME) && s.word == word,
        Some(Stored::Compressed(n)) => {
            s.flags.contains(SlotFlags::STORED)
                && !s.flags.intersects(SlotFlags::SAME | SlotFlags::HUGE)
                && usize::from(s.size) == n
        }
        Some(Stored::Huge) => {
            s.flags.contains(SlotFlags::STORED | SlotFlags::HUGE)
                && usize::from(s.size) == PAGE_SIZE
        }
        Some(Stored::Backing(n)) => {
            s.flags.contains(SlotFlags::WB)
                && !s.flags.intersects(SlotFlags::STORED | SlotFlags::SAME)
                && usize::from(s.size) == n
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("slot {s:?}, model {want:?}"))
    }
}

/// Runs `ops` on a fresh 64-page device of `algorithm` and checks every result, every page and
/// every counter against the model. Panics on a mismatch; returns what the run went through.
pub fn run_ops(ops: &[DeviceOp], algorithm: Algorithm) -> Tally {
    let mut h = Harness::new(algorithm);
    for (step, op) in ops.iter().enumerate() {
        h.step = step;
        h.apply(*op);
        h.check_stats();
        if step % CHECK_EVERY == CHECK_EVERY - 1 {
            h.check_all();
        }
    }
    h.step = ops.len();
    h.check_all();
    let tally = h.tally;
    // Freeing everything leaves nothing behind.
    h.device.set_mem_limit(None);
    h.limit_pages = 0;
    h.discard(Span {
        offset: 0,
        len_bytes: h.device.disksize(),
    });
    h.check_stats();
    assert_eq!(
        h.device.stats().mm.mem_used_total,
        0,
        "pool pages after discarding everything"
    );
    h.check_all();
    tally
}

/// The cargo-fuzz entry: decodes an algorithm and up to [`MAX_OPS`] operations from `data`.
pub fn device_ops(data: &[u8]) {
    if let Some((algorithm, ops)) = decode(data) {
        run_ops(&ops, algorithm);
    }
}

/// Appends the bytes that make arbitrary's derived enums pick variant `index` of `count`
/// (a little-endian `u32` scaled by `count`, rounded up).
fn variant(out: &mut Vec<u8>, index: usize, count: usize) {
    let x = ((index as u64) << 32).div_ceil(count as u64);
    out.extend(u32::try_from(x).expect("index < count").to_le_bytes());
}

/// The bytes that [`device_ops`] decodes into `algorithm` and `ops`: how the seed corpus is
/// written. Mirrors arbitrary 1.x's encoding; a unit test checks the round trip.
pub fn encode(algorithm: Algorithm, ops: &[DeviceOp]) -> Vec<u8> {
    const OPS: usize = 12;
    let mut out = Vec::new();
    let alg = Algorithm::ALL
        .iter()
        .position(|&a| a == algorithm)
        .expect("a known algorithm");
    variant(&mut out, alg, Algorithm::ALL.len());
    for op in ops {
        out.push(1); // one more element
        match *op {
            DeviceOp::Write {
                sector,
                sectors,
                kind,
                seed,
            } => {
                variant(&mut out, 0, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
                variant(&mut out, kind as usize, PageKind::ALL.len());
                out.push(seed);
            }
            DeviceOp::Read { sector, sectors } => {
                variant(&mut out, 1, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::Discard { sector, sectors } => {
                variant(&mut out, 2, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::WriteZeroes { sector, sectors } => {
                variant(&mut out, 3, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::Wild {
                op,
                offset,
                len_bytes,
            } => {
                variant(&mut out, 4, OPS);
                variant(&mut out, op as usize, 4);
                out.extend(offset.to_le_bytes());
                out.extend(len_bytes.to_le_bytes());
            }
            DeviceOp::Compact => variant(&mut out, 5, OPS),
            DeviceOp::SetMemLimit { pages } => {
                variant(&mut out, 6, OPS);
                match pages {
                    Some(p) => out.extend([1, p]),
                    None => out.push(0),
                }
            }
            DeviceOp::ResetMemUsedMax => variant(&mut out, 7, OPS),
            DeviceOp::SwitchContext { foreign } => {
                variant(&mut out, 8, OPS);
                out.push(u8::from(foreign));
            }
            DeviceOp::MarkIdle { all } => {
                variant(&mut out, 9, OPS);
                out.push(u8::from(all));
            }
            DeviceOp::Recompress { huge_only } => {
                variant(&mut out, 10, OPS);
                out.push(u8::from(huge_only));
            }
            DeviceOp::Writeback { page, pages, fail } => {
                variant(&mut out, 11, OPS);
                out.extend([page, pages, u8::from(fail)]);
            }
        }
    }
    out.push(0); // no more elements
    out
}

/// Decodes what [`device_ops`] would run: the algorithm and the operations.
pub fn decode(data: &[u8]) -> Option<(Algorithm, Vec<DeviceOp>)> {
    let mut u = Unstructured::new(data);
    let algorithm = u.arbitrary::<Algorithm>().ok()?;
    let ops = u
        .arbitrary_iter::<DeviceOp>()
        .and_then(|it| it.take(MAX_OPS).collect::<Result<Vec<_>, _>>())
        .ok()?;
    Some((algorithm, ops))
}

/// `n` operations decoded from a pseudo-random byte stream made from `seed`; memory limits are
/// taken modulo `limit_mod` pages, so that they bite.
pub fn scramble(seed: u64, n: usize, limit_mod: u8) -> Vec<DeviceOp> {
    let bytes: Vec<u8> = (0..n as u64 * 16)
        .map(|i| mix(seed << 32 | i) as u8)
        .collect();
    let mut u = Unstructured::new(&bytes);
    (0..n)
        .map(
            |_| match DeviceOp::arbitrary(&mut u).expect("enough bytes") {
                DeviceOp::SetMemLimit { pages } => DeviceOp::SetMemLimit {
                    pages: pages.map(|p| p % limit_mod),
                },
                op => op,
            },
        )
        .collect()
}

/// The seed corpus of `fuzz/corpus/device_ops/`: a name (the file's), an algorithm and the
/// operations, each file aimed at one behaviour.
pub fn seeds() -> Vec<(&'static str, Algorithm, Vec<DeviceOp>)> {
    use DeviceOp::*;
    use PageKind::*;
    let whole = |page: u16, pages: u8, kind: PageKind, seed: u8| Write {
        sector: page * 8,
        sectors: pages * 8,
        kind,
        seed,
    };
    let part = |sector: u16, sectors: u8, kind: PageKind, seed: u8| Write {
        sector,
        sectors,
        kind,
        seed,
    };
    let read = |sector: u16, sectors: u8| Read { sector, sectors };
    let discard = |sector: u16, sectors: u8| Discard { sector, sectors };
    let zeroes = |sector: u16, sectors: u8| WriteZeroes { sector, sectors };
    let limit = |pages: Option<u8>| SetMemLimit { pages };

    let mut kinds: Vec<DeviceOp> = PageKind::ALL
        .iter()
        .enumerate()
        .map(|(i, &k)| whole(i as u16, 1, k, i as u8))
        .collect();
    kinds.extend([
        read(0, 64),
        read(3, 9),
        whole(4, 1, Text, 9),
        whole(1, 1, Noise, 9),
        read(0, 64),
        whole(8, 8, Mixed, 200),
        read(60, 40),
    ]);
    let overwrite = [Same, Noise, Text, Zeros, Pointers, Mixed, Sparse, Noise]
        .iter()
        .enumerate()
        .flat_map(|(i, &k)| [whole(5, 1, k, i as u8), read(40, 8), read(41, 3)])
        .chain([
            discard(40, 8),
            read(40, 8),
            whole(5, 1, Text, 1),
            zeroes(40, 8),
        ])
        .collect();
    let compact: Vec<DeviceOp> = (0..48u16)
        .map(|p| whole(p, 1, [Mixed, Text, Pointers][p as usize % 3], p as u8))
        .chain((0..48u16).step_by(2).map(|p| discard(p * 8, 8)))
        .chain([Compact, read(0, 64), read(256, 64)])
        .collect();
    let recompress: Vec<DeviceOp> = (0..32u16)
        .map(|p| {
            whole(
                p,
                1,
                [Text, Pointers, Noise, Mixed][p as usize % 4],
                p as u8,
            )
        })
        .chain([
            MarkIdle { all: true },
            Recompress { huge_only: true },
            read(0, 64),
            Recompress { huge_only: false },
            read(0, 255),
            whole(3, 2, Text, 77),
            MarkIdle { all: false },
            Recompress { huge_only: false },
            Compact,
            read(0, 255),
        ])
        .collect();
    let writeback: Vec<DeviceOp> = (0..24u16)
        .map(|p| whole(p, 1, [Text, Noise, Pointers, Same][p as usize % 4], p as u8))
        .chain([
            Writeback {
                page: 0,
                pages: 8,
                fail: true,
            },
            Writeback {
                page: 0,
                pages: 12,
                fail: false,
            },
            read(0, 255),
            whole(2, 2, Text, 50),
            discard(40, 16),
            part(33, 3, Sparse, 4),
            Recompress { huge_only: false },
            Writeback {
                page: 10,
                pages: 20,
                fail: false,
            },
            Compact,
            read(0, 255),
        ])
        .collect();
    vec![
        ("seed-lz4-writeback", Algorithm::Lz4, writeback.clone()),
        ("seed-zstd-writeback", Algorithm::Zstd, writeback),
        ("seed-lz4-recompress", Algorithm::Lz4, recompress.clone()),
        ("seed-zstd-recompress", Algorithm::Zstd, recompress),
        ("seed-lz4-kinds", Algorithm::Lz4, kinds.clone()),
        ("seed-zstd-kinds", Algorithm::Zstd, kinds),
        (
            "seed-lz4-partial",
            Algorithm::Lz4,
            vec![
                part(1, 1, Text, 1),
                part(7, 2, Noise, 2),
                part(11, 14, Same, 3),
                part(20, 1, Zeros, 0),
                read(0, 40),
                whole(0, 1, Noise, 5),
                part(2, 3, Zeros, 0),
                part(3, 1, Sparse, 6),
                read(0, 16),
                read(5, 1),
            ],
        ),
        (
            "seed-lz4-discard-ends",
            Algorithm::Lz4,
            vec![
                whole(0, 8, Text, 7),
                discard(4, 16),
                discard(24, 40),
                read(0, 64),
                whole(0, 8, Pointers, 8),
                zeroes(4, 16),
                zeroes(31, 2),
                read(0, 64),
            ],
        ),
        (
            "seed-zstd-zeroes",
            Algorithm::Zstd,
            vec![
                zeroes(1, 2),
                zeroes(8, 8),
                whole(2, 2, Pointers, 3),
                zeroes(17, 14),
                zeroes(16, 1),
                read(0, 40),
                zeroes(0, 64),
                read(0, 64),
            ],
        ),
        (
            "seed-lz4-mem-limit",
            Algorithm::Lz4,
            vec![
                limit(Some(4)),
                whole(0, 8, Noise, 1),
                read(0, 64),
                whole(8, 8, Same, 2),
                whole(2, 1, Noise, 3),
                discard(0, 16),
                whole(2, 2, Noise, 4),
                part(26, 4, Text, 5),
                limit(None),
                whole(0, 8, Noise, 6),
                limit(Some(0)),
                read(0, 64),
            ],
        ),
        (
            "seed-zstd-mem-limit-partial",
            Algorithm::Zstd,
            vec![
                whole(0, 8, Text, 3),
                whole(8, 8, Mixed, 4),
                limit(Some(1)),
                part(5, 2, Noise, 9),
                zeroes(9, 3),
                part(72, 2, Text, 40),
                whole(10, 1, Same, 1),
                discard(0, 128),
                whole(0, 1, Text, 1),
                limit(None),
                whole(0, 2, Text, 3),
                part(5, 2, Noise, 9),
                zeroes(9, 3),
                read(0, 128),
            ],
        ),
        (
            "seed-lz4-out-of-range",
            Algorithm::Lz4,
            vec![
                part(508, 8, Noise, 1),
                read(512, 1),
                read(575, 64),
                discard(511, 2),
                zeroes(504, 16),
                Wild {
                    op: WildOp::Read,
                    offset: u64::MAX - 511,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Write,
                    offset: 100,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Discard,
                    offset: 4096,
                    len_bytes: 100,
                },
                Wild {
                    op: WildOp::WriteZeroes,
                    offset: 1 << 40,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Write,
                    offset: 0,
                    len_bytes: 0,
                },
                part(511, 1, Text, 2),
                read(511, 1),
                read(504, 8),
            ],
        ),
        ("seed-lz4-compact", Algorithm::Lz4, compact),
        (
            "seed-zstd-contexts",
            Algorithm::Zstd,
            vec![
                SwitchContext { foreign: true },
                whole(0, 2, Text, 1),
                read(0, 16),
                SwitchContext { foreign: false },
                part(3, 9, Mixed, 2),
                SwitchContext { foreign: true },
                read(0, 16),
                SwitchContext { foreign: true },
                part(12, 1, Noise, 3),
                read(8, 8),
            ],
        ),
        ("seed-lz4-overwrite", Algorithm::Lz4, overwrite),
        (
            "seed-zstd-mem-used-max",
            Algorithm::Zstd,
            vec![
                whole(0, 8, Noise, 1),
                whole(8, 8, Text, 2),
                ResetMemUsedMax,
                discard(0, 64),
                ResetMemUsedMax,
                limit(Some(2)),
                whole(0, 4, Noise, 3),
                Compact,
                limit(None),
            ],
        ),
        ("seed-lz4-scramble", Algorithm::Lz4, scramble(3, 300, 24)),
        ("seed-zstd-scramble", Algorithm::Zstd, scramble(4, 300, 24)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_round_trips_through_arbitrary() {
        for (name, algorithm, ops) in seeds() {
            let decoded = decode(&encode(algorithm, &ops)).expect("decodes");
            assert_eq!(decoded, (algorithm, ops), "{name}");
        }
    }

    #[test]
    fn kinds_make_the_pages_they_promise() {
        let page = |k: PageKind| k.content(7, PAGE_SIZE);
        assert_eq!(same_word(&page(PageKind::Zeros)), Some(0));
        assert!(same_word(&page(PageKind::Same)).is_some_and(|w| w != 0));
        for k in [
            PageKind::Text,
            PageKind::Pointers,
            PageKind::Noise,
            PageKind::Sparse,
        ] {
            assert_eq!(same_word(&page(k)), None, "{k:?}");
        }
        let codec = Codec::new(Algorithm::Lz4, CodecParams::default()).unwrap();
        let mut stream = codec.stream().unwrap();
        let mut buf = vec![0; MAX_COMPRESSED_LEN];
        let mut size = |k: PageKind, seed: u8| {
            let p: [u8; PAGE_SIZE] = k.content(seed, PAGE_SIZE).try_into().unwrap();
            stream.compress(&p, &mut buf).unwrap()
        };
        assert!(
            size(PageKind::Noise, 1) > PAGE_SIZE,
            "noise is incompressible"
        );
        assert!(size(PageKind::Text, 1) < PAGE_SIZE / 2, "text compresses");
        assert!(
            size(PageKind::Sparse, 1) < PAGE_SIZE / 8,
            "sparse compresses well"
        );
        let mixed: Vec<usize> = (0..32).map(|s| size(PageKind::Mixed, s)).collect();
        let (lo, hi) = (mixed.iter().min().unwrap(), mixed.iter().max().unwrap());
        assert!(
            *lo < 1500 && *hi > 2500,
            "mixed spans the classes: {lo}..{hi}"
        );
    }

    #[test]
    fn ranges_split_into_page_pieces() {
        let r = Span {
            offset: 3584,
            len_bytes: 5120,
        };
        assert_eq!(
            r.pieces(),
            vec![
                (PageIndex(0), 3584, 512),
                (PageIndex(1), 0, 4096),
                (PageIndex(2), 0, 512)
            ]
        );
        assert_eq!(
            Span::sectors(SECTOR_SPAN + 3, MAX_SECTORS + 2).offset,
            3 * 512
        );
        assert_eq!(Span::sectors(0, MAX_SECTORS + 2).len_bytes, 512);
    }

    /// A harness with a few pages of each kind written, half of page 1 discarded around.
    fn written() -> Harness {
        let mut h = Harness::new(Algorithm::Lz4);
        for (page, kind) in [
            PageKind::Text,
            PageKind::Noise,
            PageKind::Same,
            PageKind::Mixed,
        ]
        .into_iter()
        .enumerate()
        {
            h.apply(DeviceOp::Write {
                sector: page as u16 * 8,
                sectors: 8,
                kind,
                seed: 3,
            });
        }
        h.apply(DeviceOp::Discard {
            sector: 4,
            sectors: 8,
        });
        h.check_stats();
        h.check_all();
        h
    }

    /// The checks fail when the model and the device disagree, whichever side is wrong.
    #[test]
    fn the_harness_notices_a_wrong_model() {
        type Tamper = fn(&mut Harness);
        let cases: [(&str, Tamper); 5] = [
            ("a flipped byte", |h| {
                h.pages.get_mut(&PageIndex(0)).unwrap().data[100] ^= 1;
            }),
            ("a partial discard modelled as a free", |h| {
                h.pages.remove(&PageIndex(1));
            }),
            ("a compressed size off by one", |h| {
                let p = h.pages.get_mut(&PageIndex(0)).unwrap();
                let Stored::Compressed(n) = p.stored else {
                    panic!("text compresses")
                };
                p.stored = Stored::Compressed(n + 1);
            }),
            ("a free that was not counted", |h| h.io.notify_free += 1),
            ("a huge page not counted since", |h| h.huge_pages_since -= 1),
        ];
        for (what, tamper) in cases {
            let mut h = written();
            tamper(&mut h);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                h.check_stats();
                h.check_all();
            }));
            assert!(caught.is_err(), "{what} went unnoticed");
        }
    }
}
