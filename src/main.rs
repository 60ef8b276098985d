//! The `uzram` binary: parse the arguments, run them, map the outcome to an exit code (0 success,
//! 1 failure, as zramctl's; a usage error is a failure too).

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use uzram::cli::Cli;

/// An error with its chain of sources, one line.
fn report(e: &dyn std::error::Error) -> String {
    let mut msg = format!("{e}");
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            // --help and --version succeed; a usage error fails with 1, as zramctl's.
            return if usage {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    #[cfg(feature = "ublk")]
    let detached = matches!(&cli.command, Some(uzram::cli::Command::Serve(a)) if a.detached);
    #[cfg(not(feature = "ublk"))]
    let detached = false;
    let result = uzram::cli::run(cli);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = report(e.as_ref());
            if detached {
                // `uzram --find` reads the daemon's stdout for its answer.
                println!("error: {msg}");
                #[cfg(feature = "ublk")]
                uzram::daemon::log(&msg);
            }
            eprintln!("uzram: {msg}");
            ExitCode::FAILURE
        }
    }
}
