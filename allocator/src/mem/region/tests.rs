use super::chunks::CHUNK_BYTES;
use super::*;
use crate::mem::Prefault;
use std::sync::atomic::AtomicU64;

fn size(arenas: u32, meta_bytes: usize) -> RegionSize {
    RegionSize {
        arenas,
        meta_bytes,
        table_bytes: 0,
    }
}

fn dup(r: &Region) -> OwnedFd {
    r.fd().try_clone_to_owned().unwrap()
}

#[test]
fn a_region_is_adopted_with_its_arenas_bytes() {
    let r = Region::create("uzram-test", size(8, 10_000)).unwrap();
    assert_eq!(r.meta_bytes(), 12_288);
    let mut m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
    assert_eq!(m.place(), Some(0));
    m.bytes_mut()[..5].copy_from_slice(b"hello");
    m.bytes_mut()[ARENA_BYTES - 1] = 7;
    let fd = dup(&r);
    // The predecessor dies without unmapping: its mapping is leaked, not dropped.
    std::mem::forget(m);
    drop(r);

    let r2 = Region::adopt(fd).unwrap();
    assert_eq!(r2.max_arenas(), 8);
    let m2 = r2.map_existing(0).unwrap();
    assert_eq!(&m2.bytes()[..5], b"hello");
    assert_eq!(m2.bytes()[ARENA_BYTES - 1], 7);
    assert!(r2.map_existing(0).is_err(), "a place is claimed once");
    assert!(r2.map_existing(8).is_err(), "past the end");
    // A new arena takes the next free place and starts empty.
    let m3 = r2.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
    assert_eq!(m3.place(), Some(1));
    assert!(m3.bytes().iter().all(|&b| b == 0));
}

#[test]
fn giving_an_arena_back_punches_its_pages_out() {
    let r = Region::create("uzram-test", size(4, 0)).unwrap();
    let base = r.resident_bytes().unwrap();
    let mut m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
    m.bytes_mut().fill(0xa5);
    assert_eq!(r.resident_bytes().unwrap(), base + ARENA_BYTES as u64);
    drop(m);
    assert_eq!(r.resident_bytes().unwrap(), base);
    let m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
    assert_eq!(m.place(), Some(0), "the place is free again");
    assert!(m.bytes().iter().all(|&b| b == 0));
}

#[test]
fn chunks_keep_their_tags_and_words_across_an_adoption() {
    let r = Region::create("uzram-test", size(1, 4 * PAGE_SIZE)).unwrap();
    let mut a = r.claim_chunk(7).unwrap();
    let mut b = r.claim_chunk(9).unwrap();
    let c = r.claim_chunk(7).unwrap();
    a[0] = 11;
    b[CHUNK_WORDS - 1] = 22;
    let fd = dup(&r);
    let c_index = c.index();
    std::mem::forget((a, b));
    drop(c); // dropped, not given back: still tagged
    drop(r);
    let r2 = Region::adopt(fd).unwrap();
    let found = r2.take_adopted_chunks(|_| true);
    let tags: Vec<u64> = found.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, [7, 9, 7]);
    assert_eq!(found[0].1[0], 11);
    assert_eq!(found[1].1[CHUNK_WORDS - 1], 22);
    assert_eq!(found[2].1.index(), c_index);
    let d = r2.claim_chunk(1).unwrap();
    assert_eq!(d.index(), 3, "a new chunk comes after the adopted ones");
    assert!(d.iter().all(|&w| w == 0));
}

#[test]
fn a_full_metadata_area_refuses_another_chunk() {
    for bytes in [PAGE_SIZE, 3 * PAGE_SIZE, 64 * PAGE_SIZE] {
        let r = Region::create("uzram-test", size(1, bytes)).unwrap();
        let n = r.usable_chunks();
        assert!(n as usize >= bytes / (CHUNK_BYTES + 8) - 1, "{bytes}: {n}");
        let all: Vec<Chunk> = (0..n)
            .map(|i| r.claim_chunk(u64::from(i)).unwrap())
            .collect();
        // The last chunk's last word is inside the area (a fault past it would be SIGBUS
        // or a segfault here).
        let mut last = all.into_iter().last().unwrap();
        last[CHUNK_WORDS - 1] = 1;
        assert!(matches!(r.claim_chunk(0), Err(Error::RegionFull { .. })));
    }
}

#[test]
fn the_table_area_keeps_its_words() {
    use std::sync::atomic::Ordering::Relaxed;
    let r = Region::create(
        "uzram-test",
        RegionSize {
            arenas: 1,
            meta_bytes: 0,
            table_bytes: 64 * PAGE_SIZE,
        },
    )
    .unwrap();
    let t = r.table();
    assert_eq!(t.len(), 64 * PAGE_SIZE / 8);
    t[0].store(1, Relaxed);
    t[5 * 512 + 7].store(2, Relaxed);
    t[t.len() - 1].store(4, Relaxed);
    let fd = dup(&r);
    drop(r);
    let r = Region::adopt(fd).unwrap();
    let t = r.table();
    assert_eq!(
        [
            t[0].load(Relaxed),
            t[5 * 512 + 7].load(Relaxed),
            t[1].load(Relaxed)
        ],
        [1, 2, 0]
    );
    assert_eq!(t[t.len() - 1].load(Relaxed), 4);
}

#[test]
fn a_full_region_refuses_another_arena() {
    let r = Region::create("uzram-test", size(1, 0)).unwrap();
    let _m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
    assert_eq!(
        r.map_new(Prefault::Touch, &AtomicU64::new(0)).err(),
        Some(libc::ENOSPC)
    );
}

#[test]
fn a_corrupted_header_is_refused_with_the_reason() {
    for (word, bit, says) in [
        (H_MAGIC, 3, "magic"),
        (H_VERSION, 1, "format version"),
        (H_ARENAS, 0, "checksum"),
        (H_CHECKSUM, 63, "checksum"),
    ] {
        let r = Region::create("uzram-test", size(2, 0)).unwrap();
        assert!(Region::check(r.fd()).is_ok());
        r.corrupt_header(word, bit);
        let checked = Region::check(r.fd()).unwrap_err().to_string();
        assert!(checked.contains(says), "word {word}: {checked}");
        let err = Region::adopt(dup(&r)).unwrap_err().to_string();
        assert!(err.contains(says), "word {word}: {err}");
    }
}

#[test]
fn check_refuses_a_closed_region_and_a_file_that_is_not_one() {
    let r = Region::create("uzram-test", size(2, 0)).unwrap();
    r.close();
    let err = Region::check(r.fd()).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    let err = Region::check(f.as_fd()).unwrap_err().to_string();
    assert!(err.contains("memfd"), "{err}");
}

#[test]
fn a_file_that_is_not_a_sealed_region_is_refused() {
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    let err = Region::adopt(OwnedFd::from(f)).unwrap_err().to_string();
    assert!(err.contains("memfd"), "{err}");
    // A memfd whose size was never sealed.
    let name = CString::new("uzram-test").unwrap();
    // SAFETY: valid name and flags; checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: fresh descriptor owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain call on our descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 22) }, 0);
    let err = Region::adopt(fd).unwrap_err().to_string();
    assert!(err.contains("sealed"), "{err}");
}
