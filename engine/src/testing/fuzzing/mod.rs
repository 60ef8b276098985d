//! The `device_ops` fuzz harness: device operations checked against a model of the pages. Shared
//! by the cargo-fuzz target, the corpus replay test and the proptest.
//!
//! The model is a map from page to what the page holds (a missing page was never written or was
//! freed, and reads as zeros), plus zram's counters as they must come out. After every operation
//! the harness compares its result, the pages it touched and [`Device::stats`](crate::Device::stats) with the model;
//! every [`CHECK_EVERY`] operations, and at the end, it reads back every page, compares each
//! slot's flags and stored size, and calls [`Device::check_invariants`](crate::Device::check_invariants).
//!
//! What the model assumes of the engine: a page is same-filled (one 8-byte word repeated, zeros
//! included), compressed (sized by the model's own stream of the same codec), or stored raw when
//! its compressed size reaches [`Device::huge_threshold`](crate::Device::huge_threshold); a page that needs pool memory fails
//! with [`IoError::MemLimit`](crate::IoError::MemLimit) exactly when its size class has no free slot and a new zspage would
//! pass the limit; a request is applied page by page and stops at the first page that fails;
//! discard and write-zeroes free whole pages only, and write-zeroes stores its partial pages
//! anew (an empty one becomes a same-filled zero page); a page marked freed keeps its data until
//! a write stores over it (which takes the mark) or a reclaim frees it, each mark counting once
//! in `notify_free`.
//!
//! [`seeds`] are the files of `fuzz/corpus/device_ops/`, written with [`encode`].

use arbitrary::Arbitrary;
use uzram_codecs::Algorithm;

mod checks;
mod corpus;
mod harness;

pub use self::corpus::{decode, encode, scramble, seeds};
use self::harness::{Harness, Span};
use super::pages::{fill_noise, fill_text};
pub use super::pages::{mix, same_word};
use crate::{PAGE_SIZE, SECTOR_SIZE};

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
/// [`device_ops`] (the fuzz target) runs at most this many: a fuzzer explores by many short
/// inputs, and longer ones only repeat what the seeds and the proptest already run.
pub const FUZZ_OPS: usize = 64;
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
    /// Marks `pages % 17` pages from `page % 64` as freed by the device's user
    /// ([`FreedPages::mark`](crate::FreedPages::mark), as the daemon's probe does when swap frees
    /// slots): they keep their data until a write stores over them or [`DeviceOp::ReclaimFreed`],
    /// and writeback passes them by.
    FreeSlots {
        /// First page.
        page: u8,
        /// Pages.
        pages: u8,
    },
    /// [`Device::reclaim_freed`]: every marked page is freed.
    ReclaimFreed,
    /// The process "dies": the device is handed over ([`Device::leave`]) and a successor
    /// adopts it from its region ([`Device::adopt`]), reopening the backing file with the same
    /// key; then a full check.
    Restart,
    /// [`Device::make_groups`] with the secondary codec, groups of at most `max % 17` pages
    /// (the engine takes 4 to 16): every idle compressed page in a run that stores less grouped
    /// is grouped; with `split`, [`Device::split_sparse_groups`] instead.
    Group {
        /// The most pages a group.
        max: u8,
        /// Split the groups below half instead.
        split: bool,
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
    /// Requests that failed with [`IoError::MemLimit`](crate::IoError::MemLimit) on their first page.
    pub mem_limit_first: u64,
    /// Requests that failed with [`IoError::MemLimit`](crate::IoError::MemLimit) after writing some pages.
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
    /// Pages whose data a reclaim of marked pages freed.
    pub notice_freed_pages: u64,
    pub restarts: u64,
    /// Whole-page writes that took over a record kept for reuse.
    pub reused_pages: u64,
    /// Written-back pages a second read brought back into the pool.
    pub promoted_pages: u64,
    /// Pages put in cold groups.
    pub grouped_pages: u64,
    /// Pages split out of their groups into pages of their own.
    pub split_pages: u64,
    /// Grouped pages written back (each alone).
    pub grouped_written_back: u64,
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
        self.notice_freed_pages += o.notice_freed_pages;
        self.restarts += o.restarts;
        self.reused_pages += o.reused_pages;
        self.promoted_pages += o.promoted_pages;
        self.grouped_pages += o.grouped_pages;
        self.split_pages += o.split_pages;
        self.grouped_written_back += o.grouped_written_back;
    }
}

/// Runs `ops` on a fresh 64-page device of `algorithm` and checks every result, every page and
/// every counter against the model. Panics on a mismatch; returns what the run went through.
pub fn run_ops(ops: &[DeviceOp], algorithm: Algorithm) -> Tally {
    run_on(&mut Harness::new(algorithm), ops)
}

/// [`run_ops`] on `h`, which it leaves empty and checked (ready for [`Harness::reuse`]).
fn run_on(h: &mut Harness, ops: &[DeviceOp]) -> Tally {
    for (step, op) in ops.iter().enumerate() {
        h.step = step;
        h.apply(*op);
        h.check_stats();
        if step % CHECK_EVERY == CHECK_EVERY - 1 {
            h.check_all();
            // Its reads may have promoted pages (the pool grew, under whatever limit holds
            // now): checked, and the figures the next step is judged against.
            h.check_stats();
        }
    }
    h.step = ops.len();
    h.check_all();
    // Marks left are taken (as the daemon's next round would) before the run's last checks.
    h.reclaim_freed();
    h.check_stats();
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

/// The cargo-fuzz entry: decodes an algorithm and up to [`MAX_OPS`] operations from `data`,
/// and runs the first [`FUZZ_OPS`].
///
/// One harness per algorithm is kept for the thread's inputs: each run ends with every page
/// discarded and checked, which leaves the device as a fresh one to the model, and making a
/// device (two codecs' contexts, a pool, a backing file) costs more than a whole short input.
/// A crash's input replays alone with [`run_ops`] on a fresh harness; should one only fail
/// after others, `UZRAM_FUZZ_FRESH=1` gives every input a fresh harness.
pub fn device_ops(data: &[u8]) {
    use std::cell::RefCell;
    thread_local! {
        static KEPT: RefCell<[Option<Harness>; 2]> = const { RefCell::new([None, None]) };
        static FRESH: bool = std::env::var_os("UZRAM_FUZZ_FRESH").is_some();
    }
    let Some((algorithm, ops)) = decode(data) else {
        return;
    };
    if FRESH.with(|f| *f) {
        run_ops(&ops[..ops.len().min(FUZZ_OPS)], algorithm);
        return;
    }
    let ops = &ops[..ops.len().min(FUZZ_OPS)];
    let k = usize::from(algorithm != Algorithm::Lz4);
    let mut h = KEPT
        .with(|kept| kept.borrow_mut()[k].take())
        .unwrap_or_else(|| Harness::new(algorithm));
    run_on(&mut h, ops);
    h.reuse();
    KEPT.with(|kept| kept.borrow_mut()[k] = Some(h));
}

#[cfg(test)]
mod tests;
