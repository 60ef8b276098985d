//! Where the daemon's messages go: stderr (a terminal, or the --log file it was pointed at),
//! and syslog when detached without a --log file.

use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;

static SYSLOG: OnceLock<UnixDatagram> = OnceLock::new();

/// Logs one message of the daemon.
pub fn log(msg: &str) {
    crate::common::output::warn(format_args!("uzram: {msg}"));
    if let Some(sock) = SYSLOG.get() {
        // RFC 3164 as syslogd and journald take it on /dev/log: <facility*8+severity>tag[pid]: msg
        // (daemon facility 3, severity error 3).
        let line = format!("<27>uzram[{}]: {msg}", std::process::id());
        let _ = sock.send(line.as_bytes());
    }
}

/// Writes one message to the kernel's log (`/dev/kmsg`): for what happens while the device is
/// not served (a worker restarting), when a message to the log file or syslog could wait for
/// the device itself (their pages may be in swap on it). Errors are ignored.
pub fn kmsg(msg: &str) {
    use std::io::Write;
    if let Ok(mut k) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        // "<4>": a warning, so that it reaches the console as the kernel's own do.
        let _ = k.write_all(format!("<4>uzram: {msg}").as_bytes());
    }
}

/// Sends later messages to syslog (`/dev/log`) too, if there is one.
pub(super) fn open_syslog() {
    if let Ok(sock) = UnixDatagram::unbound() {
        if sock.connect("/dev/log").is_ok() {
            let _ = SYSLOG.set(sock);
        }
    }
}
