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
        "pages the policy wrote back (idle, above the watermark, host pressure)",
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
            "STREAMS" => self.streams.to_string(),
            "ZERO-PAGES" => zero.to_string(),
            "TOTAL" => size(total),
            "MEM-LIMIT" => size(limit),
            "MEM-USED" => size(used_max),
            "MIGRATED" => migrated.to_string(),
            "COMP-RATIO" => {
                if total == 0 {
                    "0".into()
                } else {
                    format!("{:.2}", orig as f64 / total as f64)
                }
            }
            "MOUNTPOINT" => self.mountpoint.clone(),
            "RSS" => size(self.rss),
            "PID" => self.pid.to_string(),
            "BD-USED" => size(self.bd_used),
            "WRITTEN-BACK" => self.written_back.to_string(),
            "EVICTED" => self.evicted.to_string(),
            "RECOMPRESSED" => self.recompressed.to_string(),
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
}

/// The table of `rows` with `columns`, as zramctl lays it out.
pub fn render(rows: &[DeviceRow], columns: &[Column], format: Format) -> String {
    let mut lines: Vec<Vec<String>> = Vec::new();
    if !format.noheadings {
        lines.push(columns.iter().map(|c| c.name.to_string()).collect());
    }
    for r in rows {
        lines.push(
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
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in &lines {
        let mut cells = Vec::with_capacity(columns.len());
        for (i, (v, c)) in l.iter().zip(columns).enumerate() {
            let last = i + 1 == columns.len();
            cells.push(if format.raw {
                v.clone()
            } else if c.right {
                format!("{v:>w$}", w = widths[i])
            } else if last {
                v.clone()
            } else {
                format!("{v:<w$}", w = widths[i])
            });
        }
        out.push_str(cells.join(" ").trim_end());
        out.push('\n');
    }
    out
}

/// What `/dev/...` is used for, as zramctl's MOUNTPOINT shows it: `[SWAP]`, a mount point, or "".
pub fn mountpoint(dev: &str) -> String {
    if crate::common::is_swap(dev) {
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
             mm_stat=13000704  2621440  3457024        0  3457024      123        0        7        7\n",
        )
        .unwrap()
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
        };
        let out = render(&[row(), DeviceRow::dead("/dev/ublkb3".into())], &cols, f);
        assert_eq!(
            out,
            "/dev/ublkb0 4294967296 50331648 live 3.76\n/dev/ublkb3 - - dead -\n"
        );
        assert!(column("mem-used").is_some());
        assert!(column("nope").is_none());
        assert!(DeviceRow::parse("pid=1\n").is_err());
        assert!(DeviceRow::parse("name=x\nmm_stat=1 2\n").is_err());
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
}
