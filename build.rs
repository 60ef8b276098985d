//! Builds the daemon's eBPF program (`src/daemon/slotfree.bpf.c`, the slot-free probe) with
//! clang, for the `ublk` feature only: `cargo test --workspace` needs no clang.
//!
//! Needs clang and libbpf's headers (Debian: `apt install clang libbpf-dev`); `CLANG` names
//! another compiler.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/daemon/slotfree.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");
    if std::env::var_os("CARGO_FEATURE_UBLK").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // libbpf's name for the architecture (its pt_regs layout), and Debian's include directory
    // for the kernel's asm headers.
    let (bpf_arch, multiarch) = match arch.as_str() {
        "x86_64" => ("x86", "x86_64-linux-gnu"),
        "aarch64" => ("arm64", "aarch64-linux-gnu"),
        "riscv64" => ("riscv", "riscv64-linux-gnu"),
        "powerpc64" => ("powerpc", "powerpc64le-linux-gnu"),
        "s390x" => ("s390", "s390x-linux-gnu"),
        other => {
            println!("cargo:warning=no eBPF target for {other}: the slot-free probe is left out");
            std::fs::write(out.join("slotfree.bpf.o"), []).expect("write OUT_DIR");
            return;
        }
    };
    // The kernel runs the program in the machine's byte order.
    let target = match std::env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() {
        Ok("big") => "bpfeb",
        _ => "bpfel",
    };
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args(["-target", target])
        .args(["-O2", "-g", "-mcpu=v3", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{bpf_arch}"))
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", SOURCE, "-o"])
        .arg(out.join("slotfree.bpf.o"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{clang} could not compile {SOURCE} ({s}): the ublk feature needs clang and \
             libbpf's headers (Debian: apt install clang libbpf-dev)"
        ),
        Err(e) => panic!(
            "cannot run {clang} ({e}): the ublk feature compiles {SOURCE} with clang \
             (Debian: apt install clang libbpf-dev; CLANG=/path/to/clang for another)"
        ),
    }
}
