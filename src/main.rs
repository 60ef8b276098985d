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
    /// Measure the engine against the raw codec on realistic pages: write and read rates at 1 and
    /// N threads, and the memory it takes (mm_stat). Without --corpus or --pid it uses the
    /// checked-in sample, so it runs on any machine.
    Bench(uzram::bench::BenchArgs),
    /// Write a process's private anonymous memory to a file of 4 KiB pages (needs root or ptrace
    /// access), for benchmarks and ratio tests on realistic pages.
    DumpPages(uzram::pagedump::DumpPagesArgs),
    /// Create /dev/ublkbN backed by the engine and serve it in the foreground until SIGTERM or
    /// SIGINT (prints the device path once it serves I/O)
    #[cfg(feature = "ublk")]
    Serve(uzram::ublk::ServeArgs),
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
    let result: Result<(), Box<dyn std::error::Error>> = match Cli::parse().command {
        Command::Bench(args) => uzram::bench::run(&args)
            .map(|r| {
                if args.json {
                    println!("{}", r.to_json());
                } else {
                    print!("{}", r.to_table());
                }
            })
            .map_err(Into::into),
        Command::DumpPages(args) => uzram::pagedump::run(&args).map_err(Into::into),
        #[cfg(feature = "ublk")]
        Command::Serve(args) => uzram::ublk::serve(&args).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", report(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
