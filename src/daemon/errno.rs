//! The one map from the engine's errors to the errnos the kernel gets, with their names and
//! causes for the log (`mailbox`).

use uzram_engine::device::writeback::BackingError;
use uzram_engine::IoError;

/// The one place engine errors become errnos for the kernel. Exhaustive: a new [`IoError`]
/// does not build until it has its errno here.
pub fn errno(e: &IoError) -> i32 {
    match e {
        IoError::OutOfRange { .. } | IoError::Misaligned { .. } => libc::EINVAL,
        IoError::MemLimit { .. } => libc::ENOSPC,
        IoError::OutOfMemory(_) | IoError::TableOutOfMemory { .. } | IoError::Context(_) => {
            libc::ENOMEM
        }
        IoError::Corrupt { .. }
        | IoError::Compress { .. }
        | IoError::Lost { .. }
        | IoError::NoCodec { .. }
        | IoError::Group { .. }
        | IoError::Backing { .. } => libc::EIO,
    }
}

/// The errno's name, for the log.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EIO => "EIO",
        libc::ENOMEM => "ENOMEM",
        libc::ENOSPC => "ENOSPC",
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "an error",
    }
}

/// Why a request failed, in words that need no allocation (the I/O path records it in the
/// mailbox).
pub fn cause(e: &IoError) -> &'static str {
    use uzram_allocator::Error as PoolError;
    match e {
        IoError::OutOfRange { .. } => "beyond the device's size",
        IoError::Misaligned { .. } => "not aligned to 512-byte sectors",
        IoError::MemLimit { .. } => "mem_limit reached",
        IoError::OutOfMemory(PoolError::ReserveExhausted { .. }) => {
            "the pool's reserve ran out and the memory thread did not map an arena in time"
        }
        IoError::OutOfMemory(PoolError::OutOfMemory { .. }) => "no memory for the pool",
        IoError::OutOfMemory(_) => "out of memory",
        IoError::TableOutOfMemory { .. } => "no memory for the slot table",
        IoError::Context(_) => "no memory for the codec streams of an i/o context",
        IoError::Corrupt { .. } => "a stored page failed to decompress",
        IoError::Compress { .. } => "a page failed to compress",
        IoError::Lost { .. } => "a page's object is missing from the pool",
        IoError::NoCodec { .. } => "a page's codec is gone",
        IoError::Group { .. } => "a page's cold group is damaged",
        IoError::Backing { source, .. } => match source {
            BackingError::Tampered { .. } => {
                "a written-back record failed authentication (the backing file changed)"
            }
            BackingError::Full => "the backing device is full",
            BackingError::Io(_) => "the backing device failed the I/O",
            _ => "the backing device",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uzram_engine::PageIndex;

    #[test]
    fn every_engine_error_has_one_errno() {
        let range = IoError::OutOfRange {
            offset: 0,
            len_bytes: 1,
            disksize: 0,
        };
        assert_eq!(errno(&range), libc::EINVAL);
        assert_eq!(
            errno(&IoError::Misaligned {
                offset: 1,
                len_bytes: 1
            }),
            libc::EINVAL
        );
        assert_eq!(
            errno(&IoError::MemLimit {
                index: PageIndex(0),
                limit_bytes: 1
            }),
            libc::ENOSPC
        );
        let lost = IoError::Lost {
            index: PageIndex(0),
            source: uzram_allocator::Error::InvalidHandle { raw: 0 },
        };
        assert_eq!(errno(&lost), libc::EIO);
    }
}
