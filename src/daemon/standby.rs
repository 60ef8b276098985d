//! Successors started ahead of need. A *standby* (`--standby`) is started by the supervisor
//! while a worker serves: pinned, its queue threads made, it waits for the supervisor's `go` on
//! its stdin and takes the device over when the worker dies.
//!
//! A *reserve* (`--standby --reserve-for N`) covers the supervisor's own death under systemd
//! (`systemctl kill`, a crash), where every process of the service dies at once and a restart
//! needs new processes while the device's I/O is held: in a swap storm those wait for memory
//! that only the held swap writes would free. A reserve is a standby that first moves itself
//! out of the service's cgroup (so the service's end does not reach it) and whose stdin is
//! the read end of a *lifeline*: a pipe whose write end the supervisor and every worker and
//! standby it starts hold (passed in [`LIFELINE_ENV`]). The pipe reaches its end only once
//! all of them have closed their descriptors, that is once none of them can run again: then
//! no process writes the region, and the reserve takes the device over. The supervisor
//! systemd starts next finds it serving and keeps it as its worker.

use std::io::Write;

use super::log;

/// What a standby is told when it takes over: the device, the restarts so far, why the last
/// worker ended.
#[derive(Debug, Clone)]
pub(super) struct Go {
    pub(super) id: u32,
    pub(super) restarts: u64,
    pub(super) cause: String,
}

/// The line a standby writes on its stdout once it is pinned and waits for its `go`: before
/// it, a takeover would start with the standby's own start-up (exec, locking, stacks), which in
/// a swap storm waits for memory that only the held device's swap writes would free.
pub(crate) const STANDBY_READY: &str = "standby";

/// Set (to 1) in a standby's environment by a supervisor that reads [`STANDBY_READY`]: one
/// from before it, which starts standbys of the binary now at its path after a package
/// upgrade, takes the first line for the worker's answer and would give the device up. An
/// environment variable, not an option, because an older binary ignores it.
pub(crate) const STANDBY_READY_ENV: &str = "UZRAM_STANDBY_READY";

/// The descriptor number of the lifeline's write end, in a worker's environment (an
/// environment variable, not an option: a binary from before reserves ignores it, and merely
/// holds the descriptor open, inherited).
pub(crate) const LIFELINE_ENV: &str = "UZRAM_LIFELINE_FD";

/// Why a reserve took the device over, as the restart's cause.
pub(crate) const RESERVE_CAUSE: &str = "service_ended";

/// A worker's first steps here: the lifeline kept and, for a reserve, out of the service's
/// cgroup (before it locks anything: what it faults in from then on is charged out there).
pub(super) fn prepare(args: &super::ServeArgs) -> Result<(), super::ServeError> {
    keep_lifeline();
    if args.reserve_for.is_some() {
        leave_service(args.log_fd)?;
    }
    Ok(())
}

/// Keeps the lifeline this worker inherited ([`LIFELINE_ENV`]) open for the rest of its life
/// and out of every program it starts. Nothing else is done with it.
fn keep_lifeline() {
    let fd = std::env::var(LIFELINE_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    if let Some(fd) = fd {
        // A descriptor that is not open is no lifeline: nothing to keep.
        let _ = crate::sys::keep_inherited_fd(fd);
    }
}

/// A reserve's first step: out of the service's cgroup (see `supervisor::cgroup`). On failure
/// it says why on the log descriptor the supervisor passed (its stderr is /dev/null) and the
/// reserve does not wait: without it a supervisor's death is a restart as before.
fn leave_service(log_fd: Option<i32>) -> Result<(), super::ServeError> {
    #[cfg(feature = "ublk")]
    let moved = super::supervisor::leave_service();
    #[cfg(not(feature = "ublk"))]
    let moved: Result<String, String> = Err("built without the ublk frontend".to_string());
    let what = moved.map_err(|why| {
        format!(
            "reserve {}: cannot leave the service's cgroup ({why}); a death of the supervisor waits for the service's restart",
            std::process::id()
        )
    });
    let line = match &what {
        Ok(there) => format!(
            "reserve {} waits in {there}: should the supervisor and its workers all end, it takes the device over",
            std::process::id()
        ),
        Err(why) => why.clone(),
    };
    if let Some(mut out) = log_fd.and_then(|fd| crate::sys::dup_fd(fd).ok()) {
        let _ = writeln!(out, "uzram: {line}");
    }
    what.map(drop).map_err(super::ServeError::Worker)
}

/// A standby, ready: says so where asked (see [`STANDBY_READY_ENV`]) and waits for its `go`
/// line; `None` when there is nothing to take over. A plain standby takes its supervisor's
/// closing the pipe for its end. A reserve (`reserve_for`) takes the pipe's end (the lifeline
/// cut) for its `go`, if its device still exists.
pub(super) fn ready_and_wait(reserve_for: Option<u32>) -> Option<Go> {
    // Ready: a death now needs nothing new but the adoption's tables and the I/O heap's step.
    if std::env::var_os(STANDBY_READY_ENV).is_some_and(|v| v == "1") {
        let _ = crate::common::output::outln(STANDBY_READY);
    }
    let mut line = String::new();
    let read = std::io::stdin().read_line(&mut line);
    if let Some(id) = reserve_for {
        // Only the end of the lifeline is a reserve's word: a line on it is not.
        if read.is_ok_and(|n| n == 0) && device_exists(id) {
            return Some(Go {
                id,
                restarts: 0,
                cause: RESERVE_CAUSE.to_string(),
            });
        }
        log(&format!(
            "reserve {}: its supervisor ended and /dev/ublkb{id} is gone: nothing to take over",
            std::process::id()
        ));
        return None;
    }
    read.ok()?;
    parse_go(&line)
}

/// `go ID RESTARTS CAUSE`.
fn parse_go(line: &str) -> Option<Go> {
    let mut words = line.split_whitespace();
    if words.next()? != "go" {
        return None;
    }
    Some(Go {
        id: words.next()?.parse().ok()?,
        restarts: words.next()?.parse().ok()?,
        cause: words.next().unwrap_or("unknown").to_string(),
    })
}

/// Whether device `id` is still there (deleted by a stop, there is nothing to take over).
fn device_exists(id: u32) -> bool {
    #[cfg(feature = "ublk")]
    {
        super::ublk::exists(id)
    }
    #[cfg(not(feature = "ublk"))]
    {
        let _ = id;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_go_line_names_the_device_the_restarts_and_the_cause() {
        let go = parse_go("go 3 7 killed_by_SIGKILL\n").expect("a go line");
        assert_eq!(
            (go.id, go.restarts, go.cause.as_str()),
            (3, 7, "killed_by_SIGKILL")
        );
        assert_eq!(
            parse_go("go 3 7").map(|g| g.cause),
            Some("unknown".to_string())
        );
        for bad in ["", "\n", "stop 3 7 x", "go x 7 y", "go 3", "go 3 -1 y"] {
            assert!(parse_go(bad).is_none(), "{bad:?}");
        }
    }
}
