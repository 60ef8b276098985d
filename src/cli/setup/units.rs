//! The systemd generator (`uzram-generator`, as zram-generator is one): at boot, and at every
//! `systemctl daemon-reload`, the devices `uzram setup` would make are written as units into the
//! directory systemd names. For a `[zramN]` section, device `/dev/ublkbN`:
//! - `uzram@zramN.service.d/generator.conf`: the packaged `uzram@.service` (a supervisor that
//!   keeps the device's memory in systemd's descriptor store) started with the section's options;
//! - `uzram-prepare@zramN.service`: once that serves, makes swap or the file system, but only on
//!   a device never written (one its service took over after a crash keeps its pages);
//! - `dev-ublkbN.swap` (wanted by `swap.target`), or the mount point's `.mount` unit (wanted by
//!   `local-fs.target`), with the section's priority and options.
//!
//! With at least one swap device, the packaged sleep units are pulled in where systemd sleeps
//! (`sleep_hooks`): swap on uzram needs them for a hibernation or a suspend under pressure.
//!
//! The swap or mount unit requires the prepare unit, which only wants the service. So a restart
//! of the service (which hands the device and its pages to the next supervisor) does not reach
//! the swap unit, whose restart would be a swapoff pulling every page back into RAM; and a
//! service that cannot start (no ublk_drv) fails the prepare unit and so the swap unit at once,
//! instead of after the device's 90 s timeout, and the system boots without that swap.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{DevicePlan, Host};
use crate::cli::ctl;

/// What a unit directory gets: a file's text, or a link (the enabling `*.wants/` links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A unit file or drop-in.
    File(String),
    /// A symbolic link to this target.
    Link(String),
}

/// The units of one planned device, as paths relative to the generator's directory. `exe` is
/// the uzram binary the service runs; `source` names where the section was read, for the
/// files' first line. Fails, naming the value, where a value cannot be written in a unit.
pub fn device_units(
    plan: &DevicePlan,
    exe: &str,
    source: &str,
) -> Result<Vec<(PathBuf, Entry)>, String> {
    let id = ctl::parse_device(&plan.device).map_err(|e| e.to_string())?;
    let section = &plan.section;
    if section.is_empty() || !section.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("section name {section:?} cannot name a unit"));
    }
    let fs = plan.fs.as_str();
    if fs.is_empty() || !fs.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("fs-type {fs:?} is not a file system's name"));
    }
    let header = format!("# Written by uzram-generator from [{section}] of {source}\n");
    let service = format!("uzram@{section}.service");
    let prepare = format!("uzram-prepare@{section}.service");
    let mut out = vec![(
        PathBuf::from(format!("{service}.d/generator.conf")),
        Entry::File(format!("{header}{}", service_dropin(plan, id, exe)?)),
    )];
    // Ordered after the service too, not only the prepare unit: at shutdown systemd stops
    // what is ordered after first, so swap is off (or the file system unmounted) before the
    // service deletes the device. After= passes no restart on.
    let needs = format!("Requires={prepare}\nAfter={prepare} {service}\n");
    let dev = &plan.device;
    let (wanted_by, unit_name, unit) = match &plan.mount {
        None if fs == "swap" => (
            "swap.target",
            format!("dev-ublkb{id}.swap"),
            format!(
                "{header}[Unit]\nDescription=uzram compressed swap on {dev}\n\
                 Documentation=man:uzram(8)\n{needs}\n[Swap]\nWhat={dev}\nPriority={}\n{}",
                plan.priority,
                options_line(&plan.options)?
            ),
        ),
        Some(mount) => {
            let name = format!("{}.mount", escape_path(mount));
            if name.len() > 255 {
                return Err(format!(
                    "mount-point {mount:?}: its unit's name would be longer than 255 bytes"
                ));
            }
            let text = format!(
                "{header}[Unit]\nDescription=uzram compressed storage on {dev}\n\
                 Documentation=man:uzram(8)\n{needs}\n[Mount]\nWhat={dev}\nWhere={}\n\
                 Type={fs}\n{}",
                unit_value("mount-point", mount)?,
                options_line(&plan.options)?
            );
            ("local-fs.target", name, text)
        }
        // A file system without a mount point: made, not mounted (as `uzram setup` does).
        None => ("local-fs.target", prepare.clone(), String::new()),
    };
    out.push((
        PathBuf::from(&prepare),
        Entry::File(format!(
            "{header}{}",
            prepare_unit(&service, wanted_by, dev, fs, exe)?
        )),
    ));
    if !unit.is_empty() {
        out.push((PathBuf::from(&unit_name), Entry::File(unit)));
    }
    out.push((
        PathBuf::from(format!("{wanted_by}.wants/{unit_name}")),
        Entry::Link(format!("../{unit_name}")),
    ));
    Ok(out)
}

/// The drop-in of `uzram@.service`: the section's options, and what its backing device needs
/// at start (its device unit, or the mounts of its file's path).
fn service_dropin(plan: &DevicePlan, id: u32, exe: &str) -> Result<String, String> {
    let mut serve = vec![
        exe.to_string(),
        "serve".into(),
        "--id".into(),
        id.to_string(),
        "--size".into(),
        plan.size_bytes.to_string(),
    ];
    let args = plan
        .device_args()
        .to_args()
        .map_err(|e| format!("writeback-device: {e}"))?;
    for a in args {
        serve.push(
            a.into_string()
                .map_err(|a| format!("{a:?} is not UTF-8, which a unit needs"))?,
        );
    }
    let exec = serve
        .iter()
        .map(|a| exec_arg(a))
        .collect::<Result<Vec<_>, _>>()?
        .join(" ");
    let mut unit = String::new();
    if let Some(wb) = &plan.writeback {
        let value = unit_value("writeback-device", wb)?;
        if let Some(rest) = wb.strip_prefix("/dev/") {
            let device = format!("dev-{}.device", escape_path(rest));
            unit = format!("[Unit]\nRequires={device}\nAfter={device}\n\n");
        } else {
            // There when the service starts, as `uzram setup` wants it (serve would make a
            // new file): the service fails, naming it, where it is not.
            // RequiresMountsFor= is a list split on blanks; AssertPathExists= one path.
            let listed = if value.contains(char::is_whitespace) {
                format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
            } else {
                value.clone()
            };
            unit = format!("[Unit]\nRequiresMountsFor={listed}\nAssertPathExists={value}\n\n");
        }
    }
    Ok(format!(
        "{unit}[Service]\n# The options are these, not /etc/uzram/{}.env's.\n\
         EnvironmentFile=\nExecStart=\nExecStart={exec}\n",
        plan.section
    ))
}

/// The oneshot that makes swap or the file system on a device never written, once its
/// service serves it. It wants the service and never requires it: a restart of the service
/// reaches neither it nor the swap unit that requires it.
fn prepare_unit(
    service: &str,
    wanted_by: &str,
    dev: &str,
    fs: &str,
    exe: &str,
) -> Result<String, String> {
    Ok(format!(
        "[Unit]\nDescription=Make {what} on {dev} if it is new\nDocumentation=man:uzram(8)\n\
         DefaultDependencies=no\nWants={service}\nAfter={service}\nBefore={wanted_by}\n\n\
         [Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={exe} prepare {dev} {fs}\n",
        what = if fs == "swap" {
            "swap".to_string()
        } else {
            format!("a {fs} file system")
        },
        exe = exec_arg(exe)?,
    ))
}

/// `Options=...` and its newline, or nothing for no options.
fn options_line(options: &str) -> Result<String, String> {
    if options.is_empty() {
        return Ok(String::new());
    }
    Ok(format!("Options={}\n", unit_value("options", options)?))
}

/// One word of an `ExecStart=` line: as it is when it needs no quoting, else in double quotes
/// with `\` and `"` escaped. `%` (a specifier) and `$` (a variable) are doubled either way.
fn exec_arg(a: &str) -> Result<String, String> {
    // A lone `;` separates commands; `\;` is the word itself.
    if a == ";" {
        return Ok("\\;".into());
    }
    if a.chars().any(char::is_control) {
        return Err(format!(
            "{a:?} has a control character, which a unit cannot hold"
        ));
    }
    let plain = !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._=,:+-@%$".contains(&b));
    let mut s = String::with_capacity(a.len() + 2);
    if !plain {
        s.push('"');
    }
    for c in a.chars() {
        match c {
            '%' => s.push_str("%%"),
            '$' => s.push_str("$$"),
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            c => s.push(c),
        }
    }
    if !plain {
        s.push('"');
    }
    Ok(s)
}

/// A unit setting's value (the rest of its line): `%` doubled; a control character refused,
/// naming the key.
fn unit_value(key: &str, v: &str) -> Result<String, String> {
    if v.chars().any(char::is_control) {
        return Err(format!(
            "{key} = {v:?}: a control character cannot be in a unit"
        ));
    }
    // A line ending in `\` goes on to the next.
    if v.ends_with('\\') {
        return Err(format!("{key} = {v:?}: a unit's line cannot end with \\"));
    }
    Ok(v.replace('%', "%%"))
}

/// A path as systemd names its mount unit (`systemd-escape --path`): slashes at either end
/// dropped, the others `-`; bytes other than letters, digits, `:`, `_` and a `.` that does not
/// start the name as `\xNN`. `/` alone is `-`.
pub fn escape_path(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return "-".into();
    }
    let mut s = String::new();
    let mut last_slash = false;
    for (i, b) in trimmed.bytes().enumerate() {
        match b {
            b'/' if last_slash => continue,
            b'/' => s.push('-'),
            b'.' if i == 0 => s.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || b":_.".contains(&b) => s.push(char::from(b)),
            b => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
        last_slash = b == b'/';
    }
    s
}

/// Why the generator writes nothing at all on this system, if it should not: uzram would set up
/// the same sections as another tool does, or cannot run here. `from_generator_files`: the plan
/// is zram-generator's files (else zramswap's).
pub fn stand_down(root: &Path, from_generator_files: bool) -> Option<String> {
    if root.join("run/systemd/container").exists() {
        return Some("in a container (ublk devices are the host's): nothing written".into());
    }
    if from_generator_files && super::zram_generator_installed(root) {
        return Some(
            "zram-generator is installed and makes the same sections kernel zram devices: \
             nothing written (mask it, `ln -s /dev/null /etc/systemd/system-generators/zram-generator`, \
             or remove it, for uzram to take them over)"
                .into(),
        );
    }
    if enabled(root, "uzram-setup.service") {
        return Some(
            "uzram-setup.service is enabled and sets these devices up itself: nothing written \
             (`systemctl disable uzram-setup.service` for this generator's units instead)"
                .into(),
        );
    }
    if !from_generator_files && enabled(root, "zramswap.service") {
        return Some(
            "zram-tools' zramswap.service is enabled and makes /etc/default/zramswap's device a \
             kernel zram one: nothing written (`systemctl disable zramswap.service` for uzram to \
             take it over)"
                .into(),
        );
    }
    None
}

/// Whether `unit` is enabled under `root`: a link to it in some `*.wants` or `*.requires`
/// directory of /etc/systemd/system.
fn enabled(root: &Path, unit: &str) -> bool {
    let Ok(dirs) = std::fs::read_dir(root.join("etc/systemd/system")) else {
        return false;
    };
    dirs.flatten().any(|d| {
        let name = d.file_name();
        let name = name.to_string_lossy();
        (name.ends_with(".wants") || name.ends_with(".requires"))
            && std::fs::symlink_metadata(d.path().join(unit)).is_ok()
    })
}

/// Runs the generator: plans from the system's configuration under `root` (`/`, or
/// `ZRAM_GENERATOR_ROOT` as zram-generator's tests set it) and writes each device's units into
/// `dir`. A device that cannot be planned or written is left out, with a line naming it; the
/// others are written. A configuration error is said and marked (`config_failed`: the command
/// then exits 1, as zram-generator does on one), and so is a directory it cannot write.
pub fn generate(dir: &Path, root: &Path, exe: &str) -> Generated {
    let mut out = Generated::default();
    let host = match Host::read(root, None) {
        Ok(h) => h,
        // Without MemTotal no size can be worked out: a failure where there is a
        // configuration to plan (as zram-generator fails), nothing to say where there is none.
        Err(e) => {
            let generator_files = !super::generator::files(root).is_empty();
            let cmdline = super::kernel_cmdline(root);
            let kernel = super::generator::kernel_option(&cmdline);
            let configured = generator_files
                || kernel == Some(true)
                || root.join("etc/default/zramswap").exists();
            if kernel != Some(false) && configured {
                out.said.push(format!("{e}: nothing written"));
                out.config_failed = stand_down(root, generator_files).is_none();
            }
            return out;
        }
    };
    let loaded = match super::load_plan(None, &host) {
        Ok(l) => l,
        // No configuration at all: nothing to say.
        Err(e) if e.file == "configuration" => return out,
        Err(e) => {
            out.said.push(format!("{e}: nothing written"));
            // A configuration uzram would stand down from anyway is not its failure (which
            // files it came from: load_plan's rule).
            let from_generator_files = super::generator_files(&host).is_some();
            out.config_failed = stand_down(root, from_generator_files).is_none();
            return out;
        }
    };
    out.said.extend(
        loaded
            .notes
            .iter()
            .filter(|n| {
                !n.starts_with("zram-generator is installed") && !n.starts_with(super::INFO)
            })
            .cloned(),
    );
    if loaded.plan.is_empty() {
        return out;
    }
    if let Some(why) = stand_down(root, loaded.system_generator_files) {
        out.said.push(why);
        return out;
    }
    let source = if loaded.system_generator_files {
        "zram-generator.conf"
    } else {
        "/etc/default/zramswap"
    };
    let mut accepted: Vec<DevicePlan> = Vec::new();
    let mut written: std::collections::BTreeSet<PathBuf> = Default::default();
    for d in loaded.plan {
        for w in &d.warnings {
            out.said.push(format!("{source} [{}] {w}", d.section));
        }
        let units = check_device(&d, &accepted)
            .and_then(|()| device_units(&d, exe, source))
            .and_then(
                |units| match units.iter().find(|(p, _)| written.contains(p)) {
                    Some((p, _)) => {
                        Err(format!("{} is an earlier section's unit too", p.display()))
                    }
                    None => Ok(units),
                },
            );
        let done = units.and_then(|units| {
            write_units(dir, &units, &mut written).map_err(|e| {
                out.write_failed = true;
                e.to_string()
            })
        });
        match done {
            Ok(()) => {
                out.said.push(format!(
                    "[{}] {}: units written (uzram@{}.service)",
                    d.section, d.device, d.section
                ));
                accepted.push(d);
            }
            Err(e) => {
                out.said.push(format!(
                    "{source} [{}] {e}: no units written for it",
                    d.section
                ));
                out.config_failed = true;
            }
        }
    }
    if accepted.iter().any(|d| d.fs == "swap" && d.mount.is_none()) {
        write_sleep_hooks(dir, root, &mut written, &mut out);
    }
    out
}

/// Writes the sleep hooks' links (`sleep_hooks`) into `dir`, and says which, or why not.
fn write_sleep_hooks(
    dir: &Path,
    root: &Path,
    written: &mut std::collections::BTreeSet<PathBuf>,
    out: &mut Generated,
) {
    let hooks = sleep_hooks(root);
    if hooks.is_empty() {
        return;
    }
    match write_units(dir, &hooks, written) {
        Ok(()) => {
            let mut names: Vec<&str> = hooks
                .iter()
                .filter_map(|(p, _)| p.file_name()?.to_str())
                .collect();
            names.dedup();
            out.said.push(format!(
                "sleep hooks pulled in where systemd sleeps: {}",
                names.join(" ")
            ));
        }
        Err(e) => {
            out.write_failed = true;
            out.said.push(format!("sleep hooks: {e}"));
        }
    }
}

/// The sleep units that make a system sleep safe with swap on uzram, and the sleep services
/// that pull them in: before a hibernation uzram is swapped off (the image is made with the
/// daemon frozen, and a swap write to it would hang), so that one is required; before a
/// suspend the processes holding swap are frozen first, which is only wanted.
const SLEEP_HOOKS: [(&str, &str, &[&str]); 2] = [
    (
        "uzram-hibernate.service",
        "requires",
        &[
            "systemd-hibernate.service",
            "systemd-hybrid-sleep.service",
            "systemd-suspend-then-hibernate.service",
        ],
    ),
    (
        "uzram-suspend.service",
        "wants",
        &["systemd-suspend.service"],
    ),
];

/// systemd's search path for system units, first match wins (`man systemd.unit`), less the
/// generators' own directories and those of `systemctl set-property` and transient units,
/// where no sleep hook's file or mask is found.
const UNIT_DIRS: [&str; 5] = [
    "etc/systemd/system",
    "run/systemd/system",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
];

/// The links that enable the sleep hooks for this boot, as `systemctl enable` would for good:
/// a user with swap on uzram gets a hibernation that works without a step of their own. A
/// hook not installed under `root`, or masked (its first file in the search path a link to
/// /dev/null, an empty file, or a link that leads nowhere), is left out: a requirement on it
/// would fail every hibernation.
fn sleep_hooks(root: &Path) -> Vec<(PathBuf, Entry)> {
    let mut out = Vec::new();
    for (hook, kind, sleeps) in SLEEP_HOOKS {
        let first = UNIT_DIRS
            .iter()
            .find(|d| root.join(d).join(hook).symlink_metadata().is_ok());
        let Some(dir) = first else { continue };
        let path = root.join(dir).join(hook);
        // A link to /dev/null reads as empty too; a link that leads nowhere has no metadata.
        let masked = std::fs::metadata(&path).map_or(true, |m| m.len() == 0);
        if masked {
            continue;
        }
        for sleep in sleeps {
            out.push((
                PathBuf::from(format!("{sleep}.{kind}/{hook}")),
                Entry::Link(format!("/{dir}/{hook}")),
            ));
        }
    }
    out
}

/// Says the generator's lines where they are read: the kernel's log (as warnings) when systemd
/// runs it (it sets SYSTEMD_SCOPE for generators, whose stderr may lead nowhere), else stderr.
pub fn say(lines: &[String]) {
    use std::io::Write as _;
    let mut kmsg = std::env::var_os("SYSTEMD_SCOPE").and_then(|_| {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .ok()
    });
    for line in lines {
        let text = format!("uzram-generator: {line}");
        match kmsg.as_mut() {
            // One write is one record of the log.
            Some(f) => {
                let _ = f.write_all(format!("<4>{text}\n").as_bytes());
            }
            None => crate::common::output::warn(&text),
        }
    }
}

/// What a run of the generator did.
#[derive(Debug, Default)]
pub struct Generated {
    /// What the journal should be told, one line each.
    pub said: Vec<String>,
    /// A unit could not be written into the directory (the generator then fails, after its
    /// lines are said).
    pub write_failed: bool,
    /// The configuration, or a device of it, could not be planned: said, and the generator
    /// fails after writing the devices it could (standing down is not a failure).
    pub config_failed: bool,
}

/// The checks `uzram setup` makes of a device, against the devices accepted before it, less
/// what cannot be known this early in the boot: whether its writeback device or file is
/// there and usable (udev has not run, file systems are not mounted; its service checks at
/// start, and waits for the device or the mounts its path needs).
fn check_device(d: &DevicePlan, accepted: &[DevicePlan]) -> Result<(), String> {
    if let Some(wb) = &d.writeback {
        if let Some(other) = accepted.iter().find(|a| a.writeback.as_ref() == Some(wb)) {
            return Err(format!(
                "writeback-device {wb} is [{}]'s too: a backing file serves one device",
                other.section
            ));
        }
    }
    let early = |p: &DevicePlan| DevicePlan {
        writeback: None,
        failed: None,
        ..p.clone()
    };
    let with: Vec<DevicePlan> = accepted.iter().chain([d]).map(early).collect();
    ctl::check_plan(&with).map_err(|e| e.to_string())
}

/// Writes a device's `units` into `dir`, noting their paths in `written`. If one cannot be
/// written, those this call made are removed again: "no units written for it" stays true.
fn write_units(
    dir: &Path,
    units: &[(PathBuf, Entry)],
    written: &mut std::collections::BTreeSet<PathBuf>,
) -> std::io::Result<()> {
    let mut made: Vec<PathBuf> = Vec::new();
    for (path, entry) in units {
        written.insert(path.clone());
        let full = dir.join(path);
        let existed = full.symlink_metadata().is_ok();
        if let Err(e) = write_entry(&full, entry) {
            for p in made.iter().rev() {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
        if !existed {
            made.push(full);
        }
    }
    Ok(())
}

fn write_entry(path: &Path, entry: &Entry) -> std::io::Result<()> {
    let named = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!("{}: {e}", crate::common::output::shown(path)),
        )
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(named)?;
    }
    match entry {
        // Under a temporary name, renamed once whole: a full disk leaves no empty unit.
        Entry::File(text) => {
            use std::io::Write as _;
            let mut unit = crate::common::output::Replacing::new(path)
                .map_err(named)?
                .new_file_mode(0o644);
            unit.write_all(text.as_bytes()).map_err(named)?;
            unit.commit().map_err(named)
        }
        Entry::Link(target) => std::os::unix::fs::symlink(target, path).map_err(named),
    }
}

/// `uzram prepare DEVICE FS`: makes swap (`FS` = `swap`) or a file system on `DEVICE`, a uzram
/// device, only if nothing was ever written to it (the kernel's count of writes since the
/// device was added is 0: it reads as zeros, and nothing is lost). A device written before (one
/// a new supervisor took over, with its pages) is left as it is. Returns what was done.
pub fn prepare(device: &str, fs: &str) -> Result<String, ctl::CtlError> {
    let id = ctl::parse_device(device)?;
    let dev = format!("/dev/ublkb{id}");
    if fs.is_empty() || !fs.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ctl::CtlError(format!(
            "{fs:?} is neither swap nor a file system's name"
        )));
    }
    // Only uzram's devices: another ublk server's device never written may still hold data.
    ctl::attr(id, "initstate", None).map_err(|e| {
        ctl::CtlError(format!(
            "{dev} is not served by uzram ({e}): its service did not start it"
        ))
    })?;
    let stat_path = format!("/sys/block/ublkb{id}/stat");
    let stat = std::fs::read_to_string(&stat_path)
        .map_err(|e| ctl::CtlError(format!("{stat_path}: {e}")))?;
    let writes = writes_of(&stat)
        .ok_or_else(|| ctl::CtlError(format!("{stat_path}: no write count in {stat:?}")))?;
    if writes > 0 {
        return Ok(format!(
            "{dev}: written before ({writes} writes): left as it is"
        ));
    }
    if fs == "swap" {
        ctl::run_program("mkswap", &[&dev])?;
        Ok(format!("{dev}: swap made"))
    } else {
        ctl::run_program(&format!("mkfs.{fs}"), &[&dev])?;
        Ok(format!("{dev}: {fs} file system made"))
    }
}

/// The count of write requests completed in a block device's `stat` (its fifth field).
fn writes_of(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(4)?.parse().ok()
}

#[cfg(test)]
#[path = "units_tests.rs"]
mod tests;
