//! The setup's reading of configurations, against the tools it replaces: zram-generator 1.2's
//! own test cases (its `tests/NN-*` directories and the unit tests of its `src/config.rs`,
//! each test below says which) and zram-tools' `zramswap` rules. The expected numbers follow
//! from those tools' rules: MemTotal 801322 kB is `ram` = 782 MiB, 8013220 kB is 7825 MiB.

use std::path::{Path, PathBuf};

use super::*;

const MEM_782: u64 = 801_322;
const MEM_7825: u64 = 8_013_220;
const MIB: u64 = 1 << 20;

/// A root directory of `files` (path under the root, text), `proc/meminfo` with MemTotal
/// `kb`, and `proc/cmdline` if given; as zram-generator's test harness lays one out.
fn root(tag: &str, files: &[(&str, &str)], kb: u64, cmdline: Option<&str>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uzram-setup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    std::fs::write(
        dir.join("proc/meminfo"),
        format!("MemTotal:       {kb} kB\nMemFree:         1000 kB\n"),
    )
    .unwrap();
    if let Some(c) = cmdline {
        std::fs::write(dir.join("proc/cmdline"), c).unwrap();
    }
    dir
}

fn plan_root(dir: &Path) -> Result<(Vec<DevicePlan>, Vec<String>), SetupError> {
    let host = Host::read(dir, None)?;
    let r = load_plan(None, &host).map(|l| (l.plan, l.notes));
    let _ = std::fs::remove_dir_all(dir);
    r
}

fn plan_text(text: &str, ram: u64) -> Result<Vec<DevicePlan>, SetupError> {
    generator::plan(&[("test.conf".into(), text.into())], ram, None).map(|(p, _)| p)
}

const MAIN: &str = "usr/lib/systemd/zram-generator.conf";
const ETC: &str = "etc/systemd/zram-generator.conf";

/// tests/01-basic: the default section, min(ram / 2, 4096) MiB of swap, priority 100, discard.
#[test]
fn zram_generator_01_basic() {
    let (p, _) = plan_root(&root("01", &[(MAIN, "[zram0]\n")], MEM_782, None)).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].line(),
        format!("device=/dev/ublkb0 size_bytes={} algorithm=default params=none recomp=none recompress=none mem_limit=0 writeback=none priority=100 fs=swap mount=none options=discard policy=none", 391 * MIB)
    );
}

/// tests/02-zstd: `set!` variables (the last one's command exits 1: a warning, its output
/// used), `ram * ratio` with ratio 3/4, a resident limit in MiB.
#[test]
fn zram_generator_02_zstd_and_set_variables() {
    let conf = "set!top = echo 3\nset!bottom = echo 4\nset!ratio = ! echo top / bottom\n\
        [zram0]\ncompression-algorithm = zstd\nhost-memory-limit = 2050\n\
        zram-resident-limit = 9999\nzram-size = ram * ratio\n";
    let (p, notes) = plan_root(&root("02", &[(ETC, conf)], MEM_782, None)).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].size_bytes, 614_989_824, "586.5 MiB, to the byte");
    assert_eq!(p[0].mem_limit, 9999 * MIB);
    assert_eq!(p[0].algorithm.as_deref(), Some("zstd"));
    assert!(
        notes
            .iter()
            .any(|n| n.contains("set!ratio") && n.contains("exit")),
        "{notes:?}"
    );
}

/// tests/03-too-much-memory: host-memory-limit 7824 on 7825 MiB: no device; equal is not
/// "too much".
#[test]
fn zram_generator_03_too_much_memory() {
    let conf = "[zram0]\nhost-memory-limit=7824\n";
    let (p, _) = plan_root(&root("03", &[(ETC, conf)], MEM_7825, None)).unwrap();
    assert!(p.is_empty());
    let conf = "[zram0]\nhost-memory-limit=7825\n";
    let (p, _) = plan_root(&root("03b", &[(ETC, conf)], MEM_7825, None)).unwrap();
    assert_eq!(p.len(), 1);
}

/// tests/04-dropins: drop-ins by name over directories, an empty drop-in masking the vendor's
/// of the same name, a later key winning, an empty `options`.
#[test]
fn zram_generator_04_dropins() {
    let files = [
        (MAIN, "[zram0]\n"),
        (
            "usr/lib/systemd/zram-generator.conf.d/01-drop1.conf",
            "[zram0]\nhost-memory-limit=1234\n",
        ),
        (
            "usr/lib/systemd/zram-generator.conf.d/02-drop2.conf",
            "[zram0]\nhost-memory-limit=1235\n",
        ),
        (
            "usr/lib/systemd/zram-generator.conf.d/03-drop3.conf",
            "[zram0]\nhost-memory-limit=1236\n[zram1]\nzram-size=ram*0.7\n",
        ),
        ("etc/systemd/zram-generator.conf.d/03-drop3.conf", ""),
        (
            "etc/systemd/zram-generator.conf.d/04-drop4.conf",
            "[zram2]\nzram-size=ram*0.8\nswap-priority=200\noptions=\n",
        ),
        (
            "etc/systemd/zram-generator.conf.d/zram-generator.conf",
            "# comments only\n",
        ),
    ];
    let (p, _) = plan_root(&root("04", &files, MEM_782, None)).unwrap();
    let got: Vec<_> = p
        .iter()
        .map(|d| {
            (
                d.device.as_str(),
                d.size_bytes,
                d.priority,
                d.options.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("/dev/ublkb0", 391 * MIB, 100, "discard"),
            ("/dev/ublkb2", 655_989_145, 200, ""),
        ]
    );
}

/// tests/05-kernel-disabled: `systemd.zram=0` on the kernel command line: no device at all.
#[test]
fn zram_generator_05_kernel_disabled() {
    let cmdline = "asfdasdf=foobar bar=foood systemd.zram=0\n";
    let (p, notes) =
        plan_root(&root("05", &[(MAIN, "[zram0]\n")], MEM_7825, Some(cmdline))).unwrap();
    assert!(p.is_empty());
    assert!(notes[0].contains("systemd.zram=0"), "{notes:?}");
}

/// tests/06-kernel-enabled: `systemd.zram` and no configuration: zram0 at the default size,
/// min(7825 / 2, 4096) = 3912.5 MiB.
#[test]
fn zram_generator_06_kernel_enabled() {
    let (p, _) = plan_root(&root("06", &[], MEM_7825, Some("\n\nsystemd.zram\n\n"))).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].device.as_str(), p[0].size_bytes),
        ("/dev/ublkb0", 4_102_553_600)
    );
    // An existing [zram0] is kept as it is (its host-memory-limit still applies).
    let conf = "[zram0]\nhost-memory-limit=100\n";
    let (p, _) = plan_root(&root(
        "06b",
        &[(ETC, conf)],
        MEM_7825,
        Some("systemd.zram=1"),
    ))
    .unwrap();
    assert!(p.is_empty());
}

/// tests/07-mount-point and 07a: mount points normalised as zram-generator writes `Where=`.
#[test]
fn zram_generator_07_mount_points() {
    let conf = "[zram11]\nmount-point=/var/compressed\nfs-type=ext4\n\
        [zram12]\nmount-point=/var/folded\nfs-type=ext4\noptions=discard,casefold\n\
        [zram13]\nmount-point=/foo//bar/baz/\nfs-type=ext4\n\
        [zram14]\nmount-point = /.żupan-ci3pły\nfs-type = ext4\n";
    let (p, _) = plan_root(&root("07", &[(ETC, conf)], MEM_782, None)).unwrap();
    let got: Vec<_> = p
        .iter()
        .map(|d| {
            (
                d.device.as_str(),
                d.mount.as_deref().unwrap(),
                d.options.as_str(),
                d.size_bytes,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("/dev/ublkb11", "/var/compressed", "discard", 391 * MIB),
            ("/dev/ublkb12", "/var/folded", "discard,casefold", 391 * MIB),
            ("/dev/ublkb13", "/foo/bar/baz", "discard", 391 * MIB),
            ("/dev/ublkb14", "/.żupan-ci3pły", "discard", 391 * MIB),
        ]
    );
    assert!(p.iter().all(|d| d.fs == "ext4"));
    // zram-generator's test also plans [zram15] at "///", the root: uzram refuses it (a new
    // file system there would hide the whole system).
    let root15 = "[zram15]\nmount-point=///\nfs-type=ext4\n";
    let e = plan_root(&root("07b", &[(ETC, root15)], MEM_782, None)).unwrap_err();
    assert!(e.to_string().contains("over the root"), "{e}");
}

/// tests/08-plain-device: fs-type without mount-point: a device with a file system, not
/// mounted (zram-generator makes no unit for it).
#[test]
fn zram_generator_08_plain_device() {
    let (p, _) = plan_root(&root(
        "08",
        &[(ETC, "[zram11]\nfs-type = ext2\n")],
        MEM_782,
        None,
    ))
    .unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].fs.as_str(), p[0].mount.as_deref()), ("ext2", None));
}

/// tests/09-zram-size: algorithm parameters in parentheses (`,` for blanks), a global
/// recompression list, `min(0.75 * ram, 6000)`.
#[test]
fn zram_generator_09_zram_size() {
    let conf =
        "[zram0]\ncompression-algorithm = zstd(dictionary=/etc/gaming,level=9) (recompargs)\n\
        host-memory-limit = 2050\nzram-size = min(0.75 * ram, 6000)\n";
    let p = plan_text(conf, 782).unwrap();
    assert_eq!(p[0].size_bytes, 614_989_824);
    assert_eq!(p[0].algorithm.as_deref(), Some("zstd"));
    assert_eq!(
        p[0].params.as_deref(),
        Some("dictionary=/etc/gaming level=9")
    );
    assert_eq!(p[0].recompress.as_deref(), Some("recompargs"));
    // Not a request zram's recompress takes: said, with the value, and planned all the same.
    assert!(
        p[0].warnings
            .iter()
            .any(|w| w.contains("(recompargs)") && w.contains("global recompression parameters")),
        "{:?}",
        p[0].warnings
    );
    assert_eq!(p[0].failed, None);
    // A request uzram refuses for another reason gets no such hint.
    let p = plan_text("[zram0]\ncompression-algorithm = zstd (type=cold)\n", 782).unwrap();
    assert!(
        p[0].warnings.iter().any(|w| w.starts_with("(type=cold): ")
            && w.contains("idle, huge or huge_idle")
            && !w.contains("no blank")),
        "{:?}",
        p[0].warnings
    );
    // A blank between an algorithm and its parameters makes them global: the hint says so.
    let p = plan_text("[zram0]\ncompression-algorithm = zstd (level=3)\n", 782).unwrap();
    assert_eq!(p[0].recompress.as_deref(), Some("level=3"));
    assert!(
        p[0].warnings
            .iter()
            .any(|w| w.starts_with("(level=3): ") && w.contains("no blank between")),
        "{:?}",
        p[0].warnings
    );
}

/// tests/10-example: zram-generator.conf.example (its `set!` program, xenstore-read, is a fake
/// printing `8 * 1024` in the original's test too).
#[test]
fn zram_generator_10_example() {
    let conf = "set!maxhotplug = echo '8 * 1024'\n\
        [zram0]\nhost-memory-limit = 9048\nzram-size = min(ram / 10, 2048)\n\
        zram-resident-limit = maxhotplug * 3/4\n\
        compression-algorithm = lzo-rle zstd(level=3) (type=idle)\noptions =\n\
        writeback-device = /dev/zvol/tarta-zoot/swap-writeback\n\
        [zram1]\nzram-size = ram / 10\nfs-type = ext2\nmount-point = /run/compressed-mount-point\n";
    let p = plan_text(conf, 782).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].size_bytes, 81_998_643);
    assert_eq!(p[0].mem_limit, 6_442_450_944);
    assert_eq!(
        p[0].algorithm.as_deref(),
        Some("lz4"),
        "lzo-rle maps to lz4"
    );
    assert_eq!(p[0].recomp, vec!["algo=zstd priority=1 level=3"]);
    assert_eq!(p[0].recompress.as_deref(), Some("type=idle"));
    assert_eq!(p[0].options, "");
    assert!(p[0].warnings[0].contains("lzo-rle"), "{:?}", p[0].warnings);
    // The zvol is not on this machine: as zram-generator's setup, that device fails, alone.
    assert!(
        p[0].failed.as_deref().is_some_and(|f| f
            .contains("writeback-device=/dev/zvol/tarta-zoot/swap-writeback: it does not exist")),
        "{:?}",
        p[0].failed
    );
    assert_eq!(p[1].failed, None);
    assert_eq!(
        (
            p[1].fs.as_str(),
            p[1].mount.as_deref(),
            p[1].size_bytes,
            p[1].mem_limit
        ),
        ("ext2", Some("/run/compressed-mount-point"), 81_998_643, 0)
    );
    // Above the host-memory-limit, zram0 is not made.
    let big = plan_text(conf, 16384).unwrap();
    assert_eq!(big.len(), 1);
    assert_eq!(big[0].device, "/dev/ublkb1");
}

/// tests/11-obsolete: zram-fraction and max-zram-size (whole MiB: 78.2 is 78), memory-limit
/// (host-memory-limit's old name), a section given twice (its later keys win).
#[test]
fn zram_generator_11_obsolete_keys() {
    let conf = "[zram0]\nzram-fraction=0.10\nmax-zram-size=2048\nmemory-limit=100000\n\
        [zram1]\nhost-memory-limit=2\n\
        [zram1]\nzram-fraction=0.10\nmax-zram-size=none\nmemory-limit=none\n\
        [zram2]\nzram-fraction=0.10\nmax-zram-size=2048\nmemory-limit=1\n";
    let p = plan_text(conf, 782).unwrap();
    let got: Vec<_> = p
        .iter()
        .map(|d| (d.device.as_str(), d.size_bytes))
        .collect();
    assert_eq!(got, [("/dev/ublkb0", 78 * MIB), ("/dev/ublkb1", 78 * MIB)]);
    // With zram-size as well, the obsolete pair wins, and says so.
    let both = plan_text("[zram0]\nzram-size=100\nzram-fraction=0.5\n", 1000).unwrap();
    assert_eq!(both[0].size_bytes, 500 * MIB);
    assert!(
        both[0].warnings.iter().any(|w| w.contains("zram-size=100 is ignored")
            && w.contains("obsolete zram-fraction")),
        "{:?}",
        both[0].warnings
    );
    assert!(p[0].warnings.iter().all(|w| !w.contains("ignored")));
    // zram-fraction alone has no cap (the man page says 4096; the code has none).
    assert_eq!(
        plan_text("[zram0]\nzram-fraction=1\n", 10000).unwrap()[0].size_bytes,
        10000 * MIB
    );
}

/// config.rs's test_kernel_has_option / test_kernel_has_no_option: the last word recognised
/// wins; others are skipped.
#[test]
fn zram_generator_kernel_option() {
    use generator::kernel_option as k;
    assert_eq!(
        k("systemd.zram=1 systemd.zram=0 systemd.zram=on systemd.zram=off systemd.zram"),
        Some(true)
    );
    assert_eq!(k("systemd.zram=1\nsystemd.zram=0\n"), Some(false));
    assert_eq!(
        k("systemd.zram=0 systemd.zram=2 systemd.zram=YES"),
        Some(false)
    );
    assert_eq!(k("quiet splash"), None);
}

/// config.rs's test_verify_mount_point.
#[test]
fn zram_generator_mount_point_rules() {
    // "/" and its spellings are zram-generator's too; uzram refuses them (see test 07).
    for bad in ["foo/bar", "/foo/../bar", "/foo/..", "", "/", "//", "///"] {
        let conf = format!("[zram0]\nmount-point = {bad}\n");
        assert!(plan_text(&conf, 782).is_err(), "{bad:?}");
    }
    for (given, normal) in [("/foobar", "/foobar"), ("/foo/./bar/", "/foo/bar")] {
        let conf = format!("[zram0]\nmount-point = {given}\n");
        assert_eq!(
            plan_text(&conf, 782).unwrap()[0].mount.as_deref(),
            Some(normal),
            "{given}"
        );
    }
}

/// config.rs's test_eval_size_expression*: MiB, with SI suffixes of fasteval (500k is 500000
/// MiB), the default, an unknown name, NaN; and what uzram refuses where zram-generator would
/// hand the kernel 2^64 - 1 bytes (an infinite size).
#[test]
fn zram_generator_size_expressions() {
    let size = |expr: &str, ram: u64| -> Result<u64, SetupError> {
        let conf = format!("set!two = echo 2\n[zram0]\nzram-size = {expr}\n");
        plan_text(&conf, ram).map(|p| p[0].size_bytes)
    };
    assert_eq!(size("0.5 * ram", 100).unwrap(), 50 * MIB);
    assert_eq!(size("0.5 * ram * two", 100).unwrap(), 100 * MIB);
    assert_eq!(size("500", 5000).unwrap(), 500 * MIB);
    assert_eq!(size("500k", 5000).unwrap(), 500_000 * MIB);
    assert_eq!(size("min(ram / 2, 4096)", 100).unwrap(), 50 * MIB);
    assert_eq!(
        plan_text("[zram0]\n", 10000).unwrap()[0].size_bytes,
        4096 * MIB
    );
    assert_eq!(size("min(0.5 * ram, 4000)", 3000).unwrap(), 1500 * MIB);
    assert!(size("array(1,2)", 100)
        .unwrap_err()
        .to_string()
        .contains("array"));
    assert!(size("(ram-100)/0", 100)
        .unwrap_err()
        .to_string()
        .contains("is not a number (0 / 0?)"));
    assert!(size("(ram-99)/0", 100)
        .unwrap_err()
        .to_string()
        .contains("is infinite (a division by 0"));
    assert!(size("-5", 100)
        .unwrap_err()
        .to_string()
        .contains("-5, below 0"));
    // A later set! of the same name wins.
    let conf = "set!x = echo 1\nset!x = echo 7\n[zram0]\nzram-size = x\n";
    assert_eq!(plan_text(conf, 782).unwrap()[0].size_bytes, 7 * MIB);
}

/// Section names: zram-generator takes `zram` and a number; uzram refuses what the kernel
/// would never make (`zram01`) and warns about the rest, which zram-generator ignores.
#[test]
fn zram_generator_section_names() {
    assert!(plan_text("[zram1]\n[zram01]\n", 782)
        .unwrap_err()
        .to_string()
        .contains("zram01"));
    assert!(plan_text("[zram+1]\n", 782).is_err());
    let (p, notes) = generator::plan(
        &[("x".into(), "[zramX]\n[swap]\n[zram3]\n".into())],
        782,
        None,
    )
    .unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(notes.len(), 2, "{notes:?}");
}

#[test]
fn uzram_policy_is_planned_and_checked() {
    let img = std::env::temp_dir().join(format!("uzram-policy-{}.img", std::process::id()));
    std::fs::write(&img, b"").unwrap();
    let conf = format!(
        "[zram0]\nwriteback-device = {}\nuzram-policy = writeback_after=2h budget=1G\n",
        img.display()
    );
    let p = plan_text(&conf, 4096);
    let _ = std::fs::remove_file(&img);
    let p = p.unwrap();
    assert_eq!(p[0].policy.as_deref(), Some("writeback_after=2h budget=1G"));
    assert!(
        p[0].line()
            .ends_with(" policy=\"writeback_after=2h budget=1G\""),
        "{}",
        p[0].line()
    );
    assert!(plan_text("[zram0]\nuzram-policy = writeback_after=soon\n", 4096).is_err());
    assert!(p[0].warnings.is_empty(), "{:?}", p[0].warnings);
    // Settings that act on a writeback device, with none: planned, and said.
    let p = plan_text(
        "[zram0]\nuzram-policy = recompress_after=1h writeback_after=2h budget=1G/day\n",
        4096,
    )
    .unwrap();
    assert_eq!(
        p[0].warnings,
        ["uzram-policy writeback_after=2h budget=1G/day does nothing without a writeback-device: pages are never written back"]
    );
}

/// zramswap's rules: defaults lz4, 256 MiB, priority 100; PERCENT (of MemTotal in KiB, in
/// whole bytes) overrides SIZE; the shell a settings file may use.
#[test]
fn zramswap_rules() {
    let stock =
        "# Compression algorithm selection\n#ALGO=lz4\n#PERCENT=50\n#SIZE=256\n#PRIORITY=100\n";
    let p = zramswap::plan("zramswap", stock, MEM_7825).unwrap();
    assert_eq!(
        p[0].line(),
        "device=/dev/ublkb0 size_bytes=268435456 algorithm=lz4 params=none recomp=none recompress=none mem_limit=0 writeback=none priority=100 fs=swap mount=none options=discard policy=none"
    );
    let p = zramswap::plan("zramswap", "PERCENT=50\n", MEM_7825).unwrap();
    assert_eq!(
        p[0].size_bytes, 4_102_768_640,
        "8013220 KiB x 1024 x 50 / 100"
    );
    let p = zramswap::plan("zramswap", "PERCENT=25\nSIZE=256\nALGO=lzo\n", 4 << 20).unwrap();
    assert_eq!(
        (p[0].size_bytes, p[0].algorithm.as_deref()),
        (1 << 30, Some("lz4"))
    );
    let shell =
        "export PERCENT=40\nPRIORITY=10 # lower than the disk\nSIZE=$((2*1024))\nALGO='zstd'\n";
    let p = zramswap::plan("zramswap", shell, 4 << 20).unwrap();
    assert_eq!(
        (p[0].size_bytes, p[0].priority, p[0].algorithm.as_deref()),
        ((4u64 << 30) * 40 / 100, 10, Some("zstd"))
    );
    let p = zramswap::plan("zramswap", "SIZE=$((2*1024))\n", 4 << 20).unwrap();
    assert_eq!(p[0].size_bytes, 2 << 30);
    // The shell's arithmetic: whole numbers, division truncating at each step, octal.
    for (expr, mib) in [
        ("1000/3*3", 999),
        ("(1+2)*100", 300),
        ("010*2", 16),
        ("-(-5)", 5),
        ("7 % 4", 3),
    ] {
        let p = zramswap::plan("zramswap", &format!("SIZE=$(({expr}))\n"), 4 << 20).unwrap();
        assert_eq!(p[0].size_bytes, mib * MIB, "{expr}");
    }
    for bad in ["2**3", "2^3", "1k", "x+1", "1/0", "(1", "1 < 2"] {
        assert!(
            zramswap::plan("zramswap", &format!("SIZE=$(({bad}))\n"), 4 << 20).is_err(),
            "{bad}"
        );
    }
    let p = zramswap::plan("zramswap", "SIZE=010\n", 4 << 20).unwrap();
    assert_eq!(p[0].size_bytes, 8 * MIB, "octal to the shell");
    let p = zramswap::plan("zramswap", "ALLOCATION=512\nCORES=4\nSIZE=64\n", 4 << 20).unwrap();
    assert_eq!(p[0].size_bytes, 64 * MIB);
    assert_eq!(p[0].warnings.len(), 2, "{:?}", p[0].warnings);
    for bad in [
        "SIZE=lots",
        "SIZE=1.5",
        "PERCENT=abc",
        "PERCENT=0",
        "PERCENT=-5",
        "PRIORITY=40000",
        "PRIORITY=abc",
        "ALGO=nosuch",
        "PERCENT=$(cat /x)",
        "SIZE=`echo 1`",
        "SIZE=$HOME",
        "if true; then SIZE=1; fi",
        "SIZE=\"1",
        "SIZE=1 PERCENT=2",
    ] {
        let e = zramswap::plan("zramswap", bad, 4 << 20).unwrap_err();
        assert!(e.to_string().contains("zramswap"), "{bad}: {e}");
    }
}

/// set! commands run bounded: in time (their whole process group is killed), in output, and
/// with the variable that keeps a `uzram setup` they start from running set! commands itself.
#[test]
fn set_commands_are_bounded_in_time_and_output() {
    use std::time::{Duration, Instant};
    let (st, out) =
        setvar::run_set("echo $UZRAM_SETUP_SET_COMMAND", Duration::from_secs(5)).unwrap();
    assert!(st.success());
    assert_eq!(out, b"1\n");
    let (st, out) = setvar::run_set("echo 7; exit 3", Duration::from_secs(5)).unwrap();
    assert_eq!((st.code(), out.as_slice()), (Some(3), &b"7\n"[..]));
    // A command that runs on, or leaves a child holding its output open, is stopped.
    // One in a session of its own escapes the kill and may hold the pipe: not waited for.
    for cmd in ["sleep 100", "sleep 100 & echo 5", "setsid sleep 3 & echo 5"] {
        let t = Instant::now();
        let e = setvar::run_set(cmd, Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("still running after 0.3 s"), "{cmd}: {e}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{cmd}: {:?}",
            t.elapsed()
        );
    }
    // Output past the bound stops it at once, not at the deadline.
    let t = Instant::now();
    let e = setvar::run_set("yes 12345", Duration::from_secs(30)).unwrap_err();
    assert!(e.contains("more than 4096 bytes"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Exactly the bound is fine.
    let (_, out) = setvar::run_set("head -c 4096 /dev/zero", Duration::from_secs(5)).unwrap();
    assert_eq!(out.len(), setvar::SET_OUTPUT_MAX);
}

#[test]
fn a_priority_in_the_list_is_left_out_and_an_unclosed_parenthesis_said() {
    let mut p = DevicePlan::new("zram0", 0);
    apply_algorithms(&mut p, "zstd(level=3 lz4(priority=1,level=2) (priority=1)");
    assert_eq!(p.params.as_deref(), Some("level=3"));
    assert_eq!(p.recomp, vec!["algo=lz4 priority=1 level=2".to_string()]);
    // Global recompression parameters keep theirs: there, priority= picks an algorithm.
    assert_eq!(p.recompress.as_deref(), Some("priority=1"));
    assert!(
        p.warnings.iter().any(|w| w.contains("no closing )")),
        "{:?}",
        p.warnings
    );
    assert!(
        p.warnings.iter().any(|w| w.contains("priority=1 left out")),
        "{:?}",
        p.warnings
    );
    assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
}

/// A recompression algorithm that is not known is left out, said, and no other stands in for
/// it; the next one keeps its own priority.
#[test]
fn an_unknown_recompression_algorithm_is_left_out() {
    let p = plan_text(
        "[zram0]\ncompression-algorithm = zstd bogus lz4(level=2)\n",
        4096,
    )
    .unwrap();
    assert_eq!(p[0].algorithm.as_deref(), Some("zstd"));
    assert_eq!(p[0].recomp, ["algo=lz4 priority=2 level=2"]);
    assert!(
        p[0].warnings
            .iter()
            .any(|w| w.contains("\"bogus\"")
                && w.contains("no recompression algorithm of priority 1")),
        "{:?}",
        p[0].warnings
    );
}

/// zramswap's PERCENT beyond what RAM could hold the slot table of fails the device, as
/// zram-size does.
#[test]
fn a_zramswap_device_too_large_for_ram_fails() {
    let p = zramswap::plan("zramswap", "PERCENT=99999999999\n", 4 << 20).unwrap();
    let why = p[0].failed.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("PERCENT=99999999999: a device of") && why.contains("slot table larger"),
        "{why}"
    );
    let p = zramswap::plan("zramswap", "PERCENT=200\n", 4 << 20).unwrap();
    assert_eq!(p[0].failed, None);
}

/// A section above host-memory-limit makes no device and is said as information (the
/// generator keeps it to itself); an error says the lines read before it, which may be why.
#[test]
fn a_skipped_section_is_said_and_an_error_keeps_what_came_before() {
    let (p, notes) = generator::plan(
        &[(
            "t.conf".into(),
            "[zram0]\nhost-memory-limit = 1024\n".into(),
        )],
        4096,
        None,
    )
    .unwrap();
    assert!(p.is_empty());
    assert_eq!(
        notes,
        ["info: [zram0] makes no device: host-memory-limit = 1024 is below this machine's 4096 MiB of RAM (zram-generator's rule)"]
    );
    let e = generator::plan(
        &[(
            "t.conf".into(),
            "set! x = echo 1\n[zram0]\nzram-size = x\n".into(),
        )],
        4096,
        None,
    )
    .unwrap_err();
    assert!(
        e.message
            .contains("(read before it: t.conf: set! x: no expression can name \" x\""),
        "{e}"
    );
}
