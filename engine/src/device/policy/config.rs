//! The policy's settings (uzram's `policy` attribute) and the host's memory figures it reacts
//! to.

use std::fmt;

use crate::Error;

/// The policy's settings: uzram's `policy` attribute, `key=value` separated by spaces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyConfig {
    /// Recompress pages idle this many seconds (`recompress_after`; `off`: never). Needs a
    /// secondary algorithm.
    pub recompress_after: Option<u32>,
    /// Write back pages idle this many seconds (`writeback_after`; `off`: never). Needs a
    /// backing device.
    pub writeback_after: Option<u32>,
    /// Percent of `mem_limit` above which cold pages are written back (`high_watermark`).
    pub high_watermark: u8,
    /// Percent of `mem_limit` the pool is brought back under (`low_watermark`).
    pub low_watermark: u8,
    /// Host pressure: `MemAvailable` under this percent of `MemTotal` (`min_free`; 0: off).
    pub min_free: u8,
    /// Host pressure: memory PSI `some avg10` at or above this (`psi`; `off`).
    pub psi: Option<f32>,
    /// Percent of `MemTotal` the pool keeps under host pressure (`pool_share`, as zswap's
    /// `max_pool_percent`; 0: none). The default, 70, is what the starved-build benchmark
    /// favours (20, zswap's default, wrote 2.6x the disk bytes; 90 let the locked pool grow
    /// until the kernel OOM-killed the workload in a 462 MiB guest; see docs/benchmarks.md).
    /// Above it, host pressure writes back the coldest pages down to 90 % of the share, or,
    /// while spill is on with a ceiling, only what is past the ceiling (the share and a
    /// sixteenth); below that, only pages idle for the adaptive cold age, and never below
    /// half the share.
    pub pool_share: u8,
    /// Percent of `pool_share` down to which host pressure also writes back pages idle for the
    /// adaptive cold age while the pool is within its share (`share_floor`; 100: never, only
    /// what is above the share goes).
    pub share_floor: u8,
    /// Bytes per day the policy and eviction may write (`budget`; `off`: no budget).
    pub budget: Option<u64>,
    /// Evict cold pages instead of failing a write that finds no room (`evict`, 1/0).
    pub evict: bool,
    /// Under host pressure with the pool at 90 % of its share, store what swap writes next
    /// straight through to the backing store, as zram + disk swap spills to the disk
    /// (`spill`, 1/0): the kernel swaps out its coldest pages, so a page arriving when the pool
    /// is full is colder than the ones the pool holds.
    pub spill: bool,
    /// Keep the record of a page swap read back from the backing store and freed, so that the
    /// page's next swap-out, unchanged, takes it over instead of writing the page again
    /// (`reuse`, 1/0; see the engine's `writeback::reuse`).
    pub reuse: bool,
    /// Bring a written-back page back into the pool when it is read a second time since its
    /// writeback sooner than the pool's coldest pages have gone untouched (`promote`, 1/0): a
    /// page the kernel keeps reading from the backing store is hotter than what the pool holds.
    pub promote: bool,
    /// When idle pages are recompressed (by this policy or zram's `recompress type=idle`),
    /// compress runs of neighbouring idle pages together, up to this many pages a group
    /// (`groups`, 4..=16; `off`). A read of a grouped page decompresses its whole group. None
    /// are made on a device with a backing store (writeback and eviction can take grouped
    /// pages, each compressed alone, but on the starved build that is not yet better).
    pub groups: Option<u8>,
}

impl Default for PolicyConfig {
    fn default() -> PolicyConfig {
        PolicyConfig {
            recompress_after: Some(10 * 60),
            writeback_after: Some(60 * 60),
            high_watermark: 90,
            low_watermark: 80,
            min_free: 5,
            psi: Some(20.0),
            pool_share: 70,
            share_floor: 50,
            budget: None,
            evict: true,
            spill: true,
            reuse: true,
            promote: true,
            groups: Some(16),
        }
    }
}

fn duration_text(secs: Option<u32>) -> String {
    match secs {
        None => "off".into(),
        Some(s) if s > 0 && s % 86400 == 0 => format!("{}d", s / 86400),
        Some(s) if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        Some(s) if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        Some(s) => format!("{s}s"),
    }
}

fn parse_duration(v: &str) -> Result<Option<u32>, &'static str> {
    const FORM: &str = "a duration: 600, 10m, 2h, 1d or off";
    if v == "off" {
        return Ok(None);
    }
    let (num, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => v.split_at(i),
        None => (v, "s"),
    };
    let mul = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(FORM),
    };
    if num.is_empty() {
        return Err(FORM);
    }
    // Only digits: the one way left for the parse or the product to fail is too large a number.
    const TOO_LONG: &str = "too long a duration: at most 4294967295 s (49710d)";
    let n: u32 = num.parse().map_err(|_| TOO_LONG)?;
    n.checked_mul(mul).map(Some).ok_or(TOO_LONG)
}

/// A switch: `1`/`on` or `0`/`off`.
fn on_off(v: &str) -> Option<bool> {
    match v {
        "1" | "on" => Some(true),
        "0" | "off" => Some(false),
        _ => None,
    }
}

impl fmt::Display for PolicyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "recompress_after={} writeback_after={} high_watermark={} low_watermark={} min_free={} psi={} pool_share={} share_floor={} budget={} evict={} spill={} reuse={} promote={} groups={}",
            duration_text(self.recompress_after),
            duration_text(self.writeback_after),
            self.high_watermark,
            self.low_watermark,
            self.min_free,
            self.psi.map_or("off".into(), |p| p.to_string()),
            self.pool_share,
            self.share_floor,
            self.budget.map_or("off".into(), |b| b.to_string()),
            u8::from(self.evict),
            u8::from(self.spill),
            u8::from(self.reuse),
            u8::from(self.promote),
            self.groups.map_or("off".into(), |g| g.to_string()),
        )
    }
}

impl PolicyConfig {
    /// Applies `key=value ...` (any subset of the keys [`PolicyConfig`]'s `Display` prints);
    /// on an error nothing changes. Durations take `s`, `m`, `h`, `d` (seconds without one),
    /// sizes zram's `K`, `M`, `G`; `off` turns a setting off.
    pub fn update(&mut self, text: &str) -> Result<(), Error> {
        let mut next = *self;
        for word in text.split_whitespace() {
            let bad = |why| Error::InvalidRequest {
                text: word.to_string(),
                why,
            };
            let (k, v) = word
                .split_once('=')
                .ok_or(bad("policy settings are key=value"))?;
            if v.contains(',') && v.contains('=') {
                return Err(bad("settings are separated by blanks, not commas"));
            }
            // `90` or `90%`
            let pct = |v: &str| {
                v.strip_suffix('%')
                    .unwrap_or(v)
                    .parse::<u8>()
                    .ok()
                    .filter(|&p| p <= 100)
            };
            match k {
                "recompress_after" => next.recompress_after = parse_duration(v).map_err(bad)?,
                "writeback_after" => next.writeback_after = parse_duration(v).map_err(bad)?,
                "high_watermark" => {
                    next.high_watermark = pct(v).ok_or(bad("a percentage 0..=100"))?
                }
                "low_watermark" => next.low_watermark = pct(v).ok_or(bad("a percentage 0..=100"))?,
                "min_free" => next.min_free = pct(v).ok_or(bad("a percentage 0..=100"))?,
                "pool_share" => next.pool_share = pct(v).ok_or(bad("a percentage 0..=100"))?,
                "share_floor" => next.share_floor = pct(v).ok_or(bad("a percentage 0..=100"))?,
                "psi" => {
                    next.psi = if v == "off" {
                        None
                    } else {
                        Some(
                            v.parse::<f32>()
                                .ok()
                                .filter(|p| (0.0..=100.0).contains(p))
                                .ok_or(bad("psi is 0..=100 (some avg10, percent) or off"))?,
                        )
                    }
                }
                "budget" => {
                    next.budget = if v == "off" || v == "0" {
                        None
                    } else {
                        Some(
                            crate::size::parse_size(v.strip_suffix("/day").unwrap_or(v)).map_err(|e| {
                                bad(match e {
                                    Error::SizeTooLarge { .. } => {
                                        "too large a budget: at most 15E a day, or off"
                                    }
                                    _ => "budget is bytes per day (4G, 512M) or off",
                                })
                            })?,
                        )
                    }
                }
                "evict" => next.evict = on_off(v).ok_or(bad("evict is 1 or 0"))?,
                "spill" => next.spill = on_off(v).ok_or(bad("spill is 1 or 0"))?,
                "reuse" => next.reuse = on_off(v).ok_or(bad("reuse is 1 or 0"))?,
                "promote" => next.promote = on_off(v).ok_or(bad("promote is 1 or 0"))?,
                "groups" => {
                    next.groups = if v == "off" || v == "0" {
                        None
                    } else {
                        Some(
                            v.parse::<u8>()
                                .ok()
                                .filter(|g| (4..=16).contains(g))
                                .ok_or(bad("groups is 4..=16 pages a group, or off"))?,
                        )
                    }
                }
                _ => {
                    return Err(bad(
                        "known settings: recompress_after writeback_after high_watermark low_watermark min_free psi pool_share share_floor budget evict spill reuse promote groups",
                    ))
                }
            }
        }
        if next.low_watermark > next.high_watermark {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why:
                    "low_watermark is above high_watermark (their defaults are 80 and 90: set both)",
            });
        }
        *self = next;
        Ok(())
    }
}

/// The host's memory state, as the policy sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    /// `MemTotal`, bytes (0: unknown).
    pub mem_total: u64,
    /// `MemAvailable`, bytes.
    pub mem_available: u64,
    /// `some avg10` of `/proc/pressure/memory`, where the kernel has PSI.
    pub psi_some_avg10: Option<f32>,
}

impl Pressure {
    /// Reads `/proc/meminfo` and `/proc/pressure/memory` (missing files give zeros / `None`).
    pub fn read() -> Pressure {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let psi = std::fs::read_to_string("/proc/pressure/memory").ok();
        Pressure::parse(&meminfo, psi.as_deref())
    }

    /// Parses the two files' text.
    pub fn parse(meminfo: &str, psi: Option<&str>) -> Pressure {
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        let psi_some_avg10 = psi.and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("some "))?
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("avg10="))?
                .parse()
                .ok()
        });
        Pressure {
            mem_total: field("MemTotal"),
            mem_available: field("MemAvailable"),
            psi_some_avg10,
        }
    }

    /// Whether memory is short enough that swap writes are coming or near: `MemAvailable` under a
    /// third of `MemTotal`, or tasks stalled on memory (PSI `some avg10` at least 1 %). Unknown
    /// figures (no `/proc/meminfo`, no PSI) count as not short.
    pub fn short(&self) -> bool {
        let low = self.mem_total > 0 && self.mem_available.saturating_mul(3) < self.mem_total;
        low || self.psi_some_avg10.is_some_and(|v| v >= 1.0)
    }

    /// The host's swap-outs so far (`pswpout` of `/proc/vmstat`, pages), where it has them: a
    /// count that moves between two reads means swap is writing now, short memory or not (a
    /// machine with much page cache and a high `vm.swappiness` swaps with MemAvailable high,
    /// and a kernel without PSI shows no stalls).
    pub fn swap_outs() -> Option<u64> {
        Pressure::parse_swap_outs(&std::fs::read_to_string("/proc/vmstat").ok()?)
    }

    /// `pswpout` of `/proc/vmstat`'s text.
    pub fn parse_swap_outs(vmstat: &str) -> Option<u64> {
        Pressure::parse_vmstat(vmstat, "pswpout")
    }

    /// The count `field` of `/proc/vmstat`'s text (its name matched whole).
    pub fn parse_vmstat(vmstat: &str, field: &str) -> Option<u64> {
        vmstat
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// No pressure at all (for callers without a host view).
    pub fn none() -> Pressure {
        Pressure::default()
    }
}
