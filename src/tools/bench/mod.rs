//! `uzram bench`: the engine against the raw codec on the same realistic pages.
//!
//! One run measures, over every page of a corpus (same-filled pages included):
//! - the raw codec (lz4_flex / zstd called directly, one thread) compressing and decompressing
//!   each page;
//! - the engine writing every page into a fresh device (slot lock, same-fill check, codec,
//!   allocator) and reading every page back, at 1 thread and at N threads (each thread a
//!   contiguous share of the pages, with its own I/O context);
//! - `mm_stat` after the first write pass.
//!
//! Each figure is the median of `--runs` rounds; the rounds interleave the measurements, so a
//! noisy neighbour slows all of them alike. Reads are verified against the corpus outside the
//! timed part.

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use uzram_codecs::backends::{lz4_flex, zstd};
use uzram_codecs::{Algorithm, Codec, MAX_COMPRESSED_LEN};

mod report;

use crate::common::output::shown;
use crate::tools::corpus::{bench_corpus_path, Corpus};
use crate::tools::pagedump::{dump_process, DumpOptions};
use uzram_engine::device::{DeviceStats, PAGE_SIZE};
use uzram_engine::{Device, Error};

/// Arguments of `uzram bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// File of 4 KiB pages, raw or zstd-compressed (default: $UZRAM_CORPUS, else the checked-in
    /// sample testdata/sample.pages.zst)
    #[arg(long, value_name = "FILE", conflicts_with = "pid")]
    pub corpus: Option<PathBuf>,
    /// Dump this live process's anonymous memory and use it as the corpus (needs root)
    #[arg(long, value_name = "PID", allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<u32>(1, i32::MAX.into()))]
    pub pid: Option<u32>,
    /// The algorithm and its parameters
    #[command(flatten)]
    pub device: crate::common::options::DeviceArgs,
    /// Threads for the multi-thread figures (default: the CPUs available)
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<usize>(1, MAX_THREADS as i128))]
    pub threads: Option<usize>,
    /// Rounds; each figure is the median
    #[arg(long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<usize>(1, MAX_RUNS as i128))]
    pub runs: usize,
    /// Print one JSON object (one line) instead of the table
    #[arg(long)]
    pub json: bool,
}

/// What a bench run measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// Where the pages came from.
    pub source: String,
    /// Algorithm and level.
    pub algorithm: Algorithm,
    /// Compression level in effect.
    pub level: i32,
    /// Pages in the corpus.
    pub pages: u64,
    /// Threads of the multi-thread figures.
    pub threads: usize,
    /// Rounds measured.
    pub runs: usize,
    /// The device's figures after the first write pass.
    pub stats: DeviceStats,
    /// Raw codec compressing, pages per second, by thread count (each thread its share).
    pub raw_compress: Vec<(usize, f64)>,
    /// Raw codec decompressing, pages per second, by thread count.
    pub raw_decompress: Vec<(usize, f64)>,
    /// Engine writes into an empty device (the pool growing), pages per second, by thread count.
    pub fill_pages_per_s: Vec<(usize, f64)>,
    /// Engine writes over written pages (steady state), pages per second, by thread count.
    pub write_pages_per_s: Vec<(usize, f64)>,
    /// Engine reads, pages per second, by thread count.
    pub read_pages_per_s: Vec<(usize, f64)>,
    /// With `--recomp-algorithm`: the slow path on the same pages.
    pub recompress: Option<RecompressFigures>,
    /// With `--backing-dev FILE`: writeback of every page (after recompression, if any).
    pub writeback: Option<WritebackFigures>,
}

/// Writeback of the bench's pages to a backing file.
#[derive(Debug, Clone, Copy)]
pub struct WritebackFigures {
    /// Pages written back.
    pub pages: u64,
    /// Bytes written (sealed compressed records).
    pub bytes_written: u64,
    /// What writing each page raw (4 KiB, zram's way) would have written.
    pub bytes_raw_equivalent: u64,
    /// Wall time of the pass.
    pub seconds: f64,
    /// `mem_used_total` after the pass (and its compaction).
    pub mem_used_total_after: u64,
}

/// The slow path on the bench's pages: written with the primary algorithm, all marked idle,
/// recompressed with the secondary ones (zram's `idle all` then `recompress type=idle`), the pool
/// compacted by the pass itself.
#[derive(Debug, Clone, Copy)]
pub struct RecompressFigures {
    /// `mem_used_total` with the primary algorithm alone.
    pub mem_used_total_primary: u64,
    /// `compr_data_size` with the primary algorithm alone.
    pub compr_primary: u64,
    /// `mem_used_total` after recompression and its compaction.
    pub mem_used_total_after: u64,
    /// `compr_data_size` after recompression.
    pub compr_after: u64,
    /// What the pass did.
    pub stats: uzram_engine::RecompressStats,
    /// Wall time of the pass (recompression and compaction).
    pub seconds: f64,
    /// Cold groups made after the pass (the policy's `groups`, on by default): the same pages,
    /// idle again, recompressed again with groups on.
    pub groups: Option<GroupingFigures>,
}

/// What grouping the recompressed pages did: zram's `idle all` and `recompress type=idle`
/// again, with the device's `groups` setting.
#[derive(Debug, Clone, Copy)]
pub struct GroupingFigures {
    /// The most pages a group (the `groups` setting).
    pub max_pages: u8,
    /// What the pass did (`groups`, `grouped_pages`).
    pub stats: uzram_engine::RecompressStats,
    /// `compr_data_size` after it.
    pub compr_after: u64,
    /// `mem_used_total` after it and its compaction.
    pub mem_used_total_after: u64,
    /// Wall time of the pass.
    pub seconds: f64,
}

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The corpus could not be loaded.
    #[error(transparent)]
    Corpus(#[from] crate::tools::corpus::CorpusError),
    /// The live process could not be dumped.
    #[error(transparent)]
    Dump(#[from] crate::tools::pagedump::DumpError),
    /// The device refused the configuration or an operation.
    #[error(transparent)]
    Device(#[from] Error),
    /// A device option was refused (it names the option).
    #[error(transparent)]
    Options(#[from] crate::common::options::OptionsError),
    /// A read or write of the device failed.
    #[error(transparent)]
    Io(#[from] uzram_engine::IoError),
    /// Pages read back differ from what was written: an engine bug, reported, never ignored.
    #[error("page {index} read back wrong after the {phase} pass")]
    Mismatch {
        /// The page.
        index: usize,
        /// Which pass.
        phase: &'static str,
    },
    /// The raw zstd context could not be made.
    #[error("cannot set up the raw zstd context")]
    RawCodec(#[source] std::io::Error),
    /// `--mem-limit` below what the corpus takes: the bench stores all of it.
    #[error(
        "--mem-limit {given} ({limit_bytes} bytes) is full after {stored} of the corpus's {pages} pages: the bench stores them all (give a larger limit, or none)"
    )]
    MemLimit {
        /// The option's value as given.
        given: String,
        /// The limit it made.
        limit_bytes: u64,
        /// Pages stored before it was reached.
        stored: u64,
        /// The corpus's pages.
        pages: u64,
    },
    /// `--runs 0` or `--threads 0`.
    #[error("--{what} must be at least 1")]
    Zero {
        /// The option.
        what: &'static str,
    },
    /// `--runs` or `--threads` past its bound.
    #[error("--{what} {value} is more than {max}")]
    TooMany {
        /// The option.
        what: &'static str,
        /// What was given.
        value: usize,
        /// Its bound.
        max: usize,
    },
}

/// The most threads `--threads` may ask for (each is a real thread with its own buffers).
pub const MAX_THREADS: usize = 1024;
/// The most rounds `--runs` may ask for.
pub const MAX_RUNS: usize = 1000;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rate(pages: usize, d: Duration) -> f64 {
    pages as f64 / d.as_secs_f64().max(1e-9)
}

/// The raw codec, called directly: lz4_flex's block API, or a zstd bulk context.
enum Raw {
    Lz4,
    Zstd(
        Box<zstd::bulk::Compressor<'static>>,
        Box<zstd::bulk::Decompressor<'static>>,
    ),
}

impl Raw {
    fn new(codec: &Codec) -> Result<Raw, BenchError> {
        let io = BenchError::RawCodec;
        Ok(match codec.algorithm() {
            Algorithm::Lz4 => Raw::Lz4,
            _ => {
                let dict = codec.params().dict.as_deref().unwrap_or(&[]);
                Raw::Zstd(
                    Box::new(
                        zstd::bulk::Compressor::with_dictionary(codec.level(), dict).map_err(io)?,
                    ),
                    Box::new(zstd::bulk::Decompressor::with_dictionary(dict).map_err(io)?),
                )
            }
        })
    }

    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> usize {
        match self {
            Raw::Lz4 => lz4_flex::block::compress_into(page, dst).expect("bound-sized buffer"),
            Raw::Zstd(c, _) => c.compress_to_buffer(page, dst).expect("bound-sized buffer"),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> usize {
        match self {
            Raw::Lz4 => lz4_flex::block::decompress_into(src, dst).expect("own output"),
            Raw::Zstd(_, d) => d.decompress_to_buffer(src, dst).expect("own output"),
        }
    }
}

/// Runs the bench.
pub fn run(args: &BenchArgs) -> Result<BenchReport, BenchError> {
    if args.runs == 0 {
        return Err(BenchError::Zero { what: "runs" });
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err(BenchError::Zero { what: "threads" });
    }
    for (what, value, max) in [
        ("threads", threads, MAX_THREADS),
        ("runs", args.runs, MAX_RUNS),
    ] {
        if value > max {
            return Err(BenchError::TooMany { what, value, max });
        }
    }
    let (source, corpus) = load_corpus(args)?;
    args.device.check_new()?;
    let setup = args.device.setup()?;
    let config = setup.config().clone();
    let pages: Vec<&[u8; PAGE_SIZE]> = corpus.pages().collect();
    let n = pages.len();
    let disksize = (n * PAGE_SIZE) as u64;
    let codec = Codec::new(config.algorithm, config.params.clone()).map_err(Error::from)?;
    // The slow path's device opens the backing files: a bad one is refused before the timed
    // rounds, not after them.
    let slow = if config.secondary.iter().any(Option::is_some) || !config.backing_devs.is_empty() {
        Some(Device::new(config.clone(), disksize)?)
    } else {
        None
    };

    let mut thread_counts = vec![1];
    if threads > 1 {
        thread_counts.push(threads);
    }
    let Rounds {
        times,
        fills,
        first_stats,
    } = timed_rounds(&config, &codec, &pages, &thread_counts, args.runs).map_err(|e| {
        match (&e, &args.device.mem_limit) {
            (BenchError::Io(uzram_engine::IoError::MemLimit { index, limit_bytes }), Some(l)) => {
                BenchError::MemLimit {
                    given: l.clone(),
                    limit_bytes: *limit_bytes,
                    stored: index.0,
                    pages: n as u64,
                }
            }
            _ => e,
        }
    })?;
    let by_threads = |phase: usize| -> Vec<(usize, f64)> {
        thread_counts
            .iter()
            .zip(&times)
            .map(|(&t, v)| (t, rate(n, median(v[phase].clone()))))
            .collect()
    };
    let fill_pages_per_s = thread_counts
        .iter()
        .zip(&fills)
        .map(|(&t, &d)| (t, rate(n, d)))
        .collect();
    let raw_compress = by_threads(0);
    let raw_decompress = by_threads(1);
    let (recompress, writeback) = match slow {
        Some(device) => slow_path(&device, &config, &pages)?,
        None => (None, None),
    };
    Ok(BenchReport {
        source,
        algorithm: config.algorithm,
        level: codec.level(),
        pages: n as u64,
        threads,
        runs: args.runs,
        stats: first_stats,
        raw_compress,
        raw_decompress,
        fill_pages_per_s,
        write_pages_per_s: by_threads(2),
        read_pages_per_s: by_threads(3),
        recompress,
        writeback,
    })
}

/// The pages to bench: a live process's memory (`--pid`) or a file of pages.
fn load_corpus(args: &BenchArgs) -> Result<(String, Corpus), BenchError> {
    Ok(match (args.pid, &args.corpus) {
        (Some(pid), _) => {
            let mut bytes = Vec::new();
            dump_process(pid, &mut bytes, &DumpOptions::default())?;
            let origin = PathBuf::from(format!("/proc/{pid}/mem"));
            (
                shown(&origin).to_string(),
                Corpus::from_bytes(bytes, &origin)?,
            )
        }
        (None, path) => {
            let path = path.clone().unwrap_or_else(bench_corpus_path);
            (shown(&path).to_string(), Corpus::open(&path)?)
        }
    })
}

/// What the timed rounds measured.
struct Rounds {
    /// Per thread count: raw compress, raw decompress, engine write, engine read.
    times: Vec<[Vec<Duration>; 4]>,
    /// Per thread count: the first round's engine write (the fill).
    fills: Vec<Duration>,
    /// The one-thread device's figures after its first write pass.
    first_stats: DeviceStats,
}

/// `runs` rounds of the raw codec and the engine at each thread count, interleaved. One device
/// per thread count, kept across rounds: round 0 fills it (the pool grows: arenas mapped and
/// zeroed), later rounds overwrite every page (the steady state of swap, where freed objects
/// make room for new ones). The timed devices have no backing file (only the slow path writes
/// back).
fn timed_rounds(
    config: &uzram_engine::DeviceConfig,
    codec: &Codec,
    pages: &[&[u8; PAGE_SIZE]],
    thread_counts: &[usize],
    runs: usize,
) -> Result<Rounds, BenchError> {
    let disksize = (pages.len() * PAGE_SIZE) as u64;
    let mut times: Vec<[Vec<Duration>; 4]> = vec![Default::default(); thread_counts.len()];
    let mut first_stats = None;
    let fast = uzram_engine::DeviceConfig {
        backing_devs: Vec::new(),
        ..config.clone()
    };
    let devices = thread_counts
        .iter()
        .map(|_| Device::new(fast.clone(), disksize))
        .collect::<Result<Vec<_>, _>>()?;
    let mut fills = Vec::new();
    for round in 0..runs {
        for (k, &nthreads) in thread_counts.iter().enumerate() {
            let (c, d) = raw_pass(codec, pages, nthreads)?;
            times[k][0].push(c);
            times[k][1].push(d);
            let (w, r) = engine_pass(&devices[k], pages, nthreads)?;
            if round == 0 {
                fills.push(w);
                if k == 0 {
                    first_stats = Some(devices[0].stats());
                }
            }
            if round > 0 || runs == 1 {
                times[k][2].push(w);
            }
            times[k][3].push(r);
        }
    }
    Ok(Rounds {
        times,
        fills,
        first_stats: first_stats.unwrap_or_else(|| devices[0].stats()),
    })
}

/// The slow path on one device: write every page with the primary codec, mark all idle, then
/// recompress (with secondary codecs) and write back (with a backing file), checking every page
/// after each step.
fn slow_path(
    device: &Device,
    config: &uzram_engine::DeviceConfig,
    pages: &[&[u8; PAGE_SIZE]],
) -> Result<(Option<RecompressFigures>, Option<WritebackFigures>), BenchError> {
    let mut ctx = device.context()?;
    let offset = |i: usize| (i * PAGE_SIZE) as u64;
    for (i, page) in pages.iter().enumerate() {
        device.write(&mut ctx, offset(i), &page[..])?;
    }
    let check = |ctx: &mut uzram_engine::IoContext, phase| -> Result<(), BenchError> {
        let mut back = vec![0u8; PAGE_SIZE];
        for (i, page) in pages.iter().enumerate() {
            device.read(ctx, offset(i), &mut back)?;
            if back[..] != page[..] {
                return Err(BenchError::Mismatch { index: i, phase });
            }
        }
        Ok(())
    };
    device.mark_idle(None);
    let recompress = if config.secondary.iter().any(Option::is_some) {
        let before = device.stats().mm;
        let request = uzram_engine::RecompressRequest {
            kind: Some(uzram_engine::RecompressType::Idle),
            ..Default::default()
        };
        // Page by page first (the figure without groups), then groups as the device's setting
        // makes them.
        let groups_setting = device.policy().groups;
        device.set_policy("groups=off")?;
        let t0 = Instant::now();
        let stats = device.recompress(&mut ctx, &request)?;
        let seconds = t0.elapsed().as_secs_f64();
        let after = device.stats().mm;
        let groups = match groups_setting {
            Some(n) => {
                device.set_policy(&format!("groups={n}"))?;
                device.mark_idle(None);
                let t0 = Instant::now();
                let stats = device.recompress(&mut ctx, &request)?;
                let seconds = t0.elapsed().as_secs_f64();
                let mm = device.stats().mm;
                Some(GroupingFigures {
                    max_pages: n,
                    stats,
                    compr_after: mm.compr_data_size,
                    mem_used_total_after: mm.mem_used_total,
                    seconds,
                })
            }
            _ => None,
        };
        Some(RecompressFigures {
            mem_used_total_primary: before.mem_used_total,
            compr_primary: before.compr_data_size,
            mem_used_total_after: after.mem_used_total,
            compr_after: after.compr_data_size,
            stats,
            seconds,
            groups,
        })
    } else {
        None
    };
    // Writeback takes what is still stored (same-filled pages stay in their slots), after the
    // check below has read every page (which clears idle): mark them again.
    let writeback = if device.backing().is_some() {
        device.mark_idle(None);
        let t0 = Instant::now();
        let stats = device.writeback(
            &mut ctx,
            uzram_engine::device::writeback::WritebackRequest::Idle,
        )?;
        let seconds = t0.elapsed().as_secs_f64();
        Some(WritebackFigures {
            pages: stats.written,
            bytes_written: stats.bytes,
            bytes_raw_equivalent: stats.written * PAGE_SIZE as u64,
            seconds,
            mem_used_total_after: device.stats().mm.mem_used_total,
        })
    } else {
        None
    };
    check(
        &mut ctx,
        if writeback.is_some() {
            "writeback"
        } else {
            "recompress"
        },
    )?;
    Ok((recompress, writeback))
}

/// The start line of a thread's two timed phases: every thread waits at it exactly twice, even one
/// that fails early, so the others never hang.
struct Phases<'a> {
    barrier: &'a Barrier,
    waited: std::cell::Cell<u32>,
}

impl Phases<'_> {
    fn wait(&self) {
        self.waited.set(self.waited.get() + 1);
        self.barrier.wait();
    }
}

/// Runs `work` on `nthreads` threads, each given a contiguous share of `n` items; the threads
/// start each of their two timed phases together. Returns the slowest thread's two times.
fn threaded_pass<F>(n: usize, nthreads: usize, work: F) -> Result<(Duration, Duration), BenchError>
where
    F: Fn(std::ops::Range<usize>, &Phases<'_>) -> Result<(Duration, Duration), BenchError> + Sync,
{
    let share = n.div_ceil(nthreads);
    let barrier = Barrier::new(nthreads);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..nthreads)
            .map(|t| {
                let (work, barrier) = (&work, &barrier);
                s.spawn(move || {
                    let phases = Phases {
                        barrier,
                        waited: std::cell::Cell::new(0),
                    };
                    let result = work((t * share).min(n)..((t + 1) * share).min(n), &phases);
                    for _ in phases.waited.get()..2 {
                        barrier.wait();
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let (mut a, mut b) = (Duration::ZERO, Duration::ZERO);
    for r in results {
        let (ta, tb) = r?;
        a = a.max(ta);
        b = b.max(tb);
    }
    Ok((a, b))
}

/// The raw codec over every page, each thread compressing then decompressing its share into its
/// own buffers; returns the compress and decompress wall times.
fn raw_pass(
    codec: &Codec,
    pages: &[&[u8; PAGE_SIZE]],
    nthreads: usize,
) -> Result<(Duration, Duration), BenchError> {
    threaded_pass(pages.len(), nthreads, |range, barrier| {
        let mine = &pages[range];
        let mut raw = Raw::new(codec)?;
        // Touched before timing, so page faults do not count against the codec.
        let mut compressed = vec![1u8; mine.len() * MAX_COMPRESSED_LEN];
        let mut lens = vec![0usize; mine.len()];
        let mut out = vec![0u8; PAGE_SIZE];
        barrier.wait();
        let t0 = Instant::now();
        for ((page, dst), len) in mine
            .iter()
            .zip(compressed.chunks_exact_mut(MAX_COMPRESSED_LEN))
            .zip(&mut lens)
        {
            *len = raw.compress(&page[..], dst);
        }
        let c = t0.elapsed();
        barrier.wait();
        let t1 = Instant::now();
        for (src, len) in compressed.chunks_exact(MAX_COMPRESSED_LEN).zip(&lens) {
            raw.decompress(&src[..*len], &mut out);
        }
        Ok((c, t1.elapsed()))
    })
}

/// Writes every page into `device`, then reads every page back, each thread its share; returns
/// the write and read wall times. Reads land in one hot page, as the raw decompressor's do; the
/// check against the corpus is a separate, untimed pass.
fn engine_pass(
    device: &Device,
    pages: &[&[u8; PAGE_SIZE]],
    nthreads: usize,
) -> Result<(Duration, Duration), BenchError> {
    threaded_pass(pages.len(), nthreads, |range, barrier| {
        let mut ctx = device.context()?;
        let mut page = vec![0u8; PAGE_SIZE];
        let offset = |i: usize| (i * PAGE_SIZE) as u64;
        barrier.wait();
        let t0 = Instant::now();
        for i in range.clone() {
            device.write(&mut ctx, offset(i), &pages[i][..])?;
        }
        let w = t0.elapsed();
        barrier.wait();
        let t1 = Instant::now();
        for i in range.clone() {
            device.read(&mut ctx, offset(i), &mut page)?;
        }
        let r = t1.elapsed();
        for i in range {
            device.read(&mut ctx, offset(i), &mut page)?;
            if page[..] != pages[i][..] {
                return Err(BenchError::Mismatch {
                    index: i,
                    phase: "read",
                });
            }
        }
        Ok((w, r))
    })
}
