//! The configurations zram users already have, planned as uzram devices: systemd's
//! `zram-generator.conf` (with its `.conf.d` drop-ins and its size expressions) and zram-tools'
//! `/etc/default/zramswap`. `uzram setup --dry-run` prints the plan, one `key=value` line per
//! device, without touching the system.
//!
//! A `[zramN]` section becomes `/dev/ublkbN`. Algorithms uzram does not have map to the nearest it
//! has, with a warning. Parsing uses the crates zram-generator itself uses (rust-ini, fasteval), so
//! a size expression means the same thing to both.

use std::path::{Path, PathBuf};

/// Why a configuration cannot be planned.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct SetupError {
    /// The file (or "zram-generator.conf" for a merged set).
    pub file: String,
    /// What is wrong.
    pub message: String,
}

fn err(file: &str, message: impl Into<String>) -> SetupError {
    SetupError {
        file: file.to_string(),
        message: message.into(),
    }
}

/// One device to set up.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePlan {
    /// The section it came from (`zram0`), or `zramswap`.
    pub section: String,
    /// `/dev/ublkbN`.
    pub device: String,
    /// The device's size.
    pub size_bytes: u64,
    /// The primary algorithm (uzram's name), if the configuration names one.
    pub algorithm: Option<String>,
    /// Its `algorithm_params`.
    pub params: Option<String>,
    /// `recomp_algorithm` specs, by priority.
    pub recomp: Vec<String>,
    /// Global recompression parameters (`(type=idle)` in zram-generator's syntax).
    pub recompress: Option<String>,
    /// `mem_limit` in bytes (0: none).
    pub mem_limit: u64,
    /// The backing device.
    pub writeback: Option<String>,
    /// Swap priority.
    pub priority: i32,
    /// `swap`, or the file system to make.
    pub fs: String,
    /// Where to mount it (file systems only).
    pub mount: Option<String>,
    /// Options for swapon or mount.
    pub options: String,
    /// uzram's tiering policy (`uzram-policy = key=value ...`; zram-generator has no such key and
    /// ignores it with a warning).
    pub policy: Option<String>,
    /// What was changed to fit uzram.
    pub warnings: Vec<String>,
}

impl DevicePlan {
    fn new(section: &str, id: u64) -> DevicePlan {
        DevicePlan {
            section: section.to_string(),
            device: format!("/dev/ublkb{id}"),
            size_bytes: 0,
            algorithm: None,
            params: None,
            recomp: Vec::new(),
            recompress: None,
            mem_limit: 0,
            writeback: None,
            policy: None,
            priority: 100,
            fs: "swap".into(),
            mount: None,
            options: "discard".into(),
            warnings: Vec::new(),
        }
    }

    /// The device's options, as `uzram --find` and `uzram serve` take them.
    pub fn device_args(&self) -> crate::common::options::DeviceArgs {
        crate::common::options::DeviceArgs {
            algorithm: self.algorithm.clone(),
            algorithm_params: self.params.clone(),
            recomp_algorithm: self.recomp.clone(),
            backing_dev: self.writeback.iter().map(PathBuf::from).collect(),
            policy: self.policy.clone(),
            mem_limit: (self.mem_limit > 0).then(|| self.mem_limit.to_string()),
        }
    }

    /// The plan's line: `device= size_bytes= algorithm= params= recomp= recompress= mem_limit=
    /// writeback= priority= fs= mount= options= policy=`, values with blanks in double quotes,
    /// `none` for nothing (`policy=none`: the defaults).
    pub fn line(&self) -> String {
        let q = |v: &str| {
            if v.is_empty() {
                "none".to_string()
            } else if v.contains(char::is_whitespace) {
                format!("\"{v}\"")
            } else {
                v.to_string()
            }
        };
        let opt = |v: &Option<String>| q(v.as_deref().unwrap_or(""));
        format!(
            "device={} size_bytes={} algorithm={} params={} recomp={} recompress={} mem_limit={} writeback={} priority={} fs={} mount={} options={} policy={}",
            self.device,
            self.size_bytes,
            q(self.algorithm.as_deref().unwrap_or("default")),
            opt(&self.params),
            q(&self.recomp.join(", ")),
            opt(&self.recompress),
            self.mem_limit,
            opt(&self.writeback),
            self.priority,
            q(&self.fs),
            opt(&self.mount),
            q(&self.options),
            opt(&self.policy),
        )
    }
}

/// uzram's algorithm for a zram algorithm name, and a warning when it is not the same one.
fn map_algorithm(name: &str) -> (String, Option<String>) {
    match name {
        "lz4" | "zstd" => (name.to_string(), None),
        "lzo" | "lzo-rle" | "842" => (
            "lz4".into(),
            Some(format!(
                "uzram has no {name}: using lz4, the nearest (as fast, a similar ratio)"
            )),
        ),
        "lz4hc" => (
            "lz4".into(),
            Some("uzram has no lz4hc: using lz4 (same format, faster, a little larger)".into()),
        ),
        "deflate" => (
            "zstd".into(),
            Some("uzram has no deflate: using zstd (a better ratio, much faster)".into()),
        ),
        other => (
            "lz4".into(),
            Some(format!("unknown algorithm {other:?}: using lz4")),
        ),
    }
}

/// `key=value,key=value` (zram-generator's parenthesised list) as zram's `algorithm_params`.
fn params_of(list: &str) -> String {
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// zram-generator's `compression-algorithm`: `lzo-rle zstd(level=3) (type=idle)`.
fn apply_algorithms(plan: &mut DevicePlan, value: &str) {
    plan.algorithm = None;
    plan.params = None;
    plan.recomp.clear();
    plan.recompress = None;
    let mut prio = 0u8;
    // Tokens split on blanks outside parentheses.
    let mut tokens = Vec::new();
    let (mut cur, mut depth) = (String::new(), 0);
    for c in value.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if c.is_whitespace() && depth == 0 {
            if !cur.is_empty() {
                tokens.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    for t in tokens {
        let (name, params) = match t.find('(') {
            Some(i) => (&t[..i], Some(params_of(t[i + 1..].trim_end_matches(')')))),
            None => (t.as_str(), None),
        };
        if name.is_empty() {
            plan.recompress = params;
            continue;
        }
        let (algo, warning) = map_algorithm(name);
        plan.warnings.extend(warning);
        if prio == 0 {
            plan.algorithm = Some(algo);
            plan.params = params.filter(|p| !p.is_empty());
        } else if prio <= 3 {
            let mut spec = format!("algo={algo} priority={prio}");
            if let Some(p) = params.filter(|p| !p.is_empty()) {
                spec.push(' ');
                spec.push_str(&p);
            }
            plan.recomp.push(spec);
        } else {
            plan.warnings.push(format!(
                "more than 3 recompression algorithms: {name} left out"
            ));
        }
        prio += 1;
    }
}

/// Evaluates a zram-generator size expression (MiB) over `ram` (MiB) and the `set!` variables.
fn eval_mib(expr: &str, ram_mib: f64, vars: &[(String, f64)]) -> Result<f64, String> {
    let mut ns = |name: &str, args: Vec<f64>| -> Option<f64> {
        if !args.is_empty() {
            return None;
        }
        if name == "ram" {
            return Some(ram_mib);
        }
        vars.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    };
    fasteval::ez_eval(expr, &mut ns).map_err(|e| format!("cannot evaluate {expr:?}: {e:?}"))
}

/// The zram-generator configuration files in precedence order: the main file (the first found of
/// /run, /etc, /usr/local/lib, /usr/lib under `root`), then every `zram-generator.conf.d/*.conf`
/// drop-in by file name (a name in an earlier directory hides the same name in later ones).
pub fn zram_generator_files(root: &Path) -> Vec<PathBuf> {
    let dirs = [
        "run/systemd",
        "etc/systemd",
        "usr/local/lib/systemd",
        "usr/lib/systemd",
    ];
    let mut files = Vec::new();
    if let Some(main) = dirs
        .iter()
        .map(|d| root.join(d).join("zram-generator.conf"))
        .find(|p| p.exists())
    {
        files.push(main);
    }
    let mut dropins: std::collections::BTreeMap<std::ffi::OsString, PathBuf> = Default::default();
    for d in dirs.iter().rev() {
        let Ok(entries) = std::fs::read_dir(root.join(d).join("zram-generator.conf.d")) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if Path::new(&name).extension().is_some_and(|x| x == "conf") {
                dropins.insert(name, e.path());
            }
        }
    }
    // A drop-in that is a symlink to /dev/null (or empty) masks the vendor's file of that name.
    files.extend(dropins.into_values());
    files
}

/// Plans the devices of zram-generator configuration texts, in precedence order (later files
/// override earlier ones, key by key), for a machine with `ram_mib` MiB of MemTotal.
pub fn plan_zram_generator(
    files: &[(String, String)],
    ram_mib: f64,
) -> Result<Vec<DevicePlan>, SetupError> {
    let (sections, vars) = merge_sections(files, ram_mib)?;
    let mut plans = Vec::new();
    for (section, settings) in &sections {
        if let Some(plan) = plan_section(section, settings, ram_mib, &vars)? {
            plans.push(plan);
        }
    }
    Ok(plans)
}

/// A `[zramN]` section's settings, merged over the files in order.
type Section = (String, Vec<(String, String)>);
/// The `set!` variables: name and value in MiB.
type Vars = Vec<(String, f64)>;

/// The `[zramN]` sections of `files`, merged key by key in file order, and the `set!`
/// variables of their global sections (each command run by `/bin/sh`, its output evaluated).
fn merge_sections(
    files: &[(String, String)],
    ram_mib: f64,
) -> Result<(Vec<Section>, Vars), SetupError> {
    // Merged key/value settings per section, in file order.
    let mut sections: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut vars: Vec<(String, f64)> = Vec::new();
    for (name, text) in files {
        let ini = ini::Ini::load_from_str_opt(
            text,
            ini::ParseOption {
                enabled_escape: false,
                ..Default::default()
            },
        )
        .map_err(|e| err(name, e.to_string()))?;
        for (section, props) in ini.iter() {
            match section {
                None => {
                    for (k, v) in props.iter() {
                        if let Some(var) = k.strip_prefix("set!") {
                            let out = std::process::Command::new("/bin/sh")
                                .args(["-c", v])
                                .output()
                                .map_err(|e| err(name, format!("set!{var}: {e}")))?;
                            let text = String::from_utf8_lossy(&out.stdout);
                            let value = eval_mib(text.trim(), ram_mib, &vars)
                                .map_err(|e| err(name, format!("set!{var}: {e}")))?;
                            vars.push((var.to_string(), value));
                        }
                    }
                }
                Some(s)
                    if s.strip_prefix("zram")
                        .is_some_and(|n| n.parse::<u64>().is_ok()) =>
                {
                    let entry = match sections.iter_mut().find(|(n, _)| n == s) {
                        Some(e) => e,
                        None => {
                            sections.push((s.to_string(), Vec::new()));
                            sections.last_mut().expect("just pushed")
                        }
                    };
                    for (k, v) in props.iter() {
                        entry.1.push((k.to_string(), v.to_string()));
                    }
                }
                Some(_) => {}
            }
        }
    }
    Ok((sections, vars))
}

/// One section's plan, or `None` when the section makes no device (its host memory limit is
/// below this machine's RAM, or its size is 0).
fn plan_section(
    section: &str,
    settings: &[(String, String)],
    ram_mib: f64,
    vars: &[(String, f64)],
) -> Result<Option<DevicePlan>, SetupError> {
    let id: u64 = section
        .strip_prefix("zram")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            err(
                "zram-generator.conf",
                format!("[{section}]: not a zramN section"),
            )
        })?;
    let mut s = SectionSettings::new(DevicePlan::new(section, id));
    for (k, v) in settings {
        s.apply(section, k, v.trim(), ram_mib, vars)?;
    }
    let SectionSettings {
        mut plan,
        mut size_expr,
        host_limit,
        fs_type,
        fraction,
        max_size,
    } = s;
    if fraction.is_some() || max_size.is_some() {
        // The obsolete pair overrides zram-size.
        size_expr = format!(
            "min(ram * {}, {})",
            fraction.unwrap_or(0.5),
            max_size.map_or("ram".to_string(), |m| m.to_string())
        );
    }
    plan.fs = fs_type.unwrap_or_else(|| {
        if plan.mount.is_some() {
            "ext2".into()
        } else {
            "swap".into()
        }
    });
    if host_limit.is_some_and(|limit| ram_mib > limit) {
        return Ok(None);
    }
    let mib = eval_mib(&size_expr, ram_mib, vars)
        .map_err(|e| err("zram-generator.conf", format!("[{section}] zram-size: {e}")))?;
    plan.size_bytes = (mib * 1024.0 * 1024.0) as u64;
    if plan.size_bytes == 0 {
        return Ok(None);
    }
    Ok(Some(plan))
}

/// A section's settings as they are read, before the size is worked out.
struct SectionSettings {
    plan: DevicePlan,
    size_expr: String,
    host_limit: Option<f64>,
    fs_type: Option<String>,
    fraction: Option<f64>,
    max_size: Option<f64>,
}

impl SectionSettings {
    fn new(plan: DevicePlan) -> SectionSettings {
        SectionSettings {
            plan,
            size_expr: "min(ram / 2, 4096)".to_string(),
            host_limit: None,
            fs_type: None,
            fraction: None,
            max_size: None,
        }
    }

    /// Takes setting `k` = `v` of `[section]`.
    fn apply(
        &mut self,
        section: &str,
        k: &str,
        v: &str,
        ram_mib: f64,
        vars: &[(String, f64)],
    ) -> Result<(), SetupError> {
        let bad = |m: String| err("zram-generator.conf", format!("[{section}] {k}={v}: {m}"));
        match k {
            "host-memory-limit" | "memory-limit" => {
                self.host_limit = if v == "none" {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|_| bad("a number of MiB or none".into()))?,
                    )
                }
            }
            "zram-size" => self.size_expr = v.to_string(),
            "zram-fraction" => {
                self.fraction = Some(v.parse().map_err(|_| bad("a number".into()))?);
            }
            "max-zram-size" => {
                self.max_size = if v == "none" {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|_| bad("a number of MiB or none".into()))?,
                    )
                }
            }
            "zram-resident-limit" => {
                let mib = eval_mib(v, ram_mib, vars).map_err(bad)?;
                self.plan.mem_limit = (mib * 1024.0 * 1024.0) as u64;
            }
            "compression-algorithm" => apply_algorithms(&mut self.plan, v),
            "writeback-device" => self.plan.writeback = (!v.is_empty()).then(|| v.to_string()),
            "uzram-policy" => {
                uzram_engine::PolicyConfig::default()
                    .update(v)
                    .map_err(|e| bad(e.to_string()))?;
                self.plan.policy = (!v.is_empty()).then(|| v.to_string());
            }
            "swap-priority" => {
                let p: i32 = v.parse().map_err(|_| bad("a number".into()))?;
                if !(-1..=32767).contains(&p) {
                    return Err(bad("must be -1..32767".into()));
                }
                self.plan.priority = p;
            }
            "mount-point" => self.plan.mount = Some(v.to_string()),
            "fs-type" => self.fs_type = Some(v.to_string()),
            "options" => self.plan.options = v.to_string(),
            other => self
                .plan
                .warnings
                .push(format!("unknown setting {other:?} left out")),
        }
        Ok(())
    }
}

/// Plans zram-tools' `/etc/default/zramswap`: `ALGO` (default lz4), `PERCENT` of MemTotal (which
/// overrides `SIZE`, in MiB), `PRIORITY` (default 100). Shell syntax, one assignment per line;
/// anything else is ignored, as `.` would only run it.
pub fn plan_zramswap(name: &str, text: &str, ram_mib: f64) -> Result<Vec<DevicePlan>, SetupError> {
    let get = |key: &str| -> Option<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .next_back()
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
    };
    let mut plan = DevicePlan::new("zramswap", 0);
    let (algo, warning) = map_algorithm(&get("ALGO").unwrap_or_else(|| "lz4".into()));
    plan.algorithm = Some(algo);
    plan.warnings.extend(warning);
    let num = |key: &str, v: String| -> Result<f64, SetupError> {
        v.parse::<f64>()
            .map_err(|_| err(name, format!("{key}={v:?} is not a number")))
    };
    let mib = match (get("PERCENT"), get("SIZE")) {
        (Some(p), _) => ram_mib * num("PERCENT", p)? / 100.0,
        (None, Some(s)) => num("SIZE", s)?,
        (None, None) => ram_mib * 0.5,
    };
    plan.size_bytes = (mib * 1024.0 * 1024.0) as u64;
    if let Some(p) = get("PRIORITY") {
        plan.priority = num("PRIORITY", p)? as i32;
    }
    Ok(if plan.size_bytes == 0 {
        Vec::new()
    } else {
        vec![plan]
    })
}

/// MemTotal in MiB, from /proc/meminfo.
pub fn ram_mib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Whether zram-generator is installed: then it acts on the same zram-generator.conf (as kernel
/// zram), and uzram must not silently do so too.
pub fn zram_generator_installed() -> bool {
    [
        "/usr/lib/systemd/system-generators/zram-generator",
        "/lib/systemd/system-generators/zram-generator",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

/// Where a plan comes from: `--config FILE`, else zram-generator's files, else
/// /etc/default/zramswap. Returns the plan and a note for the user when zram-generator is
/// installed and reads the same files.
pub fn load_plan(
    config: Option<&Path>,
    ram_mib: f64,
) -> Result<(Vec<DevicePlan>, Option<String>), SetupError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| err(&p.display().to_string(), e.to_string()))
    };
    if let Some(path) = config {
        let text = read(path)?;
        let name = path.display().to_string();
        let is_zramswap = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("zramswap"))
            || (!text.contains('[')
                && text.lines().any(|l| {
                    ["ALGO=", "PERCENT=", "SIZE=", "PRIORITY="]
                        .iter()
                        .any(|k| l.trim_start().starts_with(k))
                }));
        let plan = if is_zramswap {
            plan_zramswap(&name, &text, ram_mib)?
        } else {
            plan_zram_generator(&[(name, text)], ram_mib)?
        };
        return Ok((plan, None));
    }
    let files = zram_generator_files(Path::new("/"));
    if !files.is_empty() {
        let texts = files
            .iter()
            .map(|p| Ok((p.display().to_string(), read(p)?)))
            .collect::<Result<Vec<_>, SetupError>>()?;
        let note = zram_generator_installed().then(|| {
            "zram-generator is installed and sets up these same sections as kernel zram devices: \
             disable it (systemd.zram=0 on the kernel command line, or remove the package) before \
             `uzram setup` acts on zram-generator.conf"
                .to_string()
        });
        return Ok((plan_zram_generator(&texts, ram_mib)?, note));
    }
    let zramswap = Path::new("/etc/default/zramswap");
    if zramswap.exists() {
        return Ok((
            plan_zramswap("/etc/default/zramswap", &read(zramswap)?, ram_mib)?,
            None,
        ));
    }
    Err(err(
        "configuration",
        "none found: no zram-generator.conf (/etc/systemd, /run/systemd, /usr/lib/systemd) and no /etc/default/zramswap; give --config FILE",
    ))
}

#[cfg(test)]
mod tests;
