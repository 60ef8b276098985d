//! Codec throughput and ratio on real pages, and what `uzram_codecs::Stream` costs over calling
//! lz4_flex and zstd directly.
//!
//! ```text
//! cargo bench --bench codecs
//! UZRAM_CORPUS=other.pages.zst UZRAM_BENCH_PAGES=4096 cargo bench --bench codecs
//! ```
//!
//! Pages come from `testdata/sample.pages.zst` (zstd-compressed 4096-byte pages) or the file
//! named by `UZRAM_CORPUS` (raw or zstd-compressed); same-filled pages are skipped, since the engine
//! stores them without compressing. The pages are timed in chunks of [`CHUNK`]; for each chunk,
//! the raw library and the wrapper take turns [`REPS`] times (swapping order each turn) and each
//! one's fastest turn counts, which drops turns that were preempted and puts drift on a shared
//! machine on both alike. A run sums the chunks; each figure is the median of [`RUNS`] runs.
//! Criterion can't interleave, hence plain `Instant`. Since a chunk's pages stay in cache across
//! its turns, MB/s are hot-cache figures.
//!
//! Identical machine code runs a few percent faster or slower depending on where it and its
//! buffers land (lz4_flex's decompression loop, the same instructions in both paths, has
//! measured from 0.95 to 1.12 wrapper/raw across builds of this bench). The raw/raw control
//! column uses separate contexts and a separate copy of the raw code to show that floor.
//!
//! Columns: ratio = original / compressed bytes; MB/s = 10^6 original bytes per second through
//! the wrapper; wrap/raw = median wrapper time / median raw time (1.000 = free; the acceptance
//! limit is 1.03). `dst 3072` is the engine's huge-page check: compressing into a `dst` shorter
//! than the worst case, which the raw libraries can't do directly (the wrapper compresses into
//! a worst-case buffer and copies), against raw compression into a full-size `dst`. raw/raw is
//! the control: a second set of raw contexts against the first, so its distance from 1.000 is
//! the noise floor of the wrap/raw columns.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use uzram_codecs::backends::{lz4_flex, zstd};
use uzram_codecs::{Algorithm, Codec, CodecParams, Stream, MAX_COMPRESSED_LEN, PAGE_SIZE};

/// Runs per measurement; the figure is their median.
const RUNS: usize = 7;
/// Pages per timed chunk: short enough (tens of microseconds) that preemption rarely hits one.
const CHUNK: usize = 16;
/// Interleaved repetitions per chunk; the fastest counts, which drops preempted ones.
const REPS: usize = 3;
/// Contexts per variant, taking turns chunk by chunk: where a context's buffers land moves its
/// speed by a few percent, and this averages that out.
const INSTANCES: usize = 4;
/// Pages used unless `UZRAM_BENCH_PAGES` says otherwise.
const DEFAULT_PAGES: usize = 4096;
/// The `dst` length of the huge-page check variant.
const HUGE_CHECK_DST: usize = 3072;
/// The acceptance limit on wrapper/raw.
const LIMIT: f64 = 1.03;

type Page = [u8; PAGE_SIZE];

/// What is timed, each as one pass over a chunk.
#[derive(Clone, Copy)]
enum Variant {
    RawCompress,
    WrapperCompress,
    WrapperCompressHugeCheck,
    /// Raw again, with other contexts: the noise floor.
    ControlCompress,
    RawDecompress,
    WrapperDecompress,
    ControlDecompress,
}

const VARIANTS: [Variant; 7] = [
    Variant::RawCompress,
    Variant::WrapperCompress,
    Variant::WrapperCompressHugeCheck,
    Variant::ControlCompress,
    Variant::RawDecompress,
    Variant::WrapperDecompress,
    Variant::ControlDecompress,
];

fn main() {
    let (path, pages) = load_pages();
    let mib = (pages.len() * PAGE_SIZE) as f64 / (1 << 20) as f64;
    println!(
        "uzram-codecs: {} pages ({mib:.1} MiB, same-filled skipped) from {}",
        pages.len(),
        path.display()
    );
    println!("machine: {}; median of {RUNS} interleaved runs", machine());
    println!();
    println!(
        "{:<7} {:>5} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9}",
        "", "", "compress", "decomp", "compress", "decomp", "dst 3072", "compress", "decomp"
    );
    println!(
        "{:<7} {:>5} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9}",
        "codec", "ratio", "MB/s", "MB/s", "wrap/raw", "wrap/raw", "wrap/raw", "raw/raw", "raw/raw"
    );
    let mut worst: f64 = 0.0;
    let mut noise: f64 = 0.0;
    for (name, algorithm, level) in [
        ("lz4", Algorithm::Lz4, 1),
        ("zstd-1", Algorithm::Zstd, 1),
        ("zstd-3", Algorithm::Zstd, 3),
    ] {
        let t = bench_case(algorithm, level, &pages);
        let t = |variant: Variant| t.times[variant as usize];
        let mbps = |d: Duration| (pages.len() * PAGE_SIZE) as f64 / d.as_secs_f64() / 1e6;
        let ratios = [
            ratio(t(Variant::WrapperCompress), t(Variant::RawCompress)),
            ratio(t(Variant::WrapperDecompress), t(Variant::RawDecompress)),
            ratio(
                t(Variant::WrapperCompressHugeCheck),
                t(Variant::RawCompress),
            ),
            ratio(t(Variant::ControlCompress), t(Variant::RawCompress)),
            ratio(t(Variant::ControlDecompress), t(Variant::RawDecompress)),
        ];
        worst = worst.max(ratios[0]).max(ratios[1]);
        noise = noise
            .max((ratios[3] - 1.0).abs())
            .max((ratios[4] - 1.0).abs());
        println!(
            "{name:<7} {:>5.2} {:>9.0} {:>9.0} | {:>9.3} {:>9.3} {:>9.3} | {:>9.3} {:>9.3}",
            (pages.len() * PAGE_SIZE) as f64 / bench_compressed_bytes(algorithm, level, &pages),
            mbps(t(Variant::WrapperCompress)),
            mbps(t(Variant::WrapperDecompress)),
            ratios[0],
            ratios[1],
            ratios[2],
            ratios[3],
            ratios[4],
        );
    }
    println!();
    let verdict = if worst <= LIMIT { "within" } else { "over" };
    println!(
        "worst wrapper/raw: {worst:.3} ({verdict} the {LIMIT:.2} limit); \
         raw/raw control off by up to {noise:.3}"
    );
}

/// The total compressed length of `pages`, each compressed on its own.
fn bench_compressed_bytes(algorithm: Algorithm, level: i32, pages: &[Page]) -> f64 {
    let mut raw = Raw::new(algorithm, level);
    let mut dst = vec![0u8; MAX_COMPRESSED_LEN];
    pages
        .iter()
        .map(|page| raw.compress::<0>(page, &mut dst))
        .sum::<usize>() as f64
}

struct CaseResult {
    /// Median time of a run, by [`Variant`].
    times: [Duration; VARIANTS.len()],
}

/// lz4_flex or zstd called directly, the way a caller without the wrapper would.
enum Raw {
    Lz4,
    Zstd {
        compressor: zstd::bulk::Compressor<'static>,
        decompressor: zstd::bulk::Decompressor<'static>,
    },
}

impl Raw {
    fn new(algorithm: Algorithm, level: i32) -> Self {
        match algorithm {
            Algorithm::Lz4 => Raw::Lz4,
            _ => Raw::Zstd {
                compressor: zstd::bulk::Compressor::new(level).expect("zstd compressor"),
                decompressor: zstd::bulk::Decompressor::new().expect("zstd decompressor"),
            },
        }
    }

    /// `COPY` makes the control's code a separate copy of the raw one (`black_box` keeps the
    /// copies from being merged), so the control also shows what code placement alone does.
    #[inline(never)]
    fn compress<const COPY: u8>(&mut self, page: &Page, dst: &mut [u8]) -> usize {
        black_box(COPY);
        match self {
            Raw::Lz4 => lz4_flex::block::compress_into(page, dst).expect("lz4 compress"),
            Raw::Zstd { compressor, .. } => compressor
                .compress_to_buffer(page, dst)
                .expect("zstd compress"),
        }
    }

    #[inline(never)]
    fn decompress<const COPY: u8>(&mut self, src: &[u8], dst: &mut Page) -> usize {
        black_box(COPY);
        match self {
            Raw::Lz4 => lz4_flex::block::decompress_into(src, dst).expect("lz4 decompress"),
            Raw::Zstd { decompressor, .. } => decompressor
                .decompress_to_buffer(src, &mut dst[..])
                .expect("zstd decompress"),
        }
    }
}

/// The pages compressed, for the decompression passes, each checked against the raw library.
fn compress_all(
    algorithm: Algorithm,
    stream: &mut Stream,
    raw: &mut Raw,
    pages: &[Page],
) -> Vec<Vec<u8>> {
    let (mut dst, mut raw_dst) = (vec![0u8; MAX_COMPRESSED_LEN], vec![0u8; MAX_COMPRESSED_LEN]);
    pages
        .iter()
        .map(|page| {
            let len = stream.compress(page, &mut dst).expect("compress");
            let raw_len = raw.compress::<0>(page, &mut raw_dst);
            assert_eq!(
                raw_len, len,
                "{algorithm}: wrapper and raw outputs differ in size"
            );
            dst[..len].to_vec()
        })
        .collect()
}

fn bench_case(algorithm: Algorithm, level: i32, pages: &[Page]) -> CaseResult {
    let codec = Codec::new(algorithm, CodecParams::default().with_level(level)).expect("codec");
    let mut streams: Vec<Stream> = (0..INSTANCES)
        .map(|_| codec.stream().expect("stream"))
        .collect();
    let mut raws: Vec<Raw> = (0..INSTANCES).map(|_| Raw::new(algorithm, level)).collect();
    let mut controls: Vec<Raw> = (0..INSTANCES).map(|_| Raw::new(algorithm, level)).collect();

    let compressed = compress_all(algorithm, &mut streams[0], &mut raws[0], pages);
    let mut dst = vec![0u8; MAX_COMPRESSED_LEN];

    let mut out = Box::new([0u8; PAGE_SIZE]);
    let mut measure = |variant: Variant, chunk: usize, range: std::ops::Range<usize>| {
        let pages = &pages[range.clone()];
        let compressed = &compressed[range];
        let instance = chunk % INSTANCES;
        let (stream, raw, control) = (
            &mut streams[instance],
            &mut raws[instance],
            &mut controls[instance],
        );
        let out = &mut *out;
        match variant {
            Variant::RawCompress => time(|| {
                pages
                    .iter()
                    .map(|p| raw.compress::<0>(black_box(p), &mut dst))
                    .sum()
            }),
            Variant::ControlCompress => time(|| {
                pages
                    .iter()
                    .map(|p| control.compress::<1>(black_box(p), &mut dst))
                    .sum()
            }),
            Variant::WrapperCompress => {
                time(|| pages.iter().map(|p| compress(stream, p, &mut dst)).sum())
            }
            Variant::WrapperCompressHugeCheck => time(|| {
                let dst = &mut dst[..HUGE_CHECK_DST];
                pages.iter().map(|p| compress(stream, p, dst)).sum()
            }),
            Variant::RawDecompress => time(|| {
                compressed
                    .iter()
                    .map(|c| raw.decompress::<0>(black_box(c), out))
                    .sum()
            }),
            Variant::ControlDecompress => time(|| {
                compressed
                    .iter()
                    .map(|c| control.decompress::<1>(black_box(c), out))
                    .sum()
            }),
            Variant::WrapperDecompress => time(|| {
                compressed
                    .iter()
                    .map(|c| {
                        stream.decompress(black_box(c), out).expect("decompress");
                        usize::from(out[0])
                    })
                    .sum()
            }),
        }
    };

    let mut runs: [Vec<Duration>; VARIANTS.len()] = Default::default();
    for run in 0..RUNS {
        let mut totals = [Duration::ZERO; VARIANTS.len()];
        for (chunk, start) in (0..pages.len()).step_by(CHUNK).enumerate() {
            let range = start..(start + CHUNK).min(pages.len());
            let mut fastest = [Duration::MAX; VARIANTS.len()];
            for rep in 0..REPS {
                let mut order = VARIANTS;
                if (run + chunk + rep) % 2 == 1 {
                    order.reverse();
                }
                for variant in order {
                    let elapsed = measure(variant, chunk, range.clone());
                    fastest[variant as usize] = fastest[variant as usize].min(elapsed);
                }
            }
            for (total, fastest) in totals.iter_mut().zip(fastest) {
                *total += fastest;
            }
        }
        for (times, total) in runs.iter_mut().zip(totals) {
            times.push(total);
        }
    }
    CaseResult {
        times: runs.map(median),
    }
}

/// The compressed length, or the `dst` length for a page that does not fit (as the engine
/// would store it).
fn compress(stream: &mut Stream, page: &Page, dst: &mut [u8]) -> usize {
    let dst_len = dst.len();
    stream.compress(black_box(page), dst).unwrap_or(dst_len)
}

fn time(pass: impl FnOnce() -> usize) -> Duration {
    let start = Instant::now();
    black_box(pass());
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ratio(wrapper: Duration, raw: Duration) -> f64 {
    wrapper.as_secs_f64() / raw.as_secs_f64()
}

fn load_pages() -> (PathBuf, Vec<Page>) {
    let path = uzram::tools::corpus::bench_corpus_path();
    let limit = std::env::var("UZRAM_BENCH_PAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_PAGES);
    let corpus = uzram::tools::corpus::Corpus::open(&path).unwrap_or_else(|err| {
        eprintln!("cannot load page corpus {}: {err}", path.display());
        std::process::exit(1);
    });
    let pages: Vec<Page> = corpus
        .pages()
        // zram's same-filled test: one repeated machine word.
        .filter(|page| page.chunks_exact(8).any(|word| word != &page[..8]))
        .take(limit)
        .copied()
        .collect();
    if pages.is_empty() {
        eprintln!(
            "page corpus {} holds no pages that are not same-filled",
            path.display()
        );
        std::process::exit(1);
    }
    (path, pages)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split(':').nth(1))
        .map_or("unknown cpu", str::trim)
        .to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cpus} cpus")
}
