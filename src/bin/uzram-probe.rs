//! `uzram-probe PAGES`: loads and attaches the daemon's slot-free probe for a device of PAGES
//! pages and holds it until the daemon has taken it over (see `uzram::daemon::slotfree`). Run by
//! `uzram serve`, never by hand. A binary of its own so that the daemon, which locks all its
//! code in memory, does not carry aya's.

#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    uzram::daemon::slotfree::helper::run(&args)
}
