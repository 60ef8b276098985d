//! Bad input, table-driven: every subcommand and config format given values a user might
//! mistype, files that are not what they should be, and outputs that cannot be written. Each
//! case runs the real binary under a timeout and asserts that it exits 1 (not 0, not a panic's
//! 101, not a signal), that its message names the bad value, that nothing panicked, and that
//! nothing on disk changed: every file of the scratch directory is hashed before and after.
//!
//! The cases run on any machine: where a command would need the ublk driver, the input is
//! refused before the driver is looked for (a plan is checked whole before it touches the
//! system).

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

/// The scratch directory's files: what a case must leave as they are.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("uzram-bad-input-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a-dir")).unwrap();
        let s = Scratch { dir };
        s.write("data", &b"someone's precious document\n".repeat(100_000));
        s.write("tiny", b"hello");
        s.write("empty", b"");
        s.write("not-utf8.conf", b"[zram0]\nzram-size = \xff\xfe\n");
        s.write("big.conf", &vec![b'#'; (1 << 20) + 10]);
        let mut ext = vec![0u8; 2 << 20];
        ext[1080] = 0x53;
        ext[1081] = 0xef;
        s.write("ext4.img", &ext);
        std::os::unix::fs::symlink(s.path("data"), s.path("link-to-data")).unwrap();
        std::os::unix::fs::symlink(s.path("nowhere"), s.path("dangling")).unwrap();
        let ok = Command::new("mkfifo")
            .arg(s.path("fifo"))
            .status()
            .is_ok_and(|st| st.success());
        assert!(ok, "mkfifo");
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.path(name), bytes).unwrap();
    }

    /// Every entry under the directory: a regular file's length and hash, a symlink's target,
    /// or the kind of anything else.
    fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        let mut todo = vec![self.dir.clone()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let what = if m.is_symlink() {
                    format!("-> {:?}", std::fs::read_link(&p).unwrap())
                } else if m.is_dir() {
                    todo.push(p.clone());
                    "dir".into()
                } else if m.is_file() {
                    let bytes = std::fs::read(&p).unwrap();
                    let mut h = DefaultHasher::new();
                    bytes.hash(&mut h);
                    format!("{} bytes, {:x}", bytes.len(), h.finish())
                } else {
                    format!("{:?}", m.file_type())
                };
                out.insert(p, what);
            }
        }
        out
    }
}

/// Runs the binary with `args` and `stdin` bytes (none: /dev/null); kills it past [`TIMEOUT`].
fn run(args: &[String], stdout: Stdio) -> (Option<i32>, String, bool) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_uzram"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run uzram");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let start = Instant::now();
    let (code, timed_out) = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break (st.code(), false);
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (code, reader.join().unwrap(), timed_out)
}

/// One bad input: the arguments (`@name` is the scratch file `name`) and a word the message
/// must contain (`@name` again stands for the file's path).
struct Case {
    args: Vec<String>,
    names: String,
}

fn case(args: &str, names: &str) -> Case {
    Case {
        args: shell_words(args),
        names: names.to_string(),
    }
}

/// Splits on spaces, keeping `'...'` together (no escapes: the table needs no more).
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

fn expand(s: &str, scratch: &Scratch) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let name: String = rest[at + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
            .collect();
        out.push_str(scratch.path(&name).to_str().unwrap());
        rest = &rest[at + 1 + name.len()..];
    }
    out.push_str(rest);
    out
}

/// A zram-generator.conf (or zramswap file) with `text`, planned with `setup --dry-run`; the
/// message must name `names`.
fn conf(scratch: &Scratch, n: usize, file: &str, text: &str, names: &str) -> Case {
    let name = format!("case{n}-{file}");
    scratch.write(&name, text.as_bytes());
    Case {
        args: vec![
            "setup".into(),
            "--dry-run".into(),
            "--ram-mib".into(),
            "4096".into(),
            "--config".into(),
            scratch.path(&name).to_str().unwrap().into(),
        ],
        names: names.to_string(),
    }
}

fn command_line_cases() -> Vec<Case> {
    let mut v = Vec::new();
    // zramctl's --size (util-linux's strtosize).
    v.push(case("--find --size -1G", "'-1'"));
    for size in [
        "lots",
        "-1",
        "1.5",
        "4X",
        "16E",
        "1Z",
        "1Y",
        "G",
        "0x",
        "4 G",
        "1.5.5G",
        "4GiBs",
        "99999999999999999999",
        "4iB",
        "1e9",
    ] {
        v.push(case(&format!("--find --size '{size}'"), size));
    }
    v.push(case("--find --size 0", "size 0"));
    v.push(case("--find --size ''", "\"\""));
    // What a device is made of.
    for (args, names) in [
        ("--algorithm lzo", "lzo"),
        ("--algorithm ''", "algorithm"),
        ("--algorithm zstdx", "zstdx"),
        ("--algorithm-params level=banana", "banana"),
        ("--algorithm zstd --algorithm-params level=99999", "99999"),
        ("--algorithm lz4 --algorithm-params algo=zstd", "algo=zstd"),
        ("--algorithm-params 'priority=9 level=1'", "priority"),
        ("--algorithm-params garbage", "garbage"),
        ("--algorithm-params algo=lzo", "lzo"),
        ("--algorithm-params dict=@nowhere", "nowhere"),
        ("--algorithm-params dict=/dev/zero", "/dev/zero"),
        ("--algorithm-params dict=@fifo", "fifo"),
        ("--algorithm-params dict=@a-dir", "a-dir"),
        ("--algorithm-params dict=@empty", "empty"),
        ("--recomp-algorithm 'algo=zstd priority=4'", "priority"),
        ("--recomp-algorithm lzo", "lzo"),
        ("--recomp-algorithm priority=1", "priority=1"),
        ("--policy evict=maybe", "evict=maybe"),
        ("--policy pool_share=101", "pool_share=101"),
        ("--policy psi=200", "psi=200"),
        ("--policy colour=blue", "colour=blue"),
        ("--policy budget=lots", "budget=lots"),
        ("--policy writeback_after=soon", "writeback_after=soon"),
        ("--policy low_watermark=95", "low_watermark"),
        ("--policy spill=2", "spill=2"),
        ("--policy min_free=-1", "min_free=-1"),
        ("--policy recompress_after=99999999999d", "recompress_after"),
        ("--mem-limit much", "much"),
        ("--mem-limit -1", "-1"),
        ("--mem-limit 1.5G", "1.5G"),
        ("--mem-limit 99999999999999999999", "99999999999999999999"),
        ("--backing-dev /dev/null", "/dev/null"),
        ("--backing-dev @a-dir", "a-dir"),
        ("--backing-dev @fifo", "fifo"),
        ("--backing-dev @tiny", "tiny"),
        ("--backing-dev @data", "data"),
        ("--backing-dev @ext4.img", "ext4.img"),
        ("--backing-dev @link-to-data", "link-to-data"),
        ("--backing-dev @dangling", "dangling"),
        ("--backing-dev @tiny --force", "tiny"),
        ("--streams 0", "streams"),
        ("--streams 70000", "70000"),
        ("--streams -1", "-1"),
    ] {
        v.push(case(&format!("--find --size 64M {args}"), names));
    }
    let mut stripes = String::from("--find --size 64M");
    for i in 0..17 {
        stripes.push_str(&format!(" --backing-dev @stripe{i}"));
    }
    v.push(case(&stripes, "17"));
    // Devices and listing.
    for (args, names) in [
        ("-o NOPE", "NOPE"),
        ("-o +NOPE", "NOPE"),
        ("-o NAME,,DISKSIZE", "\"\""),
        ("--output ''", "\"\""),
        ("--reset", "--reset"),
        ("--reset /dev/ublkb99999", "/dev/ublkb99999"),
        ("--reset /dev/zram0", "/dev/zram0"),
        ("/dev/ublkbX", "/dev/ublkbX"),
        ("/dev/ublkb-1", "/dev/ublkb-1"),
        ("/dev/ublkb01", "/dev/ublkb01"),
        ("/dev/ublkb+1", "/dev/ublkb+1"),
        ("/dev/ublkb1048576", "/dev/ublkb1048576"),
        ("/dev/ublkb99999999999", "/dev/ublkb99999999999"),
        ("/dev/ublkb", "/dev/ublkb"),
        ("atr", "atr"),
        ("sertup", "sertup"),
        ("--size 1G /dev/zram0", "/dev/zram0"),
        ("--size 1G /dev/ublkb1 /dev/ublkb2", "one device"),
        ("--find --size 1G /dev/ublkb1", "either --find"),
        ("--find --streams 0", "--size"),
        ("--find --log @x", "--size"),
        ("--algorithm zstd", "--algorithm"),
        ("--force", "--force"),
        ("--bogus", "--bogus"),
        ("-z", "-z"),
        ("--size", "--size"),
        ("--log @a-dir --find --size 64M", "a-dir"),
    ] {
        v.push(case(args, names));
    }
    // attr.
    for (args, names) in [
        ("attr /dev/ublkb4000 mm_stat", "/dev/ublkb4000"),
        ("attr /dev/zram0 mm_stat", "/dev/zram0"),
        ("attr ublkbX mm_stat", "ublkbX"),
        ("attr /dev/ublkb01 mm_stat", "/dev/ublkb01"),
        ("attr", "DEVICE"),
        ("attr /dev/ublkb0", "NAME"),
        ("attr /dev/ublkb4000 disksize 1G", "/dev/ublkb4000"),
    ] {
        v.push(case(args, names));
    }
    // bench.
    for (args, names) in [
        ("bench --threads 0", "threads"),
        ("bench --threads 100000", "100000"),
        ("bench --threads -1", "-1"),
        ("bench --runs 0", "runs"),
        ("bench --runs 100000", "100000"),
        ("bench --corpus /dev/zero", "/dev/zero"),
        ("bench --corpus @fifo", "fifo"),
        ("bench --corpus @a-dir", "a-dir"),
        ("bench --corpus @nowhere", "nowhere"),
        ("bench --corpus @tiny", "tiny"),
        ("bench --corpus @empty", "empty"),
        ("bench --corpus @dangling", "dangling"),
        ("bench --algorithm lzo", "lzo"),
        ("bench --algorithm-params level=banana", "banana"),
        ("bench --policy colour=blue", "colour=blue"),
        ("bench --backing-dev @data", "data"),
        ("bench --pid 4294967295", "4294967295"),
        ("bench --pid abc", "abc"),
    ] {
        v.push(case(args, names));
    }
    // dump-pages: a process that is not there must leave the output as it was.
    for (args, names) in [
        ("dump-pages --pid 4194304 -o @data", "4194304"),
        ("dump-pages --pid 4194304 -o @link-to-data", "4194304"),
        ("dump-pages --pid 4194304 -o @new-file", "4194304"),
        ("dump-pages --pid 1 -o /dev/null", "/dev/null"),
        ("dump-pages --pid 1 -o @fifo", "fifo"),
        ("dump-pages --pid 1 -o @a-dir", "a-dir"),
        ("dump-pages --pid 1 -o @nowhere/x", "nowhere"),
        ("dump-pages --pid abc -o @x", "abc"),
        ("dump-pages --pid 1 --max-mib abc -o @x", "abc"),
        ("dump-pages -o @x", "--pid"),
    ] {
        v.push(case(args, names));
    }
    // setup and teardown: the files themselves.
    for (args, names) in [
        ("setup --dry-run --config @nowhere", "nowhere"),
        ("setup --dry-run --config @fifo", "fifo"),
        ("setup --dry-run --config /dev/zero", "/dev/zero"),
        ("setup --dry-run --config @a-dir", "a-dir"),
        ("setup --dry-run --config @big.conf", "big.conf"),
        ("setup --dry-run --config @not-utf8.conf", "not-utf8.conf"),
        ("setup --dry-run --config @empty --ram-mib -1", "-1"),
        ("setup --dry-run --config @empty --ram-mib nan", "NaN"),
        ("setup --dry-run --config @empty --ram-mib inf", "inf"),
        ("setup --dry-run --config @empty --ram-mib 0", "0"),
        ("setup --dry-run --config @empty --ram-mib abc", "abc"),
        ("teardown --config @nowhere", "nowhere"),
        ("teardown --config @fifo", "fifo"),
        ("setup --config @fifo", "fifo"),
    ] {
        v.push(case(args, names));
    }
    // Invalid UTF-8 is named by clap.
    v
}

fn config_cases(s: &Scratch) -> Vec<Case> {
    let gen = |body: &str| format!("[zram0]\n{body}\n");
    let table: &[(&str, &str, &str)] = &[
        // zram-generator.conf
        (
            "zram-generator.conf",
            &gen("zram-size = ram / 0"),
            "zram-size",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = 0 / 0"),
            "zram-size",
        ),
        ("zram-generator.conf", &gen("zram-size = -ram"), "zram-size"),
        ("zram-generator.conf", &gen("zram-size = -1"), "zram-size"),
        (
            "zram-generator.conf",
            &gen("zram-size = ram *"),
            "zram-size",
        ),
        ("zram-generator.conf", &gen("zram-size = banana"), "banana"),
        (
            "zram-generator.conf",
            &gen("zram-size = 1e300"),
            "zram-size",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = ram ^ 99"),
            "zram-size",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = -1"),
            "zram-resident-limit",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = 1/0"),
            "zram-resident-limit",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = x"),
            "zram-resident-limit",
        ),
        ("zram-generator.conf", &gen("swap-priority = abc"), "abc"),
        (
            "zram-generator.conf",
            &gen("swap-priority = 40000"),
            "40000",
        ),
        ("zram-generator.conf", &gen("swap-priority = -2"), "-2"),
        (
            "zram-generator.conf",
            &gen("host-memory-limit = abc"),
            "abc",
        ),
        ("zram-generator.conf", &gen("zram-fraction = abc"), "abc"),
        ("zram-generator.conf", &gen("max-zram-size = abc"), "abc"),
        (
            "zram-generator.conf",
            &gen("compression-algorithm = lzo-rle(level=banana)"),
            "banana",
        ),
        (
            "zram-generator.conf",
            &gen("compression-algorithm = zstd(level)"),
            "level",
        ),
        (
            "zram-generator.conf",
            &gen("fs-type = nosuchfs"),
            "nosuchfs",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = relative/dir"),
            "relative/dir",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = /a/../b"),
            "/a/../b",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = /x\nfs-type = nosuchfs"),
            "nosuchfs",
        ),
        (
            "zram-generator.conf",
            &gen("writeback-device = /dev/null"),
            "/dev/null",
        ),
        (
            "zram-generator.conf",
            &gen("writeback-device = relative"),
            "relative",
        ),
        (
            "zram-generator.conf",
            &gen("uzram-policy = colour=blue"),
            "colour=blue",
        ),
        ("zram-generator.conf", "[zram1]\n[zram01]\n", "zram01"),
        ("zram-generator.conf", "[zram0\nzram-size = 1\n", "case27"),
        (
            "zram-generator.conf",
            "[zram99999999999]\n",
            "zram99999999999",
        ),
        ("zram-generator.conf", "set! = echo 1\n[zram0]\n", "set!"),
        (
            "zram-generator.conf",
            "set!x = echo 'ram /'\n[zram0]\n",
            "set!x",
        ),
        (
            "zram-generator.conf",
            "set!x = LC_ALL=C awk 'BEGIN{printf \"%c\", 255}'\n[zram0]\n",
            "UTF-8",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-size = 100 # MiB\n",
            "zram-size",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-fraction = -1\n",
            "zram-fraction",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-fraction = inf\n",
            "zram-fraction",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nmax-zram-size = 1.5\n",
            "max-zram-size",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nhost-memory-limit = 1.5\n",
            "host-memory-limit",
        ),
        (
            "zram-generator.conf",
            "[zram0]\ncompression-algorithm = zstd(level=99)\n",
            "99",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-size = 64\n[zram1]\nzram-size = 64\nuzram-policy = spill=7\n",
            "spill=7",
        ),
        // zramswap
        ("zramswap", "PERCENT=abc\n", "abc"),
        ("zramswap", "PERCENT=-5\n", "-5"),
        ("zramswap", "PERCENT=1.5\n", "1.5"),
        ("zramswap", "SIZE=abc\n", "abc"),
        ("zramswap", "SIZE=-1\n", "-1"),
        ("zramswap", "PRIORITY=abc\n", "abc"),
        ("zramswap", "PRIORITY=40000\n", "40000"),
        ("zramswap", "PRIORITY=-2\n", "-2"),
        ("zramswap", "ALGO=nosuch\n", "nosuch"),
        ("zramswap", "ALGO=\"zstd\nPERCENT=1\n", "ALGO"),
        ("zramswap", "PERCENT=$(rm -rf /)\n", "rm -rf"),
        ("zramswap", "PERCENT=`reboot`\n", "reboot"),
    ];
    table
        .iter()
        .enumerate()
        .map(|(n, &(file, text, names))| conf(s, n, file, text, names))
        .collect()
}

/// Inputs zram-generator takes with a warning (sections and keys it does not know): planned,
/// exit 0, and the warning names them.
#[test]
fn what_zram_generator_ignores_is_warned_about_by_name() {
    let s = Scratch::new("t1");
    for (n, (text, names)) in [
        ("[zramX]\n[zram0]\n", "zramX"),
        ("[swap]\nzram-size = 1\n[zram0]\n", "swap"),
        ("[zram0]\nset!x = echo 1\n", "set!x"),
        ("[zram0]\ncolour = blue\n", "colour"),
        ("foo = 1\n[zram0]\n", "foo"),
        ("nope!x = 1\n[zram0]\n", "nope!"),
        ("set!x = echo 3; exit 1\n[zram0]\nzram-size = x\n", "exit"),
    ]
    .into_iter()
    .enumerate()
    {
        let c = conf(&s, n, "warned.conf", text, names);
        let (code, err, _) = run(&c.args, Stdio::null());
        assert_eq!(code, Some(0), "{text:?}: {err}");
        // A file's warning, or a section's ("uzram: [zram0] ...").
        let warned = err.contains("warning") || err.contains("uzram: [zram0] ");
        assert!(warned && err.contains(names), "{text:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn every_bad_input_is_refused_by_name_and_changes_nothing() {
    let scratch = Scratch::new("t2");
    let mut cases = command_line_cases();
    cases.extend(config_cases(&scratch));
    assert!(cases.len() >= 150, "{} cases", cases.len());
    let before = scratch.snapshot();
    let mut failures = Vec::new();
    for c in &cases {
        let args: Vec<String> = c.args.iter().map(|a| expand(a, &scratch)).collect();
        let names = expand(&c.names, &scratch);
        let (code, err, timed_out) = run(&args, Stdio::null());
        let what = format!("uzram {}", args.join(" "));
        if timed_out {
            failures.push(format!("{what}: still running after {TIMEOUT:?}"));
        } else if code != Some(1) {
            failures.push(format!("{what}: exit {code:?}, not 1: {err}"));
        } else if err.contains("panicked") {
            failures.push(format!("{what}: panicked: {err}"));
        } else if !err.contains(&names) {
            failures.push(format!(
                "{what}: the message does not name {names:?}: {err}"
            ));
        }
        let after = scratch.snapshot();
        if after != before {
            failures.push(format!("{what}: changed the scratch files"));
            for (p, was) in &before {
                if after.get(p) != Some(was) {
                    failures.push(format!(
                        "    {} was {was}, is {:?}",
                        p.display(),
                        after.get(p)
                    ));
                }
            }
            for p in after.keys().filter(|p| !before.contains_key(*p)) {
                failures.push(format!("    {} is new", p.display()));
            }
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch.dir);
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// An argument that is not UTF-8 is named, by its position and its lossy text.
#[test]
fn an_argument_that_is_not_utf8_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"4\xffG");
    let out = Command::new(env!("CARGO_BIN_EXE_uzram"))
        .args([
            std::ffi::OsStr::new("--find"),
            std::ffi::OsStr::new("--size"),
            bad,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("argument 3") && err.contains("4\u{fffd}G"),
        "{err}"
    );
}

/// The write end of a pipe whose reader is gone: a FIFO opened for reading (without waiting
/// for a writer), then for writing, then its reader closed.
fn closed_pipe() -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("uzram-closed-pipe-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    assert!(Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    drop(reader);
    let _ = std::fs::remove_file(&path);
    writer
}

/// A closed pipe or a full disk as stdout ends the program with exit 1 and no panic, as
/// coreutils do (quietly for the pipe).
#[test]
fn an_unwritable_stdout_is_exit_1_without_a_panic() {
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for args in [&["--list-columns"][..], &["--help"], &["bench", "--help"]] {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (code, err, _) = run(&args, Stdio::from(full()));
        assert_eq!(code, Some(1), "{args:?} >/dev/full: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let (code, err, _) = run(&args, Stdio::from(closed_pipe()));
        assert_eq!(code, Some(1), "{args:?} | (closed): {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (code, err, _) = run(&["--list-columns".into()], Stdio::from(full()));
    assert_eq!(code, Some(1));
    assert!(err.contains("No space left"), "{err}");
}

#[test]
fn a_setup_that_fails_on_its_second_device_creates_nothing() {
    // Checked whole before anything is created: the first device is fine, the second's
    // policy is not. Without a driver the plan's error must still come first.
    let s = Scratch::new("t3");
    s.write(
        "two.conf",
        b"[zram0]\nzram-size = 64\n[zram1]\nzram-size = 64\nuzram-policy = evict=maybe\n",
    );
    let conf = s.path("two.conf");
    let (code, err, _) = run(
        &[
            "setup".into(),
            "--config".into(),
            conf.to_str().unwrap().into(),
        ],
        Stdio::null(),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("evict=maybe"), "{err}");
    let _ = Path::new("/run/uzram");
    let _ = std::fs::remove_dir_all(&s.dir);
}
