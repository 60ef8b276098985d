//! Allocator speed: store+free and read per size class, and a mixed workload of realistic sizes.
//!
//! Run: `cargo bench --bench allocator`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use uzram_allocator::{Pool, PoolConfig};

fn per_class(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    for size in [64usize, 512, 1024, 1700, 2500, 3500, 4096] {
        let data = vec![0x5au8; size];
        g.throughput(Throughput::Elements(1));
        // A warm pool so that the steady state (no arena mapping) is measured.
        let pool = Pool::new(PoolConfig::default()).unwrap();
        let keep: Vec<_> = (0..10_000).map(|_| pool.store(&data).unwrap()).collect();
        g.bench_with_input(BenchmarkId::new("store_free", size), &size, |b, _| {
            b.iter(|| pool.free(pool.store(&data).unwrap()).unwrap())
        });
        let mut buf = vec![0u8; 4096];
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("read_into", size), &size, |b, _| {
            b.iter(|| {
                i = (i + 7919) % keep.len();
                pool.read_into(keep[i], &mut buf).unwrap()
            })
        });
    }
    g.finish();
}

fn mixed(c: &mut Criterion) {
    // Sizes spread like lz4 output on heap pages (most between 1 and 3 KiB).
    let sizes: Vec<usize> = (0..4096)
        .map(|i| 200 + (i * 2654435761usize) % 3000)
        .collect();
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let mut live: Vec<_> = sizes
        .iter()
        .map(|&s| pool.store(&vec![1u8; s]).unwrap())
        .collect();
    let mut i = 0;
    let mut g = c.benchmark_group("pool");
    g.throughput(Throughput::Elements(1));
    g.bench_function("mixed_replace", |b| {
        b.iter(|| {
            i = (i + 1) % live.len();
            pool.free(live[i]).unwrap();
            live[i] = pool.alloc(sizes[(i * 31) % sizes.len()]).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, per_class, mixed);
criterion_main!(benches);
