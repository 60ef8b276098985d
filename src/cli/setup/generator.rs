//! zram-generator's configuration, read as zram-generator 1.2 reads it (its `src/config.rs`):
//! which files, in which order, the `set!` variables, the size expressions over `ram` (MemTotal
//! in whole MiB), the obsolete `zram-fraction` / `max-zram-size`, `host-memory-limit`, the
//! kernel command line's `systemd.zram`, mount-point normalisation. Where zram-generator would
//! plan something the kernel then refuses (an infinite size, a section name the kernel never
//! makes), uzram refuses it up front, naming the file, section and key.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use super::{apply_algorithms, err, table_too_large, DevicePlan, SetupError, INFO};

/// What the kernel command line says (`systemd.zram`, `=1`, `=0`, `=yes`, ...): the last word
/// zram-generator recognises wins; others are skipped. `None`: nothing said.
pub fn kernel_option(cmdline: &str) -> Option<bool> {
    cmdline
        .split_whitespace()
        .rev()
        .find_map(|w| match w.strip_prefix("systemd.zram")? {
            "" | "=1" | "=yes" | "=true" | "=on" => Some(true),
            "=0" | "=no" | "=false" | "=off" => Some(false),
            _ => None,
        })
}

/// The configuration files in precedence order, under `root`: the main file (only the first
/// found of /run, /etc, /usr/local/lib, /usr/lib: they are not merged; an empty one or a link
/// to /dev/null masks the rest), then the `zram-generator.conf.d/*.conf` drop-ins by file
/// name, a name in a higher directory replacing the same name in lower ones (a link to
/// /dev/null removes it; dotfiles, other links and anything but regular files are ignored).
pub fn files(root: &Path) -> Vec<PathBuf> {
    let dirs = [
        "usr/lib/systemd",
        "usr/local/lib/systemd",
        "etc/systemd",
        "run/systemd",
    ];
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .rev()
        .map(|d| root.join(d).join("zram-generator.conf"))
        .find(|p| p.exists())
        .into_iter()
        .collect();
    let mut dropins: BTreeMap<OsString, PathBuf> = BTreeMap::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(root.join(d).join("zram-generator.conf.d")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let path = e.path();
            if name.to_string_lossy().starts_with('.')
                || !Path::new(&name).extension().is_some_and(|x| x == "conf")
            {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_symlink() {
                if std::fs::read_link(&path).is_ok_and(|t| t == Path::new("/dev/null")) {
                    dropins.remove(&name);
                }
            } else if meta.is_file() {
                dropins.insert(name, path);
            }
        }
    }
    files.extend(dropins.into_values());
    files
}

/// One `[zramN]` section's settings as read, before its size is worked out.
struct Section {
    plan: DevicePlan,
    /// `zram-size`, checked for syntax when read, evaluated after every file is read.
    size: Option<String>,
    resident: Option<String>,
    host_limit: Option<u64>,
    fraction: Option<f64>,
    /// `max-zram-size`: `Some(None)` is `none`.
    max_size: Option<Option<u64>>,
    fs_type: Option<String>,
    /// Where each setting came from, for messages: (file, key).
    source: BTreeMap<&'static str, String>,
}

/// Plans the devices of `files` (name and text, in precedence order) for a machine of `ram`
/// MiB (MemTotal, whole MiB), with the kernel command line's `systemd.zram` (`Some(true)`
/// adds a default zram0 when no file has one).
pub fn plan(
    files: &[(String, String)],
    ram: u64,
    kernel: Option<bool>,
) -> Result<(Vec<DevicePlan>, Vec<String>), SetupError> {
    let mut sections: BTreeMap<u32, Section> = BTreeMap::new();
    let mut vars: BTreeMap<String, f64> = BTreeMap::new();
    let mut notes = Vec::new();
    // An error ends the plan, and the lines said before it may be why (a set! line left out,
    // then its name used): they go with it.
    let with_notes = |mut e: SetupError, notes: &[String]| {
        // (Information is left out: the generator keeps it to itself.)
        let said: Vec<&str> = notes
            .iter()
            .filter(|n| !n.starts_with(INFO))
            .map(String::as_str)
            .collect();
        if !said.is_empty() {
            e.message = format!("{} (read before it: {})", e.message, said.join("; "));
        }
        e
    };
    for (file, text) in files {
        read_file(file, text, ram, &mut sections, &mut vars, &mut notes)
            .map_err(|e| with_notes(e, &notes))?;
    }
    if kernel == Some(true) {
        sections
            .entry(0)
            .or_insert_with(|| new_section("zram0", 0, "the kernel command line"));
    }
    let mut plans = Vec::new();
    for (_, s) in sections {
        match finish(s, ram, &vars).map_err(|e| with_notes(e, &notes))? {
            Some(Ok(mut p)) => {
                warn_writeback_only(&mut p);
                plans.push(p);
            }
            Some(Err(why)) => notes.push(why),
            None => {}
        }
    }
    Ok((plans, notes))
}

fn new_section(name: &str, id: u32, file: &str) -> Section {
    let mut source = BTreeMap::new();
    source.insert("section", file.to_string());
    Section {
        plan: DevicePlan::new(name, u64::from(id)),
        size: None,
        resident: None,
        host_limit: None,
        fraction: None,
        max_size: None,
        fs_type: None,
        source,
    }
}

/// The device id of a section name zram-generator takes (`zram` and a number), or why uzram
/// cannot plan it; `Ok(None)` for a section zram-generator ignores.
fn section_id(name: &str) -> Result<Option<u32>, String> {
    let Some(n) = name
        .strip_prefix("zram")
        .filter(|n| n.parse::<u64>().is_ok())
    else {
        return Ok(None);
    };
    let id: u64 = n.parse().expect("checked");
    if id.to_string() != n {
        return Err(format!(
            "[{name}]: write [zram{id}] (zram-generator would set up a device named {name}, which the kernel never makes; uzram's is /dev/ublkb{id})"
        ));
    }
    u32::try_from(id)
        .ok()
        .filter(|&id| id < crate::common::MAX_DEVICES)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "[{name}]: at most zram{} (ublk's device numbers)",
                crate::common::MAX_DEVICES - 1
            )
        })
}

fn read_file(
    file: &str,
    text: &str,
    ram: u64,
    sections: &mut BTreeMap<u32, Section>,
    vars: &mut BTreeMap<String, f64>,
    notes: &mut Vec<String>,
) -> Result<(), SetupError> {
    // A byte-order mark is no part of the first line: rust-ini's file loader, which
    // zram-generator reads with, skips it too.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some(at) = text_after_section(text) {
        return Err(err(
            file,
            format!("{at}: text after the section's closing ] (the reader would take it for the start of a key, with the next line)"),
        ));
    }
    let ini = ini::Ini::load_from_str(text).map_err(|e| err(file, ini_error(&e, text)))?;
    for (section, props) in ini.iter() {
        let Some(name) = section else {
            for (k, v) in props.iter() {
                super::setvar::set_var(file, k, v, ram, vars, notes)?;
            }
            continue;
        };
        let Some(id) = section_id(name).map_err(|m| err(file, m))? else {
            notes.push(format!(
                "{file}: ignoring section [{name}] (devices are [zramN], N a number)"
            ));
            continue;
        };
        let s = sections
            .entry(id)
            .or_insert_with(|| new_section(name, id, file));
        for (k, v) in props.iter() {
            apply(s, file, name, k, v)?;
        }
    }
    Ok(())
}

/// Evaluates a size expression (MiB) over `ram` and the `set!` variables (`ram` first).
pub(super) fn eval(expr: &str, ram: u64, vars: &BTreeMap<String, f64>) -> Result<f64, String> {
    if expr.is_empty() {
        return Err("empty".into());
    }
    let mut ns = |name: &str, args: Vec<f64>| -> Option<f64> {
        if !args.is_empty() {
            None
        } else if name == "ram" {
            Some(ram as f64)
        } else {
            vars.get(name).copied()
        }
    };
    fasteval::ez_eval(expr, &mut ns).map_err(|e| expr_error(&e))
}

/// Checks an expression's syntax (zram-generator parses when it reads, evaluates later).
fn parse_expr(expr: &str) -> Result<(), String> {
    let mut slab = fasteval::Slab::new();
    fasteval::Parser::new()
        .parse(expr, &mut slab.ps)
        .map(drop)
        .map_err(|e| expr_error(&e))
}

/// An expression's error in words (the evaluator's own Display is its Debug).
fn expr_error(e: &fasteval::Error) -> String {
    use fasteval::Error as E;
    match e {
        E::EOF | E::EofWhileParsing(_) => "the expression ends too early".into(),
        E::Undefined(name) => format!(
            "{name:?} is not known (an expression may use numbers, ram and the set! variables)"
        ),
        E::UnparsedTokensRemaining(rest) => format!("unexpected {rest:?} after the expression"),
        E::InvalidValue | E::ParseF64(_) => {
            "not a number where one was expected (sizes are MiB, without a unit: 4096, ram / 2)"
                .into()
        }
        E::Expected(what) => format!("expected {what}"),
        E::WrongArgs(f) => format!("wrong arguments to {f}"),
        E::TooLong => "the expression is too long".into(),
        E::TooDeep => "the expression nests too deeply".into(),
        other => format!("not a valid expression ({other:?})"),
    }
}

/// zram-generator's paths (`mount-point`, `writeback-device`): absolute, no `..`, normalised
/// (`/foo//bar/./baz/` is `/foo/bar/baz`).
fn normalise(key: &str, value: &str) -> Result<String, String> {
    let path = Path::new(value);
    if path.is_relative() {
        return Err(format!("{key} {value:?} is not absolute"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{key} {value:?} is not normalized (it has ..)"));
    }
    let p: PathBuf = path.components().collect();
    Ok(p.to_string_lossy().into_owned())
}

/// The first section line with more than a comment after its `]`, as "line N (\"LINE\")".
fn text_after_section(text: &str) -> Option<String> {
    text.lines().enumerate().find_map(|(n, l)| {
        let line = l.trim();
        let rest = line.strip_prefix('[')?.split_once(']')?.1.trim();
        (!rest.is_empty() && !rest.starts_with(['#', ';']))
            .then(|| format!("line {} ({line:?})", n + 1))
    })
}

/// rust-ini's syntax error in words: the line and column, and what was expected where the
/// parser's own text is a Rust debug form. rust-ini reports an unclosed `[` or a line without
/// `=` where it gave up (the end of the file, having read on from the line at fault): the last
/// such line of `text` is named instead, quoted, where there is one.
fn ini_error(e: &ini::ParseError, text: &str) -> String {
    let comment = |l: &str| l.starts_with(['#', ';']);
    let culprit = |wrong: &dyn Fn(&str) -> bool| {
        text.lines()
            .enumerate()
            .map(|(n, l)| (n + 1, l.trim()))
            .filter(|&(_, l)| !l.is_empty() && !comment(l) && wrong(l))
            .last()
            .map(|(n, l)| format!("line {n} ({l:?})"))
    };
    let (what, at) = if e.msg.contains("']'") {
        (
            "a section's name opened with [ is not closed with ]".to_string(),
            culprit(&|l| l.starts_with('[') && !l.contains(']')),
        )
    } else if e.msg.contains("'='") {
        (
            "a line that is neither [section] nor key = value (a key needs = before its value)"
                .to_string(),
            // (rust-ini takes `:` for `=` too)
            culprit(&|l| !l.starts_with('[') && !l.contains(['=', ':'])),
        )
    } else if e.msg.contains("\\xHH") {
        (
            "an escape \\x takes four hex digits (\\x002d for -), or write the character itself"
                .to_string(),
            culprit(&|l| l.contains("\\x")),
        )
    } else if e.msg.contains("inline comment") {
        let what = format!(
            "{} (a comment, # or ;, starts its line, with no blank before it)",
            e.msg
        );
        (what, None)
    } else {
        (e.msg.to_string(), None)
    };
    let at = at.unwrap_or_else(|| format!("line {}, column {}", e.line, e.col));
    format!("{at}: {what}")
}

/// A mount point, normalised. zram-generator would plan one over `/` or a system directory; an
/// empty file system there would hide what the system keeps in it.
fn mount_point(k: &str, v: &str) -> Result<String, String> {
    const SYSTEM: [&str; 9] = [
        "/", "/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/boot", "/var",
    ];
    let at = normalise(k, v)?;
    if SYSTEM.contains(&at.as_str()) {
        let what = if at == "/" { "the root" } else { at.as_str() };
        return Err(format!(
            "a new, empty file system mounted over {what} would hide what the system keeps \
             there; name another directory"
        ));
    }
    Ok(at)
}

fn apply(s: &mut Section, file: &str, section: &str, k: &str, v: &str) -> Result<(), SetupError> {
    let bad = |m: String| err(file, format!("[{section}] {k}={v}: {m}"));
    // Every value ends up in a command line or a unit (a tab is a blank, as in an expression).
    if v.chars().any(|c| c.is_control() && c != '\t') {
        return Err(err(
            file,
            format!("[{section}] {k}={v:?}: a control character cannot be in a value"),
        ));
    }
    let optional = |v: &str| -> Result<Option<u64>, SetupError> {
        if v == "none" {
            Ok(None)
        } else {
            v.parse()
                .map(Some)
                .map_err(|_| bad("a whole number of MiB or none".into()))
        }
    };
    let key: &'static str = match k {
        "host-memory-limit" | "memory-limit" => {
            s.host_limit = optional(v)?;
            "host-memory-limit"
        }
        "zram-size" => {
            parse_expr(v).map_err(bad)?;
            s.size = Some(v.to_string());
            "zram-size"
        }
        "zram-resident-limit" => {
            parse_expr(v).map_err(bad)?;
            s.resident = Some(v.to_string());
            "zram-resident-limit"
        }
        "zram-fraction" => {
            let f: f64 = v.parse().map_err(|_| bad("a number".into()))?;
            if f.is_nan() || f < 0.0 {
                return Err(bad("not a fraction (< 0)".into()));
            }
            s.fraction = Some(f);
            "zram-fraction"
        }
        "max-zram-size" => {
            s.max_size = Some(optional(v)?);
            "max-zram-size"
        }
        "compression-algorithm" => {
            apply_algorithms(&mut s.plan, v);
            "compression-algorithm"
        }
        "writeback-device" => {
            s.plan.writeback = Some(normalise(k, v).map_err(bad)?);
            "writeback-device"
        }
        "uzram-policy" => {
            uzram_engine::PolicyConfig::default()
                .update(v)
                .map_err(|e| bad(e.to_string()))?;
            s.plan.policy = (!v.is_empty()).then(|| v.to_string());
            "uzram-policy"
        }
        "swap-priority" => {
            let p: i32 = v
                .parse()
                .map_err(|_| bad("a swap priority is a whole number, -1..32767".into()))?;
            if !(-1..=32767).contains(&p) {
                return Err(bad("a swap priority is -1..32767".into()));
            }
            s.plan.priority = p;
            "swap-priority"
        }
        "mount-point" => {
            s.plan.mount = Some(mount_point(k, v).map_err(bad)?);
            "mount-point"
        }
        "fs-type" => {
            s.fs_type = Some(v.to_string());
            "fs-type"
        }
        "options" => {
            s.plan.options = v.to_string();
            "options"
        }
        other => {
            s.plan.warnings.push(format!(
                "{file}: unknown key {other:?}, ignoring{}",
                match other {
                    o if o.starts_with("set!") => " (set! lines go before the first section)",
                    // The INI reader joins a line without = to the key of the next line.
                    o if o.contains('\n') =>
                        " (a line without = was read with the next one: both are ignored)",
                    _ => "",
                }
            ));
            return Ok(());
        }
    };
    s.source.insert(key, file.to_string());
    Ok(())
}

/// The section's plan, or why it makes no device: `host-memory-limit` below `ram`, or a size
/// of 0 (zram-generator skips both).
fn finish(
    s: Section,
    ram: u64,
    vars: &BTreeMap<String, f64>,
) -> Result<Option<Result<DevicePlan, String>>, SetupError> {
    let Section {
        mut plan,
        size,
        resident,
        host_limit,
        fraction,
        max_size,
        fs_type,
        source,
    } = s;
    let section = plan.section.clone();
    let from = |key: &str| {
        source
            .get(key)
            .or_else(|| source.get("section"))
            .cloned()
            .unwrap_or_default()
    };
    // zram-generator says this only at its info level: a note (see [`INFO`]), which the
    // generator keeps to itself, since a machine above a distribution's limit would otherwise be
    // told at every boot.
    if let Some(limit) = host_limit.filter(|&limit| limit < ram) {
        return Ok(Some(Err(format!(
            "{INFO}[{section}] makes no device: host-memory-limit = {limit} is below this \
             machine's {ram} MiB of RAM (zram-generator's rule)"
        ))));
    }
    plan.fs = fs_type.unwrap_or_else(|| {
        if plan.mount.is_some() {
            "ext2".into()
        } else {
            "swap".into()
        }
    });
    const MIB: u64 = 1 << 20;
    let too_large = |key: &str, what: String| {
        err(
            &from(key),
            format!("[{section}] {key}: {what} is larger than any device can be"),
        )
    };
    plan.size_bytes = if fraction.is_some() || max_size.is_some() {
        // The obsolete pair: whole MiB of a fraction of RAM, at most max-zram-size. It wins
        // over zram-size, as in zram-generator, which says nothing of it.
        if let Some(expr) = &size {
            let pair = match (fraction.is_some(), max_size.is_some()) {
                (true, true) => "zram-fraction and max-zram-size",
                (true, false) => "zram-fraction",
                _ => "max-zram-size",
            };
            plan.warnings.push(format!(
                "zram-size={expr} is ignored: the obsolete {pair} set the size instead (as zram-generator reads it); give zram-size alone"
            ));
        }
        let f = fraction.unwrap_or(0.5) * ram as f64;
        let max = max_size.flatten().unwrap_or(u64::MAX);
        if !f.is_finite() && max == u64::MAX {
            return Err(too_large("zram-fraction", format!("{f}")));
        }
        let key = if max == u64::MAX {
            "zram-fraction"
        } else {
            "max-zram-size"
        };
        (f as u64)
            .min(max)
            .checked_mul(MIB)
            .ok_or_else(|| too_large(key, format!("{} MiB", (f as u64).min(max))))?
    } else {
        let expr = size.as_deref().unwrap_or("min(ram / 2, 4096)");
        let bytes = mib_to_bytes(&section, "zram-size", expr, ram, vars)
            .map_err(|m| err(&from("zram-size"), m))?;
        if bytes / ram.max(1).saturating_mul(MIB) > 32 {
            plan.warnings.push(format!(
                "zram-size={expr} would need an improbable compression ratio of over 32 (units may be wrong: the size is in MiB)"
            ));
        }
        bytes
    };
    // What the device would refuse at start (its slot table, all of it in RAM when full), said
    // now with the key's name; this device fails, the others are set up.
    if let Some(why) = table_too_large("zram-size", plan.size_bytes, ram.saturating_mul(MIB)) {
        plan.failed = Some(format!("{why} (units may be wrong: the size is in MiB)"));
    }
    if plan.failed.is_none() {
        plan.failed = plan.writeback.as_deref().and_then(unreachable_writeback);
    }
    if let Some(expr) = &resident {
        plan.mem_limit = mib_to_bytes(&section, "zram-resident-limit", expr, ram, vars)
            .map_err(|m| err(&from("zram-resident-limit"), m))?;
        if plan.mem_limit > ram.saturating_mul(MIB) {
            plan.warnings.push(format!(
                "zram-resident-limit={expr} is {} MiB, more than this machine's {ram} MiB of RAM: in effect no limit (units may be wrong: the limit is in MiB)",
                plan.mem_limit / MIB
            ));
        }
    }
    if plan.size_bytes == 0 {
        return Ok(Some(Err(format!(
            "[{section}] makes no device: its size works out to 0 MiB"
        ))));
    }
    Ok(Some(Ok(plan)))
}

/// Why writeback-device `dev` fails its device, if it does: zram-generator's setup fails the
/// device when the kernel refuses its backing_dev, as it refuses a path that does not exist
/// (the other devices are set up). A loop of links, or a directory on the way that cannot be
/// searched, is not "it does not exist".
fn unreachable_writeback(dev: &str) -> Option<String> {
    let why = match std::fs::metadata(dev) {
        Ok(_) => return None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "it does not exist".to_string(),
        Err(e) => format!("it cannot be reached: {e}"),
    };
    Some(format!(
        "writeback-device={dev}: {why}, so this device is not set up (as zram-generator's \
         setup fails it); uzram makes backing files only from its own option, --backing-dev"
    ))
}

/// An expression in MiB as bytes: NaN and negative values are errors (as zram-generator's);
/// so are values no device can have (zram-generator would saturate them to 2^64 - 1 bytes for
/// the kernel to refuse).
fn mib_to_bytes(
    section: &str,
    key: &str,
    expr: &str,
    ram: u64,
    vars: &BTreeMap<String, f64>,
) -> Result<u64, String> {
    let f = eval(expr, ram, vars).map_err(|e| format!("[{section}] {key}={expr}: {e}"))?;
    if f.is_nan() || f.is_infinite() || f < 0.0 {
        let what = match f {
            f if f.is_nan() => "is not a number (0 / 0?)".into(),
            f if f.is_infinite() => {
                "is infinite (a division by 0, or a number past 1.8e308)".into()
            }
            f => format!("is {f}, below 0"),
        };
        return Err(format!("[{section}] {key}={expr} {what}"));
    }
    let bytes = f * 1024.0 * 1024.0;
    if bytes >= u64::MAX as f64 {
        return Err(format!(
            "[{section}] {key}={expr} is {f} MiB, larger than any device can be"
        ));
    }
    Ok(bytes as u64)
}

/// Warns of the settings of the plan's `uzram-policy` whose only effect is writing pages back
/// (the others act on the pool as well), where it has no writeback device; `off` or `0` asks
/// for nothing and is not warned of.
fn warn_writeback_only(plan: &mut DevicePlan) {
    if plan.writeback.is_some() {
        return;
    }
    let Some(policy) = plan.policy.as_deref() else {
        return;
    };
    let words: Vec<&str> = policy
        .split_whitespace()
        .filter(|w| w.starts_with("writeback_after=") || w.starts_with("budget="))
        .filter(|w| !w.ends_with("=off") && !w.ends_with("=0"))
        .collect();
    if !words.is_empty() {
        let unused = words.join(" ");
        plan.warnings.push(format!(
            "uzram-policy {unused} does nothing without a writeback-device: pages are never written back"
        ));
    }
}
