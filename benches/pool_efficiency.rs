//! Allocator memory efficiency on the compressed sizes of realistic pages.
//!
//! For lz4 and zstd, every page of the corpus is compressed; same-filled pages are left out (the
//! engine keeps them in the slot table, not the pool) and pages whose compressed size lands in the
//! 4 KiB class are stored raw, as the engine does. The objects are stored until at least
//! `UZRAM_BENCH_OBJECTS` (default 100,000) are live, cycling over the corpus; then a random half is
//! freed and the pool compacted. Reported per zspage chain length (4, 8, 16 pages):
//! `pages used x 4096 / stored bytes` (zram's mem_used_total over compr_data_size) after the fill and
//! after free + compact, the same with the arena pages actually mapped, and metadata per object.
//!
//! Run: `cargo bench --bench pool_efficiency` (corpus: `UZRAM_CORPUS=FILE`, default the checked-in
//! sample).

use rand::seq::SliceRandom;
use rand::SeedableRng;
use uzram::tools::corpus::{default_sample_path, Corpus};
use uzram_allocator::{Pool, PoolConfig, PAGE_SIZE};
use uzram_codecs::{Algorithm, Codec, CodecParams, MAX_COMPRESSED_LEN};

fn same_filled(page: &[u8; PAGE_SIZE]) -> bool {
    let first = &page[..8];
    page.chunks_exact(8).all(|w| w == first)
}

/// The objects the engine would store for this corpus: compressed bytes, or the raw page when it
/// compresses into the huge class.
fn objects(corpus: &Corpus, algorithm: Algorithm, pool: &Pool) -> Vec<Vec<u8>> {
    let codec = Codec::new(algorithm, CodecParams::default()).expect("codec");
    let mut stream = codec.stream().expect("stream");
    let mut buf = vec![0u8; MAX_COMPRESSED_LEN];
    corpus
        .pages()
        .filter(|p| !same_filled(p))
        .map(|page| match stream.compress(page, &mut buf) {
            Ok(n) if n < PAGE_SIZE && pool.class_size(n).expect("size") < PAGE_SIZE => {
                buf[..n].to_vec()
            }
            _ => page.to_vec(),
        })
        .collect()
}

struct Figures {
    fill_used: f64,
    fill_mapped: f64,
    compact_used: f64,
    compact_mapped: f64,
    meta_per_obj: f64,
    objects: usize,
}

fn measure(objs: &[Vec<u8>], target: usize, chain: usize) -> Figures {
    let pool = Pool::new(PoolConfig {
        max_pages_per_zspage: chain,
        auto_compact: false,
        ..PoolConfig::default()
    })
    .expect("pool");
    let mut live = Vec::with_capacity(target);
    let mut bytes = 0u64;
    for obj in objs.iter().cycle().take(target) {
        live.push((pool.store(obj).expect("store"), obj.len() as u64));
        bytes += obj.len() as u64;
    }
    let s = pool.stats();
    let ratio = |pages: u64, bytes: u64| (pages * PAGE_SIZE as u64) as f64 / bytes as f64;
    let (fill_used, fill_mapped) = (ratio(s.pages_used, bytes), ratio(s.pages_mapped, bytes));
    let meta_per_obj = s.metadata_bytes as f64 / live.len() as f64;
    let objects = live.len();
    live.shuffle(&mut rand::rngs::StdRng::seed_from_u64(42));
    for (h, len) in live.drain(..objects / 2) {
        pool.free(h).expect("free");
        bytes -= len;
    }
    pool.compact();
    pool.check_invariants().expect("invariants");
    let s = pool.stats();
    Figures {
        fill_used,
        fill_mapped,
        compact_used: ratio(s.pages_used, bytes),
        compact_mapped: ratio(s.pages_mapped, bytes),
        meta_per_obj,
        objects,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too, so keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let path = std::env::var_os("UZRAM_CORPUS").map_or_else(default_sample_path, Into::into);
    let corpus = Corpus::open(&path).expect("corpus");
    let target: usize = std::env::var("UZRAM_BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 5_000 } else { 100_000 });
    println!(
        "corpus {} ({} pages), {} objects per run",
        path.display(),
        corpus.len(),
        target
    );
    println!(
        "{:<5} {:>5} {:>8} {:>10} {:>12} {:>14} {:>16} {:>12}",
        "algo",
        "chain",
        "objects",
        "fill used",
        "fill mapped",
        "compact used",
        "compact mapped",
        "meta B/obj"
    );
    let probe = Pool::new(PoolConfig::default()).expect("pool");
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let objs = objects(&corpus, algorithm, &probe);
        // The corpus once (the device bench's scale), then at least `target` objects.
        let runs = [(objs.len(), 8), (target, 4), (target, 8), (target, 16)];
        for (n, chain) in runs {
            let f = measure(&objs, n, chain);
            println!(
                "{:<5} {:>5} {:>8} {:>10.4} {:>12.4} {:>14.4} {:>16.4} {:>12.1}",
                algorithm.name(),
                chain,
                f.objects,
                f.fill_used,
                f.fill_mapped,
                f.compact_used,
                f.compact_mapped,
                f.meta_per_obj
            );
        }
    }
}
