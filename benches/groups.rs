//! What a read of one page costs when its page is in a cold group: decompressing a run of
//! neighbouring pages as one frame ([`uzram_codecs::GroupStream`]) against decompressing that
//! page alone, and what the group stores against its pages alone.
//!
//! ```text
//! cargo bench --bench groups
//! UZRAM_CORPUS=heap.pages UZRAM_GROUP_PAGES=8 cargo bench --bench groups
//! ```
//!
//! Pages come from `testdata/sample.pages.zst` or the file `UZRAM_CORPUS` names, in file order
//! (a dump's neighbours stay neighbours); same-filled pages are left out, as the device stores
//! them in their slots (a run here goes on across one, where the device's would stop: a little
//! in the groups' favour). Each run of a group's pages is compressed once both ways; the timed
//! reads take turns (group, then its pages one by one) so that drift hits both alike, and the
//! figures are medians over the runs. Hot-cache figures: the frames stay in cache.

use std::hint::black_box;
use std::time::Instant;

use uzram_codecs::{
    Algorithm, Codec, CodecParams, GroupStream, GROUP_COMPRESS_BOUND, MAX_COMPRESSED_LEN,
    MAX_GROUP_PAGES, PAGE_SIZE,
};

/// Pages per group unless `UZRAM_GROUP_PAGES` (1 to 16) says otherwise: the design's size.
const GROUP: usize = MAX_GROUP_PAGES;
/// Turns per group; the fastest counts, which drops preempted ones.
const REPS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let group = std::env::var("UZRAM_GROUP_PAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=MAX_GROUP_PAGES).contains(n))
        .unwrap_or(GROUP);
    let path = uzram::tools::corpus::bench_corpus_path();
    let corpus = uzram::tools::corpus::Corpus::open(&path).unwrap_or_else(|err| {
        eprintln!("cannot load page corpus {}: {err}", path.display());
        std::process::exit(1);
    });
    let pages: Vec<&[u8; PAGE_SIZE]> = corpus
        .pages()
        .filter(|page| page.chunks_exact(8).any(|word| word != &page[..8]))
        .collect();
    println!(
        "groups of {group} pages from {} ({} pages not same-filled)",
        path.display(),
        pages.len()
    );
    println!("| algorithm | stored grouped / alone | group read (us) | page read (us) | group / page | group / its {group} pages |");
    println!("|---|---|---|---|---|---|");
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let codec = Codec::new(algorithm, CodecParams::default()).expect("default level");
        let mut single = codec.stream().expect("a stream");
        let mut groups = GroupStream::new(&codec).expect("a group stream");
        let (mut frame, mut one) = (
            vec![0u8; GROUP_COMPRESS_BOUND],
            vec![0u8; MAX_COMPRESSED_LEN],
        );
        let (mut run, mut back) = (
            Vec::with_capacity(group * PAGE_SIZE),
            vec![0u8; group * PAGE_SIZE],
        );
        let mut page = [0u8; PAGE_SIZE];
        let (mut grouped, mut alone) = (0usize, 0usize);
        let (mut t_group, mut t_page, mut t_pages) = (Vec::new(), Vec::new(), Vec::new());
        for chunk in pages.chunks_exact(group) {
            run.clear();
            let mut singles = Vec::with_capacity(group);
            for p in chunk {
                run.extend_from_slice(&p[..]);
                let n = single.compress(p, &mut one).expect("compress");
                singles.push(one[..n].to_vec());
            }
            let n = groups.compress(&run, &mut frame).expect("compress a group");
            grouped += n;
            alone += singles.iter().map(Vec::len).sum::<usize>();
            let (mut best_group, mut best_pages) = (f64::MAX, f64::MAX);
            for _ in 0..REPS {
                let t = Instant::now();
                groups
                    .decompress(black_box(&frame[..n]), &mut back)
                    .expect("decompress");
                best_group = best_group.min(t.elapsed().as_secs_f64());
                assert!(back == run, "{algorithm}: a group read back wrong");
                let t = Instant::now();
                for s in &singles {
                    single
                        .decompress(black_box(s), &mut page)
                        .expect("decompress");
                }
                best_pages = best_pages.min(t.elapsed().as_secs_f64());
            }
            t_group.push(best_group * 1e6);
            t_pages.push(best_pages * 1e6);
            t_page.push(best_pages * 1e6 / group as f64);
        }
        let (g, p, ps) = (median(t_group), median(t_page), median(t_pages));
        println!(
            "| {algorithm} | {:.3} | {g:.1} | {p:.2} | {:.1}x | {:.2}x |",
            grouped as f64 / alone.max(1) as f64,
            g / p.max(1e-9),
            g / ps.max(1e-9)
        );
    }
}
