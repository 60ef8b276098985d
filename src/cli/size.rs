//! Sizes as zramctl's `--size` takes them: util-linux's `strtosize`. A whole number (decimal,
//! `0x` hex or `0` octal, as `strtoumax` with base 0 reads it), then optionally a fraction and
//! a suffix: `K M G T P E Z Y` (or lower case) alone or with `iB` for powers of 1024, with `B`
//! for powers of 1000. `4G`, `4GiB` and `4096M` are 4 GiB, `4GB` is 4,000,000,000, `1.5G` is
//! 1.5 GiB. A fraction needs a suffix; a sign is refused.
//!
//! The fraction is added digit by digit as util-linux does, each digit `d` at place `p` adding
//! `unit / (10^p / d)` (integer divisions), so `0.3G` is 357,913,941 bytes there and here
//! (not 322,122,547): the same command line makes the same device as zramctl's.

const SUFFIXES: &[u8] = b"KMGTPEZY";

/// Parses `text` as zramctl does; the error says what is wrong with it.
pub fn strtosize(text: &str) -> Result<u64, String> {
    let bad =
        |why: &str| format!("--size {text:?}: {why} (zramctl's sizes: 4G, 4GiB, 4GB, 1.5G, bytes)");
    let t = text.trim_start();
    if t.starts_with('-') {
        return Err(bad("a size is not negative"));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    // Digits that are no number are too many of them.
    let (mut x, mut rest) = leading_number(t).ok_or_else(|| {
        bad(match t.starts_with(|c: char| c.is_ascii_digit()) {
            true => "too large",
            false => "not a number",
        })
    })?;
    if rest.is_empty() {
        return Ok(x);
    }
    let mut frac: Option<(u64, usize)> = None;
    let (letter, base) = loop {
        let b = rest.as_bytes();
        let base = match &b[1..] {
            b"iB" | b"ib" => 1024,
            b"B" | b"b" => 1000,
            [] => 1024,
            _ if frac.is_none() && b[0] == b'.' => {
                let after = &rest[1..];
                let zeros = after.bytes().take_while(|&c| c == b'0').count();
                let digits = &after[zeros..];
                let n = digits.bytes().take_while(u8::is_ascii_digit).count();
                let value = if n == 0 {
                    0
                } else {
                    digits[..n]
                        .parse::<u64>()
                        .map_err(|_| bad("too many digits"))?
                };
                rest = &digits[n..];
                if rest.is_empty() {
                    return Err(bad("a fraction needs a suffix (K, M, G, ...)"));
                }
                frac = Some((value, zeros));
                continue;
            }
            _ => return Err(bad("an unknown suffix")),
        };
        break (b[0], base);
    };
    let power = SUFFIXES
        .iter()
        .position(|&s| s == letter.to_ascii_uppercase())
        .ok_or_else(|| bad("an unknown suffix"))? as u32
        + 1;
    let unit = scale(1, base, power).ok_or_else(|| bad("too large"))?;
    x = x.checked_mul(unit).ok_or_else(|| bad("too large"))?;
    if let Some((mut f, zeros)) = frac {
        // util-linux's divisor for the last digit: the least power of ten not below `f`, times
        // ten per leading zero.
        let mut div: u64 = 10;
        while div < f {
            if div <= u64::MAX / 10 {
                div *= 10;
            } else {
                f /= 10;
            }
        }
        for _ in 0..zeros {
            if div <= u64::MAX / 10 {
                div *= 10;
            } else {
                f /= 10;
            }
        }
        let mut place: u64 = 1;
        loop {
            let digit = f % 10;
            let seg_div = div / place;
            f /= 10;
            place = place.saturating_mul(10);
            if digit != 0 && seg_div / digit != 0 {
                x = x
                    .checked_add(unit / (seg_div / digit))
                    .ok_or_else(|| bad("too large"))?;
            }
            if f == 0 {
                break;
            }
        }
    }
    Ok(x)
}

/// `base` to the `power`, times `x`, or `None` past `u64`.
fn scale(x: u64, base: u64, power: u32) -> Option<u64> {
    base.checked_pow(power)?.checked_mul(x)
}

/// The whole number `strtoumax(_, _, 0)` reads at the start of `t`, and what follows it.
fn leading_number(t: &str) -> Option<(u64, &str)> {
    let (radix, digits) = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if h.starts_with(|c: char| c.is_ascii_hexdigit()) {
            (16, h)
        } else {
            // "0x" without hex digits: strtoumax reads the 0.
            return Some((0, &t[1..]));
        }
    } else if t.starts_with('0') {
        (8, t)
    } else {
        (10, t)
    };
    let n = digits.chars().take_while(|c| c.is_digit(radix)).count();
    if n == 0 {
        return None;
    }
    let value = u64::from_str_radix(&digits[..n], radix).ok()?;
    Some((value, &digits[n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sizes_as_util_linux_does() {
        for (text, want) in [
            ("4096", 4096),
            ("4G", 4 << 30),
            ("4g", 4 << 30),
            ("4GiB", 4 << 30),
            ("4GB", 4_000_000_000),
            ("512M", 512 << 20),
            ("10KiB", 10240),
            ("10KB", 10000),
            ("1.5G", 3 << 29),
            ("0.5MiB", 512 << 10),
            ("0.5MB", 500_000),
            // Digit by digit, each division truncating: 2^30/5 + 2^30/20, one short of 2^28.
            ("0.25G", (1 << 30) / 5 + (1 << 30) / 20),
            ("0.3G", (1 << 30) / 3),
            ("1.05G", (1 << 30) + (1 << 30) / 20),
            ("0x10K", 16 << 10),
            ("010K", 8 << 10),
            (" 2M", 2 << 20),
            ("+2M", 2 << 20),
            ("1E", 1 << 60),
            ("15E", 15 << 60),
        ] {
            assert_eq!(strtosize(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_util_linux_refuses_and_names_it() {
        for bad in [
            "",
            "-1",
            "-1G",
            "G",
            "4X",
            "4GiBs",
            "4 G",
            "1.5",
            "1.5.5G",
            "16E",
            "1Z",
            "1Y",
            "99999999999999999999",
            "lots",
            "4iB",
        ] {
            let e = strtosize(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
