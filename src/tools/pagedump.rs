//! Dump the private anonymous memory of a running process as a file of 4 KiB pages.
//!
//! These are the pages that get swapped, so they are what benchmarks and ratio tests should
//! compress. [`dump_process`] selects the mappings with [`MapsEntry::is_dumpable`] (private,
//! writable, anonymous: heaps, `mmap` arenas, thread stacks, `[anon:name]`), reads them through
//! `/proc/PID/mem`, and by default keeps only the pages `/proc/PID/pagemap` reports as resident or
//! swapped, so reserved but never touched address space does not flood the dump with zeros.
//! The main thread's `[stack]` is left out because it holds the process's environment strings.
//!
//! ```
//! use uzram::tools::pagedump::{dump_process, DumpOptions};
//!
//! let opts = DumpOptions { max_bytes: Some(1 << 20), ..DumpOptions::default() };
//! let mut pages = Vec::new();
//! let stats = dump_process(std::process::id(), &mut pages, &opts)?;
//! assert_eq!(pages.len() as u64, stats.pages_written * 4096);
//! # Ok::<(), uzram::tools::pagedump::DumpError>(())
//! ```
//!
//! Reading another process's memory needs ptrace access to it: root, or the same user with
//! `kernel.yama.ptrace_scope = 0`. The dump assumes 4 KiB base pages (x86_64, most arm64).

use crate::common::output::shown;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use crate::common::maps::{parse_maps_line, MapsEntry, MapsParseError, Perms};

/// Size of one dumped page, and the base page size this module assumes.
pub const PAGE_SIZE: usize = 4096;

/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_ENTRY_LEN: usize = 8;

/// Pages looked up in pagemap and read from mem per call; a run that fails is retried page by page.
const BATCH_PAGES: usize = 64;
// One bit per page of a batch in a u64 mask.
const _: () = assert!(BATCH_PAGES <= u64::BITS as usize);

/// What to dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpOptions {
    /// Stop after this many bytes, rounded down to whole pages; `None` dumps everything.
    pub max_bytes: Option<u64>,
    /// Keep only pages that pagemap reports as resident or swapped out. When pagemap cannot be
    /// read, every readable page is dumped instead.
    pub resident_only: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            max_bytes: None,
            resident_only: true,
        }
    }
}

/// What a dump wrote and skipped, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DumpStats {
    /// Mappings selected by [`MapsEntry::is_dumpable`].
    pub mappings: u64,
    /// Pages written to the output.
    pub pages_written: u64,
    /// Written pages whose bytes are all zero.
    pub zero_pages: u64,
    /// Pages skipped because pagemap says they were never touched.
    pub untouched_pages: u64,
    /// Pages skipped because `/proc/PID/mem` refused them (guard pages, mappings gone meanwhile).
    pub unreadable_pages: u64,
    /// Whether pagemap told untouched pages apart throughout; if not, pages it could not judge
    /// were dumped whether touched or not.
    pub pagemap_used: bool,
    /// Whether `max_bytes` stopped the dump before every selected page was written.
    pub truncated: bool,
}

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// An option's value that asks for nothing sensible.
    #[error("{0}")]
    Usage(String),
    #[error("no process with pid {pid}")]
    NoSuchProcess { pid: u32 },
    #[error("process {pid} has no memory of its own to dump: {why}")]
    NoMemory { pid: u32, why: &'static str },
    #[error(
        "permission denied opening {}: reading another process's memory needs ptrace access, {hint}",
        shown(path)
    )]
    PermissionDenied {
        pid: u32,
        path: PathBuf,
        /// What to do about it: run as root, or (for root) what still refuses it.
        hint: &'static str,
    },
    #[error("cannot read {}", shown(path))]
    ReadProc {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse line {line} of {}", shown(path))]
    ParseMaps {
        path: PathBuf,
        line: usize,
        #[source]
        source: MapsParseError,
    },
    #[error("cannot write the page dump")]
    Write {
        #[source]
        source: io::Error,
    },
    #[error("cannot write the page dump to {}", shown(path))]
    WriteFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Why process `pid`'s maps read empty: it has exited and waits for its parent (a zombie), or
/// it is a kernel thread (`PF_KTHREAD` in the flags of `/proc/PID/stat`).
fn no_memory_why(pid: u32) -> &'static str {
    let stat = fs::read_to_string(proc_path(pid, "stat")).unwrap_or_default();
    // After the command's name, which may hold blanks and parentheses: the state, ppid, pgrp,
    // session, tty and tpgid, then the flags.
    let mut after = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or("")
        .split_whitespace();
    let state = after.next().unwrap_or("");
    let flags: u64 = after.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
    const PF_KTHREAD: u64 = 0x0020_0000;
    if state == "Z" || state == "X" {
        "it has exited (a zombie its parent has not reaped yet)"
    } else if flags & PF_KTHREAD != 0 {
        "it is a kernel thread"
    } else {
        "its maps read empty (it may be exiting)"
    }
}

/// Writes the dumpable pages of process `pid` to `out`, in address order, as raw 4 KiB pages.
///
/// The process keeps running: stop it (SIGSTOP) first for a consistent picture. Pages that
/// cannot be read are skipped, so a mapping that disappears during the dump only shortens it.
pub fn dump_process(
    pid: u32,
    out: &mut impl Write,
    opts: &DumpOptions,
) -> Result<DumpStats, DumpError> {
    let maps_path = proc_path(pid, "maps");
    let maps = fs::read_to_string(&maps_path).map_err(|e| open_error(pid, &maps_path, e))?;
    if maps.is_empty() {
        // A kernel thread's maps read empty, and its mem does not open (ESRCH): say which.
        return Err(DumpError::NoMemory {
            pid,
            why: no_memory_why(pid),
        });
    }
    let mut entries = Vec::new();
    for (i, line) in maps.lines().enumerate() {
        let entry = parse_maps_line(line).map_err(|source| DumpError::ParseMaps {
            path: maps_path.clone(),
            line: i + 1,
            source,
        })?;
        if entry.is_dumpable() {
            entries.push(entry);
        }
    }

    let mem_path = proc_path(pid, "mem");
    let mem = File::open(&mem_path).map_err(|e| open_error(pid, &mem_path, e))?;
    // Present and swapped bits are readable without privileges (only PFNs are hidden), but
    // fall back to dumping every readable page if pagemap is unavailable.
    let pagemap = if opts.resident_only {
        File::open(proc_path(pid, "pagemap")).ok()
    } else {
        None
    };

    let mut dumper = Dumper {
        mem,
        pagemap,
        out,
        pages_left: opts.max_bytes.map(|b| b / PAGE_SIZE as u64),
        buf: vec![0; BATCH_PAGES * PAGE_SIZE],
        pm_buf: vec![0; BATCH_PAGES * PM_ENTRY_LEN],
        stats: DumpStats {
            mappings: entries.len() as u64,
            ..DumpStats::default()
        },
    };
    dumper.stats.pagemap_used = dumper.pagemap.is_some();
    for entry in &entries {
        if dumper.stats.truncated {
            break;
        }
        dumper.dump_mapping(entry)?;
    }
    dumper
        .out
        .flush()
        .map_err(|source| DumpError::Write { source })?;
    Ok(dumper.stats)
}

struct Dumper<'a, W: Write> {
    mem: File,
    pagemap: Option<File>,
    out: &'a mut W,
    /// Remaining page budget from `max_bytes`.
    pages_left: Option<u64>,
    buf: Vec<u8>,
    pm_buf: Vec<u8>,
    stats: DumpStats,
}

impl<W: Write> Dumper<'_, W> {
    fn dump_mapping(&mut self, entry: &MapsEntry) -> Result<(), DumpError> {
        let pages = entry.len_bytes() / PAGE_SIZE as u64;
        let mut done = 0;
        while done < pages && !self.stats.truncated {
            let n = (pages - done).min(BATCH_PAGES as u64) as usize;
            let addr = entry.start + done * PAGE_SIZE as u64;
            let wanted = self.wanted_pages(addr, n);
            let mut i = 0;
            while i < n && !self.stats.truncated {
                if wanted & (1 << i) == 0 {
                    self.stats.untouched_pages += 1;
                    i += 1;
                    continue;
                }
                let run = (i..n).take_while(|&j| wanted & (1 << j) != 0).count();
                self.copy_run(addr + (i * PAGE_SIZE) as u64, run)?;
                i += run;
            }
            done += n as u64;
        }
        Ok(())
    }

    /// Bit i set: page i of the `n` pages at `addr` should be dumped.
    fn wanted_pages(&mut self, addr: u64, n: usize) -> u64 {
        // 1 <= n <= BATCH_PAGES
        let all = u64::MAX >> (u64::BITS as usize - n);
        let Some(pagemap) = &self.pagemap else {
            return all;
        };
        let entries = &mut self.pm_buf[..n * PM_ENTRY_LEN];
        let offset = addr / PAGE_SIZE as u64 * PM_ENTRY_LEN as u64;
        if pagemap.read_exact_at(entries, offset).is_err() {
            self.stats.pagemap_used = false;
            return all;
        }
        entries
            .chunks_exact(PM_ENTRY_LEN)
            .enumerate()
            .fold(0, |mask, (i, e)| {
                let e = u64::from_ne_bytes(e.try_into().expect("chunks of PM_ENTRY_LEN"));
                if e & (PM_PRESENT | PM_SWAPPED) != 0 {
                    mask | 1 << i
                } else {
                    mask
                }
            })
    }

    /// Copies `run` consecutive pages at `addr`, in one read if possible, else page by page.
    fn copy_run(&mut self, addr: u64, mut run: usize) -> Result<(), DumpError> {
        if let Some(left) = self.pages_left {
            if (run as u64) > left {
                self.stats.truncated = true;
                run = left as usize;
            }
        }
        let len = run * PAGE_SIZE;
        if self.mem.read_exact_at(&mut self.buf[..len], addr).is_ok() {
            for page in 0..run {
                self.write_page(page)?;
            }
            return Ok(());
        }
        for page in 0..run {
            let offset = addr + (page * PAGE_SIZE) as u64;
            match self
                .mem
                .read_exact_at(&mut self.buf[page * PAGE_SIZE..][..PAGE_SIZE], offset)
            {
                Ok(()) => self.write_page(page)?,
                Err(_) => self.stats.unreadable_pages += 1,
            }
        }
        Ok(())
    }

    fn write_page(&mut self, index: usize) -> Result<(), DumpError> {
        let page = &self.buf[index * PAGE_SIZE..(index + 1) * PAGE_SIZE];
        self.out
            .write_all(page)
            .map_err(|source| DumpError::Write { source })?;
        self.stats.pages_written += 1;
        if page.iter().all(|&b| b == 0) {
            self.stats.zero_pages += 1;
        }
        if let Some(left) = &mut self.pages_left {
            *left -= 1;
        }
        Ok(())
    }
}

/// Whether this process runs as root: /proc/self belongs to its effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn proc_path(pid: u32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

fn open_error(pid: u32, path: &Path, source: io::Error) -> DumpError {
    match source.kind() {
        io::ErrorKind::NotFound => DumpError::NoSuchProcess { pid },
        io::ErrorKind::PermissionDenied => DumpError::PermissionDenied {
            pid,
            path: path.to_owned(),
            hint: if running_as_root() {
                "which even root lacks here (kernel.yama.ptrace_scope = 3, or a lockdown)"
            } else {
                "run as root"
            },
        },
        _ => DumpError::ReadProc {
            path: path.to_owned(),
            source,
        },
    }
}

/// Write a process's private anonymous memory (heap and anonymous mappings, not the stack) to a
/// file of 4 KiB pages, for benchmarks and ratio tests
#[derive(Debug, Clone, clap::Args)]
pub struct DumpPagesArgs {
    /// Process to dump (needs ptrace access: run as root)
    #[arg(long, allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<u32>(1, i32::MAX.into()))]
    pub pid: u32,
    /// File to write the pages to: written beside it under a temporary name and renamed over
    /// it once the dump is complete (a regular file, or a new name)
    #[arg(long, short)]
    pub output: PathBuf,
    /// Stop after this many MiB
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = crate::common::options::whole_in::<u64>(0, u64::MAX.into()))]
    pub max_mib: Option<u64>,
    /// Also dump pages that were never touched (by default pagemap filters them out)
    #[arg(long)]
    pub all_pages: bool,
}

/// Runs `uzram dump-pages` and prints a one-line summary to stderr. The output appears only
/// once complete; on failure what was there before is left as it was.
pub fn run(args: &DumpPagesArgs) -> Result<(), DumpError> {
    if args.output.as_os_str() == "-" {
        return Err(DumpError::Usage(
            "-o -: a dump is written to a file, not to standard output (name a file; ./- for one named -)"
                .into(),
        ));
    }
    if args.max_mib == Some(0) {
        return Err(DumpError::Usage(
            "--max-mib 0: a dump of nothing (give at least 1, or leave it out for no limit)".into(),
        ));
    }
    let opts = DumpOptions {
        max_bytes: args.max_mib.map(|mib| mib.saturating_mul(1 << 20)),
        resident_only: !args.all_pages,
    };
    let fail = |source| DumpError::WriteFile {
        path: args.output.clone(),
        source,
    };
    let mut out = crate::common::output::Replacing::new(&args.output).map_err(fail)?;
    let stats = dump_process(args.pid, &mut out, &opts).map_err(|e| match e {
        DumpError::Write { source } => fail(source),
        e => e,
    })?;
    // Only a complete dump takes the output's name; a failed one leaves whatever was there.
    out.commit().map_err(fail)?;
    crate::common::output::warn(format_args!(
        "pid {}: wrote {} pages ({} MiB, {} zero) from {} mappings to {}; skipped {} untouched, \
         {} unreadable{}{}",
        args.pid,
        stats.pages_written,
        (stats.pages_written * PAGE_SIZE as u64) >> 20,
        stats.zero_pages,
        stats.mappings,
        shown(&args.output),
        stats.untouched_pages,
        stats.unreadable_pages,
        if stats.pagemap_used {
            ""
        } else {
            "; pagemap unavailable, untouched pages included"
        },
        if stats.truncated {
            "; stopped at --max-mib"
        } else {
            ""
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_sentences_without_repeating_the_source() {
        let e = DumpError::ParseMaps {
            path: "/proc/1/maps".into(),
            line: 3,
            source: MapsParseError::MissingField { field: "perms" },
        };
        assert_eq!(e.to_string(), "cannot parse line 3 of /proc/1/maps");
        let e = DumpError::PermissionDenied {
            pid: 7,
            path: "/proc/7/mem".into(),
            hint: "run as root",
        };
        assert!(e.to_string().contains("run as root"), "{e}");
    }

    #[test]
    fn own_process_dump_respects_max_bytes() {
        // Reading /proc/self/mem needs no privilege.
        let opts = DumpOptions {
            max_bytes: Some(10 * PAGE_SIZE as u64 + 100),
            resident_only: true,
        };
        let mut out = Vec::new();
        let stats = dump_process(std::process::id(), &mut out, &opts).unwrap();
        assert_eq!(stats.pages_written, 10);
        assert!(stats.truncated);
        assert_eq!(out.len(), 10 * PAGE_SIZE);
        assert!(stats.mappings > 0);
    }

    #[test]
    fn own_process_dump_finds_a_heap_pattern() {
        // Built at run time so the only copies are in writable anonymous memory.
        let marker: Vec<u8> = b"UZRAM-SELF-DUMP-MARKER-"
            .iter()
            .map(|b| b ^ 0x20)
            .collect();
        let mut out = Vec::new();
        let stats = dump_process(std::process::id(), &mut out, &DumpOptions::default()).unwrap();
        assert_eq!(out.len() as u64, stats.pages_written * PAGE_SIZE as u64);
        assert!(out.windows(marker.len()).any(|w| w == marker.as_slice()));
    }
}
