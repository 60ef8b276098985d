//! The `uzram` binary: parse the arguments, run them, map the outcome to an exit code (0 success,
//! 1 failure, as zramctl's; a usage error is a failure too).

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use uzram::cli::Cli;
use uzram::common::output::{outln, warn, OutputError};

/// An error with its chain of sources, one line; a source whose words the message already ends
/// with is not said twice.
fn report(e: &dyn std::error::Error) -> String {
    let mut msg = format!("{e}");
    let mut source = e.source();
    while let Some(s) = source {
        let words = s.to_string();
        if !msg.ends_with(&words) {
            msg.push_str(&format!(": {words}"));
        }
        source = s.source();
    }
    msg
}

/// The daemon's threads that serve I/O allocate from a heap that never faults; everything else
/// from malloc (see `uzram::daemon::heap`).
#[global_allocator]
static ALLOCATOR: uzram::daemon::heap::DaemonAlloc = uzram::daemon::heap::DaemonAlloc;

fn main() -> ExitCode {
    if uzram::sys::stdout_was_closed() {
        uzram::common::output::note_stdout_closed();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.kind() == clap::error::ErrorKind::InvalidUtf8 => {
            // clap does not say which: name it (lossily, with its position).
            let bad = std::env::args_os()
                .enumerate()
                .skip(1)
                .find(|(_, a)| a.to_str().is_none());
            match bad {
                Some((i, a)) => warn(format_args!(
                    "uzram: argument {i} ({:?}) is not UTF-8, which this option needs",
                    a.to_string_lossy()
                )),
                None => warn("uzram: an argument is not UTF-8"),
            }
            return ExitCode::FAILURE;
        }
        Err(e) => {
            let usage = e.use_stderr();
            if !usage && uzram::common::output::stdout_closed() {
                // --help or --version, with nowhere to print it
                warn(format_args!(
                    "uzram: {}",
                    uzram::common::output::closed_stdout_error()
                ));
                return ExitCode::FAILURE;
            }
            if let Err(w) = e.print() {
                // The help's reader went away: nothing to say. A full disk: say so, on stderr.
                let o = OutputError(w);
                if !o.is_closed_pipe() {
                    warn(format_args!("uzram: {o}"));
                }
                return ExitCode::FAILURE;
            }
            // --help and --version succeed; a usage error fails with 1, as zramctl's.
            return if usage {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    #[cfg(feature = "ublk")]
    // A detached daemon, and a supervisor's worker, say their error on stdout too: `uzram
    // --find` and the supervisor read it there (a successor's stderr is /dev/null).
    let detached = matches!(&cli.command,
        Some(uzram::cli::Command::Serve(a)) if a.detached || a.worker_region_fd.is_some());
    #[cfg(not(feature = "ublk"))]
    let detached = false;
    let result = uzram::cli::run(cli);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(o) = e.downcast_ref::<OutputError>() {
                // The reader went away: nothing to say. A full disk: say so, once.
                if !o.is_closed_pipe() {
                    warn(format_args!("uzram: {o}"));
                }
                return ExitCode::FAILURE;
            }
            let msg = report(e.as_ref());
            if detached {
                // `uzram --find` reads the daemon's stdout for its answer.
                let _ = outln(format_args!("error: {msg}"));
                #[cfg(feature = "ublk")]
                uzram::daemon::log(&msg);
            }
            warn(format_args!("uzram: {msg}"));
            ExitCode::FAILURE
        }
    }
}
