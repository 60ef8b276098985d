use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::super::testutil::{tempdir, text_page};
use super::*;
use crate::DeviceSetup;

fn setup(dir: &Path) -> (Device, PathBuf) {
    let path = dir.join("backing");
    let mut setup = DeviceSetup::new();
    setup.set_backing_dev(&path);
    (setup.init(4 << 20).unwrap(), path)
}

#[test]
fn written_back_pages_read_back_sealed_and_packed() {
    let dir = tempdir("wb-rt");
    let (d, path) = setup(&dir);
    let mut ctx = d.context().unwrap();
    let pages: Vec<[u8; PAGE_SIZE]> = (0..300).map(text_page).collect();
    for (i, p) in pages.iter().enumerate() {
        d.write(&mut ctx, i as u64 * 4096, p).unwrap();
    }
    let before = d.stats().mm;
    d.mark_idle(None);
    let s = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
    assert_eq!((s.candidates, s.written, s.failed), (300, 300, 0), "{s:?}");
    assert!(
        s.bytes * 2 <= 300 * 4096,
        "{} bytes for 300 pages: not packed",
        s.bytes
    );
    let after = d.stats().mm;
    assert_eq!(after.compr_data_size, 0, "{after:?}");
    assert!(after.mem_used_total < before.mem_used_total);
    assert_eq!(
        d.backing().unwrap().bd_stat(),
        "     300        0      300\n"
    );
    // Each record is read as the file's alignment allows, not as the 4 KiB blocks it touches:
    // from the alignment unit it starts in to the one it ends in.
    let b = d.backing().unwrap();
    let align = b.files()[0].read_align as u64;
    assert!(
        align.is_power_of_two() && (512..=4096).contains(&align),
        "{align}"
    );
    let want: u64 = (0..300)
        .map(|i| {
            let s = d.slot_state(PageIndex(i)).unwrap();
            let (_, sector) = BackingStore::split(s.word);
            let start = sector * SECTOR;
            let end = start + (NONCE + usize::from(s.size) + TAG) as u64;
            end.next_multiple_of(align) - start / align * align
        })
        .sum();
    let mut back = vec![0u8; PAGE_SIZE];
    for (i, p) in pages.iter().enumerate() {
        d.read(&mut ctx, i as u64 * 4096, &mut back).unwrap();
        assert_eq!(&back, p, "page {i}");
    }
    assert_eq!(b.bytes_read(), want, "alignment {align}");
    if align == SECTOR {
        // Direct I/O by the sector (this disk's): less than a 4 KiB block a record.
        assert!(want < 300 * 4096, "{want}");
    }
    // Nothing of the plain text is in the file: every line of a text page starts with
    // "uzram: ", which compression keeps as a literal at least once per page.
    let file = std::fs::read(&path).unwrap();
    assert!(pages[0].starts_with(b"uzram: "));
    assert!(
        !file.windows(7).any(|w| w == b"uzram: "),
        "plain text in the backing file"
    );
    let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    d.check_invariants().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flipped_byte_fails_that_read_with_an_error() {
    let dir = tempdir("wb-flip");
    let (d, path) = setup(&dir);
    let mut ctx = d.context().unwrap();
    d.write(&mut ctx, 0, &text_page(1)).unwrap();
    d.write(&mut ctx, 4096, &text_page(2)).unwrap();
    d.writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 1 })
        .unwrap();
    let sector = d.slot_state(PageIndex(0)).unwrap().word;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, sector * SECTOR + 40).unwrap();
    b[0] ^= 0x20;
    f.write_all_at(&b, sector * SECTOR + 40).unwrap();
    let mut back = vec![0u8; PAGE_SIZE];
    assert!(matches!(
        d.read(&mut ctx, 0, &mut back),
        Err(IoError::Backing {
            source: BackingError::Tampered { .. },
            ..
        })
    ));
    assert!(
        back.iter().all(|&x| x == 0),
        "a failed read returns no stale bytes"
    );
    d.read(&mut ctx, 4096, &mut back).unwrap();
    assert_eq!(back, text_page(2), "the neighbour is intact");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failed_writes_keep_pages_in_ram_and_frees_return_space() {
    let dir = tempdir("wb-fail");
    let (d, _path) = setup(&dir);
    let mut ctx = d.context().unwrap();
    for i in 0..20u64 {
        d.write(&mut ctx, i * 4096, &text_page(i)).unwrap();
    }
    d.backing().unwrap().set_fail_writes(true);
    let s = d
        .writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 19 })
        .unwrap();
    assert_eq!((s.written, s.failed), (0, 20), "{s:?}");
    assert_eq!(d.stats().mm.pages_compacted, 0);
    d.backing().unwrap().set_fail_writes(false);
    let s = d
        .writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 19 })
        .unwrap();
    assert_eq!(s.written, 20);
    let free_before = d.backing().unwrap().free_bytes();
    d.discard(0, 10 * 4096).unwrap();
    d.write(&mut ctx, 10 * 4096, &text_page(99)).unwrap();
    let free_after = d.backing().unwrap().free_bytes();
    assert!(
        free_after > free_before,
        "discard and overwrite free backing space"
    );
    assert_eq!(
        d.backing().unwrap().bd_stat().split_whitespace().next(),
        Some("9")
    );
    let mut back = vec![0u8; PAGE_SIZE];
    for i in 11..20u64 {
        d.read(&mut ctx, i * 4096, &mut back).unwrap();
        assert_eq!(back, text_page(i));
    }
    // The writeback limit stops a pass.
    let b = d.backing().unwrap();
    b.set_limit_enable(true);
    b.set_limit(2);
    let s = d
        .writeback(
            &mut ctx,
            WritebackRequest::Pages {
                first: 10,
                last: 10,
            },
        )
        .unwrap();
    assert_eq!(s.written, 1);
    assert_eq!(b.limit(), (true, 1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_others_may_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("wb-mode");
    let path = dir.join("open");
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(matches!(
        BackingStore::open(&path, 1 << 20, false),
        Err(BackingError::Unsafe { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_of_someone_elses_data_is_refused_unless_forced_and_records_spare_the_label() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("wb-label");
    let path = dir.join("document");
    let doc = b"my thesis\n".repeat(300_000);
    std::fs::write(&path, &doc).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = BackingStore::open(&path, 1 << 20, false).unwrap_err();
    assert!(matches!(e, BackingError::Foreign { offset: 0, .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), doc, "not a byte written");
    // A store uzram made is taken again, and writeback never writes over its label.
    let own = dir.join("own");
    let mut setup = crate::DeviceSetup::new();
    setup.set_backing_dev(&own);
    let d = setup.init(256 * PAGE_SIZE as u64).unwrap();
    let mut ctx = d.context().unwrap();
    for i in 0..200u64 {
        d.write(&mut ctx, i * PAGE_SIZE as u64, &text_page(i))
            .unwrap();
    }
    let s = d
        .writeback(
            &mut ctx,
            WritebackRequest::Pages {
                first: 0,
                last: 199,
            },
        )
        .unwrap();
    assert_eq!(s.written, 200);
    let mut back = [0u8; PAGE_SIZE];
    for i in 0..200u64 {
        d.read(&mut ctx, i * PAGE_SIZE as u64, &mut back).unwrap();
        assert!(back == text_page(i), "page {i}");
    }
    drop(d);
    assert!(std::fs::read(&own).unwrap().starts_with(b"uzram backing"));
    BackingStore::open(&own, 1 << 20, false).expect("uzram's own file");
    BackingStore::open(&path, 1 << 20, true).expect("forced");
    assert!(std::fs::read(&path).unwrap().starts_with(b"uzram backing"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writeback_syntax_is_zrams() {
    assert_eq!(
        "idle".parse::<WritebackRequest>().unwrap(),
        WritebackRequest::Idle
    );
    assert_eq!(
        "type=huge_idle".parse::<WritebackRequest>().unwrap(),
        WritebackRequest::HugeIdle
    );
    assert_eq!(
        "page_indexes=3-9".parse::<WritebackRequest>().unwrap(),
        WritebackRequest::Pages { first: 3, last: 9 }
    );
    for bad in ["cold", "page_index=x", "page_indexes=9-3", "page_indexes=4"] {
        assert!(bad.parse::<WritebackRequest>().is_err(), "{bad}");
    }
    // Linux 6.16's lists: ranges and pages, as many as given; a mode ends the list.
    use WritebackRequest::Pages;
    assert_eq!(
        WritebackRequest::parse_list("page_index=42 page_index=99 page_indexes=100-200\n").unwrap(),
        [
            Pages {
                first: 42,
                last: 42
            },
            Pages {
                first: 99,
                last: 99
            },
            Pages {
                first: 100,
                last: 200
            }
        ]
    );
    assert_eq!(
        WritebackRequest::parse_list("type=idle page_index=3").unwrap(),
        [WritebackRequest::Idle]
    );
    // After page indexes a mode narrows the last range, all of whose pages are taken.
    assert_eq!(
        WritebackRequest::parse_list("page_index=5 idle page_index=9").unwrap(),
        [Pages { first: 5, last: 5 }]
    );
    for bad in ["", " ", "page_index=1 cold", "page_idx=5"] {
        assert!(WritebackRequest::parse_list(bad).is_err(), "{bad:?}");
    }
}

/// Through the attributes: each range of a list is written back, and nothing else; zram's
/// newer attributes answer as zram's do on an initialised device.
#[test]
fn a_list_of_ranges_writes_back_those_pages_and_the_newer_attributes_answer() {
    use crate::attrs::{read, write, DaemonInfo};
    let dir = tempdir("wb-list");
    let (d, _) = setup(&dir);
    let mut ctx = d.context().unwrap();
    for i in 0..16u64 {
        d.write(&mut ctx, i * 4096, &text_page(i)).unwrap();
    }
    write(
        &d,
        "writeback",
        "page_index=1 page_indexes=4-6 page_index=9",
    )
    .unwrap();
    let written: Vec<u64> = (0..16)
        .filter(|&i| {
            d.slot_state(PageIndex(i))
                .unwrap()
                .flags
                .contains(SlotFlags::WB)
        })
        .collect();
    assert_eq!(written, [1, 4, 5, 6, 9]);
    for i in 0..16u64 {
        let mut back = vec![0u8; 4096];
        d.read(&mut ctx, i * 4096, &mut back).unwrap();
        assert_eq!(back, text_page(i), "page {i}");
    }
    let pages = d.disksize() / 4096;
    let past = format!("page_index=2 page_indexes=3-{pages}");
    assert_eq!(
        write(&d, "writeback", &past).unwrap_err().errno,
        libc::ERANGE
    );
    assert!(
        !d.slot_state(PageIndex(2))
            .unwrap()
            .flags
            .contains(SlotFlags::WB),
        "nothing written on ERANGE"
    );

    let info = DaemonInfo::default();
    assert_eq!(read(&d, &info, "writeback_batch_size").unwrap(), "256\n");
    write(&d, "writeback_batch_size", "2").unwrap();
    assert_eq!(read(&d, &info, "writeback_batch_size").unwrap(), "2\n");
    for bad in ["0", "-1", "many", "4294967296"] {
        let e = write(&d, "writeback_batch_size", bad).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL, "{bad}");
    }
    // Two at a time: the rest of the pages still all go.
    write(&d, "writeback", "page_indexes=10-14").unwrap();
    assert!((10..=14).all(|i| d
        .slot_state(PageIndex(i))
        .unwrap()
        .flags
        .contains(SlotFlags::WB)));
    assert_eq!(read(&d, &info, "compressed_writeback").unwrap(), "1\n");
    for (value, errno) in [
        ("yes", libc::EBUSY),
        ("0", libc::EBUSY),
        ("on", libc::EBUSY),
    ] {
        assert_eq!(
            write(&d, "compressed_writeback", value).unwrap_err().errno,
            errno
        );
    }
    for bad in ["maybe", "o", ""] {
        let e = write(&d, "compressed_writeback", bad).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL, "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A page freed and written again while its old object is being written back may come back
/// with a state equal to the one taken (its handle reused at once, the same size, the same
/// second): the commit must still see it changed, by the slot's generation, and leave the new
/// data in RAM.
#[test]
fn a_page_rewritten_with_an_equal_state_during_writeback_keeps_its_new_data() {
    let dir = tempdir("wb-aba");
    let (d, _) = setup(&dir);
    let mut ctx = d.context().unwrap();
    let (old, new) = (
        crate::testing::pages::noise_page(1),
        crate::testing::pages::noise_page(2),
    );
    d.write(&mut ctx, 0, &old).unwrap();
    let backing = d.backing().unwrap();
    let mut bufs = WbBuffers::new(4);
    let keep = |_: &SlotState| true;
    let sectors = d
        .tiering()
        .pick(&d, &mut bufs, None, &[PageIndex(0)], &keep, true);
    let extent = backing.reserve(sectors).unwrap();
    let len = ((sectors * SECTOR) as usize).next_multiple_of(ALIGN);
    d.tiering()
        .seal_taken(&d, backing, &mut bufs, &extent, len, true);
    backing.write_extent(&extent, &bufs.out[..len]).unwrap();
    // Meanwhile swap frees the slot and writes it again: the freed handle is handed out anew.
    let taken = d.slot_state(PageIndex(0)).unwrap();
    d.discard(0, PAGE_SIZE as u64).unwrap();
    d.write(&mut ctx, 0, &new).unwrap();
    assert_eq!(
        d.slot_state(PageIndex(0)).unwrap(),
        taken,
        "the test needs the rewritten page's state equal to the one taken"
    );
    let mut stats = BatchStats::default();
    d.tiering()
        .commit(&d, backing, &bufs, &extent, true, &mut stats);
    assert_eq!(stats.written, 0, "the rewritten page was committed");
    let mut back = vec![0u8; PAGE_SIZE];
    d.read(&mut ctx, 0, &mut back).unwrap();
    assert!(back == new.to_vec(), "the page lost its new data");
    d.check_invariants().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A successor seals under the same key as its predecessor but in the next epoch: its nonces
/// (whose counter starts again at 1) never repeat one of the predecessor's, and each opens the
/// other's records.
#[test]
fn a_successors_nonces_are_its_own_and_records_open_across_epochs() {
    let dir = tempdir("wb-epoch");
    let path = dir.join("backing");
    let key = BackingKey::generate();
    let data = [7u8; 100];
    let mut sealed = Vec::new();
    // Made in epoch 0, reopened by a successor in epoch 1.
    for adopting in [None, Some(1)] {
        let store =
            BackingStore::open_keyed(std::slice::from_ref(&path), 1 << 20, false, &key, adopting)
                .unwrap();
        assert_eq!(store.epoch(), adopting.unwrap_or(0));
        let mut out = vec![0u8; NONCE + data.len() + TAG];
        out[NONCE..NONCE + data.len()].copy_from_slice(&data);
        store.seal(
            PageIndex(3),
            BackingStore::location(0, 8),
            data.len(),
            &mut out,
        );
        assert_eq!(store.key_check(), key.check_value());
        sealed.push(out);
    }
    assert_ne!(
        sealed[0][..NONCE],
        sealed[1][..NONCE],
        "the same nonce under one key"
    );
    assert_eq!(&sealed[1][8..NONCE], &1u32.to_le_bytes());
    // Another key's check value differs: a successor given it is refused.
    assert_ne!(BackingKey::generate().check_value(), key.check_value());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store that is not made leaves its files as it found them: a file it created is gone, an
/// empty one is empty again, and a start it labelled (forced, over a document) is restored.
#[test]
fn a_store_that_fails_to_open_leaves_its_files_as_they_were() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("wb-undo");
    let new = dir.join("new");
    let empty = dir.join("empty");
    let doc = dir.join("document");
    let text = b"my thesis\n".repeat(30_000);
    std::fs::write(&empty, b"").unwrap();
    std::fs::write(&doc, &text).unwrap();
    for p in [&empty, &doc] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // Each store's second file is not usable (a character device): its first is put back.
    for (first, force) in [(&new, false), (&empty, false), (&doc, true)] {
        let paths = [first.clone(), PathBuf::from("/dev/null")];
        let e = BackingStore::open_all(&paths, 1 << 20, force).unwrap_err();
        assert!(matches!(e, BackingError::NotUsable { .. }), "{e}");
    }
    assert!(!new.exists(), "the file it created is left");
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    assert!(std::fs::read(&doc).unwrap() == text, "the document's start");
    // One file named twice (under two names): refused before either is touched.
    let alias = dir.join(".").join("empty");
    let e = BackingStore::open_all(&[empty.clone(), alias], 1 << 20, false).unwrap_err();
    assert!(matches!(e, BackingError::Config(_)), "{e}");
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    let e = BackingStore::open_all(&[new.clone(), new.clone()], 1 << 20, false).unwrap_err();
    assert!(matches!(e, BackingError::Config(_)), "{e}");
    assert!(!new.exists());
    // And a store that is made keeps what it made.
    drop(BackingStore::open_all(&[new.clone(), empty.clone()], 1 << 20, false).unwrap());
    assert!(std::fs::read(&new).unwrap().starts_with(b"uzram backing"));
    assert!(std::fs::read(&empty).unwrap().starts_with(b"uzram backing"));
    let _ = std::fs::remove_dir_all(&dir);
}
