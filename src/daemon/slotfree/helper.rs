//! The slot-free probe's helper (`uzram-probe PAGES PROTOCOL`, cargo feature `ublk`): the only
//! code that talks to aya, linked into the helper alone.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};

use aya::maps::Map;
use aya::programs::links::FdLink;
use aya::programs::FEntry;
use aya::{Btf, EbpfLoader};
use uzram_engine::FreedPages;

use super::{map_words, HELPER, PROTOCOL};

/// The program build.rs compiled (aligned, as the ELF reader wants).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/slotfree.bpf.o"));

/// Loads and attaches the program for `pages` pages, says "ok PROTOCOL LINK MAP" (the
/// descriptors the daemon takes) or "error WHY" on stdout, and holds them until stdin
/// closes. The exit
/// status: 0 when the daemon was answered "ok", 1 otherwise.
pub fn run(args: &[String]) -> std::process::ExitCode {
    let pages = match args {
        [p, protocol] if protocol == PROTOCOL => p.parse::<u64>().ok().filter(|&p| p > 0),
        [_, protocol] => {
            let _ = writeln!(
                std::io::stdout(),
                "error {HELPER} speaks {PROTOCOL}, not {protocol}: it is from another uzram"
            );
            return std::process::ExitCode::FAILURE;
        }
        _ => None,
    };
    let Some(pages) = pages else {
        let _ = writeln!(
            std::io::stdout(),
            "error usage: {HELPER} PAGES {PROTOCOL} (run by uzram serve, not by hand)"
        );
        return std::process::ExitCode::FAILURE;
    };
    match load(pages) {
        Ok((ebpf, link, map)) => {
            let said = writeln!(std::io::stdout(), "ok {PROTOCOL} {link} {map}")
                .and_then(|()| std::io::stdout().flush());
            // Held until the daemon has taken the descriptors and closed the pipe.
            let mut rest = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut rest);
            drop(ebpf);
            if said.is_ok() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(why) => {
            let why = why.replace('\n', " ");
            let _ = writeln!(std::io::stdout(), "error {why}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The loaded program (holding its attachment), and the descriptor numbers of the
/// attachment and of the map.
fn load(pages: u64) -> Result<(aya::Ebpf, i32, i32), String> {
    if OBJECT.is_empty() {
        return Err("built without an eBPF target for this architecture".into());
    }
    let file = std::fs::File::open("/proc/kallsyms").map_err(|e| format!("/proc/kallsyms: {e}"))?;
    let hook = super::running_kernel_hook()?;
    let (probed, program_name) = (hook.function, hook.program);
    let (swap_info, found) = super::kallsyms(std::io::BufReader::new(file), probed)?;
    if !found {
        return Err(format!("this kernel has no {probed}{}", hook.absent_when));
    }
    let entries =
        u32::try_from(map_words(pages)).map_err(|_| format!("{pages} pages is too many"))?;
    let summary = FreedPages::summary_words(pages) as u64;
    let mut ebpf = EbpfLoader::new()
        .override_global("swap_info_addr", &swap_info, true)
        .override_global("device_pages", &pages, true)
        .override_global("summary_words", &summary, true)
        .map_max_entries("marks", entries)
        .load(OBJECT)
        .map_err(|e| format!("loading the eBPF program: {}", first_lines(&e.to_string())))?;
    let btf = Btf::from_sys_fs().map_err(|e| format!("the kernel's BTF: {e}"))?;
    let program: &mut FEntry = ebpf
        .program_mut(program_name)
        .ok_or_else(|| format!("the eBPF object has no program {program_name}"))?
        .try_into()
        .map_err(|e| format!("{program_name}: {e}"))?;
    // Checked against the function's BTF: a kernel whose function takes other arguments
    // refuses the program.
    program.load(probed, &btf).map_err(|e| {
        format!(
            "the kernel refused the eBPF program on {probed}: {}",
            first_lines(&e.to_string())
        )
    })?;
    let id = program
        .attach()
        .map_err(|e| format!("attaching to {probed}: {e}"))?;
    // The attachment, for the daemon to take: a BPF link. Left open here (aya has no
    // accessor for its number: it is this process's one BPF link), closed when this
    // process exits.
    let link: FdLink = program
        .take_link(id)
        .map_err(|e| format!("attaching to {probed}: {e}"))?
        .into();
    std::mem::forget(link);
    let link_fd = bpf_link_fd()?;
    let map_fd = match ebpf.map("marks") {
        Some(Map::Array(data)) => data.fd().as_fd().as_raw_fd(),
        _ => return Err("the eBPF object has no array map \"marks\"".into()),
    };
    Ok((ebpf, link_fd, map_fd))
}

/// This process's one BPF link descriptor.
fn bpf_link_fd() -> Result<i32, String> {
    let fds = std::fs::read_dir("/proc/self/fd").map_err(|e| format!("/proc/self/fd: {e}"))?;
    let links: Vec<i32> = fds
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link")
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    match links[..] {
        [fd] => Ok(fd),
        _ => Err(format!("{} BPF links where one was made", links.len())),
    }
}

/// The first lines of a long message (a verifier log).
fn first_lines(text: &str) -> String {
    text.lines().take(4).collect::<Vec<_>>().join(" / ")
}
