//! The attributes' tests: zram's bytes, the table's modes, uzram's own figures.

use super::*;
use crate::DeviceSetup;

fn device() -> Device {
    DeviceSetup::new().init(16 << 20).unwrap()
}

#[test]
fn reads_are_zrams_bytes() {
    let d = device();
    let info = DaemonInfo {
        streams: 2,
        ..Default::default()
    };
    assert_eq!(read(&d, &info, "disksize").unwrap(), "16777216\n");
    assert_eq!(read(&d, &info, "initstate").unwrap(), "1\n");
    assert_eq!(read(&d, &info, "comp_algorithm").unwrap(), "[lz4] zstd \n");
    assert_eq!(read(&d, &info, "max_comp_streams").unwrap(), "2\n");
    assert_eq!(
        read(&d, &info, "mm_stat").unwrap(),
        "       0        0        0        0        0        0        0        0        0\n"
    );
    assert_eq!(
        read(&d, &info, "io_stat").unwrap(),
        "       0        0 0        0\n"
    );
    assert_eq!(
        read(&d, &info, "debug_stat").unwrap(),
        "version: 1\n       0        0\n"
    );
    // Linux 6.14 dropped writestall: a bare 0 in its place.
    for kernel in [(6, 14), (6, 18), (7, 3)] {
        let newer = DaemonInfo {
            kernel: Some(kernel),
            ..Default::default()
        };
        assert_eq!(
            read(&d, &newer, "debug_stat").unwrap(),
            "version: 1\n0        0\n"
        );
    }
}

#[test]
fn uzram_stat_carries_the_queue_threads_counts() {
    let d = device();
    let info = DaemonInfo {
        round_trips: RoundTrips {
            requests: 10,
            ring_enters: 7,
            copies: 9,
            switches_voluntary: 5,
            switches_involuntary: 2,
        },
        ..Default::default()
    };
    let stat = read(&d, &info, "uzram_stat").unwrap();
    for want in [
        "queue_requests 10\n",
        "queue_ring_enters 7\n",
        "queue_copies 9\n",
        "queue_switches_voluntary 5\n",
        "queue_switches_involuntary 2\n",
    ] {
        assert!(stat.contains(want), "{want:?} in {stat}");
    }
}

#[test]
fn the_table_is_sorted_and_each_mode_matches_what_the_attribute_does() {
    let d = device();
    let names: Vec<&str> = ATTRIBUTES.iter().map(|a| a.name).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(names, sorted, "sorted, each once");
    for a in ATTRIBUTES {
        let readable = a.access != Access::Write;
        let writable = a.access != Access::Read;
        assert_eq!(a.show.is_some(), readable, "{}", a.name);
        assert_eq!(!matches!(a.store, Store::No), writable, "{}", a.name);
        let r = read(&d, &DaemonInfo::default(), a.name);
        assert_eq!(r.is_ok(), readable, "{}: {r:?}", a.name);
        if !writable {
            assert_eq!(write(&d, a.name, "1").unwrap_err().errno, libc::EACCES);
        }
    }
    assert_eq!(access("nope").unwrap_err().errno, libc::ENOENT);
}

#[test]
fn modes_and_values_fail_as_zram_does() {
    let d = device();
    let info = DaemonInfo::default();
    assert_eq!(
        read(&d, &info, "mem_limit").unwrap_err().errno,
        libc::EACCES
    );
    assert_eq!(read(&d, &info, "nope").unwrap_err().errno, libc::ENOENT);
    assert_eq!(write(&d, "mm_stat", "1").unwrap_err().errno, libc::EACCES);
    assert_eq!(
        write(&d, "mem_used_max", "1").unwrap_err().errno,
        libc::EINVAL
    );
    assert_eq!(
        write(&d, "mem_limit", "lots").unwrap_err().errno,
        libc::EINVAL
    );
    assert_eq!(write(&d, "disksize", "1G").unwrap_err().errno, libc::EBUSY);
    assert_eq!(
        write(&d, "comp_algorithm", "zstd").unwrap_err().errno,
        libc::EBUSY
    );
    // mem_limit takes effect: mm_stat's fourth column.
    write(&d, "mem_limit", "2M").unwrap();
    let mm = read(&d, &info, "mm_stat").unwrap();
    assert_eq!(mm.split_whitespace().nth(3), Some("2097152"), "{mm}");
    write(&d, "mem_used_max", "0").unwrap();
    write(&d, "compact", "1").unwrap();
    write(&d, "max_comp_streams", "4").unwrap();
    assert_eq!(write(&d, "idle", "soon").unwrap_err().errno, libc::EINVAL);
    write(&d, "idle", "all").unwrap();
    // No secondary algorithm: recompress refuses, as zram does.
    assert_eq!(
        write(&d, "recompress", "type=idle").unwrap_err().errno,
        libc::EINVAL
    );
    assert_eq!(read(&d, &info, "recomp_algorithm").unwrap(), "");
}

#[test]
fn recompression_through_the_attributes() {
    let mut setup = DeviceSetup::new();
    setup.set_recomp_algorithm("algo=zstd priority=1").unwrap();
    let d = setup.init(1 << 20).unwrap();
    let info = DaemonInfo::default();
    assert_eq!(
        read(&d, &info, "recomp_algorithm").unwrap(),
        "#1: lz4 [zstd] \n"
    );
    assert_eq!(
        write(&d, "recomp_algorithm", "algo=lz4").unwrap_err().errno,
        libc::EBUSY
    );
    let mut ctx = d.context().unwrap();
    let page: Vec<u8> = (0..4096).map(|i| (i * 7 % 251 / 3) as u8).collect();
    d.write(&mut ctx, 0, &page).unwrap();
    write(&d, "idle", "all").unwrap();
    assert_eq!(
        write(&d, "recompress", "type=cold").unwrap_err().errno,
        libc::EINVAL
    );
    write(&d, "recompress", "type=idle").unwrap();
    assert_eq!(d.slot_state(crate::PageIndex(0)).unwrap().prio, 1);
    let mut back = vec![0u8; 4096];
    d.read(&mut ctx, 0, &mut back).unwrap();
    assert_eq!(back, page);
}
