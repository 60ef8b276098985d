//! Command-line pieces shared by the subcommands.

use crate::{DeviceSetup, Error};

/// The compression options every subcommand that makes a device takes, with zram's names.
#[derive(Debug, Clone, clap::Args)]
pub struct CodecArgs {
    /// Compression algorithm, by zram's name (comp_algorithm)
    #[arg(long, default_value = "lz4")]
    pub algorithm: String,
    /// zram's algorithm_params for it, e.g. "level=3" or "dict=/path/to/dict"
    #[arg(long, value_name = "PARAMS")]
    pub algorithm_params: Option<String>,
    /// zram's recomp_algorithm: a secondary algorithm for recompression, e.g.
    /// "algo=zstd priority=1 level=9" (repeat for priorities 2 and 3)
    #[arg(long, value_name = "SPEC")]
    pub recomp_algorithm: Vec<String>,
    /// zram's backing_dev: a file (created 0600, sized to the device if empty) or a block device
    /// that writeback and eviction move pages to, compressed and encrypted; repeat to stripe
    /// over several (e.g. on two disks)
    #[arg(long, value_name = "FILE")]
    pub backing_dev: Vec<std::path::PathBuf>,
    /// The tiering policy, uzram's `policy` attribute: "key=value ..." of recompress_after,
    /// writeback_after, high_watermark, low_watermark, min_free, psi, budget, evict
    #[arg(long, value_name = "SETTINGS")]
    pub policy: Option<String>,
}

impl CodecArgs {
    /// Sets the algorithm, the recompression algorithms, then the parameters, as writing zram's
    /// attributes in that order would.
    pub fn apply(&self, setup: &mut DeviceSetup) -> Result<(), Error> {
        setup.set_comp_algorithm(&self.algorithm)?;
        // Secondary algorithms first: algorithm_params may name one by priority.
        for r in &self.recomp_algorithm {
            setup.set_recomp_algorithm(r)?;
        }
        if let Some(p) = &self.algorithm_params {
            setup.set_algorithm_params(p)?;
        }
        for b in &self.backing_dev {
            setup.add_backing_dev(b);
        }
        if let Some(p) = &self.policy {
            setup.set_policy(p)?;
        }
        Ok(())
    }
}
