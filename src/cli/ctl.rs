//! What `uzram` does as zramctl does: create a device (and leave a daemon serving it), list
//! devices, reset them, and read or write their zram attributes. The daemon itself is
//! `crate::daemon::serve`; this module only talks to it (its control socket) or starts it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::listing::{self, DeviceRow, Format};
use crate::common::control::{self, CallError, Request};
use crate::common::options::{self, DeviceArgs};
use crate::common::output::shown;
use crate::common::{
    block_path, is_swap, mount_point, socket_path, swap_state, MAX_DEVICES, RUN_DIR,
};

/// A failure of a `uzram` command: the message to print (exit code 1, as zramctl's).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CtlError(pub String);

fn err(msg: impl Into<String>) -> CtlError {
    CtlError(msg.into())
}

/// The id N of `/dev/ublkbN` or `ublkbN`.
pub fn parse_device(name: &str) -> Result<u32, CtlError> {
    let digits = name
        .strip_prefix("/dev/")
        .unwrap_or(name)
        .strip_prefix("ublkb");
    // Plain digits, no sign and no leading zero (`ublkb01` is not `ublkb1`), below ublk's
    // limit of 2^20 devices.
    let id = digits
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        .filter(|d| *d == "0" || !d.starts_with('0'))
        .and_then(|d| d.parse::<u32>().ok())
        .filter(|&id| id < MAX_DEVICES);
    match id {
        Some(id) => Ok(id),
        None if name == "serve" && !cfg!(feature = "ublk") => Err(err(
            "serve: this uzram was built without the ublk feature, which serving a device needs \
             (cargo build --release --features ublk)",
        )),
        None if name.is_empty() => Err(err("an empty device name (expected /dev/ublkbN)")),
        None if !name.contains('/') && !name.starts_with("ublkb") => Err(err(format!(
            "{name:?}: neither a subcommand (attr, setup, teardown, prepare, metrics, upgrade, sleep, serve, bench, dump-pages) nor a device name (/dev/ublkbN)"
        ))),
        None => Err(err(format!(
            "{name:?}: not a uzram device name (expected /dev/ublkbN, N from 0 to {})",
            MAX_DEVICES - 1
        ))),
    }
}

/// A new device: its size, what it is made of, and where it goes.
#[derive(Debug, Clone, Default)]
pub struct CreateArgs {
    /// `--size`.
    pub size: String,
    /// The device's options, as `uzram serve` takes them.
    pub device: DeviceArgs,
    /// `--streams` (the daemon's queues).
    pub streams: Option<u16>,
    /// The id, when a device name was given.
    pub id: Option<u32>,
    /// `--log FILE` for the daemon.
    pub log: Option<PathBuf>,
}

/// Checks everything that can be checked before a daemon is started, so that bad input fails
/// at once, clearly, and leaves nothing behind: the options through [`options::check`], as the
/// daemon checks them, then whether the device exists and the kernel has the driver.
pub fn validate(args: &CreateArgs) -> Result<(), CtlError> {
    args.device.check_new().map_err(|e| err(e.to_string()))?;
    options::check(&args.size, &args.device, args.streams).map_err(|e| err(e.to_string()))?;
    if let Some(id) = args.id {
        if socket_path(id).exists() || Path::new(&block_path(id)).exists() {
            return Err(err(format!("{} already exists", block_path(id))));
        }
    }
    if let Some(log) = &args.log {
        // Appended to by the daemon: a file (made if need be) or a character device such as
        // /dev/console; a directory or a FIFO (which would block) is refused.
        match std::fs::metadata(log) {
            Ok(m) if m.is_dir() => {
                return Err(err(format!("--log {}: is a directory", shown(log))))
            }
            Ok(m)
                if !m.is_file()
                    && !std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()) =>
            {
                return Err(err(format!(
                    "--log {}: neither a file nor a character device",
                    shown(log)
                )))
            }
            _ => {}
        }
    }
    if !crate::common::have_ublk_driver() {
        return Err(err(crate::common::NO_DRIVER));
    }
    Ok(())
}

/// Starts a detached daemon serving a new device and returns its path once it serves I/O.
pub fn create(args: &CreateArgs) -> Result<String, CtlError> {
    validate(args)?;
    let exe =
        std::env::current_exe().map_err(|e| err(format!("cannot find my own binary: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--detached", "--size", &args.size]);
    cmd.args(args.device.to_args().map_err(|e| err(e.to_string()))?);
    if let Some(s) = args.streams {
        cmd.args(["--queues", &s.to_string()]);
    }
    if let Some(id) = args.id {
        cmd.args(["--id", &id.to_string()]);
    }
    let stderr = match &args.log {
        Some(path) => {
            // The daemon runs with / as its directory.
            let path = &std::path::absolute(path)
                .map_err(|e| err(format!("--log {}: {e}", shown(path))))?;
            cmd.arg("--log").arg(path);
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| err(format!("cannot open the log {}: {e}", shown(path))))?;
            Stdio::from(f)
        }
        None => Stdio::null(),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    // A new session: the daemon outlives the terminal it was started from.
    crate::sys::start_in_new_session(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| err(format!("cannot start the daemon: {e}")))?;
    let mut first = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut first);
    }
    let first = first.trim_end();
    if first.starts_with("/dev/") {
        return Ok(first.to_string());
    }
    let status = child.wait().ok();
    Err(err(match first.strip_prefix("error: ") {
        Some(msg) => msg.to_string(),
        None => format!(
            "the daemon exited ({}) without creating a device{}",
            status.map_or("unknown status".into(), |s| s.to_string()),
            args.log
                .as_ref()
                .map_or(String::new(), |l| format!(": see {}", shown(l)))
        ),
    }))
}

/// The devices uzram daemons serve (and those whose daemon died), by id.
pub fn devices() -> Vec<DeviceRow> {
    let mut ids: Vec<u32> = std::fs::read_dir(RUN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".sock")?
                .strip_prefix("ublkb")?
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    ids.into_iter().filter_map(row).collect()
}

/// One device's row; `None` when there is neither a daemon nor a kernel device (a stale socket).
fn row(id: u32) -> Option<DeviceRow> {
    let name = block_path(id);
    let troubled = |why: String| DeviceRow {
        trouble: Some(why),
        ..DeviceRow::dead(name.clone())
    };
    let mut r = match control::call(id, &Request::Info) {
        Ok(info) => match DeviceRow::parse(&info) {
            Ok(r) => r,
            Err(why) => troubled(format!("its daemon's description makes no sense ({why})")),
        },
        Err(CallError::NoDaemon { .. }) if kernel_knows(id) => DeviceRow::dead(name.clone()),
        Err(CallError::NoDaemon { .. }) => return None,
        // A daemon that answers badly is still a device: shown, with what went wrong.
        Err(e) => troubled(e.to_string()),
    };
    r.mountpoint = listing::mountpoint(&name);
    Some(r)
}

/// The id the kernel gives the next device (ublk takes the lowest free one): zramctl's `-f`
/// without a size.
pub fn first_free_id() -> Result<u32, CtlError> {
    if !crate::common::have_ublk_driver() {
        return Err(err(crate::common::NO_DRIVER));
    }
    (0..MAX_DEVICES)
        .find(|&id| !kernel_knows(id) && !socket_path(id).exists())
        .ok_or_else(|| err("no free device id"))
}

/// Whether the kernel has device `id` (its control device), live or dead.
pub fn kernel_knows(id: u32) -> bool {
    Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists()
}

/// The listing of `rows`, with `--output` columns (zramctl's defaults when empty).
pub fn render(
    rows: &[DeviceRow],
    output: &[String],
    all: bool,
    format: Format,
) -> Result<String, CtlError> {
    let columns = listing::columns(output, all).map_err(err)?;
    Ok(if format.json {
        listing::render_json(rows, &columns, format.bytes)
    } else {
        listing::render(rows, &columns, format)
    })
}

/// Resets `/dev/ublkbN`: asks its daemon to stop and delete it (refused while the device is in
/// use), and waits until it is gone and its daemon has exited (so its backing file is closed:
/// a `umount` of the file's filesystem right after works); a dead device is deleted directly.
pub fn reset(id: u32) -> Result<(), CtlError> {
    let name = block_path(id);
    // The daemon's pid, to wait for its exit (device and socket go before it closes its files).
    let pid = control::call(id, &Request::Info)
        .ok()
        .and_then(|info| DeviceRow::parse(&info).ok())
        .map(|r| r.pid);
    // A hold that is neither swap nor a mount (the kernel finishing an umount, a probe by
    // udev) is given 3 s to go.
    let mut answer = control::call(id, &Request::Reset);
    let patience = Instant::now() + Duration::from_secs(3);
    while matches!(&answer, Err(CallError::Refused(_)))
        && !is_swap(&name)
        && mount_point(&name).is_none()
        && Instant::now() < patience
    {
        std::thread::sleep(Duration::from_millis(100));
        answer = control::call(id, &Request::Reset);
    }
    match answer {
        Ok(_) => {}
        Err(CallError::Refused(e)) => return Err(err(format!("{name}: {}", e.message))),
        Err(CallError::NoDaemon { .. }) if kernel_knows(id) => return remove_dead(id),
        Err(CallError::NoDaemon { .. }) => {
            crate::common::remove_socket(&socket_path(id));
            return Err(err(format!("{name}: no such device")));
        }
        Err(e) => return Err(err(format!("{name}: {e}"))),
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while kernel_knows(id) || socket_path(id).exists() || pid.is_some_and(alive) {
        if Instant::now() > deadline {
            return Err(err(format!(
                "{name}: the daemon did not finish stopping in 30 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Whether process `pid` still runs (a zombie has closed its files: it counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name's closing parenthesis.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

#[cfg(feature = "ublk")]
fn remove_dead(id: u32) -> Result<(), CtlError> {
    crate::daemon::remove_dead(id).map_err(|e| err(format!("{}: {e}", block_path(id))))
}

#[cfg(not(feature = "ublk"))]
fn remove_dead(id: u32) -> Result<(), CtlError> {
    Err(err(format!(
        "{}: its daemon is dead; this uzram was built without the ublk feature and cannot delete it",
        block_path(id)
    )))
}

/// Reads (`value` None) or writes an attribute of `/dev/ublkbN` through its daemon. A read
/// returns exactly the attribute's bytes.
pub fn attr(id: u32, name: &str, value: Option<&str>) -> Result<String, CtlError> {
    let dev = block_path(id);
    control::check_request(name, value).map_err(err)?;
    let request = match value {
        None => Request::Read(name.to_string()),
        Some(v) => Request::Write(name.to_string(), v.to_string()),
    };
    control::call(id, &request).map_err(|e| match e {
        // The errno first, in the words a shell's `echo > /sys/block/zramN/ATTR` prints.
        CallError::Refused(e) => {
            let errno = std::io::Error::from_raw_os_error(e.errno).to_string();
            let errno = errno.split(" (os error").next().unwrap_or_default();
            err(format!("{dev}: {name}: {errno}: {}", e.message))
        }
        CallError::NoDaemon { ref source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            err(format!("{dev}: {e}"))
        }
        CallError::NoDaemon { .. } if kernel_knows(id) => err(format!(
            "{dev}: its daemon is dead (killed?): uzram --reset {dev} removes it"
        )),
        CallError::NoDaemon { .. } => err(format!("{dev}: no such device")),
        e => err(format!("{dev}: {e}")),
    })
}

/// Runs a system command for `uzram setup`, with its error output in the error.
fn run(cmd: &str, args: &[&str]) -> Result<(), CtlError> {
    run_program(cmd, args)
}

/// Runs `cmd` with `args` (from `$PATH`); its failure, with what it printed on stderr, is the
/// error.
pub(crate) fn run_program(cmd: &str, args: &[&str]) -> Result<(), CtlError> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(format!("cannot run {cmd}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(err(format!(
            "{cmd} {}: {} {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Creates and activates the devices of `plan`, skipping what is already done (a device that
/// exists, swap that is on, a file system that is mounted): running it twice changes nothing.
/// Returns one line per device saying what was done.
pub fn setup(plan: &[super::setup::DevicePlan]) -> Result<Vec<String>, CtlError> {
    // Every device is checked before the first is made: a bad second leaves nothing behind.
    // (Without a driver, the first `create` says so before it makes anything.)
    check_plan(plan)?;
    let mut done = Vec::new();
    for d in plan {
        let id = parse_device(&d.device)?;
        let mut what = Vec::new();
        // Only a device made now is formatted: one that was there may hold someone's data.
        let fresh = !kernel_knows(id);
        if !fresh {
            what.push("exists");
        } else {
            create(&CreateArgs {
                size: d.size_bytes.to_string(),
                device: d.device_args(),
                streams: None,
                id: Some(id),
                log: None,
            })?;
            what.push("created");
        }
        if d.fs == "swap" && d.mount.is_none() {
            if swap_state(&d.device).map_err(err)? {
                what.push("swap already on");
            } else {
                if fresh {
                    run("mkswap", &[&d.device])?;
                }
                let prio = d.priority.to_string();
                let mut args = vec!["-p", prio.as_str()];
                if !d.options.is_empty() {
                    args.extend(["-o", d.options.as_str()]);
                }
                args.push(&d.device);
                run("swapon", &args)?;
                what.push("swap on");
            }
        } else if d.mount.is_none() {
            // zram-generator's fs-type without mount-point: the device and its file system,
            // not mounted.
            if fresh {
                run(&format!("mkfs.{}", d.fs), &[&d.device])?;
                what.push("file system made (not mounted: no mount-point)");
            }
        } else {
            let mount = d.mount.as_deref().unwrap_or_default();
            if !listing::mountpoint(&d.device).is_empty() {
                what.push("already mounted");
            } else {
                if fresh {
                    run(&format!("mkfs.{}", d.fs), &[&d.device])?;
                }
                std::fs::create_dir_all(mount).map_err(|e| err(format!("{mount}: {e}")))?;
                let mut args = vec!["-t", d.fs.as_str()];
                if !d.options.is_empty() {
                    args.extend(["-o", d.options.as_str()]);
                }
                args.extend([d.device.as_str(), mount]);
                run("mount", &args)?;
                what.push("mounted");
            }
        }
        done.push(format!("{}: {}", d.device, what.join(", ")));
    }
    Ok(done)
}

/// Checks a whole plan as [`setup`] would act on it, touching nothing: each device's size and
/// options through the one validation path ([`options::check`]), the program that makes its
/// file system, and ids given twice. The dry run checks the same.
pub fn check_plan(plan: &[super::setup::DevicePlan]) -> Result<(), CtlError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut backing: std::collections::BTreeMap<PathBuf, &str> = Default::default();
    let mut mounts: std::collections::BTreeMap<&str, &str> = Default::default();
    for d in plan {
        let id = parse_device(&d.device)?;
        if !seen.insert(id) {
            return Err(err(format!(
                "[{}]: {} is planned twice",
                d.section, d.device
            )));
        }
        if let Some(at) = &d.mount {
            if let Some(first) = mounts.insert(at, &d.section) {
                return Err(err(format!(
                    "[{}]: mount-point {at} is [{first}]'s too",
                    d.section
                )));
            }
        }
        if let Some(dev) = &d.writeback {
            // One file (under any of its names) backs one device.
            let key = std::fs::canonicalize(dev).unwrap_or_else(|_| PathBuf::from(dev));
            if let Some(first) = backing.insert(key, &d.section) {
                return Err(err(format!(
                    "[{}]: writeback-device {dev} is [{first}]'s too: a backing file serves one device",
                    d.section
                )));
            }
        }
        let mut args = d.device_args();
        let made = kernel_knows(id);
        if made {
            // Set up already (its daemon holds its backing device): setup leaves it as it is,
            // made perhaps by an older binary that took these options.
            args.backing_dev.clear();
        }
        (if made { Ok(()) } else { args.check_new() })
            .and_then(|()| options::check(&d.size_bytes.to_string(), &args, None).map(drop))
            .map_err(|e| err(format!("[{}]: {}", d.section, e.without_option())))?;
        // zram-generator mounts a device with a mount point whatever its fs-type says.
        if d.fs == "swap" && d.mount.is_some() {
            return Err(err(format!(
                "[{}]: fs-type swap with a mount-point: swap is not mounted: drop mount-point, \
                 or name a file system in fs-type",
                d.section
            )));
        }
        if d.fs != "swap" || d.mount.is_some() {
            let mkfs = format!("mkfs.{}", d.fs);
            if d.fs.is_empty() || find_program(&mkfs).is_none() {
                let why = if d.fs.is_empty() {
                    "is empty: name swap or a file system (ext4, xfs, ...)".to_string()
                } else {
                    format!("{}: no {mkfs} on this machine", d.fs)
                };
                return Err(err(format!("[{}]: fs-type {why}", d.section)));
            }
        }
    }
    Ok(())
}

/// `name` in `$PATH`, /sbin or /usr/sbin.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/sbin".into(), "/usr/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Undoes [`setup`]: swapoff or umount, then reset, for every device of `plan` that exists.
pub fn teardown(plan: &[super::setup::DevicePlan]) -> Result<Vec<String>, CtlError> {
    let mut done = Vec::new();
    for d in plan {
        let id = parse_device(&d.device)?;
        if !kernel_knows(id) {
            done.push(format!("{}: not there", d.device));
            continue;
        }
        if swap_state(&d.device).map_err(err)? {
            run("swapoff", &[&d.device])?;
        }
        if mount_point(&d.device).is_some() {
            run("umount", &[&d.device])?;
        }
        reset(id)?;
        done.push(format!("{}: removed", d.device));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_alive_and_an_exited_one_is_not_even_before_it_is_reaped() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Not reaped yet: a zombie, which has closed its files.
        while alive(child.id()) {
            assert!(Instant::now() < deadline, "the child never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(!alive(child.id()));
    }

    #[test]
    fn device_names() {
        assert_eq!(parse_device("/dev/ublkb3").unwrap(), 3);
        assert_eq!(parse_device("ublkb12").unwrap(), 12);
        for bad in [
            "/dev/zram0",
            "/dev/ublkb",
            "/dev/ublkbx",
            "/dev/ublkc0",
            "ublkb-1",
        ] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_input_is_refused_before_anything_starts() {
        let args = |size: &str, algorithm: Option<&str>| CreateArgs {
            size: size.into(),
            device: DeviceArgs {
                algorithm: algorithm.map(Into::into),
                ..DeviceArgs::default()
            },
            ..CreateArgs::default()
        };
        let msg = |a: &CreateArgs| validate(a).unwrap_err().to_string();
        assert!(
            msg(&args("lots", None)).contains("lots"),
            "{}",
            msg(&args("lots", None))
        );
        assert!(msg(&args("0", None)).contains("size 0"));
        assert!(msg(&args("1G", Some("lzo"))).contains("lzo"));
        let streams = CreateArgs {
            streams: Some(0),
            ..args("1G", None)
        };
        assert!(msg(&streams).contains("streams"));
        let mut params = args("1G", None);
        params.device.algorithm_params = Some("level=banana".into());
        assert!(validate(&params).is_err());
    }

    /// `uzram --find` refuses exactly what the daemon would: the same check, the same words.
    #[test]
    fn find_and_serve_validate_through_the_same_check() {
        use crate::daemon::{configure, ServeArgs};
        use clap::Parser;
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            args: ServeArgs,
        }
        let cases: &[&[&str]] = &[
            &["--size", "lots"],
            &["--size", "0"],
            &["--size", "1G", "--algorithm", "lzo"],
            &["--size", "1G", "--algorithm-params", "level=banana"],
            &["--size", "1G", "--algorithm-params", "priority=1 level=9"],
            &["--size", "1G", "--policy", "evict=maybe"],
            &["--size", "1G", "--mem-limit", "much"],
            &["--size", "1G", "--recomp-algorithm", "algo=zstd priority=4"],
            // Valid: a secondary algorithm, then parameters naming it by priority.
            &[
                "--size",
                "1G",
                "--recomp-algorithm",
                "zstd",
                "--algorithm-params",
                "priority=1 level=9",
            ],
        ];
        for &case in cases {
            let serve =
                Serve::parse_from(std::iter::once("serve").chain(case.iter().copied())).args;
            let create = CreateArgs {
                size: serve.size.clone(),
                device: serve.device.clone(),
                streams: serve.queues,
                ..CreateArgs::default()
            };
            let daemon = configure(&serve).err().map(|e| e.to_string());
            let find = validate(&create).err().map(|e| e.to_string());
            match daemon {
                Some(d) => assert_eq!(find.as_deref(), Some(d.as_str()), "{case:?}"),
                // Accepted by the daemon: --find fails only for want of the driver, if at all.
                None => assert!(
                    find.as_deref()
                        .map_or(true, |f| f == crate::common::NO_DRIVER),
                    "{case:?}: {find:?}"
                ),
            }
        }
    }
}
