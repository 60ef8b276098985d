//! The engine's errors, by layer: [`IoError`] is what a read, write, discard or write-zeroes
//! can fail with (the daemon maps each variant to one errno, in one exhaustive match); [`Error`]
//! is everything else: configuration, parsing, and management operations (which may fail with
//! an [`IoError`] inside).

use uzram_codecs::{CodecError, ConfigError, ParamsError, UnknownAlgorithm};

use crate::device::PageIndex;

/// What the I/O path can fail with. Not `non_exhaustive`: a new variant must get its errno in
/// the daemon before it builds.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A new I/O context (its codec streams) could not be made for the device: out of memory.
    #[error("cannot make an i/o context")]
    Context(#[source] ConfigError),
    /// I/O that reaches past the end of the device.
    #[error("i/o of {len_bytes} bytes at byte {offset} reaches beyond the device size {disksize}")]
    OutOfRange {
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len_bytes: u64,
        /// The device size.
        disksize: u64,
    },
    /// I/O not aligned to 512-byte sectors.
    #[error("i/o of {len_bytes} bytes at byte {offset} is not aligned to 512-byte sectors")]
    Misaligned {
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len_bytes: u64,
    },
    /// Storing the page would pass the device's memory limit; that page and the ones after it in
    /// the request were not changed.
    #[error("memory limit of {limit_bytes} bytes reached storing page {index}")]
    MemLimit {
        /// The page that did not fit.
        index: PageIndex,
        /// The limit (`mem_limit`).
        limit_bytes: u64,
    },
    /// The system refused memory; nothing was changed.
    #[error("out of memory")]
    OutOfMemory(#[source] uzram_allocator::Error),
    /// The system refused memory for the slot table's leaf that holds page `index`; nothing
    /// was changed.
    #[error("out of memory for the slot table entry of page {index}")]
    TableOutOfMemory {
        /// The page written.
        index: PageIndex,
    },
    /// A stored page failed to decompress.
    #[error("page {index} is corrupt")]
    Corrupt {
        /// The page.
        index: PageIndex,
        /// What the codec said.
        #[source]
        source: CodecError,
    },
    /// A page failed to compress (a codec bug; nothing was changed).
    #[error("page {index} failed to compress")]
    Compress {
        /// The page.
        index: PageIndex,
        /// What the codec said.
        #[source]
        source: CodecError,
    },
    /// The pool lost track of a page's object (an engine bug).
    #[error("page {index} has no object in the pool")]
    Lost {
        /// The page.
        index: PageIndex,
        /// What the pool said.
        #[source]
        source: uzram_allocator::Error,
    },
    /// A page names a codec priority the device has not got (an engine bug).
    #[error(
        "page {index} was compressed with codec priority {priority}, which this device has not got"
    )]
    NoCodec {
        /// The page.
        index: PageIndex,
        /// The priority in its slot.
        priority: u8,
    },
    /// A page's cold group is damaged: its head holds no group's header, or its chunks do not
    /// match the header.
    #[error("page {index} is in a damaged group (head object {head:#x}): {reason}")]
    Group {
        /// The page.
        index: PageIndex,
        /// The group's head chunk's raw handle.
        head: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A written-back page could not be read back (I/O error, or a record that fails its
    /// authentication: tampered with or corrupt).
    #[error("page {index} on the backing device")]
    Backing {
        /// The page.
        index: PageIndex,
        /// Why.
        #[source]
        source: crate::device::writeback::BackingError,
    },
}

/// An error of the device engine outside the I/O path: a bad setting or request, or a
/// management operation (writeback, recompression, a new context) that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A size that is not a number with an optional K/M/G/T/P/E suffix, or is 0.
    #[error("invalid size {text:?}: expected a whole number of bytes with an optional K, M, G, T, P or E suffix (no fractions: 1536M, not 1.5G)")]
    InvalidSize {
        /// What was given.
        text: String,
    },
    /// A size past what 64 bits of bytes can count.
    #[error("size {text:?} is more than 16 EiB (2^64 - 1 bytes), the most any size can be")]
    SizeTooLarge {
        /// What was given.
        text: String,
    },
    /// A disksize too large for this machine's memory to index.
    #[error(
        "disksize {disksize} needs a {table_bytes}-byte slot table when full, more than this machine's memory"
    )]
    TableTooLarge {
        /// The disksize asked for.
        disksize: u64,
        /// The slot table it needs.
        table_bytes: u64,
    },
    /// An unknown algorithm name.
    #[error(transparent)]
    UnknownAlgorithm(#[from] UnknownAlgorithm),
    /// Bad `algorithm_params`.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// A codec configuration the codec refuses (level, dictionary).
    #[error(transparent)]
    CodecConfig(#[from] ConfigError),
    /// Parameters for a recompression priority that has no algorithm yet.
    #[error("no recompression algorithm at priority {priority}: set recomp_algorithm (--recomp-algorithm) first")]
    NoRecompAlgorithm {
        /// The priority.
        priority: u8,
    },
    /// A `recomp_algorithm`, `recompress` or `writeback` request zram would refuse, or one this
    /// device cannot carry out (no recompression algorithm, no backing device).
    #[error("{text:?}: {why}")]
    InvalidRequest {
        /// The request.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The backing device could not be used.
    #[error(transparent)]
    BackingOpen(#[from] crate::device::writeback::BackingError),
    /// Marks of freed pages (`FreedPages`) with fewer words than the device's pages need.
    #[error("freed-page marks of {words} words for a device of {pages} pages: it needs {needed}")]
    FreeMarksTooShort {
        /// The device's pages.
        pages: u64,
        /// The words given.
        words: usize,
        /// The words it needs.
        needed: usize,
    },
    /// A memory region ([`DeviceConfig::region`](crate::DeviceConfig)) that cannot hold the
    /// device, or failed.
    #[error("memory region: {reason}")]
    Region {
        /// What is wrong.
        reason: String,
    },
    /// The memory region's own memory failed: creating it, adopting it, or claiming one of its
    /// metadata chunks.
    #[error("memory region: {what}")]
    RegionFailed {
        /// What was being done.
        what: &'static str,
        /// The allocator's error.
        #[source]
        source: uzram_allocator::Error,
    },
    /// A device a predecessor left in a region was not adopted ([`Device::adopt`](crate::Device)):
    /// nothing of it was changed, and none of its pages is served.
    #[error("the device left in the memory region was not adopted: {reason}")]
    NotAdopted {
        /// Why, with the value that was wrong.
        reason: String,
    },
    /// A setting that only an uninitialised device takes (zram's rule).
    #[error("{what} cannot change once the device is initialised: reset it first")]
    Busy {
        /// The setting.
        what: &'static str,
    },
}
