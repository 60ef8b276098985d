//! zram's sysfs attributes on a [`Device`]: the same names, the same value syntax, the same bytes
//! out, and the same errno for the same mistake (`EACCES` for reading a write-only attribute,
//! `EBUSY` for changing what only an uninitialised device can change, `EINVAL` for a bad value).
//! The daemon serves them over its control socket (`uzram attr DEV NAME [VALUE]`); anything else
//! that embeds a [`Device`] can serve them too.
//!
//! A uzram device is initialised when it is created (its size is given then), so it answers as an
//! initialised zram device does. uzram's own figures live in `uzram_stat`, never appended to
//! zram's attributes.

use crate::{parse_size, Device};

/// Who may do what with an attribute, as its sysfs mode says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only (0444).
    Read,
    /// Write-only (0200).
    Write,
    /// Both (0644).
    ReadWrite,
}

/// Why an attribute access failed: an errno and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AttrError {
    /// The errno zram's sysfs file would give.
    pub errno: i32,
    /// A sentence for the user.
    pub message: String,
}

impl AttrError {
    /// An error with `errno` and a message.
    pub fn new(errno: i32, message: impl Into<String>) -> AttrError {
        AttrError {
            errno,
            message: message.into(),
        }
    }
}

/// What the daemon knows that the engine does not.
#[derive(Debug, Clone, Default)]
pub struct DaemonInfo {
    /// Queues serving the device (zram's `max_comp_streams` reads the CPU count; uzram has one
    /// stream per queue).
    pub streams: usize,
    /// The daemon's resident memory in bytes (everything it costs, pool, table and buffers).
    pub rss_bytes: u64,
    /// The daemon's process id.
    pub pid: u32,
    /// Whether the pages of swap's freed slots are marked as the kernel frees them (the
    /// daemon's probe, zram's `swap_slot_free_notify`), rather than freed only when discarded.
    pub slot_free_probe: bool,
    /// Pages the probe marked freed (since it was loaded: under a supervisor, across its
    /// workers).
    pub slot_free_marked: u64,
    /// Workers the daemon's supervisor replaced because they died.
    pub restarts: u64,
    /// Why the last replaced worker ended, one word (`none` before any).
    pub last_restart: String,
    /// Writes this worker put off while the pool's reserve was dry (kept in flight and
    /// served again once memory came) rather than fail.
    pub writes_put_off: u64,
    /// The kernel the device is served on, (major, minor): attributes whose form changed
    /// between zram's versions follow its zram (None: Linux 6.12's forms).
    pub kernel: Option<(u32, u32)>,
    /// What the queue threads paid for the requests they served.
    pub round_trips: RoundTrips,
}

/// The queue threads' cost beyond the engine's work, summed over the queues: divided by
/// `requests`, the system calls and context switches a ublk round trip costs this daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// Requests completed.
    pub requests: u64,
    /// `io_uring_enter` calls (a wait for requests, with the commits queued since the last).
    pub ring_enters: u64,
    /// Copies of a request's data through the ublk char device (a `pread` or `pwrite` each).
    pub copies: u64,
    /// The queue threads' voluntary context switches (each sleep for requests).
    pub switches_voluntary: u64,
    /// The queue threads' involuntary context switches (preempted).
    pub switches_involuntary: u64,
}

/// Reads an attribute: its exact bytes.
type Show = fn(&Device, &DaemonInfo) -> String;
/// Writes an attribute from its value (trimmed).
type StoreFn = fn(&Device, &str) -> Result<(), AttrError>;

/// What a write to an attribute does.
#[derive(Clone, Copy)]
enum Store {
    /// Read-only: EACCES.
    No,
    /// What only an uninitialised zram device can change; a uzram device is initialised when it
    /// is created, so EBUSY.
    Fixed,
    /// The attribute's `*_store`.
    Fn(StoreFn),
}

/// One attribute: its name, its sysfs mode, and its `show` and `store` (zram_drv.c's
/// `*_show` / `*_store` pairs). A mode without reading has no `show`, one without writing no
/// `store`.
pub struct Attribute {
    /// The file's name, as zram's.
    pub name: &'static str,
    /// zram's mode for it.
    pub access: Access,
    show: Option<Show>,
    store: Store,
}

const fn ro(name: &'static str, show: Show) -> Attribute {
    Attribute {
        name,
        access: Access::Read,
        show: Some(show),
        store: Store::No,
    }
}

const fn wo(name: &'static str, store: StoreFn) -> Attribute {
    Attribute {
        name,
        access: Access::Write,
        show: None,
        store: Store::Fn(store),
    }
}

const fn rw(name: &'static str, show: Show, store: StoreFn) -> Attribute {
    Attribute {
        name,
        access: Access::ReadWrite,
        show: Some(show),
        store: Store::Fn(store),
    }
}

/// A zram attribute that only an uninitialised device can change (`show` None: write-only).
const fn fixed(name: &'static str, show: Option<Show>) -> Attribute {
    Attribute {
        name,
        access: if show.is_some() {
            Access::ReadWrite
        } else {
            Access::Write
        },
        show,
        store: Store::Fixed,
    }
}

/// The attributes uzram serves, with zram's modes, sorted by name. `reset` is the daemon's (it
/// stops the device); here it only refuses.
pub static ATTRIBUTES: &[Attribute] = &[
    fixed("algorithm_params", None),
    fixed("backing_dev", Some(show_backing_dev)),
    ro("bd_stat", show_bd_stat),
    fixed("comp_algorithm", Some(show_comp_algorithm)),
    wo("compact", store_compact),
    rw(
        "compressed_writeback",
        |_, _| "1\n".to_string(),
        store_compressed_writeback,
    ),
    ro("debug_stat", show_debug_stat),
    fixed("disksize", Some(show_disksize)),
    wo("idle", store_idle),
    ro("initstate", |_, _| "1\n".to_string()),
    ro("io_stat", |d, _| d.io_stat()),
    rw(
        "max_comp_streams",
        show_max_comp_streams,
        store_max_comp_streams,
    ),
    wo("mem_limit", store_mem_limit),
    wo("mem_used_max", store_mem_used_max),
    ro("mm_stat", |d, _| d.mm_stat()),
    rw("policy", show_policy, store_policy),
    ro("policy_stat", |d, _| d.policy_stats().to_string()),
    fixed("recomp_algorithm", Some(show_recomp_algorithm)),
    wo("recompress", store_recompress),
    wo("reset", store_reset),
    ro("uzram_stat", uzram_stat),
    wo("writeback", store_writeback),
    rw(
        "writeback_batch_size",
        show_writeback_batch_size,
        store_writeback_batch_size,
    ),
    rw(
        "writeback_limit",
        show_writeback_limit,
        store_writeback_limit,
    ),
    rw(
        "writeback_limit_enable",
        show_writeback_limit_enable,
        store_writeback_limit_enable,
    ),
];

/// Attribute `name`, or `ENOENT` as sysfs gives for a file that does not exist.
fn find(name: &str) -> Result<&'static Attribute, AttrError> {
    ATTRIBUTES
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| AttrError::new(libc::ENOENT, format!("no attribute {name:?}")))
}

/// The access mode of `name`, or `ENOENT` as sysfs gives for a file that does not exist.
pub fn access(name: &str) -> Result<Access, AttrError> {
    find(name).map(|a| a.access)
}

/// Reads attribute `name`: exactly the bytes zram's sysfs file holds.
pub fn read(device: &Device, info: &DaemonInfo, name: &str) -> Result<String, AttrError> {
    let attr = find(name)?;
    let show = attr.show.ok_or_else(|| {
        AttrError::new(libc::EACCES, format!("{name} is write-only (as in zram)"))
    })?;
    Ok(show(device, info))
}

/// Writes `value` to attribute `name`, with zram's syntax and errors. `reset` is not handled
/// here: the caller owns the device's life.
pub fn write(device: &Device, name: &str, value: &str) -> Result<(), AttrError> {
    match find(name)?.store {
        Store::No => Err(AttrError::new(
            libc::EACCES,
            format!("{name} is read-only (as in zram)"),
        )),
        Store::Fixed => Err(AttrError::new(
            libc::EBUSY,
            format!(
                "{name} cannot change on an initialised device (as in zram): reset it and create it again"
            ),
        )),
        Store::Fn(store) => store(device, value.trim()),
    }
}

fn invalid(e: impl std::fmt::Display) -> AttrError {
    AttrError::new(libc::EINVAL, e.to_string())
}

fn number(value: &str) -> Result<u64, AttrError> {
    value
        .parse()
        .map_err(|_| AttrError::new(libc::EINVAL, format!("not a number: {value:?}")))
}

fn show_comp_algorithm(device: &Device, _: &DaemonInfo) -> String {
    algorithm_list(device.algorithm())
}

/// "version: 1", then writestall and miss_free, as Linux 6.12 prints them (uzram never stalls
/// writes for memory and frees every slot it is told to: both 0). zram dropped writestall in
/// Linux 6.14 and prints a bare 0 in its place (6.16's, 6.18's and 7.3's modules read for it).
fn show_debug_stat(_: &Device, info: &DaemonInfo) -> String {
    if info.kernel.is_some_and(|k| k >= (6, 14)) {
        format!("version: 1\n0 {:>8}\n", 0)
    } else {
        format!("version: 1\n{:>8} {:>8}\n", 0, 0)
    }
}

fn show_disksize(device: &Device, _: &DaemonInfo) -> String {
    format!("{}\n", device.disksize())
}

fn show_backing_dev(device: &Device, _: &DaemonInfo) -> String {
    match device.backing() {
        Some(b) => format!("{}\n", b.path().display()),
        None => "none\n".to_string(),
    }
}

fn show_bd_stat(device: &Device, _: &DaemonInfo) -> String {
    match device.backing() {
        Some(b) => b.bd_stat(),
        None => format!("{:>8} {:>8} {:>8}\n", 0, 0, 0),
    }
}

fn show_writeback_limit(device: &Device, _: &DaemonInfo) -> String {
    format!("{}\n", device.backing().map_or(0, |b| b.limit().1))
}

fn show_writeback_limit_enable(device: &Device, _: &DaemonInfo) -> String {
    format!(
        "{}\n",
        u8::from(device.backing().is_some_and(|b| b.limit().0))
    )
}

fn show_max_comp_streams(_: &Device, info: &DaemonInfo) -> String {
    format!("{}\n", info.streams)
}

/// One line per secondary algorithm: "#PRIO: " and the list comp_algorithm prints.
fn show_recomp_algorithm(device: &Device, _: &DaemonInfo) -> String {
    device
        .recomp_algorithms()
        .into_iter()
        .map(|(prio, chosen)| format!("#{prio}: {}", algorithm_list(chosen)))
        .collect()
}

fn show_policy(device: &Device, _: &DaemonInfo) -> String {
    format!("{}\n", device.policy())
}

/// zram's list of algorithms: every one, `chosen` in brackets, each followed by a space, then a
/// newline.
fn algorithm_list(chosen: uzram_codecs::Algorithm) -> String {
    let mut out: String = uzram_codecs::Algorithm::ALL
        .iter()
        .map(|&a| {
            if a == chosen {
                format!("[{}] ", a.name())
            } else {
                format!("{} ", a.name())
            }
        })
        .collect();
    out.push('\n');
    out
}

/// uzram's own figures, one `key value` per line (bytes unless the name says otherwise).
fn uzram_stat(device: &Device, info: &DaemonInfo) -> String {
    let s = device.stats();
    let mut out = String::new();
    let mut line = |k: &str, v: u64| out.push_str(&format!("{k} {v}\n"));
    line("pool_mapped", s.pool_mapped_bytes);
    line("pool_reserved", s.pool_reserved_bytes);
    line("pool_reserve_target", s.pool_reserve_target_bytes);
    line("metadata", s.table_bytes);
    line("daemon_rss", info.rss_bytes);
    line("daemon_pid", u64::from(info.pid));
    line("stored_pages", s.stored_pages);
    line("slot_free_probe", u64::from(info.slot_free_probe));
    line("slot_free_marked", info.slot_free_marked);
    line("slot_free_freed", s.notice_freed_pages);
    line("restarts", info.restarts);
    line("writes_put_off", info.writes_put_off);
    let r = &info.round_trips;
    line("queue_requests", r.requests);
    line("queue_ring_enters", r.ring_enters);
    line("queue_copies", r.copies);
    line("queue_switches_voluntary", r.switches_voluntary);
    line("queue_switches_involuntary", r.switches_involuntary);
    line("huge_threshold", device.huge_threshold() as u64);
    if let Some(b) = device.backing() {
        let (failed_writes, failed_reads) = b.failures();
        line("bd_bytes_written", b.bytes_written());
        line("bd_bytes_read", b.bytes_read());
        line("bd_failed_write_batches", failed_writes);
        line("bd_failed_reads", failed_reads);
        for (i, f) in b.files().iter().enumerate() {
            line(&format!("bd_file{i}_used"), f.used_bytes);
            line(&format!("bd_file{i}_size"), f.size_bytes);
            line(&format!("bd_file{i}_batches"), f.writes);
            line(&format!("bd_file{i}_direct_io"), u64::from(f.direct));
            line(&format!("bd_file{i}_read_align"), f.read_align as u64);
        }
    }
    // The one word that is not a number: why the last replaced worker ended.
    let last = if info.last_restart.is_empty() {
        "none"
    } else {
        &info.last_restart
    };
    out.push_str(&format!("last_restart {last}\n"));
    out
}

fn store_compact(device: &Device, _: &str) -> Result<(), AttrError> {
    device.compact();
    Ok(())
}

fn store_mem_limit(device: &Device, value: &str) -> Result<(), AttrError> {
    device.set_mem_limit(Some(parse_size(value).map_err(invalid)?));
    Ok(())
}

/// zram takes only 0: reset the high watermark to the current use.
fn store_mem_used_max(device: &Device, value: &str) -> Result<(), AttrError> {
    if value.parse::<u64>() != Ok(0) {
        return Err(AttrError::new(
            libc::EINVAL,
            format!("mem_used_max takes only 0 (got {value:?})"),
        ));
    }
    device.reset_mem_used_max();
    Ok(())
}

/// zram ignores writes to max_comp_streams since Linux 4.7; so does uzram (its streams are its
/// queues, fixed when the device is created). The value must still be a number.
fn store_max_comp_streams(_: &Device, value: &str) -> Result<(), AttrError> {
    number(value).map(drop)
}

fn store_idle(device: &Device, value: &str) -> Result<(), AttrError> {
    let older = match value {
        "all" => None,
        n => Some(n.parse::<u32>().map_err(|_| {
            AttrError::new(
                libc::EINVAL,
                format!("idle takes \"all\" or seconds (got {n:?})"),
            )
        })?),
    };
    device.mark_idle(older);
    Ok(())
}

fn store_writeback(device: &Device, value: &str) -> Result<(), AttrError> {
    use crate::device::writeback::WritebackRequest;
    let requests = WritebackRequest::parse_list(value).map_err(invalid)?;
    if device.backing().is_none() {
        return Err(AttrError::new(
            libc::ENODEV,
            "no backing device (create the device with --backing-dev FILE)",
        ));
    }
    // zram checks every index before it writes anything: ERANGE past the device.
    let pages = device.pages();
    if let Some(last) = requests.iter().find_map(|r| match *r {
        WritebackRequest::Pages { last, .. } if last >= pages => Some(last),
        _ => None,
    }) {
        return Err(AttrError::new(
            libc::ERANGE,
            format!("page {last} is beyond the device's {pages} pages"),
        ));
    }
    let mut ctx = device
        .context()
        .map_err(|e| AttrError::new(libc::ENOMEM, e.to_string()))?;
    for request in requests {
        let stats = device.writeback(&mut ctx, request).map_err(invalid)?;
        // zram fails a pass cut short by the writeback limit with EIO.
        if stats.stopped && stats.written < stats.candidates {
            return Err(AttrError::new(
                libc::EIO,
                format!(
                    "writeback stopped after {} of {} pages (writeback limit or full backing device)",
                    stats.written, stats.candidates
                ),
            ));
        }
    }
    Ok(())
}

fn show_writeback_batch_size(device: &Device, _: &DaemonInfo) -> String {
    format!("{}\n", device.writeback_batch_size())
}

/// zram's `writeback_batch_size` (Linux 7.x): a number above 0. uzram writes a pass's pages
/// that many at a time, one write each, at most 256.
fn store_writeback_batch_size(device: &Device, value: &str) -> Result<(), AttrError> {
    let n = value
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| AttrError::new(libc::EINVAL, format!("not a count above 0: {value:?}")))?;
    device.set_writeback_batch_size(n as usize);
    Ok(())
}

/// zram's `compressed_writeback` (Linux 7.x): a yes or no, taken only before the device is
/// initialised. uzram's written-back records are always compressed (it shows 1), and its
/// device is always initialised: a valid value gets EBUSY, as zram's initialised device does.
fn store_compressed_writeback(_: &Device, value: &str) -> Result<(), AttrError> {
    // The kernel's kstrtobool: by the first byte (e, y, t, 1 or d, n, f, 0), or "o" and then
    // n or f.
    let valid = matches!(
        value.as_bytes(),
        [b'e' | b'E' | b'y' | b'Y' | b't' | b'T' | b'1', ..]
            | [b'd' | b'D' | b'n' | b'N' | b'f' | b'F' | b'0', ..]
            | [b'o' | b'O', b'n' | b'N' | b'f' | b'F', ..]
    );
    if !valid {
        return Err(AttrError::new(
            libc::EINVAL,
            format!("not a yes or no: {value:?}"),
        ));
    }
    Err(AttrError::new(
        libc::EBUSY,
        "compressed_writeback cannot change on an initialised device (as in zram); uzram always \
         writes back compressed",
    ))
}

fn backing_of(device: &Device) -> Result<&crate::device::writeback::BackingStore, AttrError> {
    device
        .backing()
        .ok_or_else(|| AttrError::new(libc::ENODEV, "no backing device"))
}

fn store_writeback_limit(device: &Device, value: &str) -> Result<(), AttrError> {
    let n = number(value)?;
    backing_of(device)?.set_limit(n);
    Ok(())
}

fn store_writeback_limit_enable(device: &Device, value: &str) -> Result<(), AttrError> {
    let n = number(value)?;
    backing_of(device)?.set_limit_enable(n != 0);
    Ok(())
}

fn store_policy(device: &Device, value: &str) -> Result<(), AttrError> {
    device.set_policy(value).map_err(invalid)
}

fn store_recompress(device: &Device, value: &str) -> Result<(), AttrError> {
    let request: crate::RecompressRequest = value.parse().map_err(invalid)?;
    let mut ctx = device
        .context()
        .map_err(|e| AttrError::new(libc::ENOMEM, e.to_string()))?;
    device.recompress(&mut ctx, &request).map_err(invalid)?;
    Ok(())
}

fn store_reset(_: &Device, _: &str) -> Result<(), AttrError> {
    Err(AttrError::new(
        libc::EINVAL,
        "reset is the daemon's to do (uzram --reset DEVICE)",
    ))
}

#[cfg(test)]
mod tests;
