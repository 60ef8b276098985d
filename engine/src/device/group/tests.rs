use super::*;
use proptest::prelude::*;
use uzram_allocator::PoolConfig;

fn pool() -> Pool {
    Pool::new(PoolConfig::default()).unwrap()
}

/// A frame's stand-in: any bytes do, the object layer does not decompress.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn chunk_sizes_cover_header_and_frame_in_objects_the_pool_has() {
    for frame_len in [
        1,
        100,
        4080,
        4081,
        4096,
        8000,
        16_000,
        65_536,
        GROUP_COMPRESS_BOUND,
    ] {
        let sizes: Vec<usize> = Header::chunk_sizes(frame_len).collect();
        assert!(sizes.len() <= MAX_CHUNKS, "{frame_len}: {sizes:?}");
        assert!(
            sizes.iter().all(|&s| (1..=MAX_OBJECT).contains(&s)),
            "{frame_len}: {sizes:?}"
        );
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&s| s == MAX_OBJECT),
            "{frame_len}"
        );
        assert_eq!(
            sizes.iter().sum::<usize>(),
            Header::len_bytes(sizes.len()) + frame_len
        );
    }
    // One chunk while header and frame fit a page, two from the first byte past it.
    assert_eq!(Header::chunk_sizes(MAX_OBJECT - FIXED).count(), 1);
    assert_eq!(Header::chunk_sizes(MAX_OBJECT - FIXED + 1).count(), 2);
}

#[test]
fn a_stored_group_loads_back_and_frees_every_chunk() {
    let pool = pool();
    let f = frame(20_000, 3);
    let head = store(&pool, &f, 16, 1, 77).unwrap();
    let objects = pool.stats().objects;
    assert_eq!(objects, Header::chunk_sizes(f.len()).count() as u64);
    let mut out = vec![0u8; GROUP_COMPRESS_BOUND];
    let h = load(&pool, head, &mut out).unwrap();
    assert_eq!(
        (h.pages, h.codec, h.frame_len, h.stamp),
        (16, 1, 20_000, 77)
    );
    assert_eq!(out[..f.len()], f[..]);
    let bytes = free(&pool, head).unwrap();
    assert_eq!(bytes, Header::chunk_sizes(f.len()).sum::<usize>());
    assert_eq!(pool.stats().objects, 0);
    pool.check_invariants().unwrap();
}

#[test]
fn the_longest_frame_takes_the_most_chunks_and_loads_back() {
    let pool = pool();
    let f = frame(GROUP_COMPRESS_BOUND, 4);
    let head = store(&pool, &f, MAX_GROUP_PAGES, 3, u32::MAX).unwrap();
    let chunks = Header::chunk_sizes(f.len()).count();
    assert!(
        chunks <= MAX_CHUNKS && chunks > GROUP_COMPRESS_BOUND / MAX_OBJECT,
        "{chunks}"
    );
    assert_eq!(pool.stats().objects, chunks as u64);
    let mut out = vec![0u8; GROUP_COMPRESS_BOUND];
    assert_eq!(load(&pool, head, &mut out).unwrap().stamp, u32::MAX);
    assert!(out == f);
    free(&pool, head).unwrap();
    assert_eq!(pool.stats().objects, 0);
}

#[test]
fn a_damaged_chunk_table_frees_nothing() {
    let pool = pool();
    let head = store(&pool, &frame(12_000, 2), 8, 1, 0).unwrap();
    // A live object of another size named as the third chunk: checked before any free.
    let other = pool.store(&[9; 1000]).unwrap();
    let mut bytes = vec![0u8; 4096];
    pool.read_into(head, &mut bytes).unwrap();
    let mut bad = bytes.clone();
    bad[FIXED + 8..FIXED + 16].copy_from_slice(&other.to_raw().to_le_bytes());
    pool.write(head, &bad).unwrap();
    let objects = pool.stats().objects;
    assert!(matches!(free(&pool, head), Err(GroupError::Damaged { .. })));
    assert_eq!(pool.stats().objects, objects);
    assert_eq!(pool.read(other, |o| o.to_vec()).unwrap(), vec![9; 1000]);
    pool.write(head, &bytes).unwrap();
    free(&pool, head).unwrap();
    assert_eq!(pool.stats().objects, 1);
    // Four chunks, the first three full: the second named again as the third, or the head
    // named as a chunk, pass the size check; the table is refused before any free.
    let head = store(&pool, &frame(14_000, 3), 16, 1, 0).unwrap();
    assert_eq!(
        Header::chunk_sizes(14_000).collect::<Vec<_>>()[..3],
        [MAX_OBJECT; 3]
    );
    pool.read_into(head, &mut bytes).unwrap();
    let objects = pool.stats().objects;
    for twice in [
        bytes[FIXED..FIXED + 8].to_vec(),
        head.to_raw().to_le_bytes().to_vec(),
    ] {
        let mut bad = bytes.clone();
        bad[FIXED + 8..FIXED + 16].copy_from_slice(&twice);
        pool.write(head, &bad).unwrap();
        assert!(matches!(
            free(&pool, head),
            Err(GroupError::Damaged {
                reason: "a chunk named twice",
                ..
            })
        ));
        assert_eq!(pool.stats().objects, objects);
    }
    pool.write(head, &bytes).unwrap();
    free(&pool, head).unwrap();
    assert_eq!(pool.stats().objects, 1);
}

#[test]
fn what_is_not_a_group_is_refused_by_shape_and_nothing_stays() {
    let pool = pool();
    for (len, pages) in [
        (0, 4),
        (10, 0),
        (10, MAX_GROUP_PAGES + 1),
        (GROUP_COMPRESS_BOUND + 1, 4),
    ] {
        assert!(matches!(
            store(&pool, &frame(len, 0), pages, 1, 0),
            Err(GroupError::Shape { .. })
        ));
    }
    assert_eq!(pool.stats().objects, 0);
    // A buffer shorter than the frame.
    let head = store(&pool, &frame(9000, 1), 4, 1, 0).unwrap();
    let mut short = vec![0u8; 8999];
    assert!(matches!(
        load(&pool, head, &mut short),
        Err(GroupError::Shape { .. })
    ));
}

#[test]
fn a_full_pool_leaves_no_chunk_behind() {
    let pool = Pool::new(PoolConfig {
        limit_bytes: Some(3 * 4096),
        ..PoolConfig::default()
    })
    .unwrap();
    // Five chunks cannot fit under three pages of limit: whatever was stored is freed.
    assert!(matches!(
        store(&pool, &frame(18_000, 5), 16, 1, 0),
        Err(GroupError::Pool(_))
    ));
    assert_eq!(pool.stats().objects, 0);
    pool.check_invariants().unwrap();
}

#[test]
fn a_damaged_head_or_chunk_is_named_not_read() {
    let pool = pool();
    let f = frame(10_000, 9);
    let head = store(&pool, &f, 8, 1, 1).unwrap();
    let mut out = vec![0u8; GROUP_COMPRESS_BOUND];
    // A plain object (a page's) read as a group.
    let page = pool.store(&[0x11; 700]).unwrap();
    assert!(matches!(
        load(&pool, page, &mut out),
        Err(GroupError::Damaged { .. })
    ));
    // A chunk count that does not match the frame's length.
    let mut bytes = vec![0u8; 4096];
    pool.read_into(head, &mut bytes).unwrap();
    let mut bad = bytes.clone();
    bad[3] += 1;
    pool.write(head, &bad).unwrap();
    assert!(matches!(
        header(&pool, head),
        Err(GroupError::Damaged { .. })
    ));
    // A chunk handle that names an object of the wrong size (the plain one above).
    let mut bad = bytes.clone();
    bad[FIXED..FIXED + 8].copy_from_slice(&page.to_raw().to_le_bytes());
    pool.write(head, &bad).unwrap();
    assert!(matches!(
        load(&pool, head, &mut out),
        Err(GroupError::Damaged { .. })
    ));
    pool.write(head, &bytes).unwrap();
    assert_eq!(load(&pool, head, &mut out).unwrap().frame_len, 10_000);
    assert_eq!(out[..f.len()], f[..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Groups stored and freed in any order beside plain objects: each loads back its own
    /// frame, and the pool ends with only the plain objects.
    #[test]
    fn groups_and_pages_share_the_pool(ops in prop::collection::vec((0usize..4, 1usize..30_000, 1usize..=16), 1..40)) {
        let pool = pool();
        let mut live: Vec<(Handle, Vec<u8>, usize)> = Vec::new();
        let plain: Vec<Handle> = (0..20).map(|i| pool.store(&vec![i as u8; 100 + i * 190]).unwrap()).collect();
        let mut out = vec![0u8; GROUP_COMPRESS_BOUND];
        for (i, &(op, len, pages)) in ops.iter().enumerate() {
            if op == 0 && !live.is_empty() {
                let (head, _, _) = live.swap_remove(len % live.len());
                free(&pool, head).unwrap();
            } else {
                let f = frame(len, i as u8);
                let head = store(&pool, &f, pages, 2, i as u32).unwrap();
                live.push((head, f, pages));
            }
            for (head, f, pages) in &live {
                let h = load(&pool, *head, &mut out).unwrap();
                prop_assert_eq!(usize::from(h.pages), *pages);
                prop_assert_eq!(&out[..f.len()], &f[..]);
            }
        }
        for (head, _, _) in live {
            free(&pool, head).unwrap();
        }
        prop_assert_eq!(pool.stats().objects, plain.len() as u64);
        pool.check_invariants().unwrap();
    }
}

mod estimate {
    use crate::device::testutil::text_page;
    use crate::device::{Device, PageIndex, SlotFlags, PAGE_SIZE};
    use crate::testing::pages::{fill_text, noise_page};
    use crate::{DeviceSetup, GroupEstimate};

    fn flags(d: &Device) -> Vec<Option<SlotFlags>> {
        (0..53)
            .map(|i| d.slot_state(PageIndex(i)).map(|s| s.flags))
            .collect()
    }

    fn device() -> Device {
        let mut setup = DeviceSetup::new();
        setup
            .set_recomp_algorithm("algo=zstd priority=1 level=3")
            .unwrap();
        setup.init(8 << 20).unwrap()
    }

    /// Pages 0..40 like a heap's neighbours (one vocabulary each ten pages), a noise page at
    /// 20 (huge: it cuts the run), 41..44 not idle (read after the marks), 50..52 a run too
    /// short to group.
    fn fill(d: &Device) -> Vec<(u64, [u8; PAGE_SIZE])> {
        let mut ctx = d.context().unwrap();
        let mut pages = Vec::new();
        for i in (0..45).chain(50..53) {
            let mut p = [0u8; PAGE_SIZE];
            if i == 20 {
                p = noise_page(i);
            } else {
                fill_text(&mut p, 4 + (i / 10) * 9 + (i % 3) * 1000);
            }
            d.write(&mut ctx, i * PAGE_SIZE as u64, &p).unwrap();
            pages.push((i, p));
        }
        assert_eq!(d.mark_idle(None), 48, "the noise page is stored too, huge");
        let mut back = [0u8; PAGE_SIZE];
        for i in 41..45 {
            d.read(&mut ctx, i * PAGE_SIZE as u64, &mut back).unwrap();
        }
        pages
    }

    #[test]
    fn groups_take_only_runs_of_idle_compressed_neighbours_and_change_nothing() {
        let d = device();
        let pages = fill(&d);
        let mut ctx = d.context().unwrap();
        let before = d.stats().mm;
        let flags = flags(&d);
        let est = d.estimate_groups(&mut ctx, 1, 16).unwrap();
        // 0..20 is 16 + 4 pages, 21..41 is 16 + 4: four groups of 40 pages; 50..52 too short.
        assert_eq!(
            (est.groups, est.pages, est.runs_left_single),
            (4, 40, 0),
            "{est:?}"
        );
        assert!(est.pool_grouped < est.pool_alone, "{est:?}");
        assert!(est.compr_grouped < est.compr_alone, "{est:?}");
        // At most 4 is taken as 4.
        assert_eq!(
            d.estimate_groups(&mut ctx, 1, 1).unwrap(),
            d.estimate_groups(&mut ctx, 1, 4).unwrap()
        );
        // Groups of 8: more groups, and no better than 16.
        let by8 = d.estimate_groups(&mut ctx, 1, 8).unwrap();
        assert_eq!(
            (by8.groups, by8.pages, by8.runs_left_single),
            (6, 40, 0),
            "{by8:?}"
        );
        assert!(by8.pool_grouped >= est.pool_grouped, "{by8:?} {est:?}");
        // Nothing changed: figures, flags (idle stays), contents.
        assert_eq!(d.stats().mm, before);
        assert_eq!(self::flags(&d), flags);
        let mut back = [0u8; PAGE_SIZE];
        for (i, p) in &pages {
            d.read(&mut ctx, i * PAGE_SIZE as u64, &mut back).unwrap();
            assert!(back == *p, "page {i}");
        }
        d.check_invariants().unwrap();
    }

    #[test]
    fn a_page_the_probe_marked_freed_cuts_its_run() {
        let d = device();
        fill(&d);
        d.set_freed_pages(crate::FreedPages::in_memory(d.pages()))
            .unwrap();
        d.freed_pages().unwrap().mark(PageIndex(5), 1);
        let mut ctx = d.context().unwrap();
        // 0..5 and 6..20 (5 and 14 pages), 21..37 and 37..41 (16 and 4).
        let est = d.estimate_groups(&mut ctx, 1, 16).unwrap();
        assert_eq!((est.groups, est.pages), (4, 39), "{est:?}");
    }

    #[test]
    fn a_device_without_idle_pages_or_that_codec_estimates_nothing() {
        let d = device();
        let mut ctx = d.context().unwrap();
        for i in 0..64u64 {
            d.write(&mut ctx, i * PAGE_SIZE as u64, &text_page(i))
                .unwrap();
        }
        assert_eq!(
            d.estimate_groups(&mut ctx, 0, 16).unwrap(),
            GroupEstimate::default()
        );
        assert!(d.estimate_groups(&mut ctx, 2, 16).is_err());
    }
}
