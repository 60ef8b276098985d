//! Replays the fuzz corpora through the harnesses on stable, so `cargo test` catches a
//! regression a fuzzer once found (cargo-fuzz adds its finds to the same directories).
//!
//! The seeds are written by `uzram_codecs::fuzzing::{roundtrip_seeds, decompress_corrupt_seeds}`;
//! to rewrite them after changing the input layout:
//! `cargo test -p uzram-codecs --test fuzz_corpus -- --ignored write_seed_corpora`

use std::fs;
use std::path::PathBuf;

use uzram_codecs::fuzzing;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, harness: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot read corpus {}: {err}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    for file in files {
        let data = fs::read(&file).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let result = std::panic::catch_unwind(|| harness(&data));
        assert!(result.is_ok(), "{target} panicked on {}", file.display());
    }
}

#[test]
fn codec_roundtrip_corpus_replays() {
    replay("codec_roundtrip", fuzzing::codec_roundtrip);
}

#[test]
fn codec_decompress_corrupt_corpus_replays() {
    replay(
        "codec_decompress_corrupt",
        fuzzing::codec_decompress_corrupt,
    );
}

#[test]
#[ignore = "writes the seed corpora into fuzz/corpus"]
fn write_seed_corpora() {
    for (target, seeds) in [
        ("codec_roundtrip", fuzzing::roundtrip_seeds()),
        (
            "codec_decompress_corrupt",
            fuzzing::decompress_corrupt_seeds(),
        ),
    ] {
        let dir = corpus_dir(target);
        fs::create_dir_all(&dir).expect("create corpus directory");
        for (name, data) in seeds {
            fs::write(dir.join(format!("seed-{name}")), data).expect("write seed");
        }
    }
}
