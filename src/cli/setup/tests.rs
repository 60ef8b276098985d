use super::*;

fn plan(text: &str, ram: f64) -> Vec<DevicePlan> {
    plan_zram_generator(&[("test.conf".into(), text.into())], ram).unwrap()
}

/// zram-generator's documented default: min(ram / 2, 4096) MiB, swap, priority 100, discard.
#[test]
fn the_default_section() {
    let p = plan("[zram0]\n", 2048.0);
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].line(),
        "device=/dev/ublkb0 size_bytes=1073741824 algorithm=default params=none recomp=none recompress=none mem_limit=0 writeback=none priority=100 fs=swap mount=none options=discard policy=none"
    );
    assert_eq!(plan("[zram0]\n", 16384.0)[0].size_bytes, 4096 << 20);
}

/// The example configuration shipped with zram-generator (zram-generator.conf.example,
/// https://github.com/systemd/zram-generator), with its `set!` directive's program replaced by
/// a fixed number, as zram-generator's own test of it does with a fake xenstore-read.
#[test]
fn zram_generators_example() {
    let text = "set!maxhotplug = echo 8192\n\
        [zram0]\n\
        host-memory-limit = 9048\n\
        zram-size = min(ram / 10, 2048)\n\
        zram-resident-limit = maxhotplug * 3/4\n\
        compression-algorithm = lzo-rle zstd(level=3) (type=idle)\n\
        options =\n\
        writeback-device = /dev/zvol/tarta-zoot/swap-writeback\n\
        [zram1]\n\
        fs-type = ext4\n\
        mount-point = /run/compressed-mount-point\n";
    let p = plan(text, 8000.0);
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].size_bytes, 800 << 20);
    assert_eq!(p[0].mem_limit, 6144 << 20);
    assert_eq!(p[0].algorithm.as_deref(), Some("lz4"));
    assert_eq!(p[0].recomp, vec!["algo=zstd priority=1 level=3"]);
    assert_eq!(p[0].recompress.as_deref(), Some("type=idle"));
    assert_eq!(p[0].options, "");
    assert!(p[0].warnings[0].contains("lzo-rle"), "{:?}", p[0].warnings);
    assert_eq!(
        p[0].line(),
        "device=/dev/ublkb0 size_bytes=838860800 algorithm=lz4 params=none recomp=\"algo=zstd priority=1 level=3\" recompress=type=idle mem_limit=6442450944 writeback=/dev/zvol/tarta-zoot/swap-writeback priority=100 fs=swap mount=none options=none policy=none"
    );
    assert_eq!(
        (p[1].fs.as_str(), p[1].mount.as_deref()),
        ("ext4", Some("/run/compressed-mount-point"))
    );
    // Above the host-memory-limit, zram0 is not made.
    let big = plan(text, 16384.0);
    assert_eq!(big.len(), 1);
    assert_eq!(big[0].device, "/dev/ublkb1");
}

/// The man page's piecewise-linear example: 1:1 up to 4G, then 1:2, at most 32G.
#[test]
fn the_man_pages_piecewise_size() {
    let text = "[zram0]\nzram-size = min(min(ram, 4096) + max(ram - 4096, 0) / 2, 32 * 1024)\n";
    assert_eq!(plan(text, 1024.0)[0].size_bytes, 1024 << 20);
    assert_eq!(plan(text, 12288.0)[0].size_bytes, 8192 << 20);
    assert_eq!(plan(text, 65536.0)[0].size_bytes, 32768 << 20);
}

#[test]
fn drop_ins_override_key_by_key_and_zero_sizes_vanish() {
    let files = [
        (
            "zram-generator.conf".to_string(),
            "[zram0]\nzram-size = ram\nswap-priority = 5\n[zram2]\n".to_string(),
        ),
        (
            "10-a.conf".to_string(),
            "[zram0]\nswap-priority = 50\n[zram2]\nzram-size = 0\n".to_string(),
        ),
    ];
    let p = plan_zram_generator(&files, 1000.0).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].size_bytes, p[0].priority), (1000 << 20, 50));
    assert!(plan_zram_generator(
        &[("x".into(), "[zram0]\nswap-priority = 99999\n".into())],
        1.0
    )
    .is_err());
    assert!(
        plan_zram_generator(&[("x".into(), "[zram0]\nzram-size = ram +\n".into())], 1.0).is_err()
    );
}

/// zram-tools' /etc/default/zramswap as shipped (every line commented), and with its
/// documented settings: ALGO, PERCENT (overrides SIZE), SIZE in MiB, PRIORITY.
#[test]
fn zramswap() {
    let shipped =
        "# Compression algorithm selection\n#ALGO=lz4\n#PERCENT=50\n#SIZE=256\n#PRIORITY=100\n";
    let p = plan_zramswap("zramswap", shipped, 4096.0).unwrap();
    assert_eq!(
        p[0].line(),
        "device=/dev/ublkb0 size_bytes=2147483648 algorithm=lz4 params=none recomp=none recompress=none mem_limit=0 writeback=none priority=100 fs=swap mount=none options=discard policy=none"
    );
    let set = "ALGO=zstd\nSIZE=256\nPRIORITY=10\n";
    let p = plan_zramswap("zramswap", set, 4096.0).unwrap();
    assert_eq!(
        (p[0].algorithm.as_deref(), p[0].size_bytes, p[0].priority),
        (Some("zstd"), 256 << 20, 10)
    );
    let both = "PERCENT=25\nSIZE=256\nALGO=lzo\n";
    let p = plan_zramswap("zramswap", both, 4096.0).unwrap();
    assert_eq!(p[0].size_bytes, 1024 << 20);
    assert_eq!(p[0].algorithm.as_deref(), Some("lz4"));
    assert!(plan_zramswap("zramswap", "SIZE=lots\n", 1.0).is_err());
}

#[test]
fn uzram_policy_is_planned_and_checked() {
    let conf = "[zram0]\nwriteback-device = /var/lib/uzram/zram0.img\nuzram-policy = writeback_after=2h budget=1G\n";
    let p = plan_zram_generator(&[("x".into(), conf.into())], 4096.0).unwrap();
    assert_eq!(p[0].policy.as_deref(), Some("writeback_after=2h budget=1G"));
    assert!(
        p[0].line()
            .ends_with(" policy=\"writeback_after=2h budget=1G\""),
        "{}",
        p[0].line()
    );
    let bad = "[zram0]\nuzram-policy = writeback_after=soon\n";
    assert!(plan_zram_generator(&[("x".into(), bad.into())], 4096.0).is_err());
}
