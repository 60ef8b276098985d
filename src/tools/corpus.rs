//! Files of 4 KiB pages for benchmarks and ratio tests: raw, or zstd-compressed.
//!
//! A page file is a plain concatenation of 4096-byte pages, as written by `uzram dump-pages`
//! (see [`crate::tools::pagedump`]) and `scripts/dump-workloads.sh`. A small mix of real process heaps
//! is checked in at `testdata/sample.pages.zst` ([`default_sample_path`]); benches take any other
//! file through the `UZRAM_CORPUS` environment variable ([`bench_corpus_path`]).
//!
//! ```
//! use uzram::tools::corpus::{default_sample_path, Corpus};
//!
//! let corpus = Corpus::open(&default_sample_path())?;
//! let zero_pages = corpus.pages().filter(|p| p.iter().all(|&b| b == 0)).count();
//! assert!(zero_pages < corpus.len());
//! # Ok::<(), uzram::tools::corpus::CorpusError>(())
//! ```

use crate::common::output::shown;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Size of one page in a page file.
pub const PAGE_SIZE: usize = 4096;

/// Environment variable naming the page file benches use instead of the checked-in sample.
pub const CORPUS_ENV: &str = "UZRAM_CORPUS";

/// First bytes of a zstd frame (0xFD2FB528, little endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Why a page file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorpusError {
    #[error("cannot read page file {}", shown(path))]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot decompress zstd page file {}", shown(path))]
    Decompress {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "page file {} holds {len_bytes} bytes, not a whole number of {PAGE_SIZE}-byte pages",
        shown(path)
    )]
    BadLength { path: PathBuf, len_bytes: u64 },
    #[error(
        "page file {} holds more than {} GiB of pages (decompressed): give a smaller one",
        shown(path), MAX_CORPUS_BYTES >> 30
    )]
    TooLarge { path: PathBuf },
    #[error(
        "page file {} holds no pages: make one with scripts/dump-workloads.sh",
        shown(path)
    )]
    Empty { path: PathBuf },
}

/// Most bytes a page file may hold, decompressed: the bench holds it all in memory.
pub const MAX_CORPUS_BYTES: u64 = 16 << 30;

/// The pages of one page file, decompressed, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus {
    /// Invariant: a non-zero multiple of `PAGE_SIZE` bytes.
    data: Vec<u8>,
}

impl Corpus {
    /// Reads a page file, zstd-decompressing it when its name ends in `.zst` or its content
    /// starts with the zstd magic number.
    pub fn open(path: &Path) -> Result<Self, CorpusError> {
        let read_error = |source| CorpusError::Read {
            path: path.to_owned(),
            source,
        };
        let too_large = || CorpusError::TooLarge {
            path: path.to_owned(),
        };
        // A FIFO would wait for a writer and /dev/zero never ends: a page file is a file.
        let meta = std::fs::metadata(path).map_err(read_error)?;
        if !meta.is_file() {
            return Err(read_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        if meta.len() > MAX_CORPUS_BYTES {
            return Err(too_large());
        }
        let raw = std::fs::read(path).map_err(read_error)?;
        let compressed =
            raw.starts_with(&ZSTD_MAGIC) || path.extension().is_some_and(|ext| ext == "zst");
        let data = if compressed {
            let mut data = Vec::new();
            zstd::stream::Decoder::new(raw.as_slice())
                .and_then(|d| std::io::Read::take(d, MAX_CORPUS_BYTES + 1).read_to_end(&mut data))
                .map_err(|source| CorpusError::Decompress {
                    path: path.to_owned(),
                    source,
                })?;
            if data.len() as u64 > MAX_CORPUS_BYTES {
                return Err(too_large());
            }
            data
        } else {
            raw
        };
        Self::from_bytes(data, path)
    }

    /// Pages already in memory (a live dump, say); `origin` names them in errors.
    pub fn from_bytes(data: Vec<u8>, origin: &Path) -> Result<Self, CorpusError> {
        if data.len() % PAGE_SIZE != 0 {
            return Err(CorpusError::BadLength {
                path: origin.to_owned(),
                len_bytes: data.len() as u64,
            });
        }
        if data.is_empty() {
            return Err(CorpusError::Empty {
                path: origin.to_owned(),
            });
        }
        Ok(Self { data })
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.data.len() / PAGE_SIZE
    }

    /// Always false: an empty file is refused by [`Corpus::open`].
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Page `index`, if there is one.
    pub fn page(&self, index: usize) -> Option<&[u8; PAGE_SIZE]> {
        let start = index.checked_mul(PAGE_SIZE)?;
        let page = self.data.get(start..start.checked_add(PAGE_SIZE)?)?;
        Some(page.try_into().expect("slice of PAGE_SIZE bytes"))
    }

    /// The pages in file order.
    pub fn pages(&self) -> impl ExactSizeIterator<Item = &[u8; PAGE_SIZE]> + DoubleEndedIterator {
        self.data
            .chunks_exact(PAGE_SIZE)
            .map(|page| page.try_into().expect("chunks of PAGE_SIZE bytes"))
    }

    /// All pages as one slice.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// All pages as one buffer.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }
}

/// Reads a page file (raw or zstd) into one buffer of whole pages; see [`Corpus::open`].
pub fn load_pages(path: &Path) -> Result<Vec<u8>, CorpusError> {
    Corpus::open(path).map(Corpus::into_bytes)
}

/// The checked-in sample of real process pages, `testdata/sample.pages.zst`.
pub fn default_sample_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join("sample.pages.zst")
}

/// The page file benches should use: `$UZRAM_CORPUS` if set and non-empty, else the sample.
pub fn bench_corpus_path() -> PathBuf {
    match std::env::var_os(CORPUS_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => default_sample_path(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A file under the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &[u8]) -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir()
                .join(format!("uzram-corpus-{}-{n}-{name}", std::process::id()));
            std::fs::write(&path, contents).unwrap();
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn three_pages() -> Vec<u8> {
        let mut data = vec![0u8; 3 * PAGE_SIZE];
        data[PAGE_SIZE..2 * PAGE_SIZE].fill(0xa5);
        for (i, b) in data[2 * PAGE_SIZE..].iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        data
    }

    #[test]
    fn raw_file_loads_page_by_page() {
        let data = three_pages();
        let file = TempFile::new("raw.pages", &data);
        let corpus = Corpus::open(&file.0).unwrap();
        assert_eq!(corpus.len(), 3);
        assert!(!corpus.is_empty());
        assert_eq!(corpus.as_bytes(), data.as_slice());
        let pages: Vec<_> = corpus.pages().collect();
        assert_eq!(pages.len(), 3);
        assert_eq!(pages[1], &[0xa5; PAGE_SIZE]);
        assert_eq!(corpus.page(2).unwrap().as_slice(), &data[2 * PAGE_SIZE..]);
        assert_eq!(corpus.page(3), None);
        assert_eq!(corpus.page(usize::MAX), None);
    }

    #[test]
    fn zst_extension_is_decompressed() {
        let data = three_pages();
        let file = TempFile::new("sample.pages.zst", &zstd::bulk::compress(&data, 3).unwrap());
        assert_eq!(load_pages(&file.0).unwrap(), data);
    }

    #[test]
    fn zstd_magic_is_decompressed_whatever_the_name() {
        let data = three_pages();
        let file = TempFile::new("noext", &zstd::bulk::compress(&data, 1).unwrap());
        assert_eq!(load_pages(&file.0).unwrap(), data);
    }

    #[test]
    fn length_not_a_page_multiple_is_refused_with_the_length() {
        let file = TempFile::new("short.pages", &[7u8; PAGE_SIZE + 10]);
        let err = Corpus::open(&file.0).unwrap_err();
        assert!(
            matches!(
                err,
                CorpusError::BadLength {
                    len_bytes: 4106,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("4106 bytes"), "{err}");
    }

    #[test]
    fn decompressed_length_is_checked_too() {
        let file = TempFile::new("short.zst", &zstd::bulk::compress(&[1u8; 5000], 1).unwrap());
        let err = Corpus::open(&file.0).unwrap_err();
        assert!(
            matches!(
                err,
                CorpusError::BadLength {
                    len_bytes: 5000,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn corrupt_zst_is_a_decompress_error() {
        let file = TempFile::new("bad.pages.zst", b"not zstd at all");
        let err = Corpus::open(&file.0).unwrap_err();
        assert!(matches!(err, CorpusError::Decompress { .. }), "{err:?}");
    }

    #[test]
    fn empty_and_missing_files_are_refused() {
        let file = TempFile::new("empty.pages", &[]);
        assert!(matches!(
            Corpus::open(&file.0),
            Err(CorpusError::Empty { .. })
        ));
        let missing = Path::new("/nonexistent/uzram/none.pages");
        assert!(matches!(
            Corpus::open(missing),
            Err(CorpusError::Read { .. })
        ));
    }

    #[test]
    fn checked_in_sample_is_whole_pages_of_mixed_content() {
        let corpus = Corpus::open(&default_sample_path()).unwrap();
        assert!(corpus.len() >= 1000, "{} pages", corpus.len());
        let zero = corpus.pages().filter(|p| p.iter().all(|&b| b == 0)).count();
        assert!(
            zero * 2 < corpus.len(),
            "{zero} of {} pages are zero",
            corpus.len()
        );
    }
}
