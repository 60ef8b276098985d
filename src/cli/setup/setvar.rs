//! zram-generator's `set!NAME = COMMAND` lines: the command run under /bin/sh as zram-generator
//! runs it, bounded here (its output, its time, no recursion into `uzram setup`), and its output
//! evaluated as a size expression into a variable the later expressions may use.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::generator::eval;
use super::{err, SetupError};

/// A line of the section-less part: `set!NAME = COMMAND`. The command runs under /bin/sh, as
/// zram-generator runs it (a failing exit is a warning), and its output is evaluated at once
/// over `ram` and the variables set so far; a later `set!` of the same name wins.
pub(super) fn set_var(
    file: &str,
    k: &str,
    v: &str,
    ram: u64,
    vars: &mut BTreeMap<String, f64>,
    notes: &mut Vec<String>,
) -> Result<(), SetupError> {
    let Some(bang) = k.find('!') else {
        notes.push(format!("{file}: ignoring {k:?} outside of a section"));
        return Ok(());
    };
    let (op, var) = k.split_at(bang + 1);
    if op != "set!" {
        notes.push(format!(
            "{file}: ignoring the unknown operation {op:?} ({k:?})"
        ));
        return Ok(());
    }
    // A command with control characters (a NUL, an escape) is shown quoted, not raw.
    let shown = if v.chars().any(char::is_control) {
        format!("{v:?}")
    } else {
        v.to_string()
    };
    let bad = |m: String| err(file, format!("{k} = {shown}: {m}"));
    if var.is_empty() {
        return Err(bad(
            "set! needs a variable's name (set!NAME = COMMAND)".into()
        ));
    }
    if std::env::var_os(SET_ENV).is_some() {
        return Err(bad(format!(
            "not run: this uzram was started by a set! command ({SET_ENV} is set), and running \
             set! commands from there could run the same one again without end"
        )));
    }
    if var == "ram" {
        notes.push(format!(
            "{file}: {k}: an expression's ram is always MemTotal in MiB (zram-generator reads it \
             first), so this variable is never used"
        ));
    } else if !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || var.starts_with(|c: char| c.is_ascii_digit())
    {
        notes.push(format!(
            "{file}: {k}: no expression can name {var:?} (a name is letters, digits and _, not \
             starting with a digit), so this variable is never used"
        ));
    }
    notes.push(format!("{file}: ran {k}: /bin/sh -c {v:?}"));
    let (status, stdout) = run_set(v, SET_TIMEOUT).map_err(bad)?;
    let ended = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(0), _) => String::new(),
        (Some(code), _) => format!(" (it exited with status {code})"),
        (None, Some(sig)) => format!(" (it was killed by signal {sig})"),
        (None, None) => format!(" ({status})"),
    };
    if !ended.is_empty() {
        notes.push(format!("{file}: {k} = {v}: failed{ended}; its output is used all the same, as zram-generator uses it"));
    }
    let text =
        String::from_utf8(stdout).map_err(|_| bad(format!("its output is not UTF-8{ended}")))?;
    let value = eval(text.trim(), ram, vars)
        .map_err(|m| bad(format!("its output {:?}: {m}{ended}", text.trim())))?;
    vars.insert(var.to_string(), value);
    Ok(())
}

/// The most a `set!` command may print (zram-generator reads all of it): an expression over a
/// few numbers needs far less.
pub const SET_OUTPUT_MAX: usize = 4096;
/// The longest a `set!` command may run (zram-generator waits for it): setup runs at boot.
pub const SET_TIMEOUT: Duration = Duration::from_secs(10);
/// Set in a `set!` command's environment; `uzram setup` refuses to run where it is set: a
/// `set!` that ran `uzram setup` on its own file would run itself again without end.
pub const SET_ENV: &str = "UZRAM_SETUP_SET_COMMAND";

/// Passes a `set!` command's messages on as they come (zram-generator lets them through), the
/// first [`SET_OUTPUT_MAX`] bytes of them: at boot they go to the journal, and a command that
/// prints without end must not fill it. The rest is read and dropped, so that it never blocks.
fn pass_on_errors(mut stderr: std::process::ChildStderr) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut left = SET_OUTPUT_MAX;
        let mut buf = [0u8; 4096];
        loop {
            let n = match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut e = std::io::stderr().lock();
            if left > 0 {
                let pass = n.min(left);
                let _ = e.write_all(&buf[..pass]);
                left -= pass;
                if left == 0 {
                    let _ = writeln!(e, "\n(its further messages are dropped)");
                }
            }
        }
    })
}

/// Runs a `set!` command under /bin/sh in a process group of its own, with [`SET_ENV`] set:
/// its exit status and output, or why it was stopped (it ran past `timeout`, or printed
/// more than [`SET_OUTPUT_MAX`] bytes: then its whole group is killed).
pub(super) fn run_set(
    command: &str,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, Vec<u8>), String> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    if command.contains('\0') {
        // The INI reader turns \0 into a NUL byte, which no command line can carry.
        return Err(
            "the command holds a NUL byte (the configuration's \\0 is read as one: write \\\\0 for a backslash and 0)"
                .into(),
        );
    }
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", "--", command])
        .env(SET_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run /bin/sh: {e}"))?;
    let (Some(mut stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        crate::sys::kill_group(child.id(), libc::SIGKILL);
        let _ = child.wait();
        return Err("no pipe for its output".into());
    };
    let full = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = std::thread::spawn({
        let full = std::sync::Arc::clone(&full);
        move || {
            let mut out = Vec::new();
            let _ = (&mut stdout)
                .take(SET_OUTPUT_MAX as u64 + 1)
                .read_to_end(&mut out);
            if out.len() > SET_OUTPUT_MAX {
                full.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            out
        }
    });
    let err_reader = pass_on_errors(stderr);
    let too_much = || {
        format!(
            "it printed more than {SET_OUTPUT_MAX} bytes (a size expression needs a few): stopped"
        )
    };
    let deadline = Instant::now() + timeout;
    let mut status = None;
    let stopped = loop {
        if status.is_none() {
            match child.try_wait() {
                Ok(st) => status = st,
                Err(e) => break Some(format!("waiting for it: {e}")),
            }
        }
        if full.load(std::sync::atomic::Ordering::Relaxed) {
            break Some(too_much());
        }
        // Done once the shell has exited and its output is closed (a command it left running
        // in the background may hold it open: that is waited for too, to the deadline).
        // Its errors are not waited for (zram-generator waits for its output only): a child it
        // left running may hold them open.
        if reader.is_finished() && status.is_some() {
            break None;
        }
        if Instant::now() >= deadline {
            break Some(format!(
                "still running after {} s: stopped (a set! command must finish within that)",
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if let Some(why) = stopped {
        crate::sys::kill_group(child.id(), libc::SIGKILL);
        if status.is_none() {
            let _ = child.wait();
        }
        // The reader is left to end when the pipe closes: a process that left the group (a
        // new session of its own) may hold the pipe open after the kill, and a boot-time
        // setup must not wait for it.
        drop(reader);
        drop(err_reader);
        return Err(why);
    }
    let status = match status {
        Some(s) => s,
        None => return Err("its status was lost".into()),
    };
    // Finished (checked above): joins at once.
    let out = reader.join().unwrap_or_default();
    // What it said before it ended is passed on before its output is used; a child left
    // holding its errors open gets a moment, then is left to the reader.
    let grace = Instant::now() + Duration::from_millis(100);
    while !err_reader.is_finished() && Instant::now() < grace {
        std::thread::sleep(Duration::from_millis(5));
    }
    if err_reader.is_finished() {
        let _ = err_reader.join();
    }
    // The reader may have filled up after the loop last looked.
    if out.len() > SET_OUTPUT_MAX {
        return Err(too_much());
    }
    Ok((status, out))
}
