//! Opening a backing file, and undoing what the opening changed when the store is not opened
//! after all (another of its files failed, or the file system has no room for this one): a file
//! uzram created is removed, one it sized from empty is emptied again, and the start it labelled
//! gets back what was there (zeros, or with `force` someone's data). A store that fails to open
//! leaves the user's files as it found them; a device whose setup fails after its store opened
//! (the pool, the region, the driver) does not undo the store's files.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use super::super::backing_io::BackingIo;
use super::label::{self, LABEL_LEN};
use super::space::Space;
use super::store::{AlignedBuf, BackingError, BackingFile};
use super::{ALIGN, SECTOR};

/// What opening one backing file changed: see [`Undo::undo`].
pub(super) struct Undo {
    real: PathBuf,
    created: bool,
    /// It was an empty regular file, sized here.
    sized: bool,
    /// Its first [`LABEL_LEN`] bytes before the label was written over them.
    old_start: Option<AlignedBuf>,
}

impl Undo {
    /// Puts `file` (the one opened) back as it was found. Best effort: the store's error is
    /// what the caller reports, and a file that cannot be restored is no worse for trying.
    pub(super) fn undo(self, file: &File) {
        if self.created {
            // Only the file this opening created: not one put at that name since.
            let ours = file.metadata().ok().map(|m| (m.dev(), m.ino()));
            let there = std::fs::symlink_metadata(&self.real)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            if ours.is_some() && ours == there {
                let _ = std::fs::remove_file(&self.real);
            }
        } else if self.sized {
            let _ = file.set_len(0);
        } else if let Some(old) = self.old_start {
            let _ = FileExt::write_all_at(file, &old, 0).and_then(|()| file.sync_data());
        }
    }
}

impl BackingFile {
    /// Opens (creating it 0600 if need be) `path`: a regular file, or a block device (opened
    /// exclusively: not one mounted or in use as swap). A regular file of size 0 is sized to
    /// `default_bytes`; an existing file or block device keeps its size. Its start must be
    /// uzram's label or zeros unless `force` (see [`super::label`]). On error nothing is left
    /// changed; on success, the [`Undo`] of what was.
    ///
    /// `adopting`: the file of a device a successor takes over, which must already be
    /// uzram's (its label at its start); nothing is sized, allocated or written (its blocks were
    /// allocated and its label written when the device was made, and the successor opens it
    /// while the device's I/O waits: a journal commit could wait for that very I/O).
    pub(super) fn open(
        path: &Path,
        default_bytes: u64,
        force: bool,
        adopting: bool,
        wrap: &dyn Fn(File) -> Box<dyn BackingIo>,
    ) -> Result<(BackingFile, Undo), BackingError> {
        let open_err = |source| BackingError::Open {
            path: path.to_path_buf(),
            source,
        };
        let target = label::resolve(path)?;
        let block = target.as_ref().is_some_and(|t| t.block);
        let real = target.map_or_else(|| path.to_path_buf(), |t| t.path);
        // A successor's file must be there already: it creates nothing (a journal operation
        // while the device's I/O waits).
        let (file, direct, created) = open_file(&real, block, !adopting).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                BackingError::NotUsable {
                    path: path.to_path_buf(),
                    why: "is in use (mounted, swap, or held by another device)",
                }
            } else {
                open_err(e)
            }
        })?;
        let mut undo = Undo {
            real,
            created,
            sized: false,
            old_start: None,
        };
        match prepare(
            &file,
            path,
            block,
            default_bytes,
            force,
            adopting,
            &mut undo,
        ) {
            Ok(bytes) => {
                // Reads must not dirty the inode (an atime update is a journal transaction),
                // an adopted file's no more than a new one's. Needs the file's owner or
                // CAP_FOWNER; without it, atime updates stay.
                crate::sys::set_noatime(&file);
                let read_align = read_align(&file, direct);
                let mut space = Space::new(bytes / SECTOR);
                // The label's sectors are never a record's.
                space.set(0, LABEL_LEN / SECTOR, true);
                let opened = BackingFile {
                    io: wrap(file),
                    path: path.to_path_buf(),
                    direct,
                    read_align,
                    bytes,
                    space: Mutex::new(space),
                    writes: AtomicU64::new(0),
                };
                Ok((opened, undo))
            }
            Err(e) => {
                undo.undo(&file);
                Err(e)
            }
        }
    }
}

/// The alignment of a record read from `file` (see [`BackingFile::read_align`]): a power of two
/// from a sector to [`ALIGN`], which the read buffers' 4 KiB alignment and
/// [`super::READ_WINDOW`] cover; [`ALIGN`] where the file's direct I/O says nothing usable.
fn read_align(file: &File, direct: bool) -> usize {
    if !direct {
        return SECTOR as usize;
    }
    crate::sys::dio_offset_align(file)
        .filter(|a| a.is_power_of_two() && (SECTOR as usize..=ALIGN).contains(a))
        .unwrap_or(ALIGN)
}

/// Opens `real` for reading and writing, `O_DIRECT` where its file system has direct I/O: a
/// block device exclusively (`O_EXCL` without `O_CREAT`), a regular file created if missing
/// and `create`. Returns the file, whether it is direct, and whether this call created it.
fn open_file(real: &Path, block: bool, create: bool) -> std::io::Result<(File, bool, bool)> {
    let open = |direct: bool, create_new: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create_new)
            .mode(0o600)
            .custom_flags(
                libc::O_CLOEXEC
                    | libc::O_NOFOLLOW
                    | if block { libc::O_EXCL } else { 0 }
                    | if direct { libc::O_DIRECT } else { 0 },
            )
            .open(real)
    };
    if !block && create {
        match open(true, true) {
            Ok(f) => return Ok((f, true, true)),
            // A file system without direct I/O (tmpfs before Linux 6.6) refuses O_DIRECT with
            // EINVAL once the file is made: it is this call's.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return open(false, false)
                    .map(|f| (f, false, true))
                    .inspect_err(|_| {
                        // Not reopened: the empty file this call made goes again.
                        if std::fs::symlink_metadata(real)
                            .is_ok_and(|m| m.is_file() && m.len() == 0)
                        {
                            let _ = std::fs::remove_file(real);
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    match open(true, false) {
        Ok(f) => Ok((f, true, false)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            open(false, false).map(|f| (f, false, false))
        }
        Err(e) => Err(e),
    }
}

/// Checks what `file` holds and, unless `adopting`, sizes, allocates and labels it, noting in
/// `undo` what it changed. Returns its size.
fn prepare(
    file: &File,
    path: &Path,
    block: bool,
    default_bytes: u64,
    force: bool,
    adopting: bool,
    undo: &mut Undo,
) -> Result<u64, BackingError> {
    let open_err = |source| BackingError::Open {
        path: path.to_path_buf(),
        source,
    };
    let meta = file.metadata().map_err(open_err)?;
    label::check_mode(&meta, path)?;
    if !block {
        // Held while the store is open: another device cannot take the same file.
        label::check_unshared(file, path)?;
    }
    let mut bytes = if block {
        use std::io::{Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::End(0)).map_err(open_err)?
    } else {
        meta.len()
    };
    if adopting {
        label::check_label(file, path)?;
        return Ok(bytes);
    }
    // A file this call made is uzram's, whoever the file system says owns it (root_squash,
    // a uid= mount option).
    if !undo.created {
        label::check_owner(&meta, path, force)?;
    }
    // What is there is judged before anything is written, sized or allocated.
    if bytes > 0 || block {
        label::check_contents(file, path, bytes, force)?;
        let mut old = AlignedBuf::new(LABEL_LEN as usize);
        FileExt::read_exact_at(file, &mut old, 0).map_err(open_err)?;
        undo.old_start = Some(old);
    } else {
        bytes = default_bytes
            .max(label::MIN_BYTES)
            .next_multiple_of(ALIGN as u64);
        undo.sized = true;
        file.set_len(bytes).map_err(open_err)?;
    }
    if !block {
        // Allocate every block now (see the module docs). A file system without fallocate
        // keeps a sparse file; one without room for it is an error now, not at swap-out.
        if let Err(e) = crate::sys::allocate(file, bytes) {
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(open_err(e));
            }
        }
    }
    label::write_label(file, path, bytes)?;
    Ok(bytes)
}

/// What a backing path will name once opened: its device and inode if it exists, else the
/// canonical directory it would be made in and its name.
#[derive(PartialEq, Eq)]
enum Identity {
    Inode(u64, u64, u64),
    New(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    if let Ok(m) = std::fs::metadata(path) {
        return Some(Identity::Inode(m.dev(), m.ino(), m.rdev()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(Identity::New(
        std::fs::canonicalize(dir).ok()?.join(path.file_name()?),
    ))
}

/// Refuses a store that names one file twice, before any is opened (nothing changed).
pub(super) fn check_distinct(paths: &[PathBuf]) -> Result<(), BackingError> {
    let ids: Vec<Option<Identity>> = paths.iter().map(|p| identity(p)).collect();
    for (i, a) in ids.iter().enumerate() {
        if a.is_some() && ids[..i].contains(a) {
            return Err(BackingError::Config("the same file named twice"));
        }
    }
    Ok(())
}

/// [`check_distinct`] on the files as opened (a name may have changed in between).
pub(super) fn check_distinct_files(files: &[BackingFile]) -> Result<(), BackingError> {
    for (i, a) in files.iter().enumerate() {
        let ma = a.io.file().metadata()?;
        if files[..i].iter().any(|b| {
            b.io.file()
                .metadata()
                .is_ok_and(|mb| (mb.dev(), mb.ino(), mb.rdev()) == (ma.dev(), ma.ino(), ma.rdev()))
        }) {
            return Err(BackingError::Config("the same file named twice"));
        }
    }
    Ok(())
}
