//! A device's options, defined once: `uzram --find`, `uzram serve`, `uzram bench` and `uzram
//! setup` all take [`DeviceArgs`], and [`DeviceArgs::setup`] is the one place they are checked
//! and applied, so what `--find` accepts before it starts a daemon is exactly what the daemon
//! accepts.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::common::output::shown;
use uzram_engine::device::writeback::MAX_FILES;
use uzram_engine::{parse_size, DeviceSetup, Error};

/// Why a device's options were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// The engine refused a value (it names it).
    #[error(transparent)]
    Engine(#[from] Error),
    /// An option's value the engine refused.
    #[error("{option}: {source}")]
    Option {
        /// The option.
        option: &'static str,
        /// Why.
        #[source]
        source: Error,
    },
    /// `--size 0` (as given).
    #[error("--size {0} is 0 pages: a device needs at least one page (4096 bytes)")]
    ZeroSize(String),
    /// More backing devices than a device stripes over.
    #[error("at most {max} backing devices, not {given}")]
    TooManyBackingDevs {
        /// How many were given.
        given: usize,
        /// The most a device takes.
        max: usize,
    },
    /// `--streams 0` (`--queues 0` for `uzram serve`).
    #[error("--streams (uzram serve: --queues) must be at least 1")]
    NoStreams,
    /// More streams (queues) than ublk gives a device.
    #[error("--streams {0} is more than ublk's {MAX_QUEUES} queues a device")]
    TooManyStreams(u16),
    /// Two `--recomp-algorithm`s of one priority (the second would replace the first).
    #[error(
        "--recomp-algorithm '{second}': priority {priority} is '{first}' already (give each its own priority=1..3)"
    )]
    RecompTwice {
        /// The priority both name (1 when not given).
        priority: String,
        /// The first.
        first: String,
        /// The second.
        second: String,
    },
    /// A parameter named twice in one option's value (the engine, as zram, keeps the last).
    #[error("{option} {value:?}: {key}= given twice: which one is meant?")]
    ParamTwice {
        /// The option.
        option: &'static str,
        /// The key.
        key: String,
        /// The option's value.
        value: String,
    },
    /// `uzram serve --reserve-min` above `--reserve` (the least above the most).
    #[error(
        "--reserve-min {min} is more than --reserve {reserve} (the reserve's least above its most)"
    )]
    ReserveMinAboveReserve {
        /// --reserve-min as given.
        min: String,
        /// --reserve as given.
        reserve: String,
    },
    /// One backing file or device named twice.
    #[error("--backing-dev {0}: named twice (a device stripes over distinct files)")]
    BackingTwice(String),
}

/// A size option's value; an error names the option.
pub fn parse_size_option(option: &'static str, text: &str) -> Result<u64, OptionsError> {
    parse_size(text).map_err(|source| OptionsError::Option { option, source })
}

impl OptionsError {
    /// The message without an option's name, for values that came from a configuration file,
    /// whose keys are not the options.
    pub fn without_option(&self) -> String {
        match self {
            OptionsError::Option { source, .. } => source.to_string(),
            e => e.to_string(),
        }
    }
}

/// The priority a `--recomp-algorithm` spec names, as the engine parses it (`priority=N`; 1
/// when it names none or is a bare name). A spec that does not parse has none here: the
/// engine names what is wrong with it.
fn recomp_priority(spec: &str) -> Option<u8> {
    if !spec.contains('=') {
        return Some(1);
    }
    let p: uzram_codecs::AlgorithmParams = spec.parse().ok()?;
    Some(p.priority.unwrap_or(1))
}

/// What tells two backing paths apart: a block device's number (two nodes of one disk are
/// one), a file's device and inode, else its absolute path (a file to be made).
fn backing_identity(path: &std::path::Path) -> (u64, u64, PathBuf) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => (u64::MAX, m.rdev(), PathBuf::new()),
        Ok(m) => (m.dev(), m.ino(), PathBuf::new()),
        Err(_) => (
            0,
            0,
            std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        ),
    }
}

/// ublk's most queues per device (`UBLK_MAX_NR_QUEUES`).
pub const MAX_QUEUES: u16 = 4096;

/// A value parser for a whole number option in `min..=max` (clap's own says "number too large to
/// fit in target type" past the type's range, and "unexpected argument" for a negative one):
/// any number out of range, however large or negative, is "N is not in MIN..=MAX".
pub fn whole_in<T>(
    min: i128,
    max: i128,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128> + Clone + Send + Sync + 'static,
{
    move |text: &str| {
        let t = text.trim();
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{text:?} is not a whole number"));
        }
        // Past i128, a number is out of any range here: its sign says which side.
        let n = t.parse::<i128>().unwrap_or(if t.starts_with('-') {
            i128::MIN
        } else {
            i128::MAX
        });
        match T::try_from(n) {
            Ok(v) if (min..=max).contains(&n) => Ok(v),
            _ => Err(format!("{t} is not in {min}..={max}")),
        }
    }
}

/// Checks a new device's size, options and stream (queue) count, and returns the engine's setup
/// with its disksize: the one validation path of `uzram --find`, `uzram serve` and `uzram setup`.
pub fn check(
    size: &str,
    device: &DeviceArgs,
    streams: Option<u16>,
) -> Result<(DeviceSetup, u64), OptionsError> {
    let (setup, disksize) = check_held(size, device, streams)?;
    setup.check_backing()?;
    Ok((setup, disksize))
}

/// [`check`] for a device that exists already, held by a supervisor (its worker, a standby, an
/// upgrade's check): its backing files are not checked here, since the worker serving the
/// device holds them (their lock refuses another device); the store's own opening checks them
/// when the device is taken over.
pub fn check_held(
    size: &str,
    device: &DeviceArgs,
    streams: Option<u16>,
) -> Result<(DeviceSetup, u64), OptionsError> {
    let disksize = parse_size_option("--size", size)?;
    if disksize == 0 {
        return Err(OptionsError::ZeroSize(size.to_string()));
    }
    if device.backing_dev.len() > MAX_FILES {
        return Err(OptionsError::TooManyBackingDevs {
            given: device.backing_dev.len(),
            max: MAX_FILES,
        });
    }
    match streams {
        Some(0) => return Err(OptionsError::NoStreams),
        Some(n) if n > MAX_QUEUES => return Err(OptionsError::TooManyStreams(n)),
        _ => {}
    }
    let setup = device.setup()?;
    Ok((setup, disksize))
}

/// What a device is made of, with zram's names (its size and id aside).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct DeviceArgs {
    /// Compression algorithm, by zram's name (comp_algorithm; default lz4)
    #[arg(short = 'a', long, value_name = "ALGORITHM")]
    pub algorithm: Option<String>,
    /// zram's algorithm_params, e.g. "level=3", "dict=/path/to/dict", or for a secondary
    /// algorithm "priority=1 level=9"
    #[arg(short = 'p', long, value_name = "PARAMS")]
    pub algorithm_params: Option<String>,
    /// zram's recomp_algorithm: a secondary algorithm for recompression, e.g.
    /// "algo=zstd priority=1" or just "zstd" (priority 1); repeat with "algo=lz4 priority=2"
    /// and priority=3 for more
    #[arg(long, value_name = "SPEC")]
    pub recomp_algorithm: Vec<String>,
    /// zram's backing_dev: a file (created 0600, sized to the device if empty) or a block device
    /// that writeback and eviction move pages to, compressed and encrypted; repeat to stripe
    /// over several (e.g. on two disks)
    #[arg(long, value_name = "FILE")]
    pub backing_dev: Vec<PathBuf>,
    /// Let --backing-dev overwrite a file or partition that holds data uzram did not write (a
    /// filesystem, a swap area, a partition table); without it such a backing device is refused
    #[arg(long)]
    pub force: bool,
    /// The tiering policy, uzram's `policy` attribute: "key=value ..." of recompress_after,
    /// writeback_after, high_watermark, low_watermark, min_free, psi, pool_share, share_floor,
    /// budget, evict, spill, reuse, promote
    #[arg(long, value_name = "SETTINGS")]
    pub policy: Option<String>,
    /// zram's mem_limit (0 = none)
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true)]
    pub mem_limit: Option<String>,
    /// How the device learns that swap freed a slot: "probe", an eBPF probe on the kernel's
    /// swap-slot free path (what zram's swap_slot_free_notify gets), where the kernel allows it
    /// and discards alone otherwise; or "discard", only what swap discards (swapon
    /// --discard=pages: whole free clusters)
    #[arg(long, value_name = "HOW", value_enum, default_value_t = SlotFree::Probe)]
    pub slot_free: SlotFree,
}

/// `--slot-free`: how a device learns of swap's freed slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SlotFree {
    /// The eBPF probe where the kernel allows it, else discards.
    #[default]
    Probe,
    /// Discards only.
    Discard,
}

impl DeviceArgs {
    /// What a new device's options may not hold, beyond what [`DeviceArgs::setup`] takes: two
    /// `--recomp-algorithm`s of one priority (the second would replace the first) and one
    /// backing file named twice. Only where a device is made: a successor or standby runs with
    /// the options its device was made with, perhaps by an older binary that took them, and
    /// must not refuse them now.
    pub fn check_new(&self) -> Result<(), OptionsError> {
        // (The engine keeps the last of a key given twice, as zram does, and so does a device
        // an older binary made with such options: refused only here.)
        let params = self
            .algorithm_params
            .iter()
            .map(|p| ("--algorithm-params", p))
            .chain(
                self.recomp_algorithm
                    .iter()
                    .map(|r| ("--recomp-algorithm", r)),
            )
            .chain(self.policy.iter().map(|p| ("--policy", p)));
        for (option, value) in params {
            // A malformed value is the engine's to name, in `setup`. The policy's settings are
            // blank-separated key=value words too.
            let keys = match option {
                "--policy" => value
                    .split_whitespace()
                    .filter_map(|w| w.split_once('='))
                    .map(|(k, _)| k)
                    .collect(),
                _ => uzram_codecs::param_keys(value).unwrap_or_default(),
            };
            let twice = (1..keys.len()).find(|&i| keys[..i].contains(&keys[i]));
            if let Some(key) = twice.map(|i| keys[i]) {
                return Err(OptionsError::ParamTwice {
                    option,
                    key: key.to_string(),
                    value: value.clone(),
                });
            }
        }
        for (i, r) in self.recomp_algorithm.iter().enumerate() {
            let Some(priority) = recomp_priority(r) else {
                continue;
            };
            if let Some(first) = self.recomp_algorithm[..i]
                .iter()
                .find(|f| recomp_priority(f) == Some(priority))
            {
                return Err(OptionsError::RecompTwice {
                    priority: priority.to_string(),
                    first: first.clone(),
                    second: r.clone(),
                });
            }
        }
        for (i, b) in self.backing_dev.iter().enumerate() {
            let id = backing_identity(b);
            if self.backing_dev[..i]
                .iter()
                .any(|a| backing_identity(a) == id)
            {
                return Err(OptionsError::BackingTwice(shown(b).to_string()));
            }
        }
        Ok(())
    }

    /// The engine's setup for these options, as writing zram's attributes in this order would:
    /// the algorithm, the secondary algorithms (`algorithm_params` may name one by priority),
    /// the parameters, the backing devices, the policy, `mem_limit`. Every check the engine
    /// makes before `disksize` is made here.
    pub fn setup(&self) -> Result<DeviceSetup, OptionsError> {
        let mut setup = DeviceSetup::new();
        if let Some(a) = &self.algorithm {
            setup.set_comp_algorithm(a)?;
        }
        for r in &self.recomp_algorithm {
            setup
                .set_recomp_algorithm(r)
                .map_err(|source| OptionsError::Option {
                    option: "--recomp-algorithm",
                    source,
                })?;
        }
        if let Some(p) = &self.algorithm_params {
            setup.set_algorithm_params(p)?;
        }
        for b in &self.backing_dev {
            setup.add_backing_dev(b);
        }
        setup.set_backing_force(self.force);
        if let Some(p) = &self.policy {
            setup.set_policy(p).map_err(|source| OptionsError::Option {
                option: "--policy",
                source,
            })?;
        }
        if let Some(l) = &self.mem_limit {
            let limit = parse_size_option("--mem-limit", l)?;
            setup.set_mem_limit(Some(limit));
        }
        Ok(setup)
    }

    /// The same options as command-line arguments, for starting a daemon with them (`uzram
    /// serve` parses them back into an equal `DeviceArgs`). Backing devices are made absolute:
    /// the daemon runs with `/` as its directory.
    pub fn to_args(&self) -> std::io::Result<Vec<OsString>> {
        let mut out: Vec<OsString> = Vec::new();
        let mut opt = |name: &str, value: &str| out.extend([name.into(), value.into()]);
        if let Some(a) = &self.algorithm {
            opt("--algorithm", a);
        }
        if let Some(p) = &self.algorithm_params {
            opt("--algorithm-params", p);
        }
        for r in &self.recomp_algorithm {
            opt("--recomp-algorithm", r);
        }
        if let Some(p) = &self.policy {
            opt("--policy", p);
        }
        if let Some(l) = &self.mem_limit {
            opt("--mem-limit", l);
        }
        if self.slot_free == SlotFree::Discard {
            opt("--slot-free", "discard");
        }
        if self.force {
            out.push("--force".into());
        }
        for b in &self.backing_dev {
            let b = std::path::absolute(b)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", shown(b))))?;
            out.extend(["--backing-dev".into(), b.into_os_string()]);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    #[test]
    fn a_whole_number_out_of_range_names_the_range_however_large() {
        let queues = whole_in::<u16>(1, 4096);
        assert_eq!(queues("4096"), Ok(4096));
        assert_eq!(queues("+1"), Ok(1));
        for bad in [
            "0",
            "4097",
            "65536",
            "99999999999999999999",
            "-1",
            "-99999999999999999999999999999999999999999",
        ] {
            assert_eq!(
                queues(bad),
                Err(format!("{bad} is not in 1..=4096")),
                "{bad}"
            );
        }
        for bad in ["", "x", "1.5", "1e3", "--", "0x10"] {
            assert_eq!(
                queues(bad),
                Err(format!("{bad:?} is not a whole number")),
                "{bad}"
            );
        }
        let id = whole_in::<i32>(-1, 1 << 20);
        assert_eq!(id("-1"), Ok(-1));
        assert!(id("-2").is_err());
        let mib = whole_in::<u64>(0, u64::MAX.into());
        assert_eq!(mib("18446744073709551615"), Ok(u64::MAX));
        assert!(mib("18446744073709551616").is_err());
    }

    /// A device its supervisor holds (a worker, a standby, an upgrade's check) is not refused
    /// for the lock its serving worker holds on its backing file; a new device is.
    #[test]
    fn only_a_new_device_is_refused_a_backing_file_another_holds() {
        let path = std::env::temp_dir().join(format!("uzram-held-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let device = DeviceArgs {
            backing_dev: vec![path.clone()],
            ..DeviceArgs::default()
        };
        // A device serving with it: its backing store holds the file's lock.
        let (setup, disksize) = check("16M", &device, None).unwrap();
        let holder = setup.init(disksize).unwrap();
        let new = check("1G", &device, None).unwrap_err().to_string();
        assert!(new.contains("another uzram device"), "{new}");
        assert!(check_held("1G", &device, None).is_ok());
        drop(holder);
        assert!(check("1G", &device, None).is_ok());
        let _ = std::fs::remove_file(&path);
    }

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        device: DeviceArgs,
    }

    #[test]
    fn params_may_name_a_secondary_algorithm_given_in_the_same_command() {
        let args = DeviceArgs {
            recomp_algorithm: vec!["zstd".into()],
            algorithm_params: Some("priority=1 level=9".into()),
            ..DeviceArgs::default()
        };
        args.setup()
            .expect("accepted, as zram takes the attributes in this order");
        let no_secondary = DeviceArgs {
            recomp_algorithm: vec![],
            ..args
        };
        let e = no_secondary.setup().unwrap_err().to_string();
        assert!(e.contains("priority 1"), "{e}");
    }

    #[test]
    fn options_survive_the_trip_to_the_daemons_command_line() {
        let args = DeviceArgs {
            algorithm: Some("zstd".into()),
            algorithm_params: Some("level=3".into()),
            recomp_algorithm: vec!["algo=lz4 priority=1".into(), "zstd".into()],
            backing_dev: vec!["/tmp/a".into(), "/tmp/b".into()],
            force: true,
            policy: Some("evict=on".into()),
            mem_limit: Some("1G".into()),
            slot_free: SlotFree::Discard,
        };
        let argv = std::iter::once(OsString::from("x")).chain(args.to_args().unwrap());
        assert_eq!(Cmd::parse_from(argv).device, args);
        let bare =
            std::iter::once(OsString::from("x")).chain(DeviceArgs::default().to_args().unwrap());
        assert_eq!(Cmd::parse_from(bare).device, DeviceArgs::default());
    }

    #[test]
    fn a_bad_value_is_named() {
        for (args, bad) in [
            (
                DeviceArgs {
                    algorithm: Some("lzo-rle-x".into()),
                    ..DeviceArgs::default()
                },
                "lzo-rle-x",
            ),
            (
                DeviceArgs {
                    mem_limit: Some("lots".into()),
                    ..DeviceArgs::default()
                },
                "lots",
            ),
            (
                DeviceArgs {
                    policy: Some("evict=maybe".into()),
                    ..DeviceArgs::default()
                },
                "maybe",
            ),
        ] {
            let e = args.setup().unwrap_err().to_string();
            assert!(e.contains(bad), "{e} should name {bad}");
        }
    }
}
