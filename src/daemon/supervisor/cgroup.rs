//! Keeping the device's memory out of swap wherever the supervisor was started. While no worker
//! maps the region (between a worker's death and its successor's start) nothing locks its
//! pages, and reclaim in a swap storm would write them out to the very device whose I/O waits
//! for the successor that needs them. A memory cgroup with `memory.swap.max` 0 forbids that;
//! the systemd units put uzram in one (`MemorySwapMax=0`), and a supervisor started from a
//! shell (`uzram --find`, as the README says) moves itself into one before it makes the region
//! or starts a worker, so that everything they fault in is charged there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// cgroup v2's mount point.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The cgroup a supervisor makes for itself where systemd does not manage the tree (under
/// [`CGROUP_ROOT`]; shared by every device's supervisor).
const OWN_CGROUP: &str = "uzram";
/// How long systemd may take to move the supervisor into its new scope (the job is
/// asynchronous).
const SCOPE_WAIT: Duration = Duration::from_secs(3);
/// How long `busctl` may take to answer (its own timeout bounds the call, not the connection
/// to a bus that accepts and never answers).
const BUSCTL_WAIT: Duration = Duration::from_secs(6);

/// Whether this process's memory cgroup, or one above it, forbids swap (`memory.swap.max` 0):
/// then the region's pages are never swapped out, also while no worker maps them (locked).
/// Otherwise, why not.
fn swap_forbidden() -> Result<(), String> {
    let own = own_cgroup()?;
    let mut dir = PathBuf::from(CGROUP_ROOT);
    dir.push(own.trim_start_matches('/'));
    loop {
        let max = std::fs::read_to_string(dir.join("memory.swap.max")).unwrap_or_default();
        if max.trim() == "0" {
            return Ok(());
        }
        if dir == Path::new(CGROUP_ROOT) || !dir.pop() {
            return Err(format!(
                "its cgroup {own} lets its memory be swapped (memory.swap.max is not 0 there or above)"
            ));
        }
    }
}

/// This process's cgroup v2 path (`/` for the root).
fn own_cgroup() -> Result<String, String> {
    let cgroups = crate::common::read_text(Path::new("/proc/self/cgroup"), 1 << 16)
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    crate::common::cgroup_v2_path(&cgroups)
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "it is in no cgroup v2 hierarchy (/proc/self/cgroup: {:?})",
                cgroups.trim()
            )
        })
}

/// Makes sure the device's memory cannot be swapped: nothing to do where the cgroup forbids it
/// already; a supervisor that runs as a systemd unit (systemd set `INVOCATION_ID`, or its
/// cgroup is a system service's) is left where the unit put it (moving it would take it out of
/// its service, which systemd would then see as ended); any other (a shell's, a login
/// session's) moves itself into a cgroup that forbids it: a transient scope where systemd
/// manages the tree, else a cgroup of its own. Returns what it did (`None`: nothing), or why
/// the memory stays swappable. (A shell that inherited `INVOCATION_ID` from a terminal a user
/// manager started stays too, and is told why; `sudo` clears it.)
pub fn protect_from_swap() -> Result<Option<String>, String> {
    let Err(why) = swap_forbidden() else {
        return Ok(None);
    };
    let own = own_cgroup()?;
    if std::env::var_os("INVOCATION_ID").is_some() || in_system_service(&own) {
        return Err(format!(
            "{why}, and it runs in {own}, as a systemd unit (the unit should have MemorySwapMax=0, as contrib/systemd/uzram@.service has)"
        ));
    }
    // Where the kernel counts no swap per cgroup (`cgroup.memory=noswap`), no cgroup helps: the
    // memory controller is on here, and no swap file.
    let dir = Path::new(CGROUP_ROOT).join(own.trim_start_matches('/'));
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    if own != "/"
        && controllers.split_whitespace().any(|c| c == "memory")
        && !dir.join("memory.swap.max").exists()
    {
        return Err(format!(
            "{why}, and {} has no memory.swap.max (swap is not accounted per cgroup here)",
            dir.display()
        ));
    }
    let pid = std::process::id();
    // Where systemd manages the tree, no cgroup it does not know of is made: its scope, or
    // nothing.
    let moved = if Path::new("/run/systemd/system").is_dir() {
        into_scope(
            &format!("uzram-{pid}.scope"),
            pid,
            "uzram device supervisor",
        )
    } else {
        into_own_cgroup(pid)
    };
    match moved {
        Ok(where_) => Ok(Some(where_)),
        Err(e) => Err(format!("{why}, and it could not move: {e}")),
    }
}

/// Takes this process (a reserve, see `daemon::standby`) out of its service's cgroup, so that
/// the service's end (`systemctl kill`, its supervisor's death) does not end it: into a
/// transient scope where systemd manages the tree and answers on the system bus, else into
/// [`OWN_CGROUP`]; swap is forbidden in either. Where it went, or why it could not go.
pub fn leave_service() -> Result<String, String> {
    let pid = std::process::id();
    let mut why = String::new();
    if Path::new("/run/systemd/system").is_dir() {
        match into_scope(
            &format!("uzram-reserve-{pid}.scope"),
            pid,
            "uzram device reserve",
        ) {
            Ok(there) => return Ok(there),
            Err(e) => why = format!("{e}; "),
        }
    }
    into_own_cgroup(pid).map_err(|e| format!("{why}{e}"))
}

/// Whether the cgroup `path` is (within) a system service's: a part named `*.service`, outside
/// `/user.slice` (where a user manager's services run terminals and their shells; a login
/// session is a scope).
fn in_system_service(path: &str) -> bool {
    !path.starts_with("/user.slice/") && path.split('/').any(|p| p.ends_with(".service"))
}

/// The `busctl` arguments that ask systemd for a transient scope `unit` holding `pid`, with
/// swap forbidden, collected when it ends.
fn scope_request(unit: &str, pid: u32, description: &str) -> Vec<String> {
    [
        "--timeout=5",
        "call",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        unit,
        "fail",
        "4",
        "PIDs",
        "au",
        "1",
        &pid.to_string(),
        "MemorySwapMax",
        "t",
        "0",
        "CollectMode",
        "s",
        "inactive-or-failed",
        "Description",
        "s",
        description,
        "0",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect()
}

/// Asks systemd for a transient scope `unit` (see [`scope_request`]) and waits until this
/// process is in it and swap is forbidden there.
fn into_scope(unit: &str, pid: u32, description: &str) -> Result<String, String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("busctl")
        .args(scope_request(unit, pid, description))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run busctl to ask systemd for {unit}: {e}"))?;
    let asked = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if asked.elapsed() < BUSCTL_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "busctl did not answer within {} s when asked for {unit}",
                    BUSCTL_WAIT.as_secs()
                ));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("waiting for busctl ({unit}): {e}"));
            }
        }
    };
    if !status.success() {
        let mut err = Vec::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.by_ref().take(4096).read_to_end(&mut err);
        }
        let err = String::from_utf8_lossy(&err);
        return Err(format!(
            "systemd refused the scope {unit}: {}",
            err.lines().next().unwrap_or("busctl failed")
        ));
    }
    let start = Instant::now();
    loop {
        if swap_forbidden().is_ok() && own_cgroup().is_ok_and(|c| c.ends_with(unit)) {
            return Ok(format!("systemd's scope {unit}"));
        }
        if start.elapsed() >= SCOPE_WAIT {
            return Err(format!(
                "systemd did not move it into {unit} within {} s",
                SCOPE_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Moves `pid` into [`OWN_CGROUP`] under the root, made (with the memory controller enabled
/// for the root's children) where it is missing, and forbids swap there.
fn into_own_cgroup(pid: u32) -> Result<String, String> {
    let root = Path::new(CGROUP_ROOT);
    if !root.join("cgroup.controllers").is_file() {
        return Err(format!("no cgroup v2 hierarchy at {CGROUP_ROOT}"));
    }
    let enabled = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    if !enabled.split_whitespace().any(|c| c == "memory") {
        write(&root.join("cgroup.subtree_control"), "+memory")?;
    }
    let dir = root.join(OWN_CGROUP);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    write(&dir.join("memory.swap.max"), "0")?;
    write(&dir.join("cgroup.procs"), &pid.to_string())?;
    swap_forbidden()?;
    Ok(format!("the cgroup {}", dir.display()))
}

/// Writes `value` to the cgroup file `path`, naming it on failure.
fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value)
        .map_err(|e| format!("cannot write {value} to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_system_service_is_left_where_it_is() {
        assert!(in_system_service("/system.slice/uzram@0.service"));
        assert!(in_system_service("/system.slice/foo.service/payload"));
        assert!(in_system_service("/swap.slice/uzram@0.service"));
        assert!(in_system_service("/machine.slice/m.service"));
        for shell in [
            "/",
            "/user.slice/user-0.slice/session-3.scope",
            "/user.slice/user-1000.slice/user@1000.service/app.slice/gnome-terminal-server.service",
            "/system.slice/uzram-1234.scope",
            "/uzram",
        ] {
            assert!(!in_system_service(shell), "{shell}");
        }
    }

    #[test]
    fn the_scope_request_names_its_unit_and_the_pid_once_and_counts_its_properties() {
        let args = scope_request("uzram-4242.scope", 4242, "uzram device supervisor");
        let at = |s: &str| args.iter().position(|a| a == s).unwrap();
        assert_eq!(args[at("StartTransientUnit") + 2], "uzram-4242.scope");
        // The properties' count matches the name/signature/value triples that follow it, and
        // the auxiliary units' count (0) ends the call.
        let count: usize = args[at("fail") + 1].parse().unwrap();
        let props = &args[at("fail") + 2..args.len() - 1];
        // PIDs' value is an array: its length comes before its one element.
        assert_eq!((props.len() - 1) / 3, count);
        assert_eq!((props.len() - 1) % 3, 0);
        assert_eq!(args[at("PIDs") + 3], "4242");
        assert_eq!(args.iter().filter(|a| a.as_str() == "4242").count(), 1);
        assert_eq!(args[at("MemorySwapMax") + 2], "0");
        assert_eq!(args.last().map(String::as_str), Some("0"));
    }
}
