//! zram-tools' `/etc/default/zramswap`, read as its `zramswap` script reads it (zram-tools
//! 0.3.3): the script sources the file, then takes `ALGO` (default lz4), `SIZE` in MiB
//! (default 256), `PERCENT` of MemTotal (which overrides `SIZE` whenever it is set), and
//! `PRIORITY` (default 100). A stock file, every line commented out, is a 256 MiB device.
//!
//! The file is shell, so uzram reads the shell a settings file uses: `NAME=value`, with
//! `export`, quotes, trailing `# comments`, and `$((arithmetic))`; numbers as the shell's
//! arithmetic reads them (a leading 0 is octal, with a warning). Anything else (a command, a
//! `$(substitution)`) is refused by line number: uzram does not run the file.

use super::{err, map_algorithm, table_too_large, DevicePlan, SetupError};

/// Plans the file `name` of `text` on a machine of `mem_total_kb` (MemTotal as /proc/meminfo
/// says it).
pub fn plan(name: &str, text: &str, mem_total_kb: u64) -> Result<Vec<DevicePlan>, SetupError> {
    let mut plan = DevicePlan::new("zramswap", 0);
    let mut vars: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |m: String| err(name, format!("line {}: {m}", n + 1));
        let Some((k, v)) = assignment(line).map_err(at)? else {
            continue;
        };
        match k.as_str() {
            "ALGO" | "PERCENT" | "SIZE" | "PRIORITY" => {}
            "ALLOCATION" | "PERCENTAGE" | "CORES" => plan.warnings.push(format!(
                "{k} is old zram-tools' (0.3.2) name, which zramswap ignores today: use {}",
                match k.as_str() {
                    "ALLOCATION" => "SIZE (MiB)",
                    "PERCENTAGE" => "PERCENT",
                    _ => "nothing (one device serves every CPU)",
                }
            )),
            _ => plan.warnings.push(format!(
                "{k} is not a zramswap setting (ALGO, PERCENT, SIZE, PRIORITY): ignored"
            )),
        }
        vars.retain(|(name, _)| *name != k);
        vars.push((k, v));
    }
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let algo = get("ALGO").unwrap_or("lz4");
    let (uz, warning) = map_algorithm(algo);
    if warning.as_deref().is_some_and(|w| w.starts_with("unknown")) {
        return Err(err(
            name,
            format!(
                "ALGO={algo}: not a zram algorithm (lz4, zstd, lzo, lzo-rle, lz4hc, 842, deflate)"
            ),
        ));
    }
    plan.algorithm = Some(uz);
    plan.warnings.extend(warning);
    let number = |k: &str, v: &str| -> Result<i64, SetupError> {
        let (n, octal) = shell_number(v).ok_or_else(|| {
            let why = if too_large(v) {
                "too large for the shell's arithmetic (at most 9223372036854775807)"
            } else {
                "not a whole number"
            };
            err(name, format!("{k}={v}: {why}"))
        })?;
        if octal {
            plan_note(k, v, n);
        }
        Ok(n)
    };
    // zramswap works SIZE out even when PERCENT overrides it: a bad SIZE stops it either way.
    let size_mib = number("SIZE", get("SIZE").unwrap_or("256"))?;
    let bytes = match get("PERCENT") {
        Some(p) => {
            let percent = number("PERCENT", p)?;
            i128::from(mem_total_kb) * 1024 * i128::from(percent) / 100
        }
        None => i128::from(size_mib) * 1024 * 1024,
    };
    let which = if get("PERCENT").is_some() {
        format!("PERCENT={}", get("PERCENT").unwrap_or_default())
    } else {
        format!("SIZE={}", get("SIZE").unwrap_or("256"))
    };
    plan.size_bytes = u64::try_from(bytes)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            err(
                name,
                format!("{which}: a device of {bytes} bytes (zramswap would fail to set it)"),
            )
        })?;
    plan.failed = table_too_large(&which, plan.size_bytes, mem_total_kb.saturating_mul(1024));
    if let Some(p) = get("PRIORITY") {
        // swapon -p takes it as a decimal number.
        plan.priority = p
            .parse::<i32>()
            .ok()
            .filter(|p| (-1..=32767).contains(p))
            .ok_or_else(|| err(name, format!("PRIORITY={p}: a swap priority is -1..32767")))?;
    }
    Ok(vec![plan])
}

/// Warns that the shell reads `v` as octal. (A function so the closure above stays `Fn`.)
fn plan_note(k: &str, v: &str, n: i64) {
    crate::common::output::warn(format_args!(
        "uzram: zramswap: {k}={v} is octal to the shell (a leading 0): {n}"
    ));
}

/// One line of the file: `Ok(None)` for a blank line or a comment, the assignment's name and
/// value, or what makes the line something uzram will not run.
fn assignment(line: &str) -> Result<Option<(String, String)>, String> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let t = t.strip_prefix("export ").map_or(t, str::trim_start);
    let not_setting = || {
        let bom = if t.starts_with('\u{feff}') {
            " (it begins with a byte-order mark, which the shell would not read past either)"
        } else {
            ""
        };
        format!(
            "{line:?} is not a NAME=value setting{bom} (uzram reads this file, it does not run it)"
        )
    };
    let (name, rest) = t.split_once('=').ok_or_else(not_setting)?;
    if name.is_empty()
        || !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(not_setting());
    }
    let (value, after) = match rest.chars().next() {
        Some(q @ ('"' | '\'')) => {
            let end = rest[1..]
                .find(q)
                .ok_or_else(|| format!("{name}: the quote {q} is never closed"))?;
            (&rest[1..1 + end], &rest[2 + end..])
        }
        // An arithmetic expansion is one word, blanks and all.
        _ if rest.starts_with("$((") => {
            // Where its parentheses balance.
            let mut depth = 0i32;
            let end = rest[1..]
                .char_indices()
                .find_map(|(i, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    (depth == 0).then_some(i + 2)
                })
                .ok_or_else(|| format!("{name}: the $(( is never closed"))?;
            (&rest[..end], &rest[end..])
        }
        _ => {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        }
    };
    let after = after.trim_start();
    if !after.is_empty() && !after.starts_with('#') {
        return Err(not_setting());
    }
    if value.contains("$(") && !value.starts_with("$((") || value.contains('`') {
        return Err(format!(
            "{name}={value}: runs a command, which uzram does not do: give the value"
        ));
    }
    let value = match value.strip_prefix("$((").and_then(|v| v.strip_suffix("))")) {
        Some(expr) => arithmetic(name, expr)?,
        None if value.contains('$') => {
            return Err(format!(
                "{name}={value}: uses a variable, which uzram does not expand: give the value"
            ))
        }
        None => value.to_string(),
    };
    Ok(Some((name.to_string(), value)))
}

/// `$((expr))` as the shell's arithmetic evaluates it: whole numbers (64-bit), `+ - * / %`
/// and parentheses, division truncating at each step, numbers in the shell's bases (a leading
/// 0 is octal). Anything else (a variable, `**`, a comparison) is refused.
fn arithmetic(name: &str, expr: &str) -> Result<String, String> {
    let bad = |why: &str| format!("{name}=$(({expr})): {why}");
    let mut p = Arith {
        s: expr.as_bytes(),
        at: 0,
    };
    let v = p.sum().map_err(bad)?;
    p.blanks();
    if p.at != p.s.len() {
        return Err(bad("uzram reads numbers, + - * / % and parentheses there"));
    }
    Ok(v.to_string())
}

/// A recursive-descent reader of shell arithmetic (see [`arithmetic`]).
struct Arith<'a> {
    s: &'a [u8],
    at: usize,
}

impl Arith<'_> {
    fn blanks(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.blanks();
        self.s.get(self.at).copied()
    }

    fn sum(&mut self) -> Result<i64, &'static str> {
        let mut v = self.product()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.at += 1;
            let r = self.product()?;
            v = if op == b'+' {
                v.checked_add(r)
            } else {
                v.checked_sub(r)
            }
            .ok_or("overflow")?;
        }
        Ok(v)
    }

    fn product(&mut self) -> Result<i64, &'static str> {
        let mut v = self.unary()?;
        while let Some(op @ (b'*' | b'/' | b'%')) = self.peek() {
            self.at += 1;
            if self.s.get(self.at) == Some(&b'*') {
                return Err("uzram reads numbers, + - * / % and parentheses there");
            }
            let r = self.unary()?;
            v = match op {
                b'*' => v.checked_mul(r).ok_or("overflow")?,
                _ if r == 0 => return Err("division by 0"),
                b'/' => v.checked_div(r).ok_or("overflow")?,
                _ => v.checked_rem(r).ok_or("overflow")?,
            };
        }
        Ok(v)
    }

    fn unary(&mut self) -> Result<i64, &'static str> {
        match self.peek() {
            Some(b'-') => {
                self.at += 1;
                self.unary()?.checked_neg().ok_or("overflow")
            }
            Some(b'+') => {
                self.at += 1;
                self.unary()
            }
            Some(b'(') => {
                self.at += 1;
                let v = self.sum()?;
                if self.peek() != Some(b')') {
                    return Err("a ( is never closed");
                }
                self.at += 1;
                Ok(v)
            }
            _ => {
                let start = self.at;
                while self.s.get(self.at).is_some_and(u8::is_ascii_alphanumeric) {
                    self.at += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.at]).unwrap_or_default();
                shell_number(word)
                    .map(|(n, _)| n)
                    .ok_or("uzram reads numbers, + - * / % and parentheses there")
            }
        }
    }
}

/// A number as the shell's arithmetic reads it: decimal, `0x` hex, or a leading `0` octal;
/// a sign. Returns the value and whether it was octal.
fn shell_number(v: &str) -> Option<(i64, bool)> {
    let (neg, radix, digits, octal) = shell_parts(v);
    let n = i64::from_str_radix(digits, radix).ok()?;
    if digits.starts_with(['+', '-']) {
        return None;
    }
    Some((if neg { -n } else { n }, octal))
}

/// `v` split as the shell's arithmetic reads it: its sign, radix (`0x` hex, a leading 0
/// octal, else decimal), digits, and whether it was octal.
fn shell_parts(v: &str) -> (bool, u32, &str, bool) {
    let (neg, d) = match v.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let (radix, digits, octal) = if let Some(h) = d.strip_prefix("0x").or(d.strip_prefix("0X")) {
        (16, h, false)
    } else if d.len() > 1 && d.starts_with('0') {
        (8, &d[1..], true)
    } else {
        (10, d, false)
    };
    (neg, radix, digits, octal)
}

/// Whether `v`, which [`shell_number`] refused, is a well-formed number too large for it.
fn too_large(v: &str) -> bool {
    use std::num::IntErrorKind::{NegOverflow, PosOverflow};
    let (_, radix, digits, _) = shell_parts(v);
    !digits.starts_with(['+', '-'])
        && i64::from_str_radix(digits, radix)
            .is_err_and(|e| matches!(e.kind(), PosOverflow | NegOverflow))
}
