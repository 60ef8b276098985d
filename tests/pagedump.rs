//! `uzram dump-pages` against a real child process: this test binary run again as a helper that
//! holds a known marker in its heap, a known value in its environment, and a large untouched
//! allocation, then waits for its stdin to close.
//!
//! Reading another process's memory needs ptrace access to it; a parent may normally read its
//! own child, but where that is refused (yama ptrace_scope 2 or 3, an LSM) the tests say so and
//! pass without checking.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

use clap::Parser;
use uzram::tools::corpus::Corpus;
use uzram::tools::pagedump::{
    dump_process, run, DumpError, DumpOptions, DumpPagesArgs, DumpStats, PAGE_SIZE,
};

/// Set in the helper's environment: makes `helper_child_process` act as the helper.
const CHILD_SWITCH: &str = "UZRAM_PAGEDUMP_TEST_CHILD";
/// Set in the helper's environment and never read by it, so its only copy is on the stack.
const ENV_MARKER_VAR: &str = "UZRAM_PAGEDUMP_ENV_MARKER";
/// Bytes the helper allocates and never touches.
const UNTOUCHED_BYTES: usize = 32 << 20;

fn heap_marker(pid: u32) -> Vec<u8> {
    format!("uzram-heap-marker-{pid}-").into_bytes()
}

fn env_marker(parent_pid: u32) -> String {
    format!("uzram-env-marker-{parent_pid}-never-read")
}

/// The helper process itself, run by `Helper::spawn`; ignored and inert in a normal test run.
#[test]
#[ignore = "helper process for the dump tests, started by them"]
fn helper_child_process() {
    if std::env::var_os(CHILD_SWITCH).is_none() {
        return;
    }
    // 2 MiB of the marker, built at run time so the heap holds it (the binary does not).
    let heap = heap_marker(std::process::id()).repeat((2 << 20) / 24);
    // calloc-style allocation: mapped but never written, so pagemap shows it untouched.
    let untouched = vec![0u8; UNTOUCHED_BYTES];
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "READY {}", std::process::id()).unwrap();
    stdout.flush().unwrap();
    drop(stdout);
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::hint::black_box((heap, untouched));
}

/// A running helper; killed when dropped.
struct Helper {
    child: Child,
    _stdin: ChildStdin,
}

impl Helper {
    fn spawn() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper_child_process",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_SWITCH, "1")
            .env(ENV_MARKER_VAR, env_marker(std::process::id()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let helper = Self {
            _stdin: child.stdin.take().unwrap(),
            child,
        };
        let ready = format!("READY {}", helper.pid());
        // On failure the helper is dropped, which kills and reaps the child.
        assert!(
            stdout
                .lines()
                .map_while(Result::ok)
                .any(|line| line == ready),
            "helper process exited before it was ready"
        );
        helper
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Dumps the helper into memory, or `None` (with a message) when ptrace access is refused.
fn dump_helper(helper: &Helper, opts: &DumpOptions) -> Option<(Vec<u8>, DumpStats)> {
    let mut out = Vec::new();
    match dump_process(helper.pid(), &mut out, opts) {
        Ok(stats) => Some((out, stats)),
        Err(e @ DumpError::PermissionDenied { .. }) => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("dump failed: {e:?}"),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn dump_of_child_holds_its_heap_marker_in_whole_pages() {
    let helper = Helper::spawn();
    let Some((out, stats)) = dump_helper(&helper, &DumpOptions::default()) else {
        return;
    };
    assert_eq!(out.len() % PAGE_SIZE, 0);
    assert_eq!(out.len() as u64, stats.pages_written * PAGE_SIZE as u64);
    assert!(stats.mappings > 0 && stats.pages_written > 16, "{stats:?}");
    assert!(stats.pagemap_used, "{stats:?}");
    assert!(!stats.truncated);
    assert!(
        contains(&out, &heap_marker(helper.pid())),
        "heap marker missing from the dump"
    );
}

#[test]
fn dump_of_child_leaves_its_environment_out() {
    let helper = Helper::spawn();
    let Some((out, _)) = dump_helper(&helper, &DumpOptions::default()) else {
        return;
    };
    let marker = env_marker(std::process::id());
    assert!(
        !contains(&out, marker.as_bytes()),
        "environment string found: [stack] was dumped"
    );
}

#[test]
fn untouched_pages_are_skipped_unless_all_pages_are_asked_for() {
    let helper = Helper::spawn();
    let untouched = (UNTOUCHED_BYTES / PAGE_SIZE) as u64;
    let Some((_, resident)) = dump_helper(&helper, &DumpOptions::default()) else {
        return;
    };
    assert!(resident.untouched_pages >= untouched, "{resident:?}");
    let all = DumpOptions {
        resident_only: false,
        ..DumpOptions::default()
    };
    let Some((out, every)) = dump_helper(&helper, &all) else {
        return;
    };
    assert_eq!(every.untouched_pages, 0);
    assert!(every.zero_pages >= untouched, "{every:?}");
    assert!(
        every.pages_written >= resident.pages_written + untouched,
        "{every:?} {resident:?}"
    );
    assert_eq!(out.len() as u64, every.pages_written * PAGE_SIZE as u64);
}

#[test]
fn max_bytes_caps_the_dump_at_whole_pages() {
    let helper = Helper::spawn();
    let opts = DumpOptions {
        max_bytes: Some(16 * PAGE_SIZE as u64 + 1),
        ..DumpOptions::default()
    };
    let Some((out, stats)) = dump_helper(&helper, &opts) else {
        return;
    };
    assert_eq!(stats.pages_written, 16);
    assert_eq!(out.len(), 16 * PAGE_SIZE);
    assert!(stats.truncated);
}

#[test]
fn missing_process_is_reported_by_pid() {
    // Above any possible pid_max (2^22).
    let err = dump_process(u32::MAX, &mut Vec::new(), &DumpOptions::default()).unwrap_err();
    assert!(
        matches!(err, DumpError::NoSuchProcess { pid: u32::MAX }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "no process with pid 4294967295");
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("uzram-pagedump-test-{}-{name}", std::process::id()))
}

#[test]
fn cli_run_writes_a_loadable_page_file() {
    let helper = Helper::spawn();
    let path = temp_path("child.pages");
    let args = DumpPagesArgs {
        pid: helper.pid(),
        output: path.clone(),
        max_mib: Some(1),
        all_pages: false,
    };
    match run(&args) {
        Ok(()) => {}
        Err(e @ DumpError::PermissionDenied { .. }) => return eprintln!("skipping: {e}"),
        Err(e) => panic!("{e:?}"),
    }
    let corpus = Corpus::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(corpus.len(), 256);
}

#[test]
fn cli_run_failure_names_the_output_and_leaves_no_file() {
    let path = temp_path("missing-process.pages");
    let args = DumpPagesArgs {
        pid: u32::MAX,
        output: path.clone(),
        max_mib: None,
        all_pages: false,
    };
    assert!(matches!(run(&args), Err(DumpError::NoSuchProcess { .. })));
    assert!(!path.exists());

    let args = DumpPagesArgs {
        pid: std::process::id(),
        output: PathBuf::from("/nonexistent-dir/uzram/out.pages"),
        max_mib: None,
        all_pages: false,
    };
    let err = run(&args).unwrap_err();
    assert!(matches!(err, DumpError::WriteFile { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent-dir/uzram/out.pages"),
        "{err}"
    );
}

#[test]
fn cli_arguments_parse_as_documented() {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DumpPagesArgs,
    }
    let cli = Cli::try_parse_from([
        "dump-pages",
        "--pid",
        "42",
        "--output",
        "/tmp/x.pages",
        "--max-mib",
        "96",
    ])
    .unwrap();
    assert_eq!(cli.args.pid, 42);
    assert_eq!(cli.args.output, PathBuf::from("/tmp/x.pages"));
    assert_eq!(cli.args.max_mib, Some(96));
    assert!(!cli.args.all_pages);
    assert!(
        Cli::try_parse_from(["dump-pages", "--output", "x"]).is_err(),
        "--pid is required"
    );
}
