//! Dictionary training from sample pages, with zstd's trainer (`ZDICT_trainFromBuffer`).

use crate::ConfigError;

/// zstd's smallest dictionary (`ZDICT_DICTSIZE_MIN`).
pub const MIN_DICT_LEN: usize = 256;

/// Trains a dictionary of at most `max_size` bytes on `samples`, typically pages taken from
/// the device (skip same-filled ones: the engine never compresses those). The result works for
/// zstd (a full dictionary with entropy tables) and for lz4 (which uses its last 64 KiB as
/// history).
///
/// zstd suggests about 100 times more sample bytes than `max_size`, and a `max_size` around
/// 100 KiB; training on too few or too similar samples fails with [`ConfigError::Training`].
///
/// ```no_run
/// # fn pages() -> Vec<[u8; 4096]> { Vec::new() }
/// let pages: Vec<[u8; 4096]> = pages();
/// let dict = uzram_codecs::train_dictionary(pages.iter().map(|page| &page[..]), 64 << 10)?;
/// # Ok::<(), uzram_codecs::ConfigError>(())
/// ```
pub fn train_dictionary<I>(samples: I, max_size: usize) -> Result<Vec<u8>, ConfigError>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    if max_size < MIN_DICT_LEN {
        return Err(ConfigError::DictionaryTooSmall {
            max_size,
            min: MIN_DICT_LEN,
        });
    }
    let mut buffer = Vec::new();
    let mut sizes = Vec::new();
    for sample in samples {
        let sample = sample.as_ref();
        if !sample.is_empty() {
            buffer.extend_from_slice(sample);
            sizes.push(sample.len());
        }
    }
    if sizes.is_empty() {
        return Err(ConfigError::NoSamples);
    }
    let mut dict = Vec::with_capacity(max_size);
    zstd::zstd_safe::train_from_buffer(&mut dict, &buffer, &sizes).map_err(|code| {
        ConfigError::Training {
            samples: sizes.len(),
            len_bytes: buffer.len(),
            reason: zstd::zstd_safe::get_error_name(code),
        }
    })?;
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::text_page;

    #[test]
    fn trained_dictionary_fits_max_size_and_has_an_id() {
        let pages: Vec<_> = (0..128).map(text_page).collect();
        let dict = train_dictionary(pages.iter().map(|page| &page[..]), 8192).unwrap();
        assert!(!dict.is_empty() && dict.len() <= 8192, "{}", dict.len());
        assert!(zstd::zstd_safe::get_dict_id(&dict).is_some());
    }

    #[test]
    fn accepts_arrays_and_vectors_as_samples() {
        let pages: Vec<[u8; crate::PAGE_SIZE]> = (0..64).map(text_page).collect();
        assert!(train_dictionary(&pages, 4096).is_ok());
    }

    #[test]
    fn no_samples_is_an_error() {
        assert_eq!(
            train_dictionary(Vec::<Vec<u8>>::new(), 4096),
            Err(ConfigError::NoSamples)
        );
        assert_eq!(
            train_dictionary([&[][..]], 4096),
            Err(ConfigError::NoSamples)
        );
    }

    #[test]
    fn tiny_max_size_is_an_error() {
        assert_eq!(
            train_dictionary([&[1u8; 100][..]], 100),
            Err(ConfigError::DictionaryTooSmall {
                max_size: 100,
                min: MIN_DICT_LEN
            })
        );
    }

    #[test]
    fn too_few_samples_fail_with_zstds_reason() {
        let err = train_dictionary([&b"abc"[..], &b"abd"[..]], 4096).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Training {
                    samples: 2,
                    len_bytes: 6,
                    ..
                }
            ),
            "{err}"
        );
    }
}
