//! The device listing `uzram` prints with no arguments: zramctl's columns, names, defaults and
//! size format, plus uzram's own (the daemon's resident memory, its pid, whether it is alive).

use uzram_engine::format_size;

/// A column: its name, zramctl's help for it, and whether its values are right-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The name `--output` takes and the heading shows.
    pub name: &'static str,
    /// What it shows.
    pub help: &'static str,
    right: bool,
}

const fn col(name: &'static str, help: &'static str, right: bool) -> Column {
    Column { name, help, right }
}

/// Every column, zramctl's first, in zramctl's order.
pub const COLUMNS: &[Column] = &[
    col("NAME", "zram device name", false),
    col("DISKSIZE", "limit on the uncompressed amount of data", true),
    col("DATA", "uncompressed size of stored data", true),
    col("COMPR", "compressed size of stored data", true),
    col("ALGORITHM", "the selected compression algorithm", false),
    col("STREAMS", "number of concurrent compress operations", true),
    col("ZERO-PAGES", "empty pages with no allocated memory", true),
    col(
        "TOTAL",
        "all memory including allocator fragmentation and metadata overhead",
        true,
    ),
    col(
        "MEM-LIMIT",
        "memory limit used to store compressed data",
        true,
    ),
    col(
        "MEM-USED",
        "peak memory usage to store compressed data",
        true,
    ),
    col("MIGRATED", "number of objects migrated by compaction", true),
    col("COMP-RATIO", "compression ratio: DATA/TOTAL", true),
    col("MOUNTPOINT", "where the device is mounted", false),
    col(
        "RSS",
        "the daemon's resident memory: what the device really costs",
        true,
    ),
    col("PID", "the daemon's process id", true),
    col(
        "BD-USED",
        "bytes the written-back pages take on the backing files",
        true,
    ),
    col(
        "WRITTEN-BACK",
        "pages the policy wrote back (idle, above the watermark, host pressure, spill)",
        true,
    ),
    col(
        "EVICTED",
        "pages evicted to the backing files so that a write did not fail",
        true,
    ),
    col(
        "RECOMPRESSED",
        "pages the policy recompressed with the secondary algorithm",
        true,
    ),
    col(
        "SLOT-FREE",
        "how swap's freed slots are freed: probe (as the kernel frees them) or discard",
        false,
    ),
    col(
        "SLOT-FREED",
        "pages freed as swap freed their slots (the probe)",
        true,
    ),
    col(
        "RESTARTS",
        "how often the daemon's supervisor started a successor to a worker that died",
        true,
    ),
    col(
        "LAST-RESTART",
        "why the last worker that was replaced ended (killed_by_SIGKILL, exit_status_N), or none",
        false,
    ),
    col(
        "STATE",
        "live, or dead when the daemon is gone (uzram --reset removes it)",
        false,
    ),
];

/// zramctl's default columns.
pub const DEFAULT_COLUMNS: &[&str] = &[
    "NAME",
    "ALGORITHM",
    "DISKSIZE",
    "DATA",
    "COMPR",
    "TOTAL",
    "STREAMS",
    "MOUNTPOINT",
];

/// The column called `name` (case-insensitive, as zramctl takes them).
pub fn column(name: &str) -> Option<Column> {
    COLUMNS
        .iter()
        .copied()
        .find(|c| c.name.eq_ignore_ascii_case(name))
}

/// One device as the daemon describes it (`info` on its control socket), or a dead one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceRow {
    /// `/dev/ublkbN`.
    pub name: String,
    /// False when the daemon is gone or does not answer.
    pub live: bool,
    /// Why a device that is not live is shown without figures (`None`: its daemon is gone).
    pub trouble: Option<String>,
    /// The daemon's pid.
    pub pid: u32,
    /// zram's algorithm name.
    pub algorithm: String,
    /// Bytes.
    pub disksize: u64,
    /// Queues.
    pub streams: u64,
    /// The daemon's resident memory in bytes.
    pub rss: u64,
    /// The nine mm_stat fields.
    pub mm: [u64; 9],
    /// Bytes on the backing files.
    pub bd_used: u64,
    /// Pages the policy wrote back.
    pub written_back: u64,
    /// Pages evicted.
    pub evicted: u64,
    /// Pages the policy recompressed.
    pub recompressed: u64,
    /// `probe` or `discard`: how swap's freed slots reach the device.
    pub slot_free: String,
    /// Pages freed by the probe.
    pub slot_freed: u64,
    /// Workers the supervisor replaced.
    pub restarts: u64,
    /// Why the last replaced worker ended.
    pub last_restart: String,
    /// `[SWAP]`, a mount point, or empty.
    pub mountpoint: String,
}

impl DeviceRow {
    /// A device whose daemon is gone.
    pub fn dead(name: String) -> DeviceRow {
        DeviceRow {
            name,
            ..DeviceRow::default()
        }
    }

    /// Parses the daemon's `info` reply (`key=value` lines).
    pub fn parse(info: &str) -> Result<DeviceRow, String> {
        let mut row = DeviceRow {
            live: true,
            ..DeviceRow::default()
        };
        let num = |k: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{k}={v:?} is not a number"))
        };
        for line in info.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k {
                "name" => row.name = v.to_string(),
                "pid" => row.pid = num(k, v)? as u32,
                "algorithm" => row.algorithm = v.to_string(),
                "disksize" => row.disksize = num(k, v)?,
                "streams" => row.streams = num(k, v)?,
                "rss" => row.rss = num(k, v)?,
                "bd_used" => row.bd_used = num(k, v)?,
                "written_back" => row.written_back = num(k, v)?,
                "evicted" => row.evicted = num(k, v)?,
                "recompressed" => row.recompressed = num(k, v)?,
                "slot_free" => row.slot_free = v.to_string(),
                "slot_freed" => row.slot_freed = num(k, v)?,
                "restarts" => row.restarts = num(k, v)?,
                "last_restart" => row.last_restart = v.to_string(),
                "mm_stat" => {
                    let fields: Vec<u64> = v
                        .split_whitespace()
                        .map(|f| num(k, f))
                        .collect::<Result<_, _>>()?;
                    row.mm = fields
                        .try_into()
                        .map_err(|f: Vec<u64>| format!("mm_stat has {} fields, not 9", f.len()))?;
                }
                _ => {}
            }
        }
        if row.name.is_empty() {
            return Err("no name in the daemon's info".into());
        }
        Ok(row)
    }

    fn cell(&self, c: &Column, bytes: bool) -> String {
        let size = |b: u64| {
            if bytes {
                b.to_string()
            } else {
                format_size(b)
            }
        };
        if !self.live && !matches!(c.name, "NAME" | "STATE" | "MOUNTPOINT") {
            return "-".into();
        }
        let [orig, compr, total, limit, used_max, zero, migrated, _, _] = self.mm;
        match c.name {
            "NAME" => self.name.clone(),
            "DISKSIZE" => size(self.disksize),
            "DATA" => size(orig),
            "COMPR" => size(compr),
            "ALGORITHM" => self.algorithm.clone(),
            // zramctl leaves it empty where the kernel has no max_comp_streams.
            "STREAMS" if self.streams == 0 => String::new(),
            "STREAMS" => self.streams.to_string(),
            "ZERO-PAGES" => zero.to_string(),
            "TOTAL" => size(total),
            "MEM-LIMIT" => size(limit),
            "MEM-USED" => size(used_max),
            // zramctl prints the count as a size.
            "MIGRATED" => size(migrated),
            // zramctl's printf("%.4f"), whose C library says inf and -nan for a division by 0.
            "COMP-RATIO" => match (orig, total) {
                (0, 0) => "-nan".into(),
                (_, 0) => "inf".into(),
                _ => format!("{:.4}", orig as f64 / total as f64),
            },
            "MOUNTPOINT" => self.mountpoint.clone(),
            "RSS" => size(self.rss),
            "PID" => self.pid.to_string(),
            "BD-USED" => size(self.bd_used),
            "WRITTEN-BACK" => self.written_back.to_string(),
            "EVICTED" => self.evicted.to_string(),
            "RECOMPRESSED" => self.recompressed.to_string(),
            "SLOT-FREE" => self.slot_free.clone(),
            "SLOT-FREED" => self.slot_freed.to_string(),
            "RESTARTS" => self.restarts.to_string(),
            "LAST-RESTART" => self.last_restart.clone(),
            "STATE" => if self.live { "live" } else { "dead" }.into(),
            _ => String::new(),
        }
    }
}

/// How to print the table.
#[derive(Debug, Clone, Copy, Default)]
pub struct Format {
    /// Sizes in bytes instead of zramctl's human form.
    pub bytes: bool,
    /// Columns separated by one space, no alignment (zramctl --raw).
    pub raw: bool,
    /// No heading line.
    pub noheadings: bool,
    /// JSON instead of a table ([`render_json`]).
    pub json: bool,
}

/// The table of `rows` with `columns`, byte for byte as zramctl (libsmartcols) lays it out:
/// each column as wide as its widest cell or heading (the heading counts even with
/// `--noheadings`), one blank between columns, right-aligned cells padded on the left, left-
/// aligned ones on the right except in the last column; trailing blanks are kept.
pub fn render(rows: &[DeviceRow], columns: &[Column], format: Format) -> String {
    let heading: Vec<String> = columns.iter().map(|c| c.name.to_string()).collect();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|c| {
                    let v = r.cell(c, format.bytes);
                    if format.raw {
                        // libsmartcols' raw output escapes blanks so that columns stay split.
                        v.replace(' ', "\\x20")
                    } else {
                        v
                    }
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            std::iter::once(&heading)
                .chain(&body)
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let shown = (!format.noheadings)
        .then_some(&heading)
        .into_iter()
        .chain(&body);
    for l in shown {
        let mut cells = Vec::with_capacity(columns.len());
        for (i, (v, c)) in l.iter().zip(columns).enumerate() {
            let last = i + 1 == columns.len();
            cells.push(if format.raw || (last && !c.right) {
                v.clone()
            } else if c.right {
                format!("{v:>w$}", w = widths[i])
            } else {
                format!("{v:<w$}", w = widths[i])
            });
        }
        out.push_str(&cells.join(" "));
        out.push('\n');
    }
    out
}

/// The columns `--output` (or `--output-all`) names.
pub fn columns(output: &[String], all: bool) -> Result<Vec<Column>, String> {
    let defaults = || DEFAULT_COLUMNS.iter().filter_map(|n| column(n));
    // zramctl's `-o +LIST`: the default columns, then LIST.
    let (mut columns, named): (Vec<Column>, Vec<&str>) = match output.first() {
        _ if all => (COLUMNS.to_vec(), Vec::new()),
        None => (defaults().collect(), Vec::new()),
        Some(first) if first.starts_with('+') => (
            defaults().collect(),
            std::iter::once(&first[1..])
                .chain(output[1..].iter().map(String::as_str))
                .collect(),
        ),
        Some(_) => (Vec::new(), output.iter().map(String::as_str).collect()),
    };
    for n in named {
        columns
            .push(column(n).ok_or_else(|| format!("unknown column: {n:?} (see --list-columns)"))?);
    }
    Ok(columns)
}

/// The listing as one JSON object: `{"devices": [{"name": "/dev/ublkb0", "disksize": "1G",
/// ...}]}`, a key per column (its name in lower case, as libsmartcols' JSON has it), each cell
/// as the table shows it: a whole number in a column of figures as a number (so with `--bytes`
/// the sizes), a figure a dead device has not (`-`) as null, anything else a string.
pub fn render_json(rows: &[DeviceRow], columns: &[Column], bytes: bool) -> String {
    let mut out = String::from("{\"devices\": [");
    for (i, r) in rows.iter().enumerate() {
        out.push_str(if i == 0 { "{" } else { ", {" });
        for (j, c) in columns.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            let v = r.cell(c, bytes);
            let value = if !r.live && v == "-" {
                "null".to_string()
            } else if c.right
                && (v == "0" || !v.starts_with('0'))
                && !v.is_empty()
                && v.len() < 20
                && v.bytes().all(|b| b.is_ascii_digit())
            {
                v
            } else {
                json_string(&v)
            };
            out.push_str(&format!("{}: {value}", json_string(&c.name.to_lowercase())));
        }
        out.push('}');
    }
    out.push_str("]}\n");
    out
}

/// `s` as a JSON string: quoted, with `"`, `\` and control characters escaped.
pub(crate) fn json_string(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// What `/dev/...` is used for, as zramctl's MOUNTPOINT shows it: `[SWAP]`, a mount point, or "".
pub fn mountpoint(dev: &str) -> String {
    // Unknown (no /proc/swaps to read) shows as nothing, as zramctl would.
    if crate::common::swap_state(dev) == Ok(true) {
        return "[SWAP]".into();
    }
    crate::common::mount_point(dev).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> DeviceRow {
        DeviceRow::parse(
            "name=/dev/ublkb0\npid=42\nalgorithm=lz4\ndisksize=4294967296\nstreams=2\nrss=50331648\n\
             bd_used=1048576\nevicted=96\nrecompressed=300\nwritten_back=256\n\
             slot_free=probe\nslot_freed=4242\n\
             mm_stat=13000704  2621440  3457024        0  3457024      123        0        7        7\n",
        )
        .unwrap()
    }

    /// Kernel zram's figures for one device (zram1: lz4, 64 MiB, a mem_limit of 48 MiB, 3,000
    /// pages written; Linux 6.18, whose zram has no max_comp_streams), and what util-linux 2.38's
    /// zramctl printed for them on this project's host, byte for byte.
    fn kernel_zram_row() -> DeviceRow {
        DeviceRow {
            name: "/dev/zram1".into(),
            live: true,
            algorithm: "lz4".into(),
            disksize: 67_108_864,
            streams: 0,
            mm: [
                12_288_000, 1_549_252, 1_589_248, 50_331_648, 1_589_248, 600, 0, 343, 343,
            ],
            ..DeviceRow::default()
        }
    }

    #[test]
    fn the_listing_is_zramctls_byte_for_byte() {
        let cols =
            |names: &[&str]| -> Vec<Column> { names.iter().map(|n| column(n).unwrap()).collect() };
        // zramctl 2.38's --output-all (2.39 added COMP-RATIO).
        let all = cols(&[
            "NAME",
            "DISKSIZE",
            "DATA",
            "COMPR",
            "ALGORITHM",
            "STREAMS",
            "ZERO-PAGES",
            "TOTAL",
            "MEM-LIMIT",
            "MEM-USED",
            "MIGRATED",
            "MOUNTPOINT",
        ]);
        let default = cols(DEFAULT_COLUMNS);
        let f = |bytes, raw, noheadings| Format {
            bytes,
            raw,
            noheadings,
            json: false,
        };
        let r = [kernel_zram_row()];
        for (columns, format, zramctl) in [
            (&default, f(false, false, false), "NAME       ALGORITHM DISKSIZE  DATA COMPR TOTAL STREAMS MOUNTPOINT\n/dev/zram1 lz4            64M 11.7M  1.5M  1.5M         \n"),
            (&all, f(false, false, false), "NAME       DISKSIZE  DATA COMPR ALGORITHM STREAMS ZERO-PAGES TOTAL MEM-LIMIT MEM-USED MIGRATED MOUNTPOINT\n/dev/zram1      64M 11.7M  1.5M lz4                      600  1.5M       48M     1.5M       0B \n"),
            (&default, f(false, true, false), "NAME ALGORITHM DISKSIZE DATA COMPR TOTAL STREAMS MOUNTPOINT\n/dev/zram1 lz4 64M 11.7M 1.5M 1.5M  \n"),
            (&default, f(true, false, false), "NAME       ALGORITHM DISKSIZE     DATA   COMPR   TOTAL STREAMS MOUNTPOINT\n/dev/zram1 lz4       67108864 12288000 1549252 1589248         \n"),
            (&default, f(false, false, true), "/dev/zram1 lz4            64M 11.7M  1.5M  1.5M         \n"),
            (&all, f(true, true, false), "NAME DISKSIZE DATA COMPR ALGORITHM STREAMS ZERO-PAGES TOTAL MEM-LIMIT MEM-USED MIGRATED MOUNTPOINT\n/dev/zram1 67108864 12288000 1549252 lz4  600 1589248 50331648 1589248 0 \n"),
            (&all, f(false, false, true), "/dev/zram1      64M 11.7M  1.5M lz4                      600  1.5M       48M     1.5M       0B \n"),
        ] {
            assert_eq!(render(&r, columns, format), zramctl, "{format:?}");
        }
        // 2.39's COMP-RATIO: printf's %.4f of DATA / TOTAL.
        let ratio = render(&r, &cols(&["COMP-RATIO"]), f(false, true, true));
        assert_eq!(ratio, format!("{:.4}\n", 12_288_000.0 / 1_589_248.0));
        assert_eq!(ratio, "7.7320\n");
    }

    #[test]
    fn the_default_table_is_zramctls() {
        let cols: Vec<Column> = DEFAULT_COLUMNS.iter().map(|n| column(n).unwrap()).collect();
        let mut r = row();
        r.mountpoint = "[SWAP]".into();
        assert_eq!(
            render(&[r], &cols, Format::default()),
            "NAME        ALGORITHM DISKSIZE  DATA COMPR TOTAL STREAMS MOUNTPOINT\n\
             /dev/ublkb0 lz4             4G 12.4M  2.5M  3.3M       2 [SWAP]\n"
        );
    }

    #[test]
    fn bytes_raw_noheadings_and_dead_devices() {
        let cols: Vec<Column> = ["NAME", "DISKSIZE", "RSS", "STATE", "COMP-RATIO"]
            .iter()
            .map(|n| column(n).unwrap())
            .collect();
        let f = Format {
            bytes: true,
            raw: true,
            noheadings: true,
            json: false,
        };
        let out = render(&[row(), DeviceRow::dead("/dev/ublkb3".into())], &cols, f);
        assert_eq!(
            out,
            "/dev/ublkb0 4294967296 50331648 live 3.7607\n/dev/ublkb3 - - dead -\n"
        );
        assert!(column("mem-used").is_some());
        assert!(column("nope").is_none());
        assert!(DeviceRow::parse("pid=1\n").is_err());
        assert!(DeviceRow::parse("name=x\nmm_stat=1 2\n").is_err());
    }

    #[test]
    fn the_json_listing_has_a_key_per_column_and_numbers_with_bytes() {
        let cols: Vec<Column> = ["NAME", "DISKSIZE", "STATE", "COMP-RATIO", "MOUNTPOINT"]
            .iter()
            .map(|n| column(n).unwrap())
            .collect();
        let mut r = row();
        r.mountpoint = "/mnt/a \"b\"\n".into();
        let out = render_json(&[r, DeviceRow::dead("/dev/ublkb3".into())], &cols, true);
        assert_eq!(
            out,
            "{\"devices\": [{\"name\": \"/dev/ublkb0\", \"disksize\": 4294967296, \"state\": \"live\", \
             \"comp-ratio\": \"3.7607\", \"mountpoint\": \"/mnt/a \\\"b\\\"\\u000a\"}, \
             {\"name\": \"/dev/ublkb3\", \"disksize\": null, \"state\": \"dead\", \"comp-ratio\": null, \
             \"mountpoint\": \"\"}]}\n"
        );
        assert_eq!(render_json(&[], &cols, false), "{\"devices\": []}\n");
        let human = render_json(&[row()], &cols, false);
        assert!(human.contains("\"disksize\": \"4G\""), "{human}");
    }

    #[test]
    fn the_policy_columns_show_what_the_policy_did() {
        let cols: Vec<Column> = ["NAME", "BD-USED", "WRITTEN-BACK", "EVICTED", "RECOMPRESSED"]
            .iter()
            .map(|n| column(n).unwrap())
            .collect();
        let out = render(
            &[row()],
            &cols,
            Format {
                raw: true,
                noheadings: true,
                ..Format::default()
            },
        );
        assert_eq!(out, "/dev/ublkb0 1M 256 96 300\n");
    }

    #[test]
    fn the_slot_free_columns_say_how_freed_slots_are_freed() {
        let cols: Vec<Column> = ["NAME", "SLOT-FREE", "SLOT-FREED"]
            .iter()
            .map(|n| column(n).unwrap())
            .collect();
        let f = Format {
            raw: true,
            ..Format::default()
        };
        let out = render(&[row(), DeviceRow::dead("/dev/ublkb3".into())], &cols, f);
        assert_eq!(
            out,
            "NAME SLOT-FREE SLOT-FREED\n/dev/ublkb0 probe 4242\n/dev/ublkb3 - -\n"
        );
    }
}
