//! A device in a memfd region, adopted by a successor after its process "dies": leaked (nothing
//! dropped or unmapped, as when a process is killed), killed in the middle of a write, or
//! handed over with `Device::leave`. The model is a map of the pages written; every page must
//! read back the same after each adoption, and the statistics must add up again.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use uzram_codecs::{Algorithm, CodecParams};
use uzram_engine::testing::fuzzing::PageKind;
use uzram_engine::{
    Device, DeviceConfig, Error, IoContext, PageIndex, RecompressRequest, Region, PAGE_SIZE,
};

const PAGES: u64 = 2048;
const PAGE: u64 = PAGE_SIZE as u64;

fn config(region: &Region) -> DeviceConfig {
    DeviceConfig {
        algorithm: Algorithm::Lz4,
        secondary: [Some((Algorithm::Zstd, CodecParams::default())), None, None],
        region: Some(region.clone()),
        ..DeviceConfig::default()
    }
}

fn new_device() -> (Device, Region) {
    let size = Device::region_size(PAGES * PAGE).unwrap();
    let region = Region::create("uzram-device-adopt-test", size).unwrap();
    let d = Device::new(config(&region), PAGES * PAGE).unwrap();
    (d, region)
}

fn adopt(fd: OwnedFd) -> (Device, uzram_engine::Adopted) {
    let region = Region::adopt(fd).unwrap();
    Device::adopt(config(&region), PAGES * PAGE).unwrap()
}

fn fd_of(region: &Region) -> OwnedFd {
    region.fd().try_clone_to_owned().unwrap()
}

/// The pages written; a missing page reads as zeros.
#[derive(Default)]
struct Model(HashMap<u64, Vec<u8>>);

impl Model {
    fn write(&mut self, d: &Device, ctx: &mut IoContext, page: u64, data: &[u8]) {
        d.write(ctx, page * PAGE, data).unwrap();
        for (i, p) in data.chunks(PAGE_SIZE).enumerate() {
            self.0.insert(page + i as u64, p.to_vec());
        }
    }

    fn verify(&self, d: &Device, ctx: &mut IoContext) {
        let mut buf = vec![0u8; PAGE_SIZE];
        for p in 0..d.pages() {
            d.read(ctx, p * PAGE, &mut buf).unwrap();
            let want = self.0.get(&p).map_or(&[0u8; PAGE_SIZE][..], |v| &v[..]);
            assert!(buf == want, "page {p} differs from the model");
        }
        // Written-back pages are not stored in RAM (zram counts them so too).
        let mm = d.stats().mm;
        let written_back = d.backing().map_or(0, |b| b.pages());
        assert_eq!(
            mm.orig_data_size,
            (self.0.len() as u64 - written_back) * PAGE
        );
        d.check_invariants().unwrap();
    }

    /// Writes of every kind of page, partial pages, discards and zeroes over `round`'s pages.
    fn churn(&mut self, d: &Device, ctx: &mut IoContext, round: u64) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ round;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..1500 {
            let r = next();
            let page = r % PAGES;
            let kind = PageKind::ALL[(r >> 20) as usize % PageKind::ALL.len()];
            match (r >> 32) % 10 {
                0..=6 => {
                    let pages = 1 + (r >> 40) % 3;
                    let pages = pages.min(PAGES - page);
                    let data = kind.content((r >> 48) as u8, (pages * PAGE) as usize);
                    self.write(d, ctx, page, &data);
                }
                7 => {
                    // A partial page: a read-modify-write.
                    let mut old = self.0.get(&page).cloned().unwrap_or(vec![0; PAGE_SIZE]);
                    let patch = kind.content((r >> 48) as u8, 1024);
                    d.write(ctx, page * PAGE + 1024, &patch).unwrap();
                    old[1024..2048].copy_from_slice(&patch);
                    self.0.insert(page, old);
                }
                8 => {
                    d.discard(page * PAGE, PAGE).unwrap();
                    self.0.remove(&page);
                }
                _ => {
                    d.write_zeroes(ctx, page * PAGE, PAGE).unwrap();
                    self.0.remove(&page);
                }
            }
        }
    }
}

#[test]
fn every_page_reads_the_same_after_each_adoption() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    model.churn(&d, &mut ctx, 1);
    // Recompression moves pages to other objects, codecs and size classes; compaction moves
    // objects and zspages.
    d.mark_idle(None);
    let req = RecompressRequest {
        kind: None,
        threshold: None,
        max_pages: None,
        algo: None,
        priority: None,
    };
    d.recompress(&mut ctx, &req).unwrap();
    d.compact();
    model.verify(&d, &mut ctx);
    let before = d.stats().mm;

    // Killed: nothing of the process is dropped.
    let fd = fd_of(&region);
    drop(region);
    std::mem::forget(d);
    let (d, found) = adopt(fd);
    assert_eq!(found.pages, model.0.len() as u64);
    assert_eq!((found.undone, found.orphans), (0, 0));
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
    let after = d.stats().mm;
    assert_eq!(
        (
            after.orig_data_size,
            after.compr_data_size,
            after.same_pages,
            after.huge_pages
        ),
        (
            before.orig_data_size,
            before.compr_data_size,
            before.same_pages,
            before.huge_pages
        )
    );

    // It goes on, then is handed over, and goes on again.
    model.churn(&d, &mut ctx, 2);
    model.verify(&d, &mut ctx);
    let region = d.region().unwrap().clone();
    let fd = fd_of(&region);
    drop(region);
    d.leave();
    let (d, _) = adopt(fd);
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
    model.churn(&d, &mut ctx, 3);
    model.verify(&d, &mut ctx);
}

#[test]
fn a_write_killed_halfway_is_undone_and_its_object_freed() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    model.churn(&d, &mut ctx, 4);
    // Page 7 holds text; the write that was replacing it with noise dies after storing the
    // slot's new word and before its meta.
    let text = PageKind::Text.content(9, PAGE_SIZE);
    model.write(&d, &mut ctx, 7, &text);
    let noise: [u8; PAGE_SIZE] = PageKind::Noise.content(3, PAGE_SIZE).try_into().unwrap();
    d.die_in_write(PageIndex(7), &noise).unwrap();
    let fd = fd_of(&region);
    drop(region);
    std::mem::forget(d);
    let (d, found) = adopt(fd);
    assert_eq!(found.undone, 1, "the half-done change is undone");
    assert_eq!(found.orphans, 1, "the dead write's object is freed");
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
    // The dead thread's lock is gone: the page takes a new write.
    model.write(&d, &mut ctx, 7, &noise);
    model.verify(&d, &mut ctx);
}

#[test]
fn cold_groups_are_adopted_whole_even_with_a_member_write_killed_halfway() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    // Runs of text pages, grouped; then churn takes some pages out of their groups.
    for run in 0..8u64 {
        for i in 0..16 {
            let text = PageKind::Text.content((run * 16 + i) as u8, PAGE_SIZE);
            model.write(&d, &mut ctx, 100 + run * 20 + i, &text);
        }
    }
    d.mark_idle(None);
    let pass = d.make_groups(&mut ctx, 1, 16).unwrap();
    assert!(pass.groups >= 6, "{pass:?}");
    model.churn(&d, &mut ctx, 6);
    let grouped = (0..PAGES)
        .find(|&p| d.slot_state(PageIndex(p)).unwrap().is_grouped())
        .expect("a page still grouped");
    // A write over a grouped page dies after storing the slot's new word.
    let noise: [u8; PAGE_SIZE] = PageKind::Noise.content(5, PAGE_SIZE).try_into().unwrap();
    d.die_in_write(PageIndex(grouped), &noise).unwrap();
    let before = d.stats();
    assert!(before.groups.live > 0);
    let fd = fd_of(&region);
    drop(region);
    std::mem::forget(d);
    let (d, found) = adopt(fd);
    assert_eq!((found.undone, found.orphans), (1, 1));
    assert!(d.slot_state(PageIndex(grouped)).unwrap().is_grouped());
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
    let after = d.stats();
    assert_eq!(
        (after.groups.live, after.groups.pages, after.groups.bytes),
        (before.groups.live, before.groups.pages, before.groups.bytes)
    );
    assert_eq!(after.mm.compr_data_size, before.mm.compr_data_size);
    // It goes on: the page takes its write, the groups lose members and are split.
    model.write(&d, &mut ctx, grouped, &noise);
    model.churn(&d, &mut ctx, 7);
    d.split_sparse_groups(&mut ctx).unwrap();
    model.verify(&d, &mut ctx);
    let region = d.region().unwrap().clone();
    let fd = fd_of(&region);
    drop(region);
    d.leave();
    let (d, found) = adopt(fd);
    assert_eq!(found.orphans, 0);
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
}

#[test]
fn other_settings_are_refused_and_the_region_is_left_whole() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    model.churn(&d, &mut ctx, 5);
    let fd = fd_of(&region);
    drop(region);
    std::mem::forget(d);

    let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let zstd = DeviceConfig {
        algorithm: Algorithm::Zstd,
        ..config(&r)
    };
    let err = Device::adopt(zstd, PAGES * PAGE).unwrap_err();
    assert!(
        matches!(&err, Error::NotAdopted { reason } if reason.contains("codecs")),
        "{err}"
    );
    drop(r);
    let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
    let err = Device::adopt(config(&r), 2 * PAGES * PAGE).unwrap_err();
    assert!(err.to_string().contains("disksize"), "{err}");
    drop(r);

    let (d, _) = adopt(fd);
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
}

#[test]
fn check_adoptable_answers_as_adopt_would_while_the_device_serves() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    model.churn(&d, &mut ctx, 7);
    let fd = fd_of(&region);
    // Asked while the device still serves (as a new binary is, before an upgrade).
    Device::check_adoptable(&config(&region), PAGES * PAGE, fd.as_fd()).unwrap();
    let zstd = DeviceConfig {
        algorithm: Algorithm::Zstd,
        ..config(&region)
    };
    let err = Device::check_adoptable(&zstd, PAGES * PAGE, fd.as_fd()).unwrap_err();
    assert!(err.to_string().contains("codecs"), "{err}");
    let err = Device::check_adoptable(&config(&region), 2 * PAGES * PAGE, fd.as_fd()).unwrap_err();
    assert!(err.to_string().contains("disksize"), "{err}");
    // Nothing changed: the device goes on serving, then a successor adopts every page.
    model.churn(&d, &mut ctx, 8);
    model.verify(&d, &mut ctx);
    drop(ctx);
    drop(region);
    std::mem::forget(d);
    let (d, _) = adopt(fd);
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
}

#[test]
fn a_dropped_device_is_not_adopted() {
    let (d, region) = new_device();
    let mut ctx = d.context().unwrap();
    Model::default().churn(&d, &mut ctx, 6);
    let fd = fd_of(&region);
    drop(region);
    drop(d);
    let err = Region::adopt(fd).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
}

#[test]
fn prefaulted_leaves_and_chunks_are_taken_without_a_fault() {
    for prefault in [false, true] {
        let (d, _region) = new_device();
        let mut ctx = d.context().unwrap();
        if prefault {
            let (leaves, chunks) = d.prefault_region(true);
            assert_eq!(leaves, 8, "all 8 leaves of a 2048-page device");
            assert!(chunks > 400, "{chunks} chunks");
        }
        let mut model = Model::default();
        for page in 0..PAGES {
            let kind = PageKind::ALL[page as usize % PageKind::ALL.len()];
            model.write(&d, &mut ctx, page, &kind.content(page as u8, PAGE_SIZE));
        }
        model.verify(&d, &mut ctx);
        let (leaves, chunks) = d.region_unready();
        if prefault {
            assert_eq!((leaves, chunks), (0, 0));
        } else {
            assert_eq!(leaves, 8);
            assert!(chunks > 0);
        }
    }
}

/// A device with a backing store, in a region: its written-back pages survive hand-overs (the
/// successor reopens the same files with the same key and rebuilds the space maps from the
/// slots), new records never land on old ones, and a successor given another key, other files
/// or none is refused with the region left adoptable.
#[test]
fn written_back_pages_survive_each_hand_over() {
    use uzram_engine::device::writeback::WritebackRequest;
    use uzram_engine::BackingKey;

    let dir = std::env::temp_dir().join(format!("uzram-adopt-wb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("backing");
    let key = BackingKey::generate();
    let with = |region: &Region, path: &std::path::Path, key: Option<&BackingKey>| DeviceConfig {
        backing_devs: vec![path.to_path_buf()],
        backing_key: key.cloned(),
        ..config(region)
    };
    let size = Device::region_size(PAGES * PAGE).unwrap();
    let region = Region::create("uzram-device-adopt-wb-test", size).unwrap();
    // A device in a region makes no key of its own: no one could hand it on.
    let err = Device::new(with(&region, &file, None), PAGES * PAGE).unwrap_err();
    assert!(err.to_string().contains("key"), "{err}");
    drop(region);
    let region = Region::create("uzram-device-adopt-wb-test", size).unwrap();
    let d = Device::new(with(&region, &file, Some(&key)), PAGES * PAGE).unwrap();
    drop(region);
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    let mut d = d;
    for round in 0..3u64 {
        model.churn(&d, &mut ctx, 20 + round);
        d.mark_idle(None);
        let wb = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
        assert!(wb.written > 100, "round {round}: {wb:?}");
        // Some written-back pages are read (they stay there) or overwritten (their records
        // freed) before the hand-over.
        model.churn(&d, &mut ctx, 30 + round);
        model.verify(&d, &mut ctx);
        let backing = d.backing().unwrap();
        // Records kept for reuse are in no slot: a successor's space map has them free.
        let (pages, free) = (backing.pages(), backing.free_bytes() + backing.kept().1);
        assert!(pages > 50, "round {round}: {pages} pages written back");

        let region = d.region().unwrap().clone();
        let fd = fd_of(&region);
        d.leave();
        // Refused, each naming why, the region left as it was.
        let other = dir.join("other");
        std::fs::copy(&file, &other).unwrap();
        let refusals: [(DeviceConfig, &str); 4] = [
            (with(&region, &file, Some(&BackingKey::generate())), "key"),
            (with(&region, &file, None), "no key"),
            (with(&region, &other, Some(&key)), "not the backing file"),
            (config(&region), "backing store"),
        ];
        drop(region);
        for (cfg, why) in refusals {
            let r = Region::adopt(fd.try_clone().unwrap()).unwrap();
            let cfg = DeviceConfig {
                region: Some(r.clone()),
                ..cfg
            };
            let fd_now = fd.try_clone().unwrap();
            let checked = Device::check_adoptable(&cfg, PAGES * PAGE, fd_now.as_fd());
            let err = Device::adopt(cfg, PAGES * PAGE).unwrap_err();
            assert!(
                matches!(&err, Error::NotAdopted { reason } if reason.contains(why)),
                "round {round}, expected {why:?}: {err}"
            );
            assert!(
                checked.is_err(),
                "check_adoptable accepted what adopt refused: {err}"
            );
        }
        std::fs::remove_file(&other).unwrap();

        let r = Region::adopt(fd).unwrap();
        let cfg = with(&r, &file, Some(&key));
        drop(r);
        let (adopted, found) = Device::adopt(cfg, PAGES * PAGE).unwrap();
        d = adopted;
        assert_eq!(found.pages, model.0.len() as u64);
        let backing = d.backing().unwrap();
        assert_eq!(
            (backing.pages(), backing.free_bytes()),
            (pages, free),
            "round {round}: the space maps rebuilt from the slots"
        );
        ctx = d.context().unwrap();
        model.verify(&d, &mut ctx);
    }
    drop(ctx);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A backing file the user made, of a size that is no whole number of sectors: a successor
/// takes it (its identity is its size in bytes, not in sectors) and reads every page.
#[test]
fn a_backing_file_of_odd_size_is_adopted() {
    use std::os::unix::fs::OpenOptionsExt;
    use uzram_engine::device::writeback::WritebackRequest;
    use uzram_engine::BackingKey;

    let dir = std::env::temp_dir().join(format!("uzram-adopt-odd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("backing");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .unwrap()
        .set_len(1_000_001)
        .unwrap();
    let key = BackingKey::generate();
    let size = Device::region_size(PAGES * PAGE).unwrap();
    let region = Region::create("uzram-device-adopt-odd-test", size).unwrap();
    let cfg = |region: &Region| DeviceConfig {
        backing_devs: vec![file.clone()],
        backing_key: Some(key.clone()),
        ..config(region)
    };
    let d = Device::new(cfg(&region), PAGES * PAGE).unwrap();
    let fd = fd_of(&region);
    drop(region);
    let mut ctx = d.context().unwrap();
    let mut model = Model::default();
    model.churn(&d, &mut ctx, 40);
    d.mark_idle(None);
    assert!(
        d.writeback(&mut ctx, WritebackRequest::Idle)
            .unwrap()
            .written
            > 50
    );
    drop(ctx);
    d.leave();
    let r = Region::adopt(fd).unwrap();
    let (d, _) = Device::adopt(cfg(&r), PAGES * PAGE).unwrap();
    drop(r);
    let mut ctx = d.context().unwrap();
    model.verify(&d, &mut ctx);
    drop(ctx);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
