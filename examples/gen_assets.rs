//! The package's generated files, from the command line's own definition: `uzram(8)` and a page
//! per subcommand (`uzram-setup(8)`, ...), and completions for bash, zsh and fish.
//!
//! `cargo run --example gen_assets -- DIR` writes `DIR/man/*.8` and `DIR/completions/`
//! (`uzram.bash`, `_uzram`, `uzram.fish`); `packaging/deb` runs it before `cargo deb`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;
use uzram::cli::Cli;

/// Renders `cmd`'s page in section 8 to `dir/NAME.8`.
fn man_page(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .section("8")
        .manual("uzram")
        .render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.8")), page)
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let cmd = Cli::command();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("uzram-{}", sub.get_name());
        let bin = format!("uzram {}", sub.get_name());
        man_page(sub.clone().display_name(name).bin_name(bin), &man)?;
    }
    man_page(cmd.clone(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "uzram", &completions)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: gen_assets DIR");
        return ExitCode::FAILURE;
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_assets: writing under {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
