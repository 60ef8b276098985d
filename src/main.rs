//! The `uzram` command line. Thin: parse arguments, call the library, map errors to exit codes.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "uzram",
    version,
    about = "A compressed RAM block device served from userspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a process's private anonymous memory to a file of 4 KiB pages (needs root or ptrace
    /// access), for benchmarks and ratio tests on realistic pages.
    DumpPages(uzram::pagedump::DumpPagesArgs),
}

/// An error with its chain of sources, one line.
fn report(e: &dyn std::error::Error) -> String {
    let mut msg = format!("uzram: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::DumpPages(args) => uzram::pagedump::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", report(&e));
            ExitCode::FAILURE
        }
    }
}
