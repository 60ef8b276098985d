//! The `uzram` binary as a user meets it on a machine without ublk (CI's host): clear errors,
//! exit code 1 (as zramctl's), nothing left behind; help and listing succeed.

use std::path::Path;
use std::process::Command;

fn uzram(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uzram"))
        .args(args)
        .output()
        .expect("run uzram");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version_succeed() {
    let (rc, out, _) = uzram(&["--help"]);
    assert_eq!(rc, 0);
    for word in [
        "--find",
        "--size",
        "--reset",
        "--output",
        "attr",
        "Exit status",
    ] {
        assert!(out.contains(word), "--help lacks {word}:\n{out}");
    }
    assert_eq!(uzram(&["--version"]).0, 0);
    // Every subcommand's options parse together (the device options are shared by several), and
    // each that makes a device takes them all.
    for sub in ["attr", "setup", "teardown", "bench", "dump-pages"] {
        let (rc, out, err) = uzram(&[sub, "--help"]);
        assert_eq!(rc, 0, "{sub} --help: {err}");
        if sub == "bench" {
            for opt in [
                "--algorithm",
                "--algorithm-params",
                "--recomp-algorithm",
                "--backing-dev",
                "--policy",
                "--mem-limit",
            ] {
                assert!(out.contains(opt), "bench --help lacks {opt}:\n{out}");
            }
        }
    }
}

#[test]
fn usage_errors_exit_1_with_a_message() {
    for args in [
        &["--bogus"][..],
        &["--find", "--size", "lots"],
        &["--find", "--size", "1G", "--algorithm", "lzo"],
        &["--find", "--size", "0"],
        &["--find"],
        &["--size", "1G", "/dev/zram0"],
        &["--output", "NOPE"],
        &["--algorithm", "zstd"],
        &["--reset"],
        &["attr", "/dev/ublkb4000", "mm_stat"],
    ] {
        let (rc, out, err) = uzram(args);
        assert_eq!(rc, 1, "uzram {args:?}: exit {rc}\n{out}{err}");
        assert!(!err.trim().is_empty(), "uzram {args:?} said nothing");
    }
}

#[test]
fn without_ublk_creating_fails_clearly_and_leaves_nothing() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("this machine has ublk: the no-driver path is not testable here");
        return;
    }
    let run_dir = Path::new("/run/uzram");
    let before = run_dir.read_dir().map(|d| d.count()).unwrap_or(0);
    let (rc, out, err) = uzram(&["--find", "--size", "1G"]);
    assert_eq!(rc, 1);
    assert!(out.is_empty(), "printed a device: {out}");
    assert!(err.contains("no ublk driver"), "{err}");
    assert_eq!(run_dir.read_dir().map(|d| d.count()).unwrap_or(0), before);
    // A secondary algorithm named by the parameters' priority, in one command: valid, so the
    // driver is all that is missing.
    let (rc, _, err) = uzram(&[
        "--find",
        "--size",
        "1G",
        "--recomp-algorithm",
        "zstd",
        "-p",
        "priority=1 level=9",
    ]);
    assert_eq!(rc, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no ublk driver"), "{err}");
    // The listing of no devices is empty and succeeds.
    let (rc, out, _) = uzram(&[]);
    assert_eq!((rc, out.as_str()), (0, ""));
}

/// `uzram setup --dry-run` on any machine: a zram-generator.conf and a zramswap file, planned for
/// a given MemTotal, one line per device, nothing touched.
#[test]
fn setup_dry_run_plans_both_formats() {
    let dir = std::env::temp_dir().join(format!("uzram-cli-setup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gen = dir.join("zram-generator.conf");
    std::fs::write(
        &gen,
        "[zram0]\ncompression-algorithm = zstd lz4\nswap-priority = 20\n",
    )
    .unwrap();
    let (rc, out, err) = uzram(&[
        "setup",
        "--dry-run",
        "--config",
        gen.to_str().unwrap(),
        "--ram-mib",
        "2048",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out,
        "device=/dev/ublkb0 size_bytes=1073741824 algorithm=zstd params=none recomp=\"algo=lz4 priority=1\" recompress=none mem_limit=0 writeback=none priority=20 fs=swap mount=none options=discard policy=none\n"
    );
    let zs = dir.join("zramswap");
    std::fs::write(&zs, "ALGO=deflate\nPERCENT=25\n").unwrap();
    let (rc, out, err) = uzram(&[
        "setup",
        "--dry-run",
        "--config",
        zs.to_str().unwrap(),
        "--ram-mib",
        "4096",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.starts_with("device=/dev/ublkb0 size_bytes=1073741824 algorithm=zstd "),
        "{out}"
    );
    assert!(err.contains("deflate"), "the mapping is said: {err}");
    // For real, on a machine without ublk: the clear error, exit 1.
    if !Path::new("/dev/ublk-control").exists() {
        let (rc, _, err) = uzram(&["setup", "--config", zs.to_str().unwrap()]);
        assert_eq!(rc, 1);
        assert!(err.contains("no ublk driver"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh root for `--root` or `ZRAM_GENERATOR_ROOT`: `proc/meminfo` (4 GiB) and an empty
/// `etc/systemd`.
fn fake_root(tag: &str) -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("uzram-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::create_dir_all(root.join("etc/systemd")).unwrap();
    std::fs::write(root.join("proc/meminfo"), "MemTotal: 4194304 kB\n").unwrap();
    root
}

/// The generator as systemd runs it: a configuration error is said on stderr and fails it
/// (exit 1, as zram-generator's), the sections it could plan still written; no configuration
/// at all is a quiet success.
#[test]
fn the_generator_fails_on_a_configuration_error_and_writes_the_rest() {
    let root = fake_root("gen");
    let out = root.join("out");
    let run = || {
        let o = Command::new(env!("CARGO_BIN_EXE_uzram"))
            .args(["generator", out.to_str().unwrap()])
            .env("ZRAM_GENERATOR_ROOT", &root)
            .env_remove("SYSTEMD_SCOPE")
            .output()
            .expect("run uzram generator");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (rc, err) = run();
    assert_eq!((rc, err.as_str()), (0, ""));
    std::fs::write(
        root.join("etc/systemd/zram-generator.conf"),
        "[zram0]\nzram-size = 64\n\n[zram1]\nzram-size = 64\nfs-type = nosuchfs\nmount-point = /mnt/y\n",
    )
    .unwrap();
    let (rc, err) = run();
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("[zram1]") && err.contains("configuration has errors"),
        "{err}"
    );
    assert!(out.join("dev-ublkb0.swap").is_file());
    assert!(!out.join("uzram@zram1.service.d").exists());
    let _ = std::fs::remove_dir_all(&root);
}

/// A root whose proc/cmdline never ends (a FIFO with no writer, a link to /dev/zero) is
/// planned as one without a kernel option, at once: never a hang, never a read without end.
#[test]
fn a_proc_cmdline_that_never_ends_is_not_read() {
    let root = fake_root("cmdline");
    std::fs::write(root.join("etc/systemd/zram-generator.conf"), "[zram0]\n").unwrap();
    let made = Command::new("mkfifo")
        .arg(root.join("proc/cmdline"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "mkfifo");
    for round in 0..2 {
        if round == 1 {
            std::fs::remove_file(root.join("proc/cmdline")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", root.join("proc/cmdline")).unwrap();
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_uzram"))
            .args(["setup", "--dry-run", "--root", root.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run uzram setup");
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "round {round}: still running after 20 s, or failed"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
