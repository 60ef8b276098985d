//! The generator's units against what systemd reads: the texts and links per device kind, the
//! quoting of `ExecStart=` words and of mount unit names (`systemd-escape --path`), when it
//! stands down, and a whole run over a root directory laid out as zram-generator's tests do.

use std::path::{Path, PathBuf};

use super::*;

const EXE: &str = "/usr/bin/uzram";

fn plan(section: &str, id: u32) -> DevicePlan {
    let mut p = DevicePlan::new(section, id.into());
    p.size_bytes = 1 << 30;
    p
}

fn file<'a>(units: &'a [(PathBuf, Entry)], name: &str) -> &'a str {
    match units.iter().find(|(p, _)| p == Path::new(name)) {
        Some((_, Entry::File(t))) => t,
        other => panic!("{name}: {other:?} in {units:?}"),
    }
}

fn link<'a>(units: &'a [(PathBuf, Entry)], name: &str) -> &'a str {
    match units.iter().find(|(p, _)| p == Path::new(name)) {
        Some((_, Entry::Link(t))) => t,
        other => panic!("{name}: {other:?} in {units:?}"),
    }
}

#[test]
fn a_swap_device_is_a_service_a_prepare_unit_and_a_swap_unit_wanted_by_swap_target() {
    let mut p = plan("zram0", 0);
    p.algorithm = Some("zstd".into());
    p.recomp = vec!["algo=zstd priority=1 level=9".into()];
    p.priority = 42;
    let units = device_units(&p, EXE, "zram-generator.conf").unwrap();
    assert_eq!(units.len(), 4, "{units:?}");
    let dropin = file(&units, "uzram@zram0.service.d/generator.conf");
    assert!(
        dropin.contains("\nEnvironmentFile=\nExecStart=\n"),
        "{dropin}"
    );
    assert!(
        dropin.contains(
            "ExecStart=/usr/bin/uzram serve --id 0 --size 1073741824 --algorithm zstd \
             --recomp-algorithm \"algo=zstd priority=1 level=9\"\n"
        ),
        "{dropin}"
    );
    let prepare = file(&units, "uzram-prepare@zram0.service");
    for line in [
        "DefaultDependencies=no",
        "Wants=uzram@zram0.service",
        "After=uzram@zram0.service",
        "Before=swap.target",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "ExecStart=/usr/bin/uzram prepare /dev/ublkb0 swap",
    ] {
        assert!(prepare.lines().any(|l| l == line), "{line} in {prepare}");
    }
    // The service is wanted, never required: its restart keeps swap on.
    assert!(!prepare.contains("Requires="), "{prepare}");
    let swap = file(&units, "dev-ublkb0.swap");
    for line in [
        "Requires=uzram-prepare@zram0.service",
        "After=uzram-prepare@zram0.service uzram@zram0.service",
        "What=/dev/ublkb0",
        "Priority=42",
        "Options=discard",
    ] {
        assert!(swap.lines().any(|l| l == line), "{line} in {swap}");
    }
    // Ordered after the service (stopped before it at shutdown), never bound to it: its
    // restart keeps swap on.
    for dep in ["Requires=", "BindsTo=", "PartOf=", "Wants="] {
        assert!(
            !swap
                .lines()
                .any(|l| l.starts_with(dep) && l.contains("uzram@")),
            "{dep} in {swap}"
        );
    }
    assert_eq!(
        link(&units, "swap.target.wants/dev-ublkb0.swap"),
        "../dev-ublkb0.swap"
    );
}

#[test]
fn a_mounted_device_is_a_mount_unit_wanted_by_local_fs_target() {
    let mut p = plan("zram3", 3);
    p.fs = "ext4".into();
    p.mount = Some("/var/compressed tmp".into());
    p.options = "noatime,x-100%".into();
    let units = device_units(&p, EXE, "zram-generator.conf").unwrap();
    let name = "var-compressed\\x20tmp.mount";
    let mount = file(&units, name);
    for line in [
        "Requires=uzram-prepare@zram3.service",
        "What=/dev/ublkb3",
        "Where=/var/compressed tmp",
        "Type=ext4",
        "Options=noatime,x-100%%",
    ] {
        assert!(mount.lines().any(|l| l == line), "{line} in {mount}");
    }
    assert_eq!(
        link(&units, &format!("local-fs.target.wants/{name}")),
        format!("../{name}")
    );
    let prepare = file(&units, "uzram-prepare@zram3.service");
    assert!(prepare.contains("ExecStart=/usr/bin/uzram prepare /dev/ublkb3 ext4\n"));
    assert!(prepare.contains("Before=local-fs.target\n"));
}

#[test]
fn a_file_system_without_a_mount_point_is_made_not_mounted() {
    let mut p = plan("zram1", 1);
    p.fs = "xfs".into();
    let units = device_units(&p, EXE, "zram-generator.conf").unwrap();
    assert_eq!(units.len(), 3, "{units:?}");
    assert_eq!(
        link(&units, "local-fs.target.wants/uzram-prepare@zram1.service"),
        "../uzram-prepare@zram1.service"
    );
    assert!(!units
        .iter()
        .any(|(p, _)| p.to_string_lossy().ends_with(".mount")));
}

#[test]
fn values_a_unit_cannot_hold_leave_the_device_out_naming_them() {
    let mut p = plan("zram0", 0);
    p.options = "discard\nExecStartPre=/bin/evil".into();
    let e = device_units(&p, EXE, "f").unwrap_err();
    assert!(
        e.contains("options") && e.contains("control character"),
        "{e}"
    );
    let mut p = plan("zram0", 0);
    p.policy = Some("spill=1\n".into());
    let e = device_units(&p, EXE, "f").unwrap_err();
    assert!(e.contains("control character"), "{e}");
    let mut p = plan("zram0", 0);
    p.fs = "ext4;rm".into();
    p.mount = Some("/mnt".into());
    let e = device_units(&p, EXE, "f").unwrap_err();
    assert!(e.contains("ext4;rm"), "{e}");
}

#[test]
fn exec_words_are_quoted_and_specifiers_doubled() {
    assert_eq!(exec_arg("--size").unwrap(), "--size");
    assert_eq!(exec_arg("level=3 dict=/d").unwrap(), "\"level=3 dict=/d\"");
    assert_eq!(exec_arg("50%").unwrap(), "50%%");
    assert_eq!(exec_arg("$HOME").unwrap(), "$$HOME");
    assert_eq!(exec_arg("a\"b\\c").unwrap(), "\"a\\\"b\\\\c\"");
    assert_eq!(exec_arg("").unwrap(), "\"\"");
    assert_eq!(exec_arg(";").unwrap(), "\\;");
    assert!(exec_arg("a\tb").is_err());
}

#[test]
fn mount_unit_names_are_systemd_escape_paths() {
    assert_eq!(escape_path("/"), "-");
    assert_eq!(escape_path("/var/tmp/"), "var-tmp");
    assert_eq!(escape_path("/a//b"), "a-b");
    assert_eq!(escape_path("/mnt/a-b"), "mnt-a\\x2db");
    assert_eq!(escape_path("/.hidden/x.y"), "\\x2ehidden-x.y");
    assert_eq!(escape_path("/mnt/é"), "mnt-\\xc3\\xa9");
}

#[test]
fn writes_are_the_fifth_field_of_a_block_devices_stat() {
    let stat = "     120        0     9600       31        7        0       56        2        0       40       33        0        0        0        0        0        0\n";
    assert_eq!(writes_of(stat), Some(7));
    assert_eq!(writes_of("1 2 3"), None);
}

/// A root directory holding `files` (path, text) and a MemTotal of 4 GiB.
fn root(tag: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uzram-units-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    std::fs::write(dir.join("proc/meminfo"), "MemTotal: 4194304 kB\n").unwrap();
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

const CONF: (&str, &str) = (
    "etc/systemd/zram-generator.conf",
    "[zram0]\nzram-size = ram / 2\ncompression-algorithm = zstd\n\n\
     [zram1]\nzram-size = 64\nfs-type = ext4\nmount-point = /mnt/z\n\n\
     [zram2]\nzram-size = 64\nfs-type = nosuchfs\nmount-point = /mnt/y\n\n\
     [zram4]\nzram-size = 64\nfs-type = ext4\nmount-point = /mnt/z\n\n\
     [zram5]\nzram-size = 64\nwriteback-device = /nonexistent/uzram-test\n",
);

#[test]
fn the_generator_writes_each_device_it_can_and_names_the_one_it_cannot() {
    let dir = root("gen", &[CONF]);
    let out = dir.join("out");
    let done = generate(&out, &dir, EXE);
    // Sections left out fail the run (as zram-generator's does), the others written.
    assert!(done.config_failed && !done.write_failed);
    let said = done.said;
    let dropin = std::fs::read_to_string(out.join("uzram@zram0.service.d/generator.conf")).unwrap();
    assert!(
        dropin.contains("serve --id 0 --size 2147483648 --algorithm zstd\n"),
        "{dropin}"
    );
    assert_eq!(
        std::fs::read_link(out.join("swap.target.wants/dev-ublkb0.swap")).unwrap(),
        Path::new("../dev-ublkb0.swap")
    );
    assert!(out.join("dev-ublkb0.swap").is_file());
    assert!(out.join("local-fs.target.wants/mnt-z.mount").exists());
    assert!(!out.join("uzram@zram2.service.d").exists());
    assert!(
        said.iter()
            .any(|l| l.starts_with("zram-generator.conf [zram2] ")
                && l.contains("mkfs.nosuchfs")
                && l.contains("no units written")),
        "{said:?}"
    );
    // Two sections, one mount point: the second is left out, the first kept.
    assert!(
        said.iter()
            .any(|l| l.starts_with("zram-generator.conf [zram4] ")
                && l.contains("mount-point /mnt/z is [zram1]'s too")),
        "{said:?}"
    );
    assert!(!out.join("uzram@zram4.service.d").exists());
    assert!(std::fs::read_to_string(out.join("mnt-z.mount"))
        .unwrap()
        .contains("What=/dev/ublkb1\n"));
    // A writeback file not there at generator time: its service waits for its path's mounts
    // and checks it at start.
    let dropin5 =
        std::fs::read_to_string(out.join("uzram@zram5.service.d/generator.conf")).unwrap();
    assert!(
        dropin5.starts_with("# Written by uzram-generator from [zram5] of zram-generator.conf\n[Unit]\nRequiresMountsFor=/nonexistent/uzram-test\nAssertPathExists=/nonexistent/uzram-test\n"),
        "{dropin5}"
    );
    assert!(
        dropin5.contains("--backing-dev /nonexistent/uzram-test"),
        "{dropin5}"
    );
    assert!(
        said.iter()
            .any(|l| l.starts_with("[zram0] /dev/ublkb0: units written")),
        "{said:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file under a test root: its path and text.
type Written = (&'static str, &'static str);

#[test]
fn the_generator_stands_down_for_the_tool_that_owns_the_configuration() {
    let cases: [(&str, &[Written], &str); 4] = [
        (
            "zramgen",
            &[
                CONF,
                ("usr/lib/systemd/system-generators/zram-generator", ""),
            ],
            "zram-generator is installed",
        ),
        (
            "setup",
            &[
                CONF,
                (
                    "etc/systemd/system/swap.target.wants/uzram-setup.service",
                    "",
                ),
            ],
            "uzram-setup.service is enabled",
        ),
        (
            "zramswap",
            &[
                ("etc/default/zramswap", "PERCENT=50\n"),
                (
                    "etc/systemd/system/multi-user.target.wants/zramswap.service",
                    "",
                ),
            ],
            "zramswap.service is enabled",
        ),
        (
            "container",
            &[CONF, ("run/systemd/container", "docker\n")],
            "in a container",
        ),
    ];
    for (tag, files, why) in cases {
        let dir = root(tag, files);
        let out = dir.join("out");
        let done = generate(&out, &dir, EXE);
        let said = done.said;
        assert!(said.iter().any(|l| l.contains(why)), "{tag}: {said:?}");
        assert!(!done.config_failed, "{tag}: standing down is not a failure");
        assert!(!out.exists(), "{tag}: wrote units");
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Masked, zram-generator leaves the configuration to uzram.
    let dir = root(
        "masked",
        &[
            CONF,
            ("usr/lib/systemd/system-generators/zram-generator", ""),
        ],
    );
    std::fs::create_dir_all(dir.join("etc/systemd/system-generators")).unwrap();
    std::os::unix::fs::symlink(
        "/dev/null",
        dir.join("etc/systemd/system-generators/zram-generator"),
    )
    .unwrap();
    generate(&dir.join("out"), &dir, EXE);
    assert!(dir.join("out/dev-ublkb0.swap").exists());
    // zramswap's file, zram-tools not enabled: uzram takes it.
    let _ = std::fs::remove_dir_all(&dir);
    let dir = root(
        "zramswap-alone",
        &[("etc/default/zramswap", "PERCENT=50\n")],
    );
    generate(&dir.join("out"), &dir, EXE);
    assert!(dir.join("out/dev-ublkb0.swap").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_configuration_writes_nothing_and_says_nothing() {
    let dir = root("none", &[]);
    let done = generate(&dir.join("out"), &dir, EXE);
    assert!(done.said.is_empty() && !done.config_failed, "{done:?}");
    assert!(!dir.join("out").exists());
    let dir2 = root(
        "bad",
        &[(
            "etc/systemd/zram-generator.conf",
            "[zram0]\nzram-size = ram /\n",
        )],
    );
    let done = generate(&dir2.join("out"), &dir2, EXE);
    assert!(done.config_failed);
    let said = done.said;
    assert!(
        said.len() == 1
            && said[0].contains("zram-generator.conf")
            && said[0].contains("nothing written"),
        "{said:?}"
    );
    // The same error where uzram stands down anyway (uzram-setup.service enabled): said, not
    // a failure of the generator.
    let dir3 = root(
        "bad-standing-down",
        &[
            (
                "etc/systemd/zram-generator.conf",
                "[zram0]\nzram-size = ram /\n",
            ),
            (
                "etc/systemd/system/multi-user.target.wants/uzram-setup.service",
                "",
            ),
        ],
    );
    let done = generate(&dir3.join("out"), &dir3, EXE);
    assert!(!done.config_failed && !done.said.is_empty(), "{done:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
    let _ = std::fs::remove_dir_all(&dir3);
}

/// Without MemTotal no size can be worked out: where there is a configuration that is a
/// failure, said without advice the generator cannot take (setup's --ram-mib); where there is
/// none, nothing at all.
#[test]
fn an_unreadable_meminfo_fails_only_where_there_is_a_configuration() {
    let dir = root("nomem", &[CONF]);
    std::fs::remove_file(dir.join("proc/meminfo")).unwrap();
    let done = generate(&dir.join("out"), &dir, EXE);
    assert!(done.config_failed, "{done:?}");
    assert!(
        done.said.len() == 1
            && done.said[0].contains("proc/meminfo")
            && done.said[0].ends_with("nothing written")
            && !done.said[0].contains("--ram-mib"),
        "{:?}",
        done.said
    );
    assert!(!dir.join("out").exists());
    let bare = root("nomem-bare", &[]);
    std::fs::write(bare.join("proc/meminfo"), "MemFree: 1 kB\n").unwrap();
    let done = generate(&bare.join("out"), &bare, EXE);
    assert!(done.said.is_empty() && !done.config_failed, "{done:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&bare);
}

/// systemd itself reads the units (where `systemd-analyze` is installed, as on CI's Debian):
/// the generator's, with contrib's `uzram@.service` beside them, and contrib's own; nothing is
/// refused or warned about.
#[test]
fn systemd_analyze_verify_accepts_the_units() {
    let Ok(probe) = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
    else {
        eprintln!("no systemd-analyze here: not checked");
        return;
    };
    assert!(probe.status.success());
    let dir = root("verify", &[CONF]);
    let out = dir.join("out");
    // An executable that exists, for ExecStart= to name.
    assert!(!generate(&out, &dir, "/bin/sh").write_failed);
    // contrib's units, as the package installs them (the binary another that exists).
    std::fs::create_dir_all(dir.join("tpl")).unwrap();
    let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let mut contrib_units = Vec::new();
    for e in std::fs::read_dir(&contrib).unwrap().flatten() {
        let name = e.file_name().into_string().unwrap();
        if name.ends_with(".service") || name.ends_with(".timer") {
            let text = std::fs::read_to_string(e.path())
                .unwrap()
                .replace("/usr/local/bin/uzram", "/bin/sh");
            std::fs::write(dir.join("tpl").join(&name), text).unwrap();
            if !name.contains('@') {
                contrib_units.push(dir.join("tpl").join(&name));
            }
        }
    }
    assert!(contrib_units.len() >= 5, "{contrib_units:?}");
    let r = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(
            [
                "dev-ublkb0.swap",
                "uzram-prepare@zram0.service",
                "mnt-z.mount",
                "uzram-prepare@zram1.service",
            ]
            .map(|u| out.join(u)),
        )
        .args(&contrib_units)
        .env(
            "SYSTEMD_UNIT_PATH",
            format!("{}:{}:", out.display(), dir.join("tpl").display()),
        )
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&r.stderr);
    assert!(
        r.status.success() && said.trim().is_empty(),
        "{:?}: {said}",
        r.status
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_that_cannot_be_written_fails_after_naming_each_device() {
    let dir = root("unwritable", &[CONF]);
    // A file where the directory should be.
    std::fs::write(dir.join("out"), "").unwrap();
    let g = generate(&dir.join("out"), &dir, EXE);
    assert!(g.write_failed);
    assert!(
        g.said
            .iter()
            .any(|l| l.contains("[zram0]") && l.contains("no units written")),
        "{:?}",
        g.said
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A swap device pulls the installed sleep hooks in where systemd sleeps, as `systemctl enable`
/// would for this boot; a masked or missing hook is left out (a requirement on it would fail
/// every hibernation), and a system with no swap on uzram gets none.
#[test]
fn a_swap_device_pulls_in_the_installed_sleep_hooks_unless_masked() {
    let hooks: [Written; 2] = [
        ("usr/lib/systemd/system/uzram-hibernate.service", "[Unit]\n"),
        ("usr/lib/systemd/system/uzram-suspend.service", "[Unit]\n"),
    ];
    let conf = (
        "etc/systemd/zram-generator.conf",
        "[zram0]\nzram-size = 64\n",
    );
    let dir = root("sleep", &[conf, hooks[0], hooks[1]]);
    let out = dir.join("out");
    let done = generate(&out, &dir, EXE);
    assert!(!done.config_failed && !done.write_failed, "{done:?}");
    for sleep in [
        "systemd-hibernate",
        "systemd-hybrid-sleep",
        "systemd-suspend-then-hibernate",
    ] {
        assert_eq!(
            std::fs::read_link(
                out.join(format!("{sleep}.service.requires/uzram-hibernate.service"))
            )
            .unwrap(),
            Path::new("/usr/lib/systemd/system/uzram-hibernate.service")
        );
    }
    assert!(out
        .join("systemd-suspend.service.wants/uzram-suspend.service")
        .symlink_metadata()
        .is_ok());
    assert!(
        done.said
            .iter()
            .any(|l| l.starts_with("sleep hooks pulled in")),
        "{:?}",
        done.said
    );

    // Both masked in /etc (one a link to /dev/null, one an empty file): neither pulled in.
    let masked = root("sleep-masked", &[conf, hooks[0], hooks[1]]);
    let etc = masked.join("etc/systemd/system");
    std::fs::create_dir_all(&etc).unwrap();
    std::os::unix::fs::symlink("/dev/null", etc.join("uzram-hibernate.service")).unwrap();
    std::fs::write(etc.join("uzram-suspend.service"), "").unwrap();
    let out2 = masked.join("out");
    generate(&out2, &masked, EXE);
    assert!(out2.join("dev-ublkb0.swap").is_file());
    assert!(!out2.join("systemd-hibernate.service.requires").exists());
    assert!(!out2.join("systemd-suspend.service.wants").exists());

    // Not installed, or no swap device: no link.
    let bare = root("sleep-bare", &[conf]);
    generate(&bare.join("out"), &bare, EXE);
    assert!(!bare.join("out/systemd-hibernate.service.requires").exists());
    let fs_only = (
        "etc/systemd/zram-generator.conf",
        "[zram0]\nzram-size = 64\nfs-type = ext4\nmount-point = /mnt/z\n",
    );
    let mounted = root("sleep-fs", &[fs_only, hooks[0], hooks[1]]);
    generate(&mounted.join("out"), &mounted, EXE);
    assert!(mounted.join("out/mnt-z.mount").is_file());
    assert!(!mounted
        .join("out/systemd-hibernate.service.requires")
        .exists());
    for d in [dir, masked, bare, mounted] {
        let _ = std::fs::remove_dir_all(&d);
    }
}
