//! One line of `/proc/PID/maps`, parsed: what the page dump walks and what the daemon reads
//! to find malloc's heap.

/// Why a line of `/proc/PID/maps` did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MapsParseError {
    #[error("the {field} field is missing")]
    MissingField { field: &'static str },
    #[error("the {field} field {value:?} is malformed")]
    BadField { field: &'static str, value: String },
}

/// Permissions of a mapping, the `rwxp` column of maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    /// `p` (copy on write) rather than `s` (shared).
    pub private: bool,
}

/// One line of `/proc/PID/maps`:
/// `7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0    [heap]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub perms: Perms,
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// File path, `[heap]`, `[stack]`, `[anon:name]`, ... or empty for plain anonymous memory.
    pub pathname: String,
}

impl MapsEntry {
    /// Whether the mapping holds swappable process data: private, readable and writable, not
    /// backed by a file, and plain anonymous, `[heap]` or a named anonymous region.
    /// The main `[stack]` (environment strings) and kernel areas (`[vvar]`, `[vdso]`,
    /// `[vsyscall]`) are excluded, as are private file mappings (`.data`, `.bss` of libraries).
    pub fn is_dumpable(&self) -> bool {
        let anonymous_name = self.pathname.is_empty()
            || self.pathname == "[heap]"
            || (self.pathname.starts_with("[anon:") && self.pathname.ends_with(']'));
        self.perms.read
            && self.perms.write
            && self.perms.private
            && self.inode == 0
            && anonymous_name
    }

    /// Length of the mapping in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Parses one line of `/proc/PID/maps`. The pathname may contain spaces and is kept as is.
pub fn parse_maps_line(line: &str) -> Result<MapsEntry, MapsParseError> {
    let mut rest = line.trim_end_matches('\n');
    let mut field = |name: &'static str| {
        let trimmed = rest.trim_start_matches([' ', '\t']);
        let end = trimmed.find([' ', '\t']).unwrap_or(trimmed.len());
        let (value, tail) = trimmed.split_at(end);
        rest = tail;
        if value.is_empty() {
            Err(MapsParseError::MissingField { field: name })
        } else {
            Ok(value)
        }
    };
    let range = field("address")?;
    let perms = field("perms")?;
    let offset = field("offset")?;
    let dev = field("dev")?;
    let inode = field("inode")?;
    let pathname = rest.trim_start_matches([' ', '\t']).to_owned();

    let bad = |field: &'static str, value: &str| MapsParseError::BadField {
        field,
        value: value.to_owned(),
    };
    let hex = |field: &'static str, value: &str| {
        u64::from_str_radix(value, 16).map_err(|_| bad(field, value))
    };

    let (start, end) = range.split_once('-').ok_or_else(|| bad("address", range))?;
    let (start, end) = (hex("address", start)?, hex("address", end)?);
    if end < start {
        return Err(bad("address", range));
    }
    let perms = parse_perms(perms).ok_or_else(|| bad("perms", perms))?;
    let offset = hex("offset", offset)?;
    let (major, minor) = dev.split_once(':').ok_or_else(|| bad("dev", dev))?;
    let dev_major = u32::from_str_radix(major, 16).map_err(|_| bad("dev", dev))?;
    let dev_minor = u32::from_str_radix(minor, 16).map_err(|_| bad("dev", dev))?;
    let inode = inode.parse().map_err(|_| bad("inode", inode))?;
    Ok(MapsEntry {
        start,
        end,
        perms,
        offset,
        dev_major,
        dev_minor,
        inode,
        pathname,
    })
}

fn parse_perms(s: &str) -> Option<Perms> {
    let &[r, w, x, p] = s.as_bytes() else {
        return None;
    };
    let flag = |c: u8, set: u8| match c {
        c if c == set => Some(true),
        b'-' => Some(false),
        _ => None,
    };
    let private = match p {
        b'p' => true,
        b's' => false,
        _ => return None,
    };
    Some(Perms {
        read: flag(r, b'r')?,
        write: flag(w, b'w')?,
        exec: flag(x, b'x')?,
        private,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: &str) -> MapsEntry {
        parse_maps_line(line).unwrap()
    }

    #[test]
    fn heap_line_parses_and_is_dumpable() {
        let e = entry(
            "55713f8ca000-55713f8eb000 rw-p 00000000 00:00 0                          [heap]",
        );
        assert_eq!(e.start, 0x5571_3f8c_a000);
        assert_eq!(e.end, 0x5571_3f8e_b000);
        assert_eq!(
            e.perms,
            Perms {
                read: true,
                write: true,
                exec: false,
                private: true
            }
        );
        assert_eq!((e.offset, e.dev_major, e.dev_minor, e.inode), (0, 0, 0, 0));
        assert_eq!(e.pathname, "[heap]");
        assert_eq!(e.len_bytes(), 0x21000);
        assert!(e.is_dumpable());
    }

    #[test]
    fn plain_anonymous_mapping_is_dumpable() {
        let e = entry("7ffae68b4000-7ffae68d6000 rw-p 00000000 00:00 0 ");
        assert_eq!(e.pathname, "");
        assert!(e.is_dumpable());
        assert!(entry("7ffae68b4000-7ffae68d6000 rw-p 00000000 00:00 0").is_dumpable());
    }

    #[test]
    fn named_anonymous_mapping_is_dumpable() {
        let e = entry("7f0000000000-7f0000100000 rw-p 00000000 00:00 0    [anon:libc_malloc]");
        assert_eq!(e.pathname, "[anon:libc_malloc]");
        assert!(e.is_dumpable());
    }

    #[test]
    fn stacks_and_kernel_areas_are_excluded() {
        for line in [
            "7ffd1c2e5000-7ffd1c306000 rw-p 00000000 00:00 0                          [stack]",
            "7f5a3c000000-7f5a3c021000 rw-p 00000000 00:00 0                          [stack:1234]",
            "7ffae6b26000-7ffae6b2a000 r--p 00000000 00:00 0                          [vvar]",
            "7ffae6b2a000-7ffae6b2c000 r-xp 00000000 00:00 0                          [vdso]",
            "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
            "7f0000000000-7f0000001000 rw-s 00000000 00:01 1025   [anon_shmem:shared]",
        ] {
            assert!(!entry(line).is_dumpable(), "{line}");
        }
    }

    #[test]
    fn file_backed_mappings_are_excluded() {
        // A library's .data is private and writable but backed by a file (inode != 0).
        let data = entry("7ffae6b0c000-7ffae6b0e000 rw-p 001d3000 fe:00 326279   /usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(
            (data.offset, data.dev_major, data.dev_minor, data.inode),
            (0x1d3000, 0xfe, 0, 326279)
        );
        assert!(!data.is_dumpable());
        let deleted =
            entry("7f0000000000-7f0000001000 rw-p 00000000 00:05 77  /dev/zero (deleted)");
        assert_eq!(deleted.pathname, "/dev/zero (deleted)");
        assert!(!deleted.is_dumpable());
    }

    #[test]
    fn non_writable_or_shared_or_guard_mappings_are_excluded() {
        for line in [
            "7f0000000000-7f0000001000 r--p 00000000 00:00 0 ",
            "7f0000000000-7f0000001000 ---p 00000000 00:00 0 ",
            "7f0000000000-7f0000001000 rw-s 00000000 00:00 0 ",
            "7f0000000000-7f0000001000 -w-p 00000000 00:00 0 ",
        ] {
            assert!(!entry(line).is_dumpable(), "{line}");
        }
    }

    #[test]
    fn pathname_with_spaces_is_kept_whole() {
        let e = entry("00400000-00452000 r-xp 00000000 08:02 173521      /opt/my app/bin x");
        assert_eq!(e.pathname, "/opt/my app/bin x");
    }

    #[test]
    fn malformed_lines_name_the_field() {
        assert_eq!(
            parse_maps_line(""),
            Err(MapsParseError::MissingField { field: "address" })
        );
        assert_eq!(
            parse_maps_line("00400000-00452000 r-xp 00000000 08:02"),
            Err(MapsParseError::MissingField { field: "inode" })
        );
        assert_eq!(
            parse_maps_line("00400000 r-xp 00000000 08:02 1"),
            Err(MapsParseError::BadField {
                field: "address",
                value: "00400000".into()
            })
        );
        assert_eq!(
            parse_maps_line("00500000-00400000 r-xp 00000000 08:02 1"),
            Err(MapsParseError::BadField {
                field: "address",
                value: "00500000-00400000".into()
            })
        );
        assert_eq!(
            parse_maps_line("00400000-00452000 rwxq 00000000 08:02 1"),
            Err(MapsParseError::BadField {
                field: "perms",
                value: "rwxq".into()
            })
        );
        assert_eq!(
            parse_maps_line("00400000-00452000 rw-p 00000000 0802 1"),
            Err(MapsParseError::BadField {
                field: "dev",
                value: "0802".into()
            })
        );
        assert_eq!(
            parse_maps_line("00400000-00452000 rw-p 00000000 08:02 x1"),
            Err(MapsParseError::BadField {
                field: "inode",
                value: "x1".into()
            })
        );
    }
}
