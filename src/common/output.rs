//! The program's own output. stdout may be a closed pipe (`uzram | head -1`) or a full disk
//! (`uzram >/dev/full`): writing it is an error the command ends with, exit 1, quietly for a
//! closed pipe, as coreutils do, never a panic. stderr's failures are ignored (there is nowhere
//! left to say anything).

use std::fmt;
use std::io::{self, Write};

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

/// Writes `text` to stdout and flushes it.
pub fn out(text: &str) -> Result<(), OutputError> {
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
/// is written.
pub struct Replacing {
    target: std::path::PathBuf,
    file: io::BufWriter<tempfile::NamedTempFile>,
}

impl Replacing {
    pub fn new(path: &std::path::Path) -> io::Result<Replacing> {
        let target = match std::fs::metadata(path) {
            Ok(m) if m.is_file() => std::fs::canonicalize(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "it exists and is not a regular file; uzram replaces only regular files",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => path.to_path_buf(),
            Err(e) => return Err(e),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".uzram-")
            .suffix(".tmp")
            .tempfile_in(dir)?;
        Ok(Replacing {
            target,
            file: io::BufWriter::new(tmp),
        })
    }

    /// Flushes the file to disk and renames it over the target.
    pub fn commit(self) -> io::Result<()> {
        let tmp = self
            .file
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        tmp.as_file().sync_all()?;
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
