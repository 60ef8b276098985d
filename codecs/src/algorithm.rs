//! The compression algorithms, named as zram names them in `comp_algorithm`.

use std::fmt;
use std::str::FromStr;

/// A compression algorithm, spelled as in zram's `comp_algorithm` attribute.
///
/// Only the algorithms this crate implements are listed; zram knows more (`lzo`, `lzo-rle`,
/// `lz4hc`, `deflate`, `842`), and asking for one of them is an [`UnknownAlgorithm`] error that
/// lists what is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "testing", derive(arbitrary::Arbitrary))]
#[non_exhaustive]
pub enum Algorithm {
    /// LZ4 block format (no frame, no size header), as the kernel's `lz4` backend writes it,
    /// through `lz4_flex`.
    Lz4,
    /// Zstandard frames through libzstd (the `zstd` crate).
    Zstd,
}

impl Algorithm {
    /// Every algorithm this crate implements, in the order zram lists them.
    pub const ALL: &'static [Algorithm] = &[Algorithm::Lz4, Algorithm::Zstd];

    /// The name zram uses: `lz4`, `zstd`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "lz4",
            Algorithm::Zstd => "zstd",
        }
    }

    /// The level used when `level=` is not given: zstd's default 3; for lz4 the acceleration 1
    /// that the kernel uses (and that lz4_flex always uses, see [`Algorithm::level_range`]).
    pub fn default_level(self) -> i32 {
        match self {
            Algorithm::Lz4 => 1,
            Algorithm::Zstd => zstd::zstd_safe::CLEVEL_DEFAULT,
        }
    }

    /// The levels this algorithm accepts, or `None` if it accepts any `i32`.
    ///
    /// zstd: from `ZSTD_minCLevel()` (negative levels trade ratio for speed) to
    /// `ZSTD_maxCLevel()`; 0 means zstd's default. lz4: `None`. The kernel treats an lz4 level as
    /// the acceleration of `LZ4_compress_fast()` and clamps it, so every value is accepted for
    /// compatibility, but lz4_flex's block API has no acceleration knob: the level is recorded
    /// and has no effect (lz4_flex compresses like LZ4 at acceleration 1).
    pub fn level_range(self) -> Option<std::ops::RangeInclusive<i32>> {
        match self {
            Algorithm::Lz4 => None,
            Algorithm::Zstd => {
                Some(zstd::zstd_safe::min_c_level()..=zstd::zstd_safe::max_c_level())
            }
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// Parses a name exactly as zram spells it (case-sensitive, like the kernel's `strcmp`).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|algorithm| algorithm.name() == name)
            .ok_or_else(|| UnknownAlgorithm {
                name: name.to_owned(),
            })
    }
}

/// A compression algorithm name this crate does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown compression algorithm {name:?}: available: {}",
    AvailableNames
)]
pub struct UnknownAlgorithm {
    /// The name that was asked for.
    pub name: String,
}

/// Formats [`Algorithm::ALL`] as zram's `comp_algorithm` does: names separated by spaces.
struct AvailableNames;

impl fmt::Display for AvailableNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, algorithm) in Algorithm::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(algorithm.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_their_algorithm() {
        for &algorithm in Algorithm::ALL {
            assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
            assert_eq!(algorithm.to_string(), algorithm.name());
        }
    }

    #[test]
    fn unknown_algorithm_message_lists_available_names() {
        let err = "lzo".parse::<Algorithm>().unwrap_err();
        assert_eq!(err.name, "lzo");
        assert_eq!(
            err.to_string(),
            r#"unknown compression algorithm "lzo": available: lz4 zstd"#
        );
    }

    #[test]
    fn names_are_case_sensitive_like_the_kernel() {
        assert!("LZ4".parse::<Algorithm>().is_err());
        assert!(" zstd".parse::<Algorithm>().is_err());
    }

    #[test]
    fn zstd_levels_include_negative_ones() {
        let range = Algorithm::Zstd.level_range().unwrap();
        assert!(*range.start() < 0);
        assert!(*range.end() >= 19);
        assert!(range.contains(&Algorithm::Zstd.default_level()));
        assert_eq!(Algorithm::Lz4.level_range(), None);
    }
}
