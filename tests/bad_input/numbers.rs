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
