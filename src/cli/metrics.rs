//! `uzram metrics`: every figure of each device's `mm_stat`, `io_stat`, `bd_stat`,
//! `policy_stat` and `uzram_stat`, in Prometheus' text format (for node_exporter's textfile
//! collector: `--output FILE` replaces the file whole, a new one readable by all as that
//! collector expects, a replaced one keeping its mode) or as JSON. The figures are the
//! attributes' own numbers; the names of zram's positional fields are those of the kernel's
//! zram documentation.

use std::fmt::Write as _;

use crate::cli::ctl;
use crate::cli::listing::{json_string, DeviceRow};

/// What `uzram metrics` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Prometheus' text exposition format
    Prometheus,
    /// One JSON object
    Json,
}

/// `uzram metrics`: the figures of every device now, printed or replacing `output`.
pub fn write(format: Format, output: Option<&std::path::Path>) -> Result<(), ctl::CtlError> {
    let devs = collect();
    let text = match format {
        Format::Prometheus => prometheus(&devs),
        Format::Json => json(&devs),
    };
    // "-" is standard output, as for most tools that take an output file.
    let Some(path) = output.filter(|p| *p != std::path::Path::new("-")) else {
        return crate::common::output::out(&text).map_err(|e| ctl::CtlError(e.to_string()));
    };
    let named =
        |e: std::io::Error| ctl::CtlError(format!("{}: {e}", crate::common::output::shown(path)));
    let mut f = crate::common::output::Replacing::new(path)
        .map_err(named)?
        .new_file_mode(0o644)
        .unsynced();
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(named)?;
    f.commit().map_err(named)
}

/// zram's `mm_stat` fields, in order.
const MM_STAT: [&str; 9] = [
    "orig_data_size",
    "compr_data_size",
    "mem_used_total",
    "mem_limit",
    "mem_used_max",
    "same_pages",
    "pages_compacted",
    "huge_pages",
    "huge_pages_since",
];
/// zram's `io_stat` fields.
const IO_STAT: [&str; 4] = ["failed_reads", "failed_writes", "invalid_io", "notify_free"];
/// zram's `bd_stat` fields (pages).
const BD_STAT: [&str; 3] = ["bd_count", "bd_reads", "bd_writes"];

/// One device's figures: per attribute, its fields and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// `ublkbN`.
    pub device: String,
    /// Whether its daemon answered.
    pub live: bool,
    /// The device's size in bytes (0 when its daemon is gone).
    pub disksize: u64,
    /// (attribute, [(field, value)]) in the order above; an attribute that could not be read
    /// is left out.
    pub groups: Vec<(&'static str, Vec<(String, u64)>)>,
}

/// The values of a positional attribute, by the names given (numbers that do not parse, and
/// fields past the names, are left out).
fn positional(names: &[&str], text: &str) -> Vec<(String, u64)> {
    names
        .iter()
        .zip(text.split_whitespace())
        .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
        .collect()
}

/// The values of a `key value` per line attribute; lines whose value is not a number (such as
/// `budget_left_bytes off`) are left out.
fn keyed(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (k, v) = (f.next()?, f.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// How an attribute's text becomes its fields.
type Parse = fn(&str) -> Vec<(String, u64)>;

/// Parses what each attribute said (`None`: not read) into a device's figures.
pub fn figures(row: &DeviceRow, read: impl Fn(&str) -> Option<String>) -> Figures {
    let mut groups = Vec::new();
    if row.live {
        let attrs: [(&'static str, Parse); 5] = [
            ("mm_stat", |t| positional(&MM_STAT, t)),
            ("io_stat", |t| positional(&IO_STAT, t)),
            ("bd_stat", |t| positional(&BD_STAT, t)),
            ("policy_stat", keyed),
            ("uzram_stat", keyed),
        ];
        for (name, parse) in attrs {
            if let Some(text) = read(name) {
                groups.push((name, parse(&text)));
            }
        }
    }
    Figures {
        device: row.name.trim_start_matches("/dev/").to_string(),
        live: row.live,
        disksize: if row.live { row.disksize } else { 0 },
        groups,
    }
}

/// Every device's figures, read from the daemons now.
pub fn collect() -> Vec<Figures> {
    ctl::devices()
        .iter()
        .map(|row| {
            let id = ctl::parse_device(&row.name).ok();
            figures(row, |attr| ctl::attr(id?, attr, None).ok())
        })
        .collect()
}

/// A family's Prometheus name: `uzram_ATTR_FIELD` (`uzram_stat_FIELD` for uzram's own), with
/// anything but letters, digits and `_` as `_`.
fn family(attr: &str, field: &str) -> String {
    let prefix = if attr == "uzram_stat" {
        "uzram_stat".to_string()
    } else {
        format!("uzram_{attr}")
    };
    format!("{prefix}_{field}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Whether a field only ever grows (a counter), is a level (a gauge), or uzram does not say.
fn kind(attr: &str, field: &str) -> &'static str {
    match (attr, field) {
        ("io_stat", _)
        | ("mm_stat", "pages_compacted" | "huge_pages_since")
        | ("bd_stat", "bd_reads" | "bd_writes") => "counter",
        ("mm_stat" | "bd_stat", _) => "gauge",
        _ => "untyped",
    }
}

/// Prometheus' text format: `uzram_up` and `uzram_disksize_bytes` per device, then one family
/// per attribute field, each with its `# HELP` and `# TYPE` once and a sample per device that
/// has it (labelled `device="ublkbN"`).
pub fn prometheus(devs: &[Figures]) -> String {
    let mut out = String::new();
    let head = |out: &mut String, name: &str, help: &str, kind: &str| {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    };
    head(
        &mut out,
        "uzram_up",
        "Whether the device's daemon answers (1) or is gone (0).",
        "gauge",
    );
    for d in devs {
        let _ = writeln!(
            out,
            "uzram_up{{device=\"{}\"}} {}",
            d.device,
            u8::from(d.live)
        );
    }
    head(
        &mut out,
        "uzram_disksize_bytes",
        "The device's size.",
        "gauge",
    );
    for d in devs.iter().filter(|d| d.live) {
        let _ = writeln!(
            out,
            "uzram_disksize_bytes{{device=\"{}\"}} {}",
            d.device, d.disksize
        );
    }
    // Families in the order they first appear, each with all its samples together.
    let mut families: Vec<(&str, &str)> = Vec::new();
    for d in devs {
        for (attr, fields) in &d.groups {
            for (field, _) in fields {
                if !families.iter().any(|&(a, f)| a == *attr && f == field) {
                    families.push((attr, field));
                }
            }
        }
    }
    for (attr, field) in families {
        let name = family(attr, field);
        head(
            &mut out,
            &name,
            &format!("{field} of the device's {attr} (uzram attr DEV {attr})."),
            kind(attr, field),
        );
        for d in devs {
            let value = d
                .groups
                .iter()
                .filter(|(a, _)| *a == attr)
                .flat_map(|(_, f)| f.iter())
                .find(|(f, _)| f == field);
            if let Some((_, v)) = value {
                let _ = writeln!(out, "{name}{{device=\"{}\"}} {v}", d.device);
            }
        }
    }
    out
}

/// The same figures as JSON: `{"devices": [{"device": "ublkb0", "live": true, "disksize":
/// N, "mm_stat": {"orig_data_size": N, ...}, ...}]}`.
pub fn json(devs: &[Figures]) -> String {
    let mut out = String::from("{\"devices\": [");
    for (i, d) in devs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(
            out,
            "{{\"device\": {}, \"live\": {}, \"disksize\": {}",
            json_string(&d.device),
            d.live,
            d.disksize
        );
        for (attr, fields) in &d.groups {
            let _ = write!(out, ", {}: {{", json_string(attr));
            for (j, (f, v)) in fields.iter().enumerate() {
                let sep = if j > 0 { ", " } else { "" };
                let _ = write!(out, "{sep}{}: {v}", json_string(f));
            }
            out.push('}');
        }
        out.push('}');
    }
    out.push_str("]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, live: bool) -> DeviceRow {
        DeviceRow {
            live,
            disksize: 1 << 30,
            ..DeviceRow::dead(name.to_string())
        }
    }

    fn read(attr: &str) -> Option<String> {
        match attr {
            "mm_stat" => Some("  4096  100  8192  0  8192  1  2  0  0\n".into()),
            "io_stat" => Some("0 3 0 7\n".into()),
            "policy_stat" => Some("ticks 5\nevictions 2\nbudget_left_bytes off\n".into()),
            "uzram_stat" => Some("daemon_rss 123\nlast_restart none\n".into()),
            // No bd_stat: left out.
            _ => None,
        }
    }

    #[test]
    fn every_numeric_field_is_a_family_with_one_sample_per_device() {
        let devs = [
            figures(&row("/dev/ublkb0", true), read),
            figures(&row("/dev/ublkb1", true), read),
            figures(&row("/dev/ublkb2", false), read),
        ];
        let text = prometheus(&devs);
        for line in [
            "uzram_up{device=\"ublkb0\"} 1",
            "uzram_up{device=\"ublkb2\"} 0",
            "uzram_disksize_bytes{device=\"ublkb1\"} 1073741824",
            "# TYPE uzram_mm_stat_orig_data_size gauge",
            "uzram_mm_stat_orig_data_size{device=\"ublkb0\"} 4096",
            "uzram_mm_stat_huge_pages_since{device=\"ublkb1\"} 0",
            "# TYPE uzram_io_stat_failed_writes counter",
            "uzram_io_stat_notify_free{device=\"ublkb1\"} 7",
            "# TYPE uzram_policy_stat_evictions untyped",
            "uzram_policy_stat_evictions{device=\"ublkb0\"} 2",
            "uzram_stat_daemon_rss{device=\"ublkb0\"} 123",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
        // Words are not numbers; a dead device has no figures; no family twice.
        assert!(!text.contains("budget_left") && !text.contains("last_restart"));
        assert!(!text.contains("disksize_bytes{device=\"ublkb2\"}"));
        assert!(!text.contains("bd_stat"));
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut unique = types.clone();
        unique.dedup();
        assert_eq!(types.len(), unique.len());
        assert_eq!(types.len(), 2 + 9 + 4 + 2 + 1);
        // A family's samples follow its TYPE line, together.
        let i = text.find("# TYPE uzram_io_stat_failed_reads").unwrap();
        let block: Vec<&str> = text[i..].lines().skip(1).take(3).collect();
        assert!(block[0].starts_with("uzram_io_stat_failed_reads{device=\"ublkb0\"}"));
        assert!(block[1].starts_with("uzram_io_stat_failed_reads{device=\"ublkb1\"}"));
        assert!(block[2].starts_with("# HELP"));
    }

    #[test]
    fn json_holds_the_same_figures() {
        let devs = [
            figures(&row("/dev/ublkb0", true), read),
            figures(&row("/dev/ublkb2", false), read),
        ];
        let text = json(&devs);
        assert!(text.starts_with("{\"devices\": [{\"device\": \"ublkb0\", \"live\": true, \"disksize\": 1073741824, \"mm_stat\": {\"orig_data_size\": 4096, \"compr_data_size\": 100,"), "{text}");
        assert!(
            text.contains("\"policy_stat\": {\"ticks\": 5, \"evictions\": 2}"),
            "{text}"
        );
        assert!(
            text.ends_with("{\"device\": \"ublkb2\", \"live\": false, \"disksize\": 0}]}\n"),
            "{text}"
        );
    }

    #[test]
    fn fields_that_are_not_numbers_are_left_out() {
        assert_eq!(
            positional(&IO_STAT, "1 x 3"),
            vec![("failed_reads".into(), 1), ("invalid_io".into(), 3)]
        );
        assert_eq!(
            keyed("a 1\nb\nc -1\nd 4 extra\n"),
            vec![("a".into(), 1), ("d".into(), 4)]
        );
    }
}
