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
}

impl CodecArgs {
    /// Sets the algorithm and then its parameters, as writing zram's two attributes would.
    pub fn apply(&self, setup: &mut DeviceSetup) -> Result<(), Error> {
        setup.set_comp_algorithm(&self.algorithm)?;
        if let Some(p) = &self.algorithm_params {
            setup.set_algorithm_params(p)?;
        }
        Ok(())
    }
}
