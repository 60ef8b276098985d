//! The `uzram` command line: zramctl's options and listing ([`zramctl`]), the attribute client
//! (`uzram attr`), the zram-generator / zramswap setup, and the subcommands' arguments.

pub mod ctl;
pub mod listing;
pub mod metrics;
pub mod setup;
mod size;
pub mod sleep;
mod upgrade;

use clap::{Args, Parser, Subcommand};

use self::ctl::{CreateArgs, CtlError};
use crate::common::block_path;
use crate::common::options::DeviceArgs;
use crate::common::output::{out, outln, shown, warn};

const ABOUT: &str =
    "Set up and control uzram devices: compressed RAM block devices served from userspace through \
the kernel's ublk driver, driven like zramctl drives zram.";

const AFTER_HELP: &str = "\
Without arguments, uzram lists its devices (zramctl's columns).

Examples:
  uzram --find --size 4G --algorithm zstd      create a device; prints /dev/ublkbN once it serves
  mkswap $(uzram -f -s 8G) && swapon ...       a swap device in one line
  uzram --size 2G /dev/ublkb3                  create it as /dev/ublkb3
  uzram                                        list devices (NAME ALGORITHM DISKSIZE DATA COMPR TOTAL STREAMS MOUNTPOINT)
  uzram --output-all --bytes                   every column, sizes in bytes
  uzram attr /dev/ublkb0 mm_stat               zram's attributes, byte for byte (reads open to all users)
  uzram attr /dev/ublkb0 mem_limit 2G          changes need root
  uzram -f -s 4G --recomp-algorithm algo=zstd  then: uzram attr DEV idle all; uzram attr DEV recompress type=idle
  uzram --reset /dev/ublkb0                    stop and delete (refused while swap or mounted)

ublk devices exist only once created (unlike hot-added zram devices): a device name given with
--size is the id to create. Each device is served by a daemon (`uzram serve`, detached, logging to
syslog or --log FILE) that holds its memory locked and is safe to hold swap.

Exit status: 0 on success, 1 on failure.";

#[derive(Parser)]
#[command(
    name = "uzram",
    version,
    about = ABOUT,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// A subcommand; none: zramctl's options.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// zramctl's options.
    #[command(flatten)]
    pub ctl: CtlArgs,
}

/// zramctl's options.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Device(s): /dev/ublkbN (to create with --size, to reset, or to show)
    #[arg(value_name = "DEVICE")]
    devices: Vec<String>,
    /// Create a device with the first free id (with --size); alone, print the name the next
    /// device gets, as zramctl -f does
    #[arg(short = 'f', long)]
    find: bool,
    /// Device size, as zramctl takes it: 4G or 4GiB (powers of 1024), 4GB (of 1000), 1.5G, bytes
    #[arg(short = 's', long, value_name = "SIZE", allow_hyphen_values = true)]
    size: Option<String>,
    /// What a new device is made of
    #[command(flatten)]
    device: DeviceArgs,
    /// Number of compression streams (the daemon's I/O queues; default 2, 1 on a one-CPU machine)
    #[arg(short = 't', long, value_name = "NUMBER", value_parser = crate::common::options::whole_in::<u16>(1, crate::common::options::MAX_QUEUES.into()), allow_negative_numbers = true)]
    streams: Option<u16>,
    /// The new device's daemon appends its messages here (default: syslog)
    #[arg(long, value_name = "FILE")]
    log: Option<std::path::PathBuf>,
    /// Reset (stop and delete) the given devices
    #[arg(short = 'r', long)]
    reset: bool,
    /// Columns to list (comma-separated; see --list-columns)
    #[arg(short = 'o', long, value_name = "LIST", value_delimiter = ',')]
    output: Vec<String>,
    /// List every column
    #[arg(long)]
    output_all: bool,
    /// Print sizes in bytes rather than in human-readable form
    #[arg(short = 'b', long)]
    bytes: bool,
    /// Do not print headings
    #[arg(short = 'n', long)]
    noheadings: bool,
    /// Raw output: columns separated by one space
    #[arg(long)]
    raw: bool,
    /// The listing as JSON (`{"devices": [{"name": ..., ...}]}`, a key per column, lower case;
    /// with --bytes the sizes are numbers)
    #[arg(short = 'J', long, conflicts_with_all = ["raw", "list_columns"])]
    json: bool,
    /// Print the available columns and what they show
    #[arg(long)]
    list_columns: bool,
}

#[derive(Subcommand)]
pub enum Command {
    /// Read or write a zram attribute of a device: mm_stat, io_stat, debug_stat, comp_algorithm,
    /// recomp_algorithm, disksize, initstate, max_comp_streams, mem_limit, mem_used_max, idle,
    /// recompress, backing_dev, writeback, writeback_limit, writeback_limit_enable, bd_stat,
    /// compact, reset, and uzram's own uzram_stat, policy (the tiering settings) and
    /// policy_stat (what the policy did). A read prints the attribute's exact
    /// bytes.
    Attr {
        /// The device, /dev/ublkbN
        device: String,
        /// The attribute
        name: String,
        /// The value to write (omit to read)
        #[arg(allow_negative_numbers = true)]
        value: Option<String>,
    },
    /// Set up the devices that zram-generator.conf (and its .conf.d drop-ins) or
    /// /etc/default/zramswap describe, as uzram devices ([zramN] is /dev/ublkbN): create, mkswap,
    /// swapon with the priority and options (or mkfs and mount); what is done already is skipped.
    /// With --dry-run, print the plan (one `key=value` line per device) and change nothing
    Setup {
        /// Print the plan and change nothing
        #[arg(long)]
        dry_run: bool,
        /// The configuration file (zram-generator.conf syntax, or zramswap's when its name says
        /// so or it has ALGO=/PERCENT=/SIZE=/PRIORITY= lines)
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
        /// MemTotal to plan for, in MiB (default: this machine's)
        #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_ram_mib)]
        ram_mib: Option<u64>,
        /// Read the configuration files, proc/meminfo and proc/cmdline under DIR instead of /
        /// (as zram-generator's ZRAM_GENERATOR_ROOT); with --dry-run, to plan another system
        #[arg(long, value_name = "DIR")]
        root: Option<std::path::PathBuf>,
    },
    /// Make swap (FS: swap) or a file system (mkfs.FS) on a uzram device only if nothing was ever
    /// written to it (it reads as zeros: nothing is lost); a device written before, say one a new
    /// supervisor took over with its pages, is left as it is. The generator's units run it after
    /// the device's service starts
    Prepare {
        /// The device, /dev/ublkbN
        device: String,
        /// swap, or a file system type (ext4, xfs, btrfs, ...)
        fs: String,
    },
    /// Every figure of each device's mm_stat, io_stat, bd_stat, policy_stat and uzram_stat, in
    /// Prometheus' text format (for node_exporter's textfile collector; uzram-metrics.timer
    /// writes it every 30 s once enabled) or as JSON
    Metrics {
        /// prometheus or json
        #[arg(long, value_enum, default_value_t = metrics::Format::Prometheus)]
        format: metrics::Format,
        /// Replace FILE with them (written beside it and renamed; a new file readable by all,
        /// as the textfile collector wants, a replaced one keeping its mode) instead of
        /// printing them ("-": print them)
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<std::path::PathBuf>,
    },
    /// Internal: the systemd generator (installed as
    /// /usr/lib/systemd/system-generators/uzram-generator): write the units of the devices
    /// zram-generator.conf or /etc/default/zramswap describe into the first directory
    #[command(hide = true)]
    Generator {
        /// The generator's directories, as systemd gives them (normal, early, late)
        #[arg(required = true, num_args = 1..=3)]
        dirs: Vec<std::path::PathBuf>,
    },
    /// Hand a device over to the uzram binary now installed (after a package upgrade): the
    /// daemon's supervisor asks the new binary whether it can take the device over, and only then
    /// stops the running worker; the new one adopts every page, and requests in flight are
    /// reissued (none fails). Waits until the new worker serves.
    Upgrade {
        /// The device, /dev/ublkbN
        device: String,
    },
    /// What a system sleep needs of swap on uzram, run by uzram's sleep units around systemd's
    /// (contrib/systemd/uzram-suspend.service, uzram-hibernate.service). pre suspend: freeze
    /// (cgroup freezer) the cgroups of processes holding swap, so none waits on a daemon the
    /// kernel freezes. pre hibernate
    /// (hybrid-sleep, suspend-then-hibernate): swapoff every uzram swap device, or refuse
    /// (exit 1, so the unit fails and systemd does not hibernate) when RAM and other swap cannot
    /// take its pages back. post: undo what pre did
    Sleep {
        /// pre or post (as systemd-sleep names them)
        #[arg(value_enum)]
        phase: sleep::Phase,
        /// suspend, hibernate, hybrid-sleep or suspend-then-hibernate
        action: String,
    },
    /// Undo `uzram setup` for the same configuration: swapoff or umount, then reset each device
    Teardown {
        /// The configuration file (as for setup)
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
    },
    /// Measure the engine against the raw codec on realistic pages: write and read rates at 1 and
    /// N threads, and the memory it takes (mm_stat). Without --corpus or --pid it uses the
    /// checked-in sample, so it runs on any machine.
    Bench(crate::tools::bench::BenchArgs),
    /// Write a process's private anonymous memory to a file of 4 KiB pages (needs root or ptrace
    /// access), for benchmarks and ratio tests on realistic pages.
    DumpPages(crate::tools::pagedump::DumpPagesArgs),
    /// Create /dev/ublkbN backed by the engine and serve it in the foreground until SIGTERM or
    /// SIGINT (prints the device path once it serves I/O); `uzram --find` runs this detached
    #[cfg(feature = "ublk")]
    Serve(crate::daemon::ServeArgs),
}

/// Runs what the command line asks for.
pub fn run(cli: Cli) -> Outcome {
    match cli.command {
        None => zramctl(cli.ctl),
        Some(Command::Attr {
            device,
            name,
            value,
        }) => ctl::parse_device(&device)
            .and_then(|id| ctl::attr(id, &name, value.as_deref()))
            .map_err(Box::<dyn std::error::Error>::from)
            .and_then(|text| Ok(out(&text)?)),
        Some(Command::Setup {
            dry_run,
            config,
            ram_mib,
            root,
        }) => setup(dry_run, config.as_deref(), ram_mib, root.as_deref()),
        Some(Command::Teardown { config }) => teardown(config.as_deref()),
        Some(Command::Prepare { device, fs }) => {
            outln(setup::units::prepare(&device, &fs)?)?;
            Ok(())
        }
        Some(Command::Generator { dirs }) => generator(&dirs[0]),
        Some(Command::Metrics { format, output }) => {
            metrics::write(format, output.as_deref()).map_err(Into::into)
        }
        Some(Command::Sleep { phase, action }) => {
            let said = sleep::run(phase, &action)?;
            for line in said {
                outln(format!("uzram sleep: {line}"))?;
            }
            Ok(())
        }
        Some(Command::Upgrade { device }) => ctl::parse_device(&device)
            .and_then(upgrade::upgrade)
            .map_err(Box::<dyn std::error::Error>::from)
            .and_then(|text| Ok(outln(&text)?)),
        Some(Command::Bench(args)) => {
            let r = crate::tools::bench::run(&args)?;
            if args.json {
                outln(r.to_json())?;
            } else {
                out(&r.to_table())?;
            }
            Ok(())
        }
        Some(Command::DumpPages(args)) => crate::tools::pagedump::run(&args).map_err(Into::into),
        #[cfg(feature = "ublk")]
        Some(Command::Serve(args)) => crate::daemon::serve(&args).map_err(Into::into),
    }
}

pub type Outcome = Result<(), Box<dyn std::error::Error>>;

/// Whether none of a new device's options (what it is made of, its streams, its log) is given.
fn alone_args(a: &CtlArgs) -> bool {
    a.device == DeviceArgs::default() && a.streams.is_none() && a.log.is_none()
}

/// A `--size` in zramctl's syntax, in bytes for the daemon; one that rounds to nothing is
/// named as given.
fn size_bytes(size: &str) -> Result<u64, CtlError> {
    let bytes = size::strtosize(size).map_err(CtlError)?;
    if bytes == 0 {
        return Err(CtlError(format!(
            "--size {size} is 0 bytes: a device needs at least one page (4096 bytes)"
        )));
    }
    Ok(bytes)
}

pub fn zramctl(a: CtlArgs) -> Outcome {
    if a.list_columns {
        let text: String = listing::COLUMNS
            .iter()
            .map(|c| format!("{:>11}  {}\n", c.name, c.help))
            .collect();
        out(&text)?;
        return Ok(());
    }
    let ids = a
        .devices
        .iter()
        .map(|d| ctl::parse_device(d))
        .collect::<Result<Vec<u32>, CtlError>>()?;
    if a.reset {
        if a.size.is_some() || a.find || !alone_args(&a) {
            return Err(CtlError(
                "--reset deletes devices: --size, --find and a new device's options do not go with it".into(),
            )
            .into());
        }
        if ids.is_empty() {
            return Err(CtlError("--reset needs the device(s) to reset".into()).into());
        }
        // Each failure said once: all but the last here, the last as the command's error.
        let mut failed: Option<CtlError> = None;
        for id in ids {
            if let Err(e) = ctl::reset(id) {
                if let Some(earlier) = failed.replace(e) {
                    warn(format_args!("uzram: {earlier}"));
                }
            }
        }
        return failed.map_or(Ok(()), |e| Err(e.into()));
    }
    let alone = alone_args(&a);
    if a.find && a.size.is_none() && ids.is_empty() && alone {
        // zramctl's `-f` alone: the name the next device would get.
        return Ok(outln(block_path(ctl::first_free_id()?))?);
    }
    if a.find || a.size.is_some() {
        let Some(size) = a.size else {
            return Err(CtlError(
                "--find with a device's options needs --size: a ublk device exists only once it is created with a size"
                    .into(),
            )
            .into());
        };
        if ids.len() > 1 || (a.find && !ids.is_empty()) {
            return Err(CtlError("give either --find or one device name to create".into()).into());
        }
        let path = ctl::create(&CreateArgs {
            size: size_bytes(&size)?.to_string(),
            device: a.device,
            streams: a.streams,
            id: ids.first().copied(),
            log: a.log,
        })?;
        outln(path)?;
        return Ok(());
    }
    if !alone {
        return Err(CtlError(
            "--algorithm, --algorithm-params, --recomp-algorithm, --backing-dev, --force, --policy, --streams, --mem-limit and --log apply to a new device: add --size (and --find or a device name)"
                .into(),
        )
        .into());
    }
    let mut rows = ctl::devices();
    if !ids.is_empty() {
        for id in &ids {
            if !rows.iter().any(|r| r.name == block_path(*id)) {
                return Err(CtlError(format!("{}: no such device", block_path(*id))).into());
            }
        }
        rows.retain(|r| ids.iter().any(|id| r.name == block_path(*id)));
    }
    for r in rows.iter().filter(|r| !r.live) {
        match &r.trouble {
            Some(why) => warn(format_args!("uzram: {}: {why}", r.name)),
            None => warn(format_args!(
                "uzram: {}: its daemon is dead (killed?); I/O to it fails; uzram --reset {} removes it",
                r.name, r.name
            )),
        }
    }
    let format = listing::Format {
        bytes: a.bytes,
        raw: a.raw,
        noheadings: a.noheadings,
        json: a.json,
    };
    // Rendered (and so the columns checked) even with no device to show.
    let table = ctl::render(&rows, &a.output, a.output_all, format)?;
    if !rows.is_empty() || !ids.is_empty() || a.json {
        out(&table)?;
    }
    Ok(())
}

fn plan(
    config: Option<&std::path::Path>,
    ram_mib: Option<u64>,
    root: Option<&std::path::Path>,
) -> Result<setup::Loaded, Box<dyn std::error::Error>> {
    let host = setup::Host::read(root.unwrap_or(std::path::Path::new("/")), ram_mib).map_err(
        |mut e| {
            if ram_mib.is_none() {
                e.message.push_str(" (give --ram-mib N)");
            }
            e
        },
    )?;
    let loaded = setup::load_plan(config, &host)?;
    for note in &loaded.notes {
        match note.strip_prefix(setup::INFO) {
            Some(info) => warn(format_args!("uzram: note: {info}")),
            None => warn(format_args!("uzram: warning: {note}")),
        }
    }
    for device in &loaded.plan {
        for w in &device.warnings {
            warn(format_args!("uzram: [{}] {w}", device.section));
        }
    }
    Ok(loaded)
}

fn setup(
    dry_run: bool,
    config: Option<&std::path::Path>,
    ram_mib: Option<u64>,
    root: Option<&std::path::Path>,
) -> Outcome {
    if root.is_some() && !dry_run {
        return Err(CtlError("--root plans another system: use it with --dry-run".into()).into());
    }
    if let Some(r) = root.filter(|r| !r.is_dir()) {
        return Err(CtlError(format!("--root {}: no such directory", shown(r))).into());
    }
    let setup::Loaded {
        plan,
        system_generator_files,
        ..
    } = plan(config, ram_mib, root)?;
    // A device that fails alone (as zram-generator fails one device's unit) leaves the others
    // to be set up; the command then fails, naming it.
    let (plan, failed): (Vec<_>, Vec<_>) = plan.into_iter().partition(|d| d.failed.is_none());
    let failure = (!failed.is_empty()).then(|| {
        let why: Vec<String> = failed
            .iter()
            .map(|d| {
                format!(
                    "[{}] {}",
                    d.section,
                    d.failed.as_deref().unwrap_or_default()
                )
            })
            .collect();
        CtlError(why.join("; "))
    });
    if dry_run {
        // The dry run checks what the real setup checks (ctl::setup checks it itself).
        ctl::check_plan(&plan)?;
        let text: String = plan.iter().map(|d| d.line() + "\n").collect();
        out(&text)?;
        return failure.map_or(Ok(()), |e| Err(e.into()));
    }
    if system_generator_files && setup::zram_generator_installed(std::path::Path::new("/")) {
        return Err(CtlError(
            "zram-generator is installed and acts on the same zram-generator.conf: mask it (ln -s /dev/null /etc/systemd/system-generators/zram-generator) or remove it first, or give --config FILE".into(),
        )
        .into());
    }
    for line in ctl::setup(&plan)? {
        outln(line)?;
    }
    failure.map_or(Ok(()), |e| Err(e.into()))
}

/// The generator: a directory it cannot write or a configuration error fails it (exit 1, as
/// zram-generator; systemd logs that and still reads the units written).
fn generator(dir: &std::path::Path) -> Outcome {
    let root = std::env::var_os("ZRAM_GENERATOR_ROOT")
        .filter(|r| !r.is_empty())
        .map_or_else(|| std::path::PathBuf::from("/"), std::path::PathBuf::from);
    // The path it was started by (the wrapper names /usr/bin/uzram), not that path with its
    // links resolved: a link to a versioned install must keep naming the installed binary.
    let exe = std::env::args_os()
        .next()
        .filter(|a| std::path::Path::new(a).is_absolute())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::current_exe().ok())
        .and_then(|p| p.into_os_string().into_string().ok())
        .unwrap_or_else(|| "/usr/bin/uzram".into());
    let done = setup::units::generate(dir, &root, &exe);
    setup::units::say(&done.said);
    if done.write_failed {
        return Err(CtlError(format!(
            "some units could not be written into {}",
            crate::common::output::shown(dir)
        ))
        .into());
    }
    if done.config_failed {
        return Err(CtlError(
            "the configuration has errors (said above): the devices they name have no units".into(),
        )
        .into());
    }
    Ok(())
}

fn teardown(config: Option<&std::path::Path>) -> Outcome {
    for line in ctl::teardown(&plan(config, None, None)?.plan)? {
        outln(line)?;
    }
    Ok(())
}

/// `--ram-mib`: whole MiB, said plainly where the parse of a `u64` would only say "invalid
/// digit".
fn parse_ram_mib(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err("MiB of RAM are not negative".into());
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a whole number of MiB (4096 for 4 GiB)".into());
    }
    t.parse()
        .map_err(|_| format!("too large: at most {} MiB", u64::MAX))
}
