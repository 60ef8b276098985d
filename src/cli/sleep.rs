//! `uzram sleep pre|post ACTION`: what the system's sleep needs of swap on uzram,
//! run by the units in `contrib/systemd/` before and after systemd's sleep services.
//!
//! When the system sleeps the kernel freezes every user task, uzram's daemons included. Two
//! things then wait on a frozen daemon:
//! - a task that faults on a page swapped out to uzram just before its daemon froze: it waits
//!   for the read in a state the freezer cannot freeze, so the freeze fails after 20 s (EBUSY);
//! - hibernation's image: after the freeze the kernel frees memory for it by reclaim, which
//!   writes swap, and a swap write to a frozen daemon never completes (in the VM the guest hung
//!   in "Preallocating image memory").
//!
//! So before a suspend, the cgroups of the processes that hold swap (`VmSwap`) are frozen with
//! the cgroup freezer, which waits for their swap-ins to end (the daemon still serves them);
//! the kernel's freezer then finds them frozen. `pre` then waits (up to 5 s) for swap to stand
//! still, so that kswapd is not writing to a daemon as the kernel freezes it. Before a
//! hibernation every uzram swap device is swapped off, or, when RAM and the other swap cannot
//! take its pages back, the hibernation is refused (the unit fails, so systemd does not
//! hibernate). After, `post` undoes what `pre` did,
//! from the state it wrote in `/run/uzram/sleep.state`; a `pre` that finds that file first
//! undoes the sleep before (a `post` that never ran).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ctl::{parse_device, CtlError};
use crate::common::output::shown;
use crate::common::RUN_DIR;

/// Where `pre` says what `post` must undo.
const STATE_FILE: &str = "sleep.state";

/// The cgroup v2 hierarchy.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long `pre` waits for a cgroup it froze to report frozen (each of its tasks out of the
/// kernel; a swap-in ends once the daemon serves it).
const FREEZE_WAIT: Duration = Duration::from_secs(10);

/// How long `post` retries a swapon that finds the device busy.
const SWAPON_BUSY_WAIT: Duration = Duration::from_secs(15);

/// How long `pre` waits, once the cgroups are frozen, for swap to stand still (see [`settle`]).
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// How long no page may be swapped in or out, with no request in flight on a uzram device, for
/// swap to count as standing still.
const SETTLE_QUIET: Duration = Duration::from_millis(300);

/// At most this many processes are named in the warnings of a `pre` (the rest are counted).
const NAMED: usize = 3;

/// What must stay free after a hibernation's swapoff, beyond the pages it brings back: the
/// image's own bookkeeping and whatever runs meanwhile (1/16 of RAM, at least 64 MiB).
fn hibernate_margin_kb(mem_total_kb: u64) -> u64 {
    (mem_total_kb / 16).max(64 << 10)
}

/// The phase systemd-sleep names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Pre,
    Post,
}

/// What kind of sleep: systemd's names (`suspend`, `hibernate`, `hybrid-sleep`,
/// `suspend-then-hibernate`). Every one that writes a hibernation image needs what `hibernate`
/// does.
fn hibernates(action: &str) -> Result<bool, CtlError> {
    match action {
        "suspend" => Ok(false),
        "hibernate" | "hybrid-sleep" | "suspend-then-hibernate" => Ok(true),
        other => Err(CtlError(format!(
            "sleep: unknown action '{other}' (suspend, hibernate, hybrid-sleep or suspend-then-hibernate)"
        ))),
    }
}

/// One line of /proc/swaps.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Swap {
    name: String,
    size_kb: u64,
    used_kb: u64,
    priority: i32,
}

/// /proc/swaps' entries (a name with spaces is escaped there as `\040`; such a name is no
/// uzram device and is only counted).
fn parse_swaps(text: &str) -> Vec<Swap> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Swap {
                name: f.first()?.to_string(),
                size_kb: f.get(2)?.parse().ok()?,
                used_kb: f.get(3)?.parse().ok()?,
                priority: f.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

/// Whether swap entry `name` is a ublk device: uzram's, or another server's (a process the
/// freezer stops all the same). Told by its name, not by its daemon's control socket, which is
/// briefly missing while a worker restarts.
fn is_uzram(name: &str) -> bool {
    parse_device(name).is_ok()
}

/// A field of /proc/meminfo, kB.
fn meminfo_kb(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// What `pre` did, for `post`: one line each, `swapoff NAME PRIORITY` or `frozen CGROUP`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct State {
    swapped_off: Vec<(String, i32)>,
    frozen: Vec<PathBuf>,
}

impl State {
    fn parse(text: &str) -> State {
        let mut s = State::default();
        for l in text.lines() {
            match l.split_once(' ') {
                Some(("swapoff", rest)) => {
                    if let Some((name, Ok(p))) = rest.rsplit_once(' ').map(|(n, p)| (n, p.parse()))
                    {
                        s.swapped_off.push((name.to_string(), p));
                    }
                }
                // A cgroup's path may hold spaces: the rest of the line.
                Some(("frozen", path)) if path.starts_with('/') => {
                    s.frozen.push(PathBuf::from(path))
                }
                _ => {}
            }
        }
        s
    }

    fn render(&self) -> String {
        let mut t = String::new();
        for (name, p) in &self.swapped_off {
            t.push_str(&format!("swapoff {name} {p}\n"));
        }
        for c in &self.frozen {
            // The path as it is (a message would quote it): `parse` reads it back.
            t.push_str(&format!("frozen {}\n", c.display()));
        }
        t
    }

    fn is_empty(&self) -> bool {
        self.swapped_off.is_empty() && self.frozen.is_empty()
    }
}

fn state_path() -> PathBuf {
    Path::new(RUN_DIR).join(STATE_FILE)
}

/// Writes the state (a temporary file renamed over the old): `post` must find all of it or the
/// state before.
fn save(state: &State) -> Result<(), CtlError> {
    let path = state_path();
    let tmp = path.with_extension("tmp");
    std::fs::create_dir_all(RUN_DIR)
        .and_then(|()| std::fs::write(&tmp, state.render()))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| CtlError(format!("sleep: cannot write {}: {e}", shown(&path))))
}

fn load() -> State {
    std::fs::read_to_string(state_path())
        .map(|t| State::parse(&t))
        .unwrap_or_default()
}

/// Runs `uzram sleep PHASE ACTION`; returns what it did, a line each. `post` undoes whatever
/// `pre` recorded, whatever the action (it may run twice: the units run it after a failed `pre`
/// too).
pub fn run(phase: Phase, action: &str) -> Result<Vec<String>, CtlError> {
    match phase {
        Phase::Post => {
            // Whatever pre recorded is undone first, whatever the action; an action pre would
            // not take is said after.
            let undone = undo();
            hibernates(action)?;
            undone
        }
        Phase::Pre => {
            let hibernate = hibernates(action)?;
            let mut said = Vec::new();
            if !load().is_empty() {
                said.push(
                    "a sleep before left its state (its post never ran): undone first".into(),
                );
                match undo() {
                    Ok(lines) => said.extend(lines),
                    Err(e) => said.push(format!("warning: {e}")),
                }
            }
            if hibernate {
                said.extend(before_hibernation()?);
            } else {
                said.extend(before_suspend()?);
            }
            Ok(said)
        }
    }
}

/// `post`: swaps on again what `pre` swapped off (with its priority; with discard of freed
/// pages where the device takes discards) and thaws the cgroups it froze; then forgets them.
fn undo() -> Result<Vec<String>, CtlError> {
    let state = load();
    let mut said = Vec::new();
    let mut failed = Vec::new();
    for c in &state.frozen {
        match std::fs::write(c.join("cgroup.freeze"), "0") {
            Ok(()) => said.push(format!("thawed {}", shown(c))),
            // A cgroup gone meanwhile has nothing left to thaw.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push(format!("cannot thaw {}: {e}", shown(c))),
        }
    }
    let on = parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default());
    for (name, prio) in &state.swapped_off {
        // A swapoff that failed or was killed left the device on (the kernel puts it back).
        if on.iter().any(|s| &s.name == name) {
            said.push(format!("{name} is swap already"));
            continue;
        }
        let mut args: Vec<String> = Vec::new();
        if *prio >= 0 {
            args.extend(["-p".into(), prio.to_string()]);
        }
        if takes_discard(name) {
            args.push("--discard=pages".into());
        }
        args.push(name.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        // A device held exclusively for a moment (a daemon of an earlier uzram did so right
        // after a swapoff, freeing the pages swap left behind) fails swapon with EBUSY: tried
        // again meanwhile.
        let start = Instant::now();
        let swapped_on = loop {
            match super::ctl::run_program("swapon", &refs) {
                Err(e) if e.0.contains("busy") && start.elapsed() < SWAPON_BUSY_WAIT => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => break other,
            }
        };
        match swapped_on {
            Ok(()) => said.push(format!("swapon {}", args.join(" "))),
            Err(e) => failed.push(e.0),
        }
    }
    let _ = std::fs::remove_file(state_path());
    if failed.is_empty() {
        Ok(said)
    } else {
        Err(CtlError(format!("sleep post: {}", failed.join("; "))))
    }
}

/// Whether block device `name` takes discards (its queue says so).
fn takes_discard(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    std::fs::read_to_string(format!("/sys/block/{base}/queue/discard_max_bytes"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// Before a hibernation: every uzram swap device off, its pages back in RAM or other swap;
/// refused (nothing changed) when they would not fit.
fn before_hibernation() -> Result<Vec<String>, CtlError> {
    let swaps = parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default());
    let (ours, others): (Vec<Swap>, Vec<Swap>) = swaps.into_iter().partition(|s| is_uzram(&s.name));
    if ours.is_empty() {
        return Ok(vec!["no swap on uzram: nothing to do".into()]);
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail = meminfo_kb(&meminfo, "MemAvailable").unwrap_or(0);
    let total = meminfo_kb(&meminfo, "MemTotal").unwrap_or(0);
    let need: u64 = ours.iter().map(|s| s.used_kb).sum();
    let other_free: u64 = others
        .iter()
        .map(|s| s.size_kb.saturating_sub(s.used_kb))
        .sum();
    let margin = hibernate_margin_kb(total);
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    if need + margin > avail + other_free {
        return Err(CtlError(format!(
            "hibernation refused: swap on uzram ({}) holds {} MiB, and RAM (MemAvailable {} MiB) and other swap ({} MiB free) cannot take it back with {} MiB to spare; swap on uzram must be off before hibernating (the image's preallocation writes swap, and a frozen daemon never completes the write). Free memory, or add disk swap, and try again",
            names.join(" "),
            need >> 10,
            avail >> 10,
            other_free >> 10,
            margin >> 10
        )));
    }
    let mut state = load();
    let mut said = Vec::new();
    for s in &ours {
        // Recorded before the swapoff: a swapoff that ends the hook (killed, timed out) is
        // undone by `post` all the same (the units run it after a failed start too,
        // `ExecStopPost=`).
        state.swapped_off.push((s.name.clone(), s.priority));
        save(&state)?;
        if let Err(e) = super::ctl::run_program("swapoff", &[&s.name]) {
            // What was swapped off goes back on; the hibernation is refused.
            let undone = match undo() {
                Ok(lines) if lines.is_empty() => String::new(),
                Ok(lines) => format!(" (undone: {})", lines.join(", ")),
                Err(u) => format!(" ({u})"),
            };
            return Err(CtlError(format!("hibernation refused: {e}{undone}")));
        }
        said.push(format!(
            "swapoff {} ({} MiB back in RAM or other swap)",
            s.name,
            s.used_kb >> 10
        ));
    }
    Ok(said)
}

/// A process's cgroup v2 path (relative to the hierarchy's root, "" for the root), if it has
/// one.
fn cgroup_of(pid: &str) -> Option<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    crate::common::cgroup_v2_path(&cgroups).map(|p| p.trim_start_matches('/').to_string())
}

/// Whether cgroup `a` is `b` or above it.
fn contains(a: &str, b: &str) -> bool {
    a.is_empty() || a == b || b.strip_prefix(a).is_some_and(|r| r.starts_with('/'))
}

/// The processes now (their /proc names).
fn pids() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// The cgroups that must not be frozen: uzram's daemons' (every process whose executable is
/// this one's or that serves a device), this process's own and PID 1's.
fn protected_cgroups() -> Vec<String> {
    let me = std::fs::read_link("/proc/self/exe").ok();
    let mut keep = Vec::new();
    for pid in ["self", "1"] {
        keep.extend(cgroup_of(pid));
    }
    for pid in pids() {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if (exe.is_some() && exe == me) || comm.trim() == "uzram" {
            keep.extend(cgroup_of(&pid));
        }
    }
    keep
}

/// Whether cgroup `cg` is one of systemd's own services or the message bus (journald, logind,
/// udevd, dbus): a sleep's own steps may wait on them, so they are never frozen.
fn core_service(cg: &str) -> bool {
    cg.strip_prefix("system.slice/").is_some_and(|unit| {
        unit.starts_with("systemd-") || unit.starts_with("dbus") || unit.starts_with("polkit")
    })
}

/// Before a suspend: the cgroups of the processes holding swap frozen (see the module's docs),
/// when some of it is on uzram.
fn before_suspend() -> Result<Vec<String>, CtlError> {
    let swaps = parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default());
    if !swaps.iter().any(|s| is_uzram(&s.name) && s.used_kb > 0) {
        return Ok(vec!["no pages swapped to uzram: nothing to do".into()]);
    }
    if !Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        return Ok(vec![format!(
            "warning: no cgroup v2 hierarchy at {CGROUP_ROOT}: a process that touches a page swapped to uzram as its daemon freezes can make the suspend fail (EBUSY)"
        )]);
    }
    let keep = protected_cgroups();
    let mut said = Vec::new();
    let mut unfrozen = 0;
    let mut to_freeze: Vec<String> = Vec::new();
    for pid in pids() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if !meminfo_kb(&status, "VmSwap").is_some_and(|kb| kb > 0) {
            continue;
        }
        let Some(cg) = cgroup_of(&pid) else { continue };
        if keep.iter().any(|k| contains(&cg, k)) || core_service(&cg) {
            unfrozen += 1;
            if unfrozen > NAMED {
                continue;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            said.push(format!(
                "warning: process {pid} {} holds swap in a cgroup that is not frozen (/{cg}: uzram's, the hook's, PID 1's or a core service's): if it touches a page on uzram as the daemon freezes, the suspend fails (EBUSY)",
                comm.trim()
            ));
            continue;
        }
        if !to_freeze.contains(&cg) {
            to_freeze.push(cg);
        }
    }
    if unfrozen > NAMED {
        said.push(format!(
            "warning: and {} more processes holding swap in such cgroups",
            unfrozen - NAMED
        ));
    }
    // Only cgroups nobody froze before (systemd's user.slice freeze thaws its own).
    let mut state = load();
    let mut frozen_now = Vec::new();
    for cg in to_freeze {
        let dir = Path::new(CGROUP_ROOT).join(&cg);
        let already =
            std::fs::read_to_string(dir.join("cgroup.freeze")).is_ok_and(|t| t.trim() == "1");
        if already {
            continue;
        }
        // Recorded first: `post` thaws it even if this hook ends before it says so.
        state.frozen.push(dir.clone());
        save(&state)?;
        match std::fs::write(dir.join("cgroup.freeze"), "1") {
            Ok(()) => frozen_now.push(dir),
            Err(e) => said.push(format!("warning: cannot freeze {}: {e}", shown(&dir))),
        }
    }
    let start = Instant::now();
    for dir in &frozen_now {
        let frozen = loop {
            let events = std::fs::read_to_string(dir.join("cgroup.events")).unwrap_or_default();
            if events.lines().any(|l| l.trim() == "frozen 1") {
                break true;
            }
            if start.elapsed() >= FREEZE_WAIT {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        said.push(if frozen {
            format!(
                "froze {} (it holds swap) in {} ms",
                shown(dir),
                start.elapsed().as_millis()
            )
        } else {
            format!(
                "warning: {} was not frozen after {} s (the kernel's freezer tries again)",
                shown(dir),
                FREEZE_WAIT.as_secs()
            )
        });
    }
    let devices: Vec<&str> = swaps
        .iter()
        .filter(|s| is_uzram(&s.name))
        .map(|s| s.name.as_str())
        .collect();
    said.push(settle(&devices));
    Ok(said)
}

/// `pswpin` and `pswpout` of /proc/vmstat's text (0 where absent).
fn swap_counts(vmstat: &str) -> (u64, u64) {
    let count = |field| uzram_engine::Pressure::parse_vmstat(vmstat, field).unwrap_or(0);
    (count("pswpin"), count("pswpout"))
}

/// Waits, at most [`SETTLE_WAIT`], until swap stands still: no page swapped in or out
/// (`/proc/vmstat`) and no request in flight on the uzram `devices` for [`SETTLE_QUIET`].
/// With the programs that hold swap frozen, kswapd still reclaims up to its watermark, writing
/// swap; a daemon the kernel's freezer freezes in the middle of that leaves kswapd waiting for
/// it, and kswapd, frozen after the user tasks, then refuses to freeze (EBUSY; seen in the VM).
/// Returns the line that says how it went.
fn settle(devices: &[&str]) -> String {
    let start = Instant::now();
    let moving = || {
        let (pswpin, pswpout) =
            swap_counts(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default());
        let in_flight: u64 = devices
            .iter()
            .map(|d| {
                let base = d.rsplit('/').next().unwrap_or(d);
                std::fs::read_to_string(format!("/sys/block/{base}/inflight"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|n| n.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum();
        (pswpin, pswpout, in_flight)
    };
    let first = moving();
    let mut last = first;
    let mut quiet_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = moving();
        if now != last || now.2 > 0 {
            (last, quiet_since) = (now, Instant::now());
        } else if quiet_since.elapsed() >= SETTLE_QUIET {
            return format!("swap stood still after {} ms", start.elapsed().as_millis());
        }
        if start.elapsed() >= SETTLE_WAIT {
            return format!(
                "warning: swap still moving after {} s ({} pages in, {} out meanwhile, {} requests in flight on uzram): kswapd may be writing to a daemon as it freezes",
                SETTLE_WAIT.as_secs(),
                now.0.saturating_sub(first.0),
                now.1.saturating_sub(first.1),
                now.2
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_parse_as_the_kernel_prints_them() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
/dev/ublkb0                             partition\t1048572\t\t524\t\t32767\n\
/swap\\040file                            file\t\t2097148\t\t0\t\t-2\n";
        let s = parse_swaps(text);
        assert_eq!(
            s,
            vec![
                Swap {
                    name: "/dev/ublkb0".into(),
                    size_kb: 1048572,
                    used_kb: 524,
                    priority: 32767
                },
                Swap {
                    name: "/swap\\040file".into(),
                    size_kb: 2097148,
                    used_kb: 0,
                    priority: -2
                }
            ]
        );
    }

    #[test]
    fn the_state_reads_back_what_was_written_and_skips_what_it_does_not_know() {
        let s = State {
            swapped_off: vec![("/dev/ublkb0".into(), 100), ("/dev/ublkb2".into(), -2)],
            frozen: vec![
                "/sys/fs/cgroup/user.slice/a b.scope".into(),
                // a cgroup's name may hold any character but / and a newline
                "/sys/fs/cgroup/user.slice/a\tb\x1b.scope".into(),
            ],
        };
        assert_eq!(State::parse(&s.render()), s);
        let odd = format!("{}garbage\nswapoff /dev/ublkb1 notanumber\n", s.render());
        assert_eq!(State::parse(&odd), s);
        assert!(State::parse("").is_empty());
    }

    #[test]
    fn actions_are_systemds_names() {
        assert!(!hibernates("suspend").unwrap());
        for a in ["hibernate", "hybrid-sleep", "suspend-then-hibernate"] {
            assert!(hibernates(a).unwrap(), "{a}");
        }
        let e = hibernates("nap").unwrap_err().0;
        assert!(e.contains("'nap'"), "{e}");
    }

    #[test]
    fn systemds_own_services_and_the_bus_are_never_frozen() {
        for cg in [
            "system.slice/systemd-journald.service",
            "system.slice/dbus.service",
            "system.slice/dbus-broker.service",
        ] {
            assert!(core_service(cg), "{cg}");
        }
        for cg in [
            "system.slice/postgresql.service",
            "user.slice/user-1000.slice/session-2.scope",
            "systemd-journald.service",
        ] {
            assert!(!core_service(cg), "{cg}");
        }
    }

    #[test]
    fn a_cgroup_contains_itself_and_what_is_below_it_only() {
        assert!(contains("", "system.slice/uzram.service"));
        assert!(contains("system.slice", "system.slice/uzram.service"));
        assert!(contains(
            "system.slice/uzram.service",
            "system.slice/uzram.service"
        ));
        assert!(!contains(
            "system.slice/uzram",
            "system.slice/uzram.service"
        ));
        assert!(!contains("user.slice", "system.slice/uzram.service"));
    }

    #[test]
    fn swap_counts_are_read_by_their_exact_name() {
        let vmstat = "pswpin_x 9\npswpin 12\npswpout 345\npswpoutx 1\n";
        assert_eq!(swap_counts(vmstat), (12, 345));
        assert_eq!(swap_counts("nr_free_pages 3\n"), (0, 0));
    }

    #[test]
    fn meminfo_fields_are_read_by_their_exact_name() {
        let t = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:   8000000 kB\nVmSwap:\t  12 kB\n";
        assert_eq!(meminfo_kb(t, "MemAvailable"), Some(8_000_000));
        assert_eq!(meminfo_kb(t, "MemTotal"), Some(16_384_000));
        assert_eq!(meminfo_kb(t, "VmSwap"), Some(12));
        assert_eq!(meminfo_kb(t, "Mem"), None);
    }

    #[test]
    fn the_hibernation_margin_is_a_sixteenth_of_ram_and_at_least_64_mib() {
        assert_eq!(hibernate_margin_kb(512 << 10), 64 << 10);
        assert_eq!(hibernate_margin_kb(16 << 20), 1 << 20);
    }
}
