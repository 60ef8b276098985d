//! The label at the start of every backing file: its first 4 KiB say "uzram wrote this", so
//! a later device may take the file over, and a file or partition that holds anyone else's
//! data (a filesystem, a swap area, a partition table, a document) is refused unless the user
//! says `force`. Records never use those 4 KiB.
//!
//! What is checked, before anything is written: the first [`CHECKED`] bytes (where every
//! common signature lives: partition tables at 0 and 512, ext's superblock at 1024, swap's at
//! 4086, btrfs's at 64 KiB) are the label, or all zeros (a new file, or a wiped partition).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::store::{AlignedBuf, BackingError};
use super::ALIGN;

/// The label's first bytes.
const MAGIC: &[u8; 16] = b"uzram backing\0\0\x01";
/// Bytes the label takes (one aligned block: records start after it).
pub(super) const LABEL_LEN: u64 = ALIGN as u64;
/// Bytes at the start of a file looked at for someone else's data.
const CHECKED: u64 = 1 << 20;
/// The smallest backing file: the label and room for some records.
pub(super) const MIN_BYTES: u64 = 64 << 10;

/// What the start of a file holds.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// uzram's label.
    Label,
    /// Zeros.
    Blank,
    /// Something else: the offset of its first non-zero byte.
    Data(u64),
}

/// Reads the first [`CHECKED`] bytes (at most `len`) of `file`, through an aligned buffer
/// (the file may be open `O_DIRECT`).
fn inspect(file: &File, len: u64) -> std::io::Result<Found> {
    let n = len.min(CHECKED) as usize;
    let mut buf = AlignedBuf::new(n.next_multiple_of(ALIGN));
    let mut done = 0;
    while done < n {
        // A window past the end of a short file reads short: what is there is what counts.
        let got = file.read_at(&mut buf[done..], done as u64)?;
        if got == 0 {
            break;
        }
        done += got;
    }
    let bytes = &buf[..done.min(n)];
    if bytes.starts_with(MAGIC) {
        return Ok(Found::Label);
    }
    Ok(match bytes.iter().position(|&b| b != 0) {
        None => Found::Blank,
        Some(at) => Found::Data(at as u64),
    })
}

/// Checks that `file` (of `len` bytes, at `path`) may be used, and labels it: it must be at
/// least [`MIN_BYTES`], and hold uzram's label or zeros at its start, unless `force`.
pub(super) fn claim(file: &File, path: &Path, len: u64, force: bool) -> Result<(), BackingError> {
    let io = |source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    };
    if len < MIN_BYTES {
        return Err(BackingError::TooSmall {
            path: path.to_path_buf(),
            bytes: len,
            min: MIN_BYTES,
        });
    }
    if let Found::Data(offset) = inspect(file, len).map_err(io)? {
        if !force {
            return Err(BackingError::Foreign {
                path: path.to_path_buf(),
                offset,
            });
        }
    }
    let mut label = AlignedBuf::new(LABEL_LEN as usize);
    label.fill(0);
    label[..MAGIC.len()].copy_from_slice(MAGIC);
    label[MAGIC.len()..MAGIC.len() + 8].copy_from_slice(&len.to_le_bytes());
    file.write_all_at(&label, 0).map_err(io)?;
    file.sync_data().map_err(io)
}

/// What [`super::BackingStore::open_all`] would refuse `path` for, found without writing
/// anything or opening it for writing: for a command line to check its whole plan before it
/// starts a device. A missing file is fine (it will be created).
pub fn check(path: &Path, force: bool) -> Result<(), BackingError> {
    let io = |source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    };
    let block = is_block_device(path)?;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    // A block device is opened exclusively, as the store will open it: one mounted, used as
    // swap or held by another device refuses.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        let excl = if block { libc::O_EXCL } else { 0 };
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | excl)
            .open(path)
    };
    let file = match file {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(BackingError::NotUsable {
                path: path.to_path_buf(),
                why: "is in use (mounted, swap, or held by another device)",
            })
        }
        f => f.map_err(io)?,
    };
    let len = if !block {
        meta.len()
    } else {
        use std::io::{Seek, SeekFrom};
        (&file).seek(SeekFrom::End(0)).map_err(io)?
    };
    if !block && len == 0 {
        // Empty: uzram sizes it.
        return Ok(());
    }
    if len < MIN_BYTES {
        return Err(BackingError::TooSmall {
            path: path.to_path_buf(),
            bytes: len,
            min: MIN_BYTES,
        });
    }
    match inspect(&file, len).map_err(io)? {
        Found::Data(offset) if !force => Err(BackingError::Foreign {
            path: path.to_path_buf(),
            offset,
        }),
        _ => Ok(()),
    }
}

/// Whether `path` is a block device (`false`: a regular file, or nothing yet, which the store
/// creates); a symbolic link or any other kind of file is refused by name.
pub(super) fn is_block_device(path: &Path) -> Result<bool, BackingError> {
    let refuse = |why| BackingError::NotUsable {
        path: path.to_path_buf(),
        why,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            Err(refuse("is a symbolic link: name the file or device itself"))
        }
        Ok(m) if m.file_type().is_block_device() => Ok(true),
        Ok(m) if m.file_type().is_file() => Ok(false),
        Ok(_) => Err(refuse("is neither a block device nor a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BackingError::Open {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(dir: &Path, name: &str, bytes: &[u8], len: u64) -> (File, std::path::PathBuf) {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.set_len(len).unwrap();
        (f, path)
    }

    #[test]
    fn only_zeros_or_our_label_are_taken_without_force() {
        let dir = crate::device::testutil::tempdir("label");
        let (f, p) = file_with(&dir, "zeros", &[], 2 << 20);
        claim(&f, &p, 2 << 20, false).unwrap();
        assert_eq!(inspect(&f, 2 << 20).unwrap(), Found::Label);
        claim(&f, &p, 2 << 20, false).expect("ours, taken again");

        let mut ext = vec![0u8; 4096];
        ext[1024 + 56] = 0x53; // ext's superblock magic, low byte
        let (f, p) = file_with(&dir, "ext", &ext, 2 << 20);
        let before = std::fs::read(&p).unwrap();
        let e = claim(&f, &p, 2 << 20, false).unwrap_err();
        assert!(
            matches!(e, BackingError::Foreign { offset: 1080, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("force"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), before, "nothing written");
        claim(&f, &p, 2 << 20, true).expect("forced");
        assert_eq!(inspect(&f, 2 << 20).unwrap(), Found::Label);

        // The read-only check says the same, and writes nothing either.
        let (_, p) = file_with(&dir, "ext2", &ext, 2 << 20);
        assert!(matches!(
            check(&p, false),
            Err(BackingError::Foreign { offset: 1080, .. })
        ));
        check(&p, true).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), before);
        check(&dir.join("new"), false).expect("a new file is created");
        assert!(!dir.join("new").exists());
        assert!(matches!(
            check(Path::new("/dev/null"), false),
            Err(BackingError::NotUsable { .. })
        ));

        let (f, p) = file_with(&dir, "tiny", b"hello", 5);
        let e = claim(&f, &p, 5, true).unwrap_err();
        assert!(matches!(e, BackingError::TooSmall { bytes: 5, .. }), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"hello", "nothing written");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
