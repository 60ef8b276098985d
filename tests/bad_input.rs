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
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "bad_input/cases.rs"]
mod cases;
#[path = "bad_input/numbers.rs"]
mod numbers;

const TIMEOUT: Duration = Duration::from_secs(20);

/// The scratch directory's files: what a case must leave as they are.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        // The process id in letters: messages name the scratch files, and a row that expects
        // a number ("-5") must not find it in the path.
        let id: String = std::process::id()
            .to_string()
            .bytes()
            .map(|d| char::from(b'a' + (d - b'0')))
            .collect();
        let dir = std::env::temp_dir().join(format!("uzram-bad-input-{tag}-{id}"));
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
        std::os::unix::fs::symlink(s.path("tiny"), s.path("link-to-tiny")).unwrap();
        std::os::unix::fs::symlink(s.path("nowhere"), s.path("dangling")).unwrap();
        std::os::unix::fs::symlink(s.path("loop"), s.path("loop")).unwrap();
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

/// Inputs zram-generator takes with a warning (sections and keys it does not know): planned,
/// exit 0, and the warning names them.
#[test]
fn what_zram_generator_ignores_is_warned_about_by_name() {
    let s = Scratch::new("t1");
    for (n, (text, names)) in [
        ("[zramX]\n[zram0]\n", "zramX] (devices are [zramN]"),
        ("[swap]\nzram-size = 1\n[zram0]\n", "swap"),
        (
            "[zram0]\nset!x = echo 1\n",
            "\"set!x\", ignoring (set! lines go before the first section)",
        ),
        ("[zram0]\ncolour = blue\n", "colour"),
        ("foo = 1\n[zram0]\n", "foo"),
        ("nope!x = 1\n[zram0]\n", "nope!"),
        ("set!x = echo 3; exit 1\n[zram0]\nzram-size = x\n", "exit"),
        (
            "set!ram = echo 5\n[zram0]\n",
            "set!ram: an expression's ram is always MemTotal",
        ),
        (
            "set!x-y = echo 5\n[zram0]\n",
            "no expression can name \"x-y\"",
        ),
        (
            "[zram0]\nzram-size = ram - ram\n",
            "[zram0] makes no device: its size",
        ),
        (
            "[zram0]\nzram-size\nswap-priority = 5\n",
            "\"zram-size\\nswap-priority\", ignoring (a line without = was read with the next one",
        ),
        (
            "[zram0]\nzram-size = 100\nzram-fraction = 0.5\n",
            "zram-size=100 is ignored: the obsolete zram-fraction set the size",
        ),
        (
            "[zram0]\nzram-resident-limit = 4G\n",
            "more than this machine's 4096 MiB of RAM: in effect no limit",
        ),
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
    let mut cases = cases::device_options();
    cases.extend(cases::subcommands());
    cases.extend(cases::configs(&scratch));
    cases.extend(numbers::numbers());
    cases.extend(numbers::mangled(&scratch));
    cases.extend(numbers::others(&scratch));
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
    // A full disk is said (a closed pipe is not): the help's too.
    for args in [&["--list-columns"][..], &["--help"]] {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (code, err, _) = run(&args, Stdio::from(full()));
        assert_eq!(code, Some(1));
        assert!(err.contains("No space left"), "{args:?}: {err}");
    }
}

/// A stdout closed at start (`uzram --help >&-`) is a write error said on stderr, exit 1, where
/// Rust's runtime would take the writes for a success; `>/dev/null` is not one.
#[test]
fn a_closed_stdout_is_said_and_exit_1() {
    use std::os::unix::process::CommandExt;
    for args in [&["--help"][..], &["--version"], &["--list-columns"]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uzram"));
        cmd.args(args).stdin(Stdio::null()).stderr(Stdio::piped());
        // SAFETY: close(2) is async-signal-safe; the child closes its own stdout before exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::close(1);
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} >&-: {err}");
        assert!(err.contains("standard output is closed"), "{args:?}: {err}");
        let out = Command::new(env!("CARGO_BIN_EXE_uzram"))
            .args(args)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?} >/dev/null");
        // /dev/null opened read-write by a parent (Python's DEVNULL, daemon(3)) is no closed
        // stdout either
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_uzram"))
            .args(args)
            .stdout(Stdio::from(rw))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?} 1<>/dev/null");
    }
}

/// A path holding a newline is quoted in messages: printed raw, its first line would name
/// another file.
#[test]
fn a_path_with_a_newline_is_quoted() {
    let s = Scratch::new("t5");
    let bad = s.path("a\nb");
    let out = Command::new(env!("CARGO_BIN_EXE_uzram"))
        .args(["setup", "--dry-run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a\\nb"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn a_setup_that_fails_on_its_second_device_creates_nothing() {
    // Checked whole before anything is created: the first device is fine, the second's backing
    // device holds a file system, which only the plan's check finds (the file parses). Without
    // a driver, the plan's error must still come first, and nothing appear.
    let s = Scratch::new("t3");
    let img = s.path("ext4.img");
    s.write(
        "two.conf",
        format!(
            "[zram0]\nzram-size = 64\n[zram1]\nzram-size = 64\nwriteback-device = {}\n",
            img.display()
        )
        .as_bytes(),
    );
    let conf = s.path("two.conf");
    let before = std::fs::read_dir("/run/uzram")
        .map(|d| d.count())
        .unwrap_or(0);
    let image = std::fs::read(&img).unwrap();
    for dry in [true, false] {
        let mut args: Vec<String> = vec!["setup".into()];
        if dry {
            args.push("--dry-run".into());
        }
        args.extend(["--config".into(), conf.to_str().unwrap().into()]);
        let (code, err, _) = run(&args, Stdio::null());
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(
            err.contains("[zram1]") && err.contains("ext4.img") && err.contains("holds data"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("no ublk driver"),
            "the plan is checked first: {err}"
        );
    }
    let after = std::fs::read_dir("/run/uzram")
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(before, after, "a control socket appeared");
    assert_eq!(std::fs::read(&img).unwrap(), image, "the image changed");
    let _ = std::fs::remove_dir_all(&s.dir);
}
