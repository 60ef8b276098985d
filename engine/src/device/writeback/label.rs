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

/// Checks what an existing file or device of `len` bytes holds, before anything is written
/// to it (or it is sized or allocated): at least [`MIN_BYTES`], and uzram's label or zeros at
/// its start, unless `force`.
pub(super) fn check_contents(
    file: &File,
    path: &Path,
    len: u64,
    force: bool,
) -> Result<(), BackingError> {
    if len < MIN_BYTES {
        return Err(BackingError::TooSmall {
            path: path.to_path_buf(),
            bytes: len,
            min: MIN_BYTES,
        });
    }
    let found = inspect(file, len).map_err(|source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    match found {
        Found::Data(offset) if !force => Err(BackingError::Foreign {
            path: path.to_path_buf(),
            offset,
        }),
        _ => Ok(()),
    }
}

/// Refuses `file` unless it starts with uzram's label: for a successor reopening a device's
/// backing file, which uzram labelled when it made the device (reads 4 KiB, writes nothing).
pub(super) fn check_label(file: &File, path: &Path) -> Result<(), BackingError> {
    match inspect(file, LABEL_LEN) {
        Ok(Found::Label) => Ok(()),
        Ok(_) => Err(BackingError::NotUsable {
            path: path.to_path_buf(),
            why: "does not start with uzram's label (it is not the backing file uzram wrote)",
        }),
        Err(source) => Err(BackingError::Open {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes the label at the start of `file` (of `len` bytes).
pub(super) fn write_label(file: &File, path: &Path, len: u64) -> Result<(), BackingError> {
    let io = |source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut label = AlignedBuf::new(LABEL_LEN as usize);
    label.fill(0);
    label[..MAGIC.len()].copy_from_slice(MAGIC);
    label[MAGIC.len()..MAGIC.len() + 8].copy_from_slice(&len.to_le_bytes());
    file.write_all_at(&label, 0).map_err(io)?;
    file.sync_data().map_err(io)
}

/// Refuses a file others may write (it could be tampered with, or swapped for another): a
/// regular file must be writable by its owner only; a block device belongs to group disk, which
/// may write it (0660).
pub(super) fn check_mode(meta: &std::fs::Metadata, path: &Path) -> Result<(), BackingError> {
    use std::os::unix::fs::MetadataExt;
    let forbidden = if meta.file_type().is_file() {
        0o022
    } else {
        0o002
    };
    if meta.mode() & forbidden != 0 {
        return Err(BackingError::Unsafe {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Refuses, unless `force`, an existing regular file that another user owns (what uzram writes,
/// pages of memory, would be kept in their file) or that its owner may not write (read-only
/// on purpose): uzram's own backing files are its user's, mode 0600.
pub(super) fn check_owner(
    meta: &std::fs::Metadata,
    path: &Path,
    force: bool,
) -> Result<(), BackingError> {
    use std::os::unix::fs::MetadataExt;
    if force || !meta.file_type().is_file() {
        return Ok(());
    }
    let why = if meta.uid() != crate::sys::euid() {
        "belongs to another user: what uzram writes, pages of memory, would be kept in their \
         file (chown it, name another file, or give --force)"
    } else if meta.mode() & 0o200 == 0 {
        "is read-only (its owner may not write it): chmod u+w it, name another file, or give \
         --force"
    } else {
        return Ok(());
    };
    Err(BackingError::NotUsable {
        path: path.to_path_buf(),
        why,
    })
}

/// A regular file another uzram device holds (its `flock`) is refused: two stores in one file
/// would overwrite each other's records.
pub(super) fn check_unshared(file: &File, path: &Path) -> Result<(), BackingError> {
    match crate::sys::try_lock(file) {
        Ok(true) => Ok(()),
        Ok(false) => Err(BackingError::NotUsable {
            path: path.to_path_buf(),
            why: "is the backing file of another uzram device",
        }),
        Err(source) => Err(BackingError::Open {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// What [`super::BackingStore::open_all`] would refuse `path` for, found without writing
/// anything or opening it for writing: for a command line to check its whole plan before it
/// starts a device. A missing file is fine (it will be created).
pub fn check(path: &Path, force: bool) -> Result<(), BackingError> {
    let io = |source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    };
    let Some(target) = resolve(path)? else {
        return Ok(());
    };
    let block = target.block;
    // Opened as the store will open it (read and write, a block device exclusively: one
    // mounted, used as swap or held by another device refuses), but nothing is written.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        let excl = if block { libc::O_EXCL } else { 0 };
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | excl)
            .open(&target.path)
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
    let meta = file.metadata().map_err(io)?;
    check_mode(&meta, path)?;
    check_owner(&meta, path, force)?;
    if !block {
        check_unshared(&file, path)?;
    }
    let len = if block {
        use std::io::{Seek, SeekFrom};
        (&file).seek(SeekFrom::End(0)).map_err(io)?
    } else {
        meta.len()
    };
    if !block && len == 0 {
        // Empty: uzram sizes it.
        return Ok(());
    }
    check_contents(&file, path, len, force)
}

/// What a backing path names: the path to open (a link to a block device, such as
/// `/dev/disk/by-id/...` or `/dev/mapper/...`, resolved) and whether it is a block device.
pub(super) struct Target {
    pub(super) path: std::path::PathBuf,
    pub(super) block: bool,
}

/// Resolves `path` (see [`Target`]); `None` when it does not exist yet, and then the store may
/// create it: not under /dev (a device that has not appeared would become a file in RAM), and
/// only in a directory that exists. A link to anything but a block device, and any other kind
/// of file, is refused by name.
pub(super) fn resolve(path: &Path) -> Result<Option<Target>, BackingError> {
    let refuse = |why| BackingError::NotUsable {
        path: path.to_path_buf(),
        why,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            let real = std::fs::canonicalize(path).map_err(|e| {
                refuse(if e.raw_os_error() == Some(libc::ELOOP) {
                    "is a loop of symbolic links"
                } else {
                    "is a symbolic link to nothing"
                })
            })?;
            if std::fs::metadata(&real).is_ok_and(|m| m.file_type().is_block_device()) {
                Ok(Some(Target {
                    path: real,
                    block: true,
                }))
            } else {
                Err(refuse("is a symbolic link to a file: name the file itself"))
            }
        }
        Ok(m) if m.file_type().is_block_device() => Ok(Some(Target {
            path: path.to_path_buf(),
            block: true,
        })),
        Ok(m) if m.file_type().is_file() => {
            // procfs and sysfs files look regular (and empty) but hold no data.
            let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            if real.starts_with("/proc") || real.starts_with("/sys") {
                return Err(refuse(
                    "is a kernel interface under /proc or /sys, not a file that can hold data",
                ));
            }
            Ok(Some(Target {
                path: path.to_path_buf(),
                block: false,
            }))
        }
        Ok(_) => Err(refuse("is neither a block device nor a regular file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.starts_with("/dev") {
                return Err(refuse(
                    "does not exist (uzram makes backing files, but not under /dev)",
                ));
            }
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            if dir.is_some_and(|d| !d.is_dir()) {
                return Err(refuse("does not exist, nor does its directory"));
            }
            Ok(None)
        }
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
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
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
        check_contents(&f, &p, 2 << 20, false).unwrap();
        write_label(&f, &p, 2 << 20).unwrap();
        assert_eq!(inspect(&f, 2 << 20).unwrap(), Found::Label);
        check_contents(&f, &p, 2 << 20, false).expect("ours, taken again");

        let mut ext = vec![0u8; 4096];
        ext[1024 + 56] = 0x53; // ext's superblock magic, low byte
        let (f, p) = file_with(&dir, "ext", &ext, 2 << 20);
        let before = std::fs::read(&p).unwrap();
        let e = check_contents(&f, &p, 2 << 20, false).unwrap_err();
        assert!(
            matches!(e, BackingError::Foreign { offset: 1080, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("force"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), before, "nothing written");
        check_contents(&f, &p, 2 << 20, true).expect("forced");

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
            check(&dir.join("no-such-dir/new"), false),
            Err(BackingError::NotUsable { .. })
        ));
        assert!(matches!(
            check(Path::new("/dev/uzram-no-such-disk"), false),
            Err(BackingError::NotUsable { .. })
        ));
        // A file another device holds is refused.
        let (held, p) = file_with(&dir, "held", &[], 0);
        assert!(crate::sys::try_lock(&held).unwrap());
        assert!(matches!(
            check(&p, false),
            Err(BackingError::NotUsable { .. })
        ));
        drop(held);
        check(&p, false).expect("free again");
        assert!(matches!(
            check(Path::new("/dev/null"), false),
            Err(BackingError::NotUsable { .. })
        ));

        let (f, p) = file_with(&dir, "tiny", b"hello", 5);
        let e = check_contents(&f, &p, 5, true).unwrap_err();
        assert!(matches!(e, BackingError::TooSmall { bytes: 5, .. }), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"hello", "nothing written");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
