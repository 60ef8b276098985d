//! Sizes as zram takes them (`memparse`): a number with an optional K, M, G, T, P or E suffix,
//! powers of 1024, case-insensitive; and the human form zramctl prints.

use crate::Error;

/// Parses `4G`, `512M`, `65536`, `1.5G` is refused (zram takes whole numbers only).
pub fn parse_size(text: &str) -> Result<u64, Error> {
    let invalid = || Error::InvalidSize {
        text: text.to_string(),
    };
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                'E' => 60,
                _ => return Err(invalid()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    // Only digits: the one way left for parse or the shift to fail is too large a number.
    let too_large = || Error::SizeTooLarge {
        text: text.to_string(),
    };
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    n.checked_mul(1u64 << shift).ok_or_else(too_large)
}

/// A size in zramctl's human form: `4G`, `1.5M`, `512B` (one decimal, dropped when it is 0).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes}B");
    }
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{}{}", rounded as u64, UNITS[unit])
    } else {
        format!("{rounded:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_zram_sizes() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size(" 1K\n").unwrap(), 1024);
        assert_eq!(parse_size("1E").unwrap(), 1 << 60);
    }

    #[test]
    fn refuses_what_zram_refuses() {
        for bad in ["", "G", "1.5G", "-1", "4X", "4GB"] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.to_string().contains("invalid size"), "{bad}: {err}");
        }
        for big in ["99999999999999999999", "16E", "16384P"] {
            let err = parse_size(big).unwrap_err();
            assert!(err.to_string().contains("more than 16 EiB"), "{big}: {err}");
        }
        assert_eq!(parse_size("15E").unwrap(), 15 << 60);
    }

    #[test]
    fn formats_like_zramctl() {
        assert_eq!(format_size(4 << 30), "4G");
        assert_eq!(format_size(1536 << 10), "1.5M");
        assert_eq!(format_size(100), "100B");
        assert_eq!(format_size(0), "0B");
    }
}
