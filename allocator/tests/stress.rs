//! Many threads storing, rewriting, reading and freeing at once, with compaction running beside
//! them; every object's bytes are verified at the end.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use uzram_allocator::fuzzing::pattern;
use uzram_allocator::{Handle, Pool, PoolConfig};

#[test]
fn concurrent_ops_keep_every_object_intact() {
    let pool = Arc::new(Pool::new(PoolConfig::default()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut live: Vec<(Handle, Vec<u8>)> = Vec::new();
                for i in 0..30_000u32 {
                    match rng.gen_range(0..10) {
                        0..=4 => {
                            let data = pattern(rng.gen(), rng.gen_range(1..=4096));
                            live.push((pool.store(&data).unwrap(), data));
                        }
                        5..=6 if !live.is_empty() => {
                            let (h, _) = live.swap_remove(rng.gen_range(0..live.len()));
                            pool.free(h).unwrap();
                        }
                        7 if !live.is_empty() => {
                            let j = rng.gen_range(0..live.len());
                            let data = pattern(rng.gen(), live[j].1.len());
                            pool.write(live[j].0, &data).unwrap();
                            live[j].1 = data;
                        }
                        _ if !live.is_empty() => {
                            let (h, d) = &live[rng.gen_range(0..live.len())];
                            assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), d);
                        }
                        _ => {}
                    }
                    if t == 0 && i % 5000 == 0 {
                        pool.compact();
                    }
                }
                live
            })
        })
        .collect();
    let all: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    pool.check_invariants().unwrap();
    for (h, d) in &all {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), d);
    }
    assert_eq!(pool.stats().objects, all.len() as u64);
    pool.compact();
    pool.check_invariants().unwrap();
    for (h, d) in &all {
        assert_eq!(&pool.read(*h, |o| o.to_vec()).unwrap(), d);
    }
}
