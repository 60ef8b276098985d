//! Codec parameters, and zram's `algorithm_params` attribute that sets them.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::algorithm::{Algorithm, UnknownAlgorithm};

/// zram's `ZRAM_MAX_COMPS`: one primary algorithm (priority 0) and up to three for recompression.
pub const MAX_COMPS: usize = 4;

/// The largest dictionary file [`read_dictionary`] accepts. zstd dictionaries are typically
/// 16 to 112 KiB; lz4 uses only the last 64 KiB of one.
pub const MAX_DICT_LEN: usize = 16 << 20;

/// What a [`Codec`](crate::Codec) is built with, besides its [`Algorithm`].
///
/// Cheap to clone: the dictionary is shared.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodecParams {
    /// The compression level; `None` for [`Algorithm::default_level`]. See
    /// [`Algorithm::level_range`] for what each algorithm accepts and does with it.
    pub level: Option<i32>,
    /// A pre-trained dictionary (see [`train_dictionary`](crate::train_dictionary)), or raw
    /// content to use as history. Pages compressed with a dictionary decompress only with the
    /// same dictionary.
    pub dict: Option<Arc<[u8]>>,
}

impl CodecParams {
    /// These parameters with `level` set.
    pub fn with_level(mut self, level: i32) -> Self {
        self.level = Some(level);
        self
    }

    /// These parameters with `dict` set.
    pub fn with_dict(mut self, dict: impl Into<Arc<[u8]>>) -> Self {
        self.dict = Some(dict.into());
        self
    }
}

impl fmt::Debug for CodecParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodecParams")
            .field("level", &self.level)
            .field("dict_len", &self.dict.as_ref().map(|dict| dict.len()))
            .finish()
    }
}

/// The parsed value of zram's `algorithm_params` attribute:
/// `[algo=NAME | priority=N] [level=N] [dict=PATH]`.
///
/// Parameters are `key=value` pairs separated by whitespace; a value may be double-quoted to
/// hold spaces (`dict="/var/lib/my dict"`). A repeated key overrides the earlier one, as in the
/// kernel. Unlike the kernel, which skips keys it does not know, an unknown key is an error.
/// Parsing does no I/O; [`AlgorithmParams::load_codec_params`] reads the dictionary.
///
/// `algo` and `priority` pick which of the device's algorithms the parameters are for; the
/// kernel looks `algo` up among the configured algorithms and lets it override `priority`.
/// Both are left to the engine.
///
/// ```
/// use uzram_codecs::{Algorithm, AlgorithmParams};
///
/// let params: AlgorithmParams = "algo=zstd level=-3 dict=/etc/uzram/dict".parse().unwrap();
/// assert_eq!(params.algo, Some(Algorithm::Zstd));
/// assert_eq!(params.level, Some(-3));
/// assert_eq!(params.dict_path.as_deref(), Some("/etc/uzram/dict".as_ref()));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AlgorithmParams {
    /// `algo=NAME`: the algorithm these parameters are for.
    pub algo: Option<Algorithm>,
    /// `priority=N`: 0 for the primary algorithm, 1 to 3 for recompression algorithms.
    pub priority: Option<u8>,
    /// `level=N`: the compression level, not yet checked against the algorithm's range
    /// ([`Codec::new`](crate::Codec::new) does that).
    pub level: Option<i32>,
    /// `dict=PATH`: a dictionary file.
    pub dict_path: Option<PathBuf>,
}

impl AlgorithmParams {
    /// The keys `algorithm_params` accepts.
    pub const KEYS: &'static [&'static str] = &["algo", "priority", "level", "dict"];

    /// The [`CodecParams`] these parameters ask for, reading the dictionary file if there is one.
    pub fn load_codec_params(&self) -> Result<CodecParams, ParamsError> {
        let dict = self.dict_path.as_deref().map(read_dictionary).transpose()?;
        Ok(CodecParams {
            level: self.level,
            dict,
        })
    }
}

impl FromStr for AlgorithmParams {
    type Err = ParamsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut params = AlgorithmParams::default();
        let mut rest = text.trim_start();
        while !rest.is_empty() {
            let (key, value, after) = next_param(rest)?;
            match key {
                "algo" => params.algo = Some(value.parse()?),
                "priority" => {
                    let priority = parse_int("priority", value)?;
                    params.priority = Some(
                        u8::try_from(priority)
                            .ok()
                            .filter(|&p| usize::from(p) < MAX_COMPS)
                            .ok_or(ParamsError::PriorityOutOfRange { priority })?,
                    );
                }
                "level" => params.level = Some(parse_int("level", value)?),
                "dict" => params.dict_path = Some(PathBuf::from(value)),
                _ => {
                    return Err(ParamsError::UnknownParam {
                        key: key.to_owned(),
                    })
                }
            }
            rest = after.trim_start();
        }
        Ok(params)
    }
}

/// The keys of `key=value ...` parameters in the order given, as [`AlgorithmParams`] reads them
/// (a quoted value may hold blanks), repeats included; the first malformed parameter's error.
pub fn param_keys(text: &str) -> Result<Vec<&str>, ParamsError> {
    let mut keys = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let (key, _, after) = next_param(rest)?;
        keys.push(key);
        rest = after.trim_start();
    }
    Ok(keys)
}

/// Splits `key=value` or `key="quoted value"` off the front of `text`, which starts with a
/// non-blank character. Returns the key, the value and what follows.
fn next_param(text: &str) -> Result<(&str, &str, &str), ParamsError> {
    let token_end = text.find(char::is_whitespace).unwrap_or(text.len());
    let malformed = || ParamsError::MalformedParam {
        token: text[..token_end].to_owned(),
    };
    let (key, after_key) = text.split_once('=').ok_or_else(malformed)?;
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(malformed());
    }
    let (value, after) = match after_key.strip_prefix('"') {
        Some(quoted) => {
            let end = quoted
                .find('"')
                .ok_or_else(|| ParamsError::UnterminatedQuote {
                    key: key.to_owned(),
                })?;
            let after = &quoted[end + 1..];
            if !after.is_empty() && !after.starts_with(char::is_whitespace) {
                return Err(malformed());
            }
            (&quoted[..end], after)
        }
        None => after_key.split_at(
            after_key
                .find(char::is_whitespace)
                .unwrap_or(after_key.len()),
        ),
    };
    if value.is_empty() {
        return Err(ParamsError::MissingValue {
            key: key.to_owned(),
        });
    }
    Ok((key, value, after))
}

fn parse_int(key: &'static str, value: &str) -> Result<i32, ParamsError> {
    value.parse().map_err(|_| ParamsError::NotAnInteger {
        key,
        value: value.to_owned(),
    })
}

/// Reads a dictionary file of at most [`MAX_DICT_LEN`] bytes.
pub fn read_dictionary(path: &Path) -> Result<Arc<[u8]>, ParamsError> {
    let read_error = |source: std::io::Error| ParamsError::ReadDictionary {
        path: path.to_owned(),
        source: Arc::new(source),
    };
    // Opening a FIFO would wait for a writer, and a device has no end: a dictionary is a file.
    if !std::fs::metadata(path).map_err(read_error)?.is_file() {
        return Err(read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut dict = Vec::new();
    // One byte more than allowed tells a file of exactly MAX_DICT_LEN from a longer one.
    file.take(MAX_DICT_LEN as u64 + 1)
        .read_to_end(&mut dict)
        .map_err(read_error)?;
    if dict.len() > MAX_DICT_LEN {
        return Err(ParamsError::DictionaryTooLarge {
            path: path.to_owned(),
            max: MAX_DICT_LEN,
        });
    }
    if dict.is_empty() {
        return Err(ParamsError::EmptyDictionary {
            path: path.to_owned(),
        });
    }
    Ok(dict.into())
}

/// `algorithm_params` text that cannot be parsed, or a dictionary file that cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ParamsError {
    /// `algo=` names an algorithm this crate does not implement.
    #[error(transparent)]
    UnknownAlgorithm(#[from] UnknownAlgorithm),
    /// A token without `=`, or with an empty key.
    #[error(
        "parameter {token:?} is not of the form key=value (a value with blanks goes in quotes: dict=\"/my dir/d\")"
    )]
    MalformedParam {
        /// The offending token.
        token: String,
    },
    /// `key=` with nothing after the `=`.
    #[error("parameter {key} has no value")]
    MissingValue {
        /// The key.
        key: String,
    },
    /// `key="...` without the closing quote.
    #[error("the value of parameter {key} has no closing quote")]
    UnterminatedQuote {
        /// The key.
        key: String,
    },
    /// A key other than those in [`AlgorithmParams::KEYS`].
    #[error("unknown parameter {key:?}: known: {}", AlgorithmParams::KEYS.join(" "))]
    UnknownParam {
        /// The key.
        key: String,
    },
    /// `level=` or `priority=` with a value that is not a decimal `i32`.
    #[error("parameter {key}={value:?} is not a whole number from -2147483648 to 2147483647")]
    NotAnInteger {
        /// `level` or `priority`.
        key: &'static str,
        /// The value given.
        value: String,
    },
    /// `priority=` outside `0..MAX_COMPS`.
    #[error("priority {priority} is out of range: use 0 (primary) to {}", MAX_COMPS - 1)]
    PriorityOutOfRange {
        /// The priority given.
        priority: i32,
    },
    /// The dictionary file could not be opened or read.
    #[error("cannot read dictionary file {path:?}: {source}")]
    ReadDictionary {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The dictionary file is longer than [`MAX_DICT_LEN`].
    #[error("dictionary file {path:?} is larger than {max} bytes")]
    DictionaryTooLarge {
        /// The file.
        path: PathBuf,
        /// [`MAX_DICT_LEN`].
        max: usize,
    },
    /// The dictionary file is empty.
    #[error("dictionary file {path:?} is empty")]
    EmptyDictionary {
        /// The file.
        path: PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AlgorithmParams, ParamsError> {
        text.parse()
    }

    #[test]
    fn empty_text_sets_nothing() {
        assert_eq!(parse("").unwrap(), AlgorithmParams::default());
        assert_eq!(parse(" \n").unwrap(), AlgorithmParams::default());
    }

    #[test]
    fn all_keys_parse_with_any_whitespace_and_trailing_newline() {
        let params = parse("  priority=1\tlevel=-5  algo=lz4 dict=/tmp/d\n").unwrap();
        assert_eq!(params.priority, Some(1));
        assert_eq!(params.level, Some(-5));
        assert_eq!(params.algo, Some(Algorithm::Lz4));
        assert_eq!(params.dict_path, Some(PathBuf::from("/tmp/d")));
    }

    #[test]
    fn level_accepts_sign_like_kstrtoint() {
        assert_eq!(parse("level=+7").unwrap().level, Some(7));
        assert_eq!(parse("level=-131072").unwrap().level, Some(-131072));
    }

    #[test]
    fn quoted_value_may_hold_spaces() {
        let params = parse(r#"dict="/var/lib/my dict" level=3"#).unwrap();
        assert_eq!(params.dict_path, Some(PathBuf::from("/var/lib/my dict")));
        assert_eq!(params.level, Some(3));
    }

    #[test]
    fn repeated_key_overrides_like_the_kernel() {
        assert_eq!(parse("level=1 level=9").unwrap().level, Some(9));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        assert!(matches!(
            parse("level 3"),
            Err(ParamsError::MalformedParam { token }) if token == "level"
        ));
        assert!(matches!(
            parse("=3"),
            Err(ParamsError::MalformedParam { .. })
        ));
        assert!(matches!(
            parse(r#"dict="a"b"#),
            Err(ParamsError::MalformedParam { .. })
        ));
        assert!(matches!(
            parse("level="),
            Err(ParamsError::MissingValue { key }) if key == "level"
        ));
        assert!(matches!(
            parse(r#"dict="/a b"#),
            Err(ParamsError::UnterminatedQuote { .. })
        ));
    }

    #[test]
    fn unknown_key_is_an_error_naming_the_known_ones() {
        let err = parse("deflate.winbits=12").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"unknown parameter "deflate.winbits": known: algo priority level dict"#
        );
    }

    #[test]
    fn non_integer_level_names_key_and_value() {
        let err = parse("level=fast").unwrap_err();
        assert!(matches!(
            err,
            ParamsError::NotAnInteger { key: "level", .. }
        ));
        assert_eq!(
            err.to_string(),
            r#"parameter level="fast" is not a whole number from -2147483648 to 2147483647"#
        );
        assert!(matches!(
            parse("level=99999999999"),
            Err(ParamsError::NotAnInteger { .. })
        ));
    }

    #[test]
    fn priority_must_be_below_max_comps() {
        assert_eq!(parse("priority=3").unwrap().priority, Some(3));
        for bad in ["priority=4", "priority=-1"] {
            assert!(
                matches!(parse(bad), Err(ParamsError::PriorityOutOfRange { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            parse("priority=4").unwrap_err().to_string(),
            "priority 4 is out of range: use 0 (primary) to 3"
        );
    }

    #[test]
    fn unknown_algo_lists_available_names() {
        let err = parse("algo=lzo-rle").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"unknown compression algorithm "lzo-rle": available: lz4 zstd"#
        );
    }

    #[test]
    fn load_codec_params_reads_the_dictionary_file() {
        let dir = std::env::temp_dir().join(format!("uzram-codecs-params-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dict");
        std::fs::write(&path, b"some dictionary bytes").unwrap();

        let params = AlgorithmParams {
            level: Some(5),
            dict_path: Some(path.clone()),
            ..Default::default()
        };
        let codec_params = params.load_codec_params().unwrap();
        assert_eq!(codec_params.level, Some(5));
        assert_eq!(
            codec_params.dict.as_deref(),
            Some(&b"some dictionary bytes"[..])
        );

        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            params.load_codec_params(),
            Err(ParamsError::EmptyDictionary { .. })
        ));

        let missing = AlgorithmParams {
            dict_path: Some(dir.join("missing")),
            ..Default::default()
        };
        let err = missing.load_codec_params().unwrap_err();
        assert!(matches!(err, ParamsError::ReadDictionary { .. }));
        assert!(std::error::Error::source(&err).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn codec_params_debug_shows_dict_length_not_bytes() {
        let params = CodecParams::default()
            .with_level(3)
            .with_dict(vec![7u8; 1000]);
        assert_eq!(
            format!("{params:?}"),
            "CodecParams { level: Some(3), dict_len: Some(1000) }"
        );
    }
}
