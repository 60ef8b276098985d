//! The program's own output. stdout may be a closed pipe (`uzram | head -1`) or a full disk
//! (`uzram >/dev/full`): writing it is an error the command ends with, exit 1, quietly for a
//! closed pipe, as coreutils do, never a panic. stderr's failures are ignored (there is nowhere
//! left to say anything).

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the program started with its stdout closed (`uzram >&-`): Rust's standard library
/// takes a write to a closed stdout for a success, so [`out`] says so itself.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Records that stdout was closed at start (`main`, from `sys::stdout_was_closed`; Rust's runtime
/// has pointed the descriptor at /dev/null, so that no file takes its number): every later
/// [`out`] fails.
pub fn note_stdout_closed() {
    STDOUT_CLOSED.store(true, Ordering::Relaxed);
}

/// Whether stdout was closed at start.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// The error of a write to a stdout that was closed at start.
pub fn closed_stdout_error() -> OutputError {
    OutputError(io::Error::other("standard output is closed"))
}

/// stdout could not be written.
#[derive(Debug)]
pub struct OutputError(pub io::Error);

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "write error: {}", self.0)
    }
}

impl std::error::Error for OutputError {}

impl OutputError {
    /// Whether the reader went away (EPIPE): nothing to tell anyone.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

/// A path as messages show it: as it is when it is printable UTF-8 without control characters,
/// else quoted with escapes (a name holding a newline would otherwise print as two lines, the
/// first naming another file).
pub struct Shown<'a>(pub &'a std::path::Path);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.to_str() {
            Some(s) if !s.chars().any(char::is_control) => f.write_str(s),
            _ => write!(f, "{:?}", self.0),
        }
    }
}

/// [`Shown`] of `path`.
pub fn shown(path: &std::path::Path) -> Shown<'_> {
    Shown(path)
}

/// Writes `text` to stdout and flushes it.
pub fn out(text: &str) -> Result<(), OutputError> {
    if stdout_closed() {
        return Err(closed_stdout_error());
    }
    let mut o = io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(OutputError)
}

/// Writes `line` and a newline to stdout.
pub fn outln(line: impl fmt::Display) -> Result<(), OutputError> {
    out(&format!("{line}\n"))
}

/// Writes `line` and a newline to stderr; a failure is ignored.
pub fn warn(line: impl fmt::Display) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

/// An output file written under a temporary name beside `path` and renamed over it by
/// [`Replacing::commit`]: a failure (or a drop without commit) leaves `path` as it was, and the
/// temporary file, which uzram created, is removed. `path` must be a new name or a regular file
/// (a symlink to one is followed): a device, FIFO or directory there is refused before anything
/// is written. A file replaced keeps its mode (less any set-id bits) and group: the content was
/// asked for, not those; one that belongs to another user is refused, since what uzram writes
/// is often a process's memory, which would then be that user's. A new one is made 0600
/// (or [`Replacing::new_file_mode`]).
pub struct Replacing {
    target: std::path::PathBuf,
    file: io::BufWriter<tempfile::NamedTempFile>,
    /// The replaced file's mode, owner and group.
    keep: Option<(u32, u32, u32)>,
    /// A new file's mode.
    new_mode: u32,
    /// Whether the file is flushed to disk before the rename.
    sync: bool,
}

impl Replacing {
    pub fn new(path: &std::path::Path) -> io::Result<Replacing> {
        use std::os::unix::fs::MetadataExt;
        let mut keep = None;
        let target = match std::fs::metadata(path) {
            Ok(m) if m.is_file() => {
                let me = crate::sys::uid();
                if m.uid() != me {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "it belongs to uid {}, not to uzram's user (uid {me}): what uzram \
                             writes would become theirs; remove it first or name another file",
                            m.uid()
                        ),
                    ));
                }
                keep = Some((m.mode() & 0o777, m.uid(), m.gid()));
                let real = std::fs::canonicalize(path)?;
                // procfs and sysfs files look regular but are no place for a file of uzram's
                // (by path, and by file system type where they are mounted elsewhere)
                if real.starts_with("/proc")
                    || real.starts_with("/sys")
                    || crate::sys::on_kernel_fs(&real).unwrap_or(false)
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "it is a kernel interface (on procfs or sysfs), not a file uzram can replace",
                    ));
                }
                real
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "it exists and is not a regular file; uzram replaces only regular files",
                ))
            }
            // A dangling link: renaming over it would replace the link, not make its target.
            Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::read_link(path) {
                Ok(to) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "it is a symbolic link to {}, which does not exist; name the file \
                             itself",
                            shown(&to)
                        ),
                    ))
                }
                Err(_) => path.to_path_buf(),
            },
            Err(e) => return Err(e),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".uzram-")
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(|e| {
                // The system's words for why, without the path (said once, here).
                let why = match (e.kind(), e.raw_os_error()) {
                    (io::ErrorKind::NotFound, _)
                        if crate::sys::on_kernel_fs(&dir).unwrap_or(false) =>
                    {
                        "it is a kernel interface (procfs or sysfs), where no file can be made"
                            .into()
                    }
                    (io::ErrorKind::NotFound, _) if !dir.exists() => "no such directory".into(),
                    (_, Some(n)) => io::Error::from_raw_os_error(n).to_string(),
                    (kind, None) => kind.to_string(),
                };
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot make a file in {} to write it under a temporary name: {why}",
                        shown(&dir)
                    ),
                )
            })?;
        Ok(Replacing {
            target,
            file: io::BufWriter::new(tmp),
            keep,
            new_mode: 0o600,
            sync: true,
        })
    }

    /// A new file gets `mode` rather than 0600 (a replaced one keeps its own).
    pub fn new_file_mode(mut self, mode: u32) -> Replacing {
        self.new_mode = mode;
        self
    }

    /// No flush to disk before the rename: for a file rewritten every few seconds, whose loss
    /// in a crash costs nothing (and whose flushes would wear flash).
    pub fn unsynced(mut self) -> Replacing {
        self.sync = false;
        self
    }

    /// Flushes the file to disk (unless [`Replacing::unsynced`]), gives it the replaced file's
    /// mode and group (or the new file's mode), and renames it
    /// over the target.
    pub fn commit(self) -> io::Result<()> {
        let tmp = self
            .file
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        if let Some((mode, uid, gid)) = self.keep {
            let f = tmp.as_file();
            // Its owner is uzram's user (see `new`); its group may not be one of theirs: then
            // the group keeps nothing of the mode.
            let mode = match std::os::unix::fs::fchown(f, Some(uid), Some(gid)) {
                Ok(()) => mode,
                Err(_) => mode & 0o700,
            };
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        } else if self.new_mode != 0o600 {
            tmp.as_file()
                .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(self.new_mode))?;
        }
        if self.sync {
            tmp.as_file().sync_all()?;
        }
        tmp.persist(&self.target).map_err(|e| e.error)?;
        Ok(())
    }
}

impl Write for Replacing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A file replaced keeps its mode and group; another user's is refused; a new one is
    /// 0600; a dropped one leaves the old content and no temporary file.
    #[test]
    fn a_replaced_file_keeps_its_mode_and_group_and_another_users_is_refused() {
        let dir = std::env::temp_dir().join(format!("uzram-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let root = crate::sys::uid() == 0;
        if root {
            std::os::unix::fs::chown(&path, None, Some(65534)).unwrap();
        }
        let mut r = Replacing::new(&path).unwrap();
        r.write_all(b"dropped").unwrap();
        drop(r);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let mut r = Replacing::new(&path).unwrap();
        r.write_all(b"new").unwrap();
        r.commit().unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(m.mode() & 0o7777, 0o640);
        if root {
            assert_eq!((m.uid(), m.gid()), (0, 65534));
            // Another user's file is not replaced: the dump would become theirs.
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            let e = Replacing::new(&path).err().expect("refused");
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), b"new");
        }
        let fresh = dir.join("fresh");
        let mut r = Replacing::new(&fresh).unwrap();
        r.write_all(b"x").unwrap();
        r.commit().unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o7777, 0o600);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 2, "{left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
