//! The configurations zram users already have, planned as uzram devices: systemd's
//! `zram-generator.conf` (with its `.conf.d` drop-ins and its size expressions) and zram-tools'
//! `/etc/default/zramswap`. `uzram setup --dry-run` prints the plan, one `key=value` line per
//! device, without touching the system.
//!
//! A `[zramN]` section becomes `/dev/ublkbN`. Algorithms uzram does not have map to the nearest it
//! has, with a warning. Parsing uses the crates zram-generator itself uses (rust-ini, fasteval), so
//! a size expression means the same thing to both.

mod generator;

/// What begins a note that is information, not a warning (zram-generator's info level): setup
/// says it, the generator does not.
pub const INFO: &str = "info: ";

mod setvar;
pub mod units;
mod zramswap;

use crate::common::output::shown;
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
    /// Why this device is not set up, though the others are (as zram-generator fails one
    /// device's unit): its writeback device does not exist.
    pub failed: Option<String>,
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
            failed: None,
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
            force: false,
            slot_free: crate::common::options::SlotFree::default(),
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

/// Why a device of `size_bytes` (set by `key`) would be refused at start on a machine of
/// `ram_bytes`: its slot table, all of it in RAM once the device is full, would not fit.
fn table_too_large(key: &str, size_bytes: u64, ram_bytes: u64) -> Option<String> {
    (uzram_engine::Device::full_table_bytes(size_bytes) > ram_bytes).then(|| {
        format!(
            "{key}: a device of {size_bytes} bytes needs a slot table larger than this machine's {} MiB of RAM when full",
            ram_bytes >> 20
        )
    })
}

/// Whether `name` is one of zram's algorithms (uzram maps each to one of its own).
fn known_algorithm(name: &str) -> bool {
    matches!(
        name,
        "lz4" | "zstd" | "lzo" | "lzo-rle" | "842" | "lz4hc" | "deflate"
    )
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

/// zram-generator's `compression-algorithm`: `lzo-rle zstd(level=3) (type=idle)`. As
/// zram-generator splits it: on blanks (a parameter list may not hold one), each token's
/// algorithm before its first `(`, the parameters after it with one `)` taken off the end.
fn apply_algorithms(plan: &mut DevicePlan, value: &str) {
    plan.algorithm = None;
    plan.params = None;
    plan.recomp.clear();
    plan.recompress = None;
    let mut prio = 0u8;
    let tokens = value.split_whitespace();
    for t in tokens {
        let (name, params) = match t.find('(') {
            Some(i) => {
                let inner = &t[i + 1..];
                let inner = inner.strip_suffix(')').unwrap_or_else(|| {
                    plan.warnings
                        .push(format!("{t:?} has no closing ): read as {t})"));
                    inner
                });
                if inner.contains(")(") {
                    plan.warnings.push(format!(
                        "{t}: one (...) per algorithm, its parameters separated by commas: \
                         {}({})",
                        &t[..i],
                        inner.replace(")(", ",")
                    ));
                }
                (&t[..i], Some(params_of(inner)))
            }
            None => (t, None),
        };
        // The place in the list is the priority: one given again would be said twice.
        let params = params.map(|p| {
            let (given, kept): (Vec<&str>, Vec<&str>) = p
                .split_whitespace()
                .partition(|w| w.starts_with("priority="));
            let listed = prio > 0 && !name.is_empty();
            if !given.is_empty() && listed {
                plan.warnings.push(format!(
                    "{t}: {} left out: an algorithm's place in the list is its priority ({prio})",
                    given.join(" ")
                ));
            }
            if listed {
                kept.join(" ")
            } else {
                p
            }
        });
        if name.is_empty() {
            // Global recompression parameters are a `recompress` request, which zram-generator's
            // setup leaves unwritten (a failed write would be a warning there): what uzram would
            // refuse of it is said, with the value, and the device is set up all the same.
            if let Some(Err(e)) = params
                .as_deref()
                .map(str::parse::<uzram_engine::RecompressRequest>)
            {
                // Parameters with no key of a request's are most likely an algorithm's, a blank
                // too many before them.
                let (why, hint) = match &e {
                    uzram_engine::Error::InvalidRequest { why, .. } => (
                        why.to_string(),
                        if why.starts_with("unknown key") || why.starts_with("expected") {
                            " (an algorithm's own parameters follow its name with no blank \
                             between, as in zstd(level=3))"
                        } else {
                            ""
                        },
                    ),
                    other => (other.to_string(), ""),
                };
                plan.warnings.push(format!(
                    "{t}: global recompression parameters, a recompress request uzram refuses: \
                     {why}{hint}"
                ));
            }
            plan.recompress = params;
            continue;
        }
        if prio > 0 && !known_algorithm(name) {
            // zram's recomp_algorithm refuses a name it does not know, and zram-generator's
            // setup goes on without it: no algorithm stands in for one nobody named.
            plan.warnings.push(format!(
                "unknown algorithm {name:?}: no recompression algorithm of priority {prio} \
                 (a list of algorithms is separated by blanks; parameters follow a name with \
                 no blank, as in zstd(level=3))"
            ));
            prio += 1;
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

/// What `setup` reads of the machine, under a root directory (`/`, or `--root DIR` as
/// zram-generator's `ZRAM_GENERATOR_ROOT`): MemTotal from `proc/meminfo` and the kernel command
/// line from `proc/cmdline`.
pub struct Host {
    /// The directory the configuration files and `proc/` are read under.
    pub root: PathBuf,
    /// MemTotal in KiB (`--ram-mib` overrides what `proc/meminfo` says).
    pub mem_total_kb: u64,
    /// `systemd.zram` on the kernel command line.
    pub kernel: Option<bool>,
}

impl Host {
    /// Reads `root`'s `proc/meminfo` (unless `ram_mib` is given) and `proc/cmdline`.
    pub fn read(root: &Path, ram_mib: Option<u64>) -> Result<Host, SetupError> {
        let mem_total_kb = match ram_mib {
            Some(r) if (1..=1u64 << 40).contains(&r) => r * 1024,
            Some(r) => {
                return Err(err(
                    "--ram-mib",
                    format!("{r}: MemTotal in MiB is a whole number from 1 to 2^40"),
                ))
            }
            None => {
                let path = root.join("proc/meminfo");
                let text = crate::common::read_text(&path, crate::common::MAX_CONFIG_BYTES)
                    .map_err(|e| {
                        err(
                            &shown(&path).to_string(),
                            format!("{e}: MemTotal cannot be read from it"),
                        )
                    })?;
                mem_total_kb(&text)
                    .filter(|&kb| (1024..=1u64 << 50).contains(&kb))
                    .ok_or_else(|| {
                        let said = match text
                            .lines()
                            .find_map(|l| l.trim_start().strip_prefix("MemTotal:"))
                        {
                            Some(value) => format!(
                                "MemTotal {:?} is not a number of kB from 1 MiB to 2^40 MiB",
                                value.trim()
                            ),
                            None => "no MemTotal line".to_string(),
                        };
                        err(&shown(&path).to_string(), said)
                    })?
            }
        };
        let cmdline = kernel_cmdline(root);
        Ok(Host {
            root: root.to_path_buf(),
            mem_total_kb,
            kernel: generator::kernel_option(&cmdline),
        })
    }

    /// MemTotal in whole MiB, as zram-generator's `ram`.
    pub fn ram_mib(&self) -> u64 {
        self.mem_total_kb / 1024
    }
}

/// `root`'s `proc/cmdline`, empty where it cannot be read whole: a kernel's command line is at
/// most a few KiB, and under `--root` it may be anything (a FIFO, a link to /dev/zero).
pub(super) fn kernel_cmdline(root: &Path) -> String {
    crate::common::read_text(&root.join("proc/cmdline"), 64 << 10).unwrap_or_default()
}

/// MemTotal in KiB: the first line whose first field is `MemTotal:` (as zram-generator).
fn mem_total_kb(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == "MemTotal:").then(|| f.next()?.parse().ok())?
    })
}

/// Whether zram-generator is installed under `root` and not masked (a link to /dev/null in
/// /etc/systemd/system-generators or /run/systemd/system-generators): then it acts on the same
/// zram-generator.conf (as kernel zram), and uzram must not silently do so too.
pub fn zram_generator_installed(root: &Path) -> bool {
    let masked = [
        "etc/systemd/system-generators/zram-generator",
        "run/systemd/system-generators/zram-generator",
    ]
    .iter()
    .any(|p| std::fs::read_link(root.join(p)).is_ok_and(|t| t == Path::new("/dev/null")));
    !masked
        && [
            "usr/lib/systemd/system-generators/zram-generator",
            "lib/systemd/system-generators/zram-generator",
        ]
        .iter()
        .any(|p| root.join(p).exists())
}

/// Whether a `--config` file is zramswap's rather than zram-generator's: its name says so, or it
/// has no section and sets one of zramswap's keys.
fn is_zramswap(path: &Path, text: &str) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().contains("zramswap"))
        || (!text.contains('[')
            && text.lines().any(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("export ").unwrap_or(l);
                ["ALGO=", "PERCENT=", "SIZE=", "PRIORITY="]
                    .iter()
                    .any(|k| l.starts_with(k))
            }))
}

/// A plan, with what the user should be told about it.
pub struct Loaded {
    /// The devices.
    pub plan: Vec<DevicePlan>,
    /// Warnings about the files as a whole (ignored sections, `set!` commands that failed),
    /// and information (beginning with [`INFO`]: a section that makes no device).
    pub notes: Vec<String>,
    /// The plan is the system's zram-generator configuration, which zram-generator itself acts
    /// on too.
    pub system_generator_files: bool,
}

/// zram-generator's files under the host's root, when the plan comes from them (as
/// zram-generator: some are there, or `systemd.zram=1` asks for its defaults); else `None`
/// (`/etc/default/zramswap`'s turn).
pub fn generator_files(host: &Host) -> Option<Vec<std::path::PathBuf>> {
    let files = generator::files(&host.root);
    (!files.is_empty() || host.kernel == Some(true)).then_some(files)
}

/// Where a plan comes from: `--config FILE`; else, as zram-generator, the kernel command line
/// (`systemd.zram=0`: nothing) and zram-generator's files under the host's root; else its
/// `etc/default/zramswap`.
pub fn load_plan(config: Option<&Path>, host: &Host) -> Result<Loaded, SetupError> {
    let read = |p: &Path| {
        crate::common::read_text(p, crate::common::MAX_CONFIG_BYTES)
            .map_err(|e| err(&shown(p).to_string(), e.to_string()))
    };
    if let Some(path) = config {
        let text = read(path)?;
        let name = shown(path).to_string();
        let (plan, notes) = if is_zramswap(path, &text) {
            (zramswap::plan(&name, &text, host.mem_total_kb)?, Vec::new())
        } else {
            generator::plan(&[(name, text)], host.ram_mib(), None)?
        };
        return Ok(Loaded {
            plan,
            notes,
            system_generator_files: false,
        });
    }
    if host.kernel == Some(false) {
        return Ok(Loaded {
            plan: Vec::new(),
            notes: vec![
                "systemd.zram=0 on the kernel command line: no devices (zram-generator's rule)"
                    .into(),
            ],
            system_generator_files: false,
        });
    }
    if let Some(files) = generator_files(host) {
        let texts = files
            .iter()
            .map(|p| Ok((shown(p).to_string(), read(p)?)))
            .collect::<Result<Vec<_>, SetupError>>()?;
        let (plan, mut notes) = generator::plan(&texts, host.ram_mib(), host.kernel)?;
        if zram_generator_installed(&host.root) {
            notes.push(
                "zram-generator is installed and sets up these same sections as kernel zram devices: \
                 mask it (ln -s /dev/null /etc/systemd/system-generators/zram-generator) or remove \
                 the package before `uzram setup` acts on zram-generator.conf"
                    .to_string(),
            );
        }
        return Ok(Loaded {
            plan,
            notes,
            system_generator_files: true,
        });
    }
    let zramswap = host.root.join("etc/default/zramswap");
    if zramswap.exists() {
        let name = shown(&zramswap).to_string();
        return Ok(Loaded {
            plan: zramswap::plan(&name, &read(&zramswap)?, host.mem_total_kb)?,
            notes: Vec::new(),
            system_generator_files: false,
        });
    }
    Err(err(
        "configuration",
        "none found: no zram-generator.conf (/etc/systemd, /run/systemd, /usr/local/lib/systemd, /usr/lib/systemd) and no /etc/default/zramswap; give --config FILE",
    ))
}

#[cfg(test)]
mod tests;
