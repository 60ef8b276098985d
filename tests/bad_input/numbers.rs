//! More rows of tests/bad_input.rs: whole numbers out of any range (past the option's type, or
//! negative), and configuration lines the INI reader mangles.

use super::{case, conf, Case, Scratch};

/// A number past the option's type or below its least names the option and its range, never
/// "number too large to fit in target type" or "unexpected argument".
pub fn numbers() -> Vec<Case> {
    let huge = "99999999999999999999";
    let mut v = Vec::new();
    for (args, names) in [
        (
            format!("--find --size 4G --streams {huge}"),
            format!("'--streams <NUMBER>': {huge} is not in 1..=4096"),
        ),
        (
            format!("dump-pages --pid {huge} -o @x"),
            format!("'--pid <PID>': {huge} is not in 1..=2147483647"),
        ),
        (
            "dump-pages --pid 0 -o @x".into(),
            "'--pid <PID>': 0 is not in 1..=".into(),
        ),
        (
            format!("dump-pages --pid 1 --max-mib {huge} -o @x"),
            format!("'--max-mib <N>': {huge} is not in 0..="),
        ),
        (
            format!("bench --runs {huge}"),
            format!("'--runs <RUNS>': {huge} is not in 1..=1000"),
        ),
        (
            format!("bench --threads {huge}"),
            format!("'--threads <N>': {huge} is not in 1..=1024"),
        ),
        (
            "bench --threads -1".into(),
            "'--threads <N>': -1 is not in 1..=1024".into(),
        ),
        (
            format!("bench --pid {huge}"),
            format!("'--pid <PID>': {huge} is not in 1..="),
        ),
        (
            "bench --runs 1.5".into(),
            "'--runs <RUNS>': \"1.5\" is not a whole number".into(),
        ),
    ] {
        v.push(case(&args, &names));
    }
    if cfg!(feature = "ublk") {
        for (args, names) in [
            (
                format!("serve --size 1G --queues {huge}"),
                format!("'--queues <QUEUES>': {huge} is not in 1..=4096"),
            ),
            (
                format!("serve --size 1G --depth {huge}"),
                format!("'--depth <DEPTH>': {huge} is not in 1..=65535"),
            ),
            (
                "serve --size 1G --depth -1".into(),
                "'--depth <DEPTH>': -1 is not in 1..=65535".into(),
            ),
            (
                format!("serve --size 1G --id -{huge}"),
                format!("'--id <ID>': -{huge} is not in -1..=1048575"),
            ),
        ] {
            v.push(case(&args, &names));
        }
    }
    v
}

/// Configuration lines whose fault the INI reader reports elsewhere, or mangles: the line at
/// fault is named and quoted, a NUL the reader made out of `\0` is named as one.
pub fn mangled(s: &Scratch) -> Vec<Case> {
    [
        (
            "[zram0]\nzram-size = 1\n[zram1\n",
            "line 3 (\"[zram1\"): a section's name opened with [ is not closed",
        ),
        (
            "set!x = printf 'a\\0b'\n[zram0]\nzram-size = x\n",
            "the command holds a NUL byte",
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(n, (text, names))| conf(s, 900 + n, "mangled.conf", text, names))
    .collect()
}

/// Files that are not uzram's to write (read-only, another user's), outputs through a dangling
/// link, values that round to nothing, and configuration lines the reader would take apart.
pub fn others(s: &Scratch) -> Vec<Case> {
    use std::os::unix::fs::PermissionsExt;
    s.write("zeros-ro", &vec![0u8; 1 << 20]);
    std::fs::set_permissions(s.path("zeros-ro"), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::create_dir_all(s.path("root-bad/proc")).unwrap();
    s.write("root-bad/proc/meminfo", b"MemTotal: abc kB\n");
    let mut v: Vec<Case> = [
        ("metrics -o @dangling", "symbolic link to"),
        (
            "dump-pages --pid 1 -o -",
            "-o -: a dump is written to a file",
        ),
        ("--find --size 0.0001K", "--size 0.0001K is 0 bytes"),
        (
            "bench --runs 1 --threads 1 --mem-limit 1",
            "--mem-limit 1 (4096 bytes) is full after",
        ),
        (
            "--find --size 64M --policy budget=4G/day/day",
            "budget=4G/day/day",
        ),
        (
            "setup --dry-run --root @root-bad",
            "MemTotal \"abc kB\" is not a number of kB",
        ),
    ]
    .into_iter()
    .map(|(args, names)| case(args, names))
    .collect();
    if cfg!(feature = "ublk") {
        v.push(case(
            "serve --size 64M --reserve -1",
            "--reserve: invalid size \"-1\"",
        ));
        v.push(case(
            "serve --size 64M --reserve-min -1",
            "--reserve-min: invalid size \"-1\"",
        ));
    }
    // Where the tests run as root, a file of another user's, and a read-only one.
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        s.write("zeros-other", &vec![0u8; 1 << 20]);
        std::os::unix::fs::chown(s.path("zeros-other"), Some(65534), Some(65534)).unwrap();
        v.push(case(
            "bench --runs 1 --threads 1 --backing-dev @zeros-other",
            "belongs to another user",
        ));
        // (Only root opens a read-only file for writing at all.)
        v.push(case(
            "bench --runs 1 --threads 1 --backing-dev @zeros-ro",
            "is read-only (its owner may not write it)",
        ));
    }
    let loop_path = s.path("loop");
    let loop_path = loop_path.to_str().unwrap();
    for (n, (text, names)) in [
        (
            "[zram0]]\nzram-size = 64\n".to_string(),
            "line 1 (\"[zram0]]\"): text after the section's closing ]".to_string(),
        ),
        (
            "[zram0]\nmount-point = /tmp/x\\x2dy\nfs-type = ext4\n".to_string(),
            "line 2 (\"mount-point = /tmp/x\\\\x2dy\"): an escape \\x takes four hex digits"
                .to_string(),
        ),
        (
            format!("[zram0]\nwriteback-device = {loop_path}\n"),
            "it cannot be reached".to_string(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        v.push(conf(s, 920 + n, "others.conf", &text, &names));
    }
    v
}
