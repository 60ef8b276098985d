//! The daemon's control socket: how `uzram attr`, `uzram --reset` and the device listing talk to
//! the daemon that serves a device.
//!
//! One Unix stream socket per device, `/run/uzram/ublkbN.sock`, mode 0666: like sysfs, reading is
//! open to every local user (monitoring runs unprivileged) and every change needs root, checked
//! per request from the peer's credentials (`SO_PEERCRED`), never from anything the client says.
//!
//! The protocol is one request per connection, one line of text (at most [`MAX_REQUEST`] bytes):
//! `read NAME`, `write NAME VALUE`, `info` or `reset`. The reply is `ok` or `err ERRNO`, a
//! newline, then the body (the attribute's bytes, or the error's message). A malformed request
//! gets an `err` reply; a client that sends nothing is dropped after [`IO_TIMEOUT`].

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::socket_path;
use crate::sys::peer;
use uzram_engine::attrs::AttrError;

/// Longest request line.
pub const MAX_REQUEST: usize = 4096;
/// How long either side waits for the other.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client waits for the reply to a write that works through the whole device
/// ([`Request::is_long`]): zram's sysfs write of `recompress` or `writeback` blocks until the
/// pass is done, minutes on a large device or a slow machine, and so does this one.
pub const LONG_TIMEOUT: Duration = Duration::from_secs(3600);

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Read an attribute.
    Read(String),
    /// Write an attribute (root only).
    Write(String, String),
    /// The figures the listing shows, `key=value` lines.
    Info,
    /// Stop and delete the device (root only); refused while it is in use.
    Reset,
}

impl Request {
    /// The request's line, without the newline.
    pub fn encode(&self) -> String {
        match self {
            Request::Read(n) => format!("read {n}"),
            Request::Write(n, v) => format!("write {n} {v}"),
            Request::Info => "info".into(),
            Request::Reset => "reset".into(),
        }
    }

    /// Parses a request line (without its newline).
    pub fn decode(line: &str) -> Result<Request, AttrError> {
        let bad = || AttrError::new(libc::EINVAL, format!("malformed request {line:?}"));
        if line.chars().any(char::is_control) {
            return Err(AttrError::new(
                libc::EINVAL,
                format!(
                    "request {line:?} holds a control character (a newline?): one request \
                     names one attribute, and a value is one line of text"
                ),
            ));
        }
        let name_ok = is_attr_name;
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        match verb {
            "read" if name_ok(rest) => Ok(Request::Read(rest.into())),
            "write" => {
                let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                if name_ok(name) {
                    Ok(Request::Write(name.into(), value.into()))
                } else {
                    Err(bad())
                }
            }
            "info" if rest.is_empty() => Ok(Request::Info),
            "reset" if rest.is_empty() => Ok(Request::Reset),
            _ => Err(bad()),
        }
    }

    /// Whether only root may make this request.
    pub fn needs_root(&self) -> bool {
        matches!(self, Request::Write(..) | Request::Reset)
    }

    /// Whether the daemon works through the whole device before it answers (recompression,
    /// writeback, compaction, idle marking): its client waits [`LONG_TIMEOUT`] for the reply,
    /// not [`IO_TIMEOUT`].
    pub fn is_long(&self) -> bool {
        matches!(self, Request::Write(name, _)
            if matches!(name.as_str(), "recompress" | "writeback" | "compact" | "idle"))
    }
}

/// Serves requests on `listener` until it fails; each connection is read, answered and closed
/// before the next. `handle` answers a request that passed the permission check.
pub fn serve(
    listener: &UnixListener,
    mut handle: impl FnMut(&Request) -> Result<String, AttrError>,
) {
    for conn in listener.incoming() {
        let Ok(mut stream) = conn else { continue };
        let reply = answer(&stream, &mut handle);
        let text = match reply {
            Ok(body) => format!("ok\n{body}"),
            Err(e) => format!("err {}\n{}", e.errno, e.message),
        };
        let _ = stream.write_all(text.as_bytes());
        // Drain what the client sent beyond the request (bounded), so that closing with unread
        // bytes does not reset the connection before the client has read the reply.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = std::io::copy(&mut (&stream).take(1 << 16), &mut std::io::sink());
    }
}

fn answer(
    stream: &UnixStream,
    handle: &mut impl FnMut(&Request) -> Result<String, AttrError>,
) -> Result<String, AttrError> {
    let io_err = |e: std::io::Error| AttrError::new(libc::EIO, format!("control socket: {e}"));
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
    let who = peer(stream).map_err(io_err)?;
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream.take(MAX_REQUEST as u64 + 1));
    reader.read_until(b'\n', &mut line).map_err(io_err)?;
    if line.last() != Some(&b'\n') {
        return Err(AttrError::new(
            libc::EINVAL,
            format!("request not a line of at most {MAX_REQUEST} bytes"),
        ));
    }
    // One request per connection: a second line that arrived with it is refused, not ignored
    // (the client meant something by it); one sent later is not seen (best effort).
    if !reader.buffer().is_empty() {
        return Err(AttrError::new(
            libc::EINVAL,
            "more than one line sent: one request per connection",
        ));
    }
    line.pop();
    let text = std::str::from_utf8(&line)
        .map_err(|_| AttrError::new(libc::EINVAL, "request is not UTF-8"))?;
    let request = Request::decode(text)?;
    if request.needs_root() && who.uid != 0 {
        return Err(AttrError::new(
            libc::EPERM,
            format!("{} needs root (you are uid {})", request.encode(), who.uid),
        ));
    }
    handle(&request)
}

/// Why a request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No daemon listens on the socket (none was ever there, or it died).
    #[error("no daemon answers on {path}: {source}")]
    NoDaemon {
        /// The socket.
        path: PathBuf,
        /// What connect said.
        #[source]
        source: std::io::Error,
    },
    /// The daemon refused or failed the request.
    #[error("{0}")]
    Refused(AttrError),
    /// The daemon's reply was too slow, too long or not text.
    #[error("the daemon on {path} did not answer properly: {why}")]
    BadReply {
        /// The socket.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// The conversation broke off.
    #[error("talking to the daemon on {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
}

/// The most bytes a reply may hold (the longest attribute is a few KiB).
pub const MAX_REPLY: usize = 1 << 20;

/// Reads the whole reply, within one `timeout` for all of it (a daemon that trickles bytes
/// cannot keep the client waiting longer) and at most [`MAX_REPLY`] bytes.
fn read_reply(
    stream: &mut UnixStream,
    path: &Path,
    timeout: Duration,
) -> Result<String, CallError> {
    let bad = |why: String| CallError::BadReply {
        path: path.to_path_buf(),
        why,
    };
    let deadline = std::time::Instant::now() + timeout;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(bad(format!(
                "no whole reply within {} s (the daemon is stuck or busy)",
                timeout.as_secs()
            )));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|source| CallError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if reply.len() + n > MAX_REPLY => {
                return Err(bad(format!("a reply longer than {MAX_REPLY} bytes")))
            }
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(source) => {
                return Err(CallError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
    String::from_utf8(reply).map_err(|_| bad("a reply that is not UTF-8".into()))
}

/// Sends `request` to the daemon of device `id` and returns the reply's body.
pub fn call(id: u32, request: &Request) -> Result<String, CallError> {
    call_at(&socket_path(id), request)
}

/// [`call`] on a given socket path.
pub fn call_at(path: &Path, request: &Request) -> Result<String, CallError> {
    // What would not arrive as itself (a name or value with a newline would be two lines) is
    // refused here, before anything is sent.
    let sent = Request::decode(&request.encode()).map_err(CallError::Refused)?;
    if sent != *request {
        return Err(CallError::Refused(AttrError::new(
            libc::EINVAL,
            format!(
                "{:?} would arrive as {:?}: a name has no spaces",
                request.encode(),
                sent
            ),
        )));
    }
    let mut stream = UnixStream::connect(path).map_err(|source| CallError::NoDaemon {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| CallError::Io {
        path: path.to_path_buf(),
        source,
    };
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream
        .write_all(format!("{}\n", request.encode()).as_bytes())
        .map_err(io)?;
    let timeout = if request.is_long() {
        LONG_TIMEOUT
    } else {
        IO_TIMEOUT
    };
    let reply = read_reply(&mut stream, path, timeout)?;
    let (status, body) = reply.split_once('\n').unwrap_or((&reply, ""));
    if status == "ok" {
        return Ok(body.to_string());
    }
    let errno = status
        .strip_prefix("err ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(libc::EIO);
    Err(CallError::Refused(AttrError::new(errno, body)))
}

/// Whether `name` can be an attribute's name: zram's are lowercase letters and `_`.
pub fn is_attr_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// The client's check of a request, so that what is wrong is said in the user's terms, not the
/// protocol's: a name that cannot be an attribute's, a value that is not one line of text.
pub fn check_request(name: &str, value: Option<&str>) -> Result<(), String> {
    if !is_attr_name(name) {
        return Err(format!(
            "{name:?}: not an attribute's name (zram's names: lowercase letters and _, e.g. mm_stat)"
        ));
    }
    match value.filter(|v| v.chars().any(char::is_control)) {
        Some(v) => Err(format!(
            "{name}: the value {v:?} holds a control character (a newline?): a value is one line of text"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        for r in [
            Request::Read("mm_stat".into()),
            Request::Write("mem_limit".into(), "2G".into()),
            Request::Write("compact".into(), "".into()),
            Request::Info,
            Request::Reset,
        ] {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        for bad in [
            "",
            "read",
            "read ../etc",
            "read MM",
            "info x",
            "frob mm_stat",
            "write",
            "read mm_stat\nreset",
            "write policy psi=off\nreset",
            "write policy a\tb",
            "write comp_algorithm lz4\r",
        ] {
            assert_eq!(
                Request::decode(bad).unwrap_err().errno,
                libc::EINVAL,
                "{bad:?}"
            );
        }
    }

    /// A scratch directory of this process's own for test `tag`, and a socket listening in it.
    fn listening(tag: &str) -> (PathBuf, PathBuf, UnixListener) {
        let dir = std::env::temp_dir().join(format!("uzram-control-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    /// A reply later than [`IO_TIMEOUT`] is waited for after a write that works through the
    /// whole device (zram's blocks as long), and is an error after any other request.
    #[test]
    fn long_writes_wait_for_a_slow_reply_and_others_do_not() {
        let (dir, path, listener) = listening("slow");
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { continue };
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                std::thread::sleep(IO_TIMEOUT + Duration::from_millis(300));
                let _ = s.write_all(b"ok\ndone");
            }
        });
        assert!(Request::Write("recompress".into(), "type=idle".into()).is_long());
        assert!(!Request::Write("mem_limit".into(), "1G".into()).is_long());
        assert!(!Request::Read("recompress".into()).is_long());
        let long = call_at(
            &path,
            &Request::Write("recompress".into(), "type=idle".into()),
        );
        assert_eq!(long.unwrap(), "done");
        match call_at(&path, &Request::Read("mm_stat".into())) {
            Err(CallError::BadReply { why, .. }) => assert!(why.contains("within 2 s"), "{why}"),
            r => panic!("a reply after {IO_TIMEOUT:?} was taken: {r:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_socket_answers_reads_and_refuses_malformed_requests() {
        let (dir, path, listener) = listening("serve");
        std::thread::spawn(move || {
            serve(&listener, |r| match r {
                Request::Read(n) if n == "mm_stat" => Ok("1 2 3\n".into()),
                Request::Read(n) => Err(AttrError::new(libc::ENOENT, format!("no {n}"))),
                _ => Ok(String::new()),
            })
        });
        assert_eq!(
            call_at(&path, &Request::Read("mm_stat".into())).unwrap(),
            "1 2 3\n"
        );
        match call_at(&path, &Request::Read("nope".into())) {
            Err(CallError::Refused(e)) => {
                assert_eq!((e.errno, e.message.as_str()), (libc::ENOENT, "no nope"))
            }
            r => panic!("{r:?}"),
        }
        // A name or value that would not arrive as itself is refused before it is sent.
        for r in [
            Request::Read("mm_stat\nreset".into()),
            Request::Write("policy".into(), "psi=off\nreset".into()),
        ] {
            match call_at(&path, &r) {
                Err(CallError::Refused(e)) => {
                    assert_eq!(e.errno, libc::EINVAL);
                    assert!(e.message.contains("control character"), "{}", e.message);
                }
                r => panic!("{r:?}"),
            }
        }
        match call_at(&path, &Request::Write("policy x".into(), "y".into())) {
            Err(CallError::Refused(e)) => assert!(e.message.contains("would arrive as"), "{e:?}"),
            r => panic!("{r:?}"),
        }
        // Raw garbage, an overlong line, a silent client and two requests in one: errors, and
        // the server lives on.
        for junk in [
            &b"\xff\xfe\n"[..],
            &vec![b'a'; MAX_REQUEST + 10][..],
            b"read mm_stat",
            b"read mm_stat\nreset\n",
        ] {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(junk).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).unwrap();
            assert!(reply.starts_with("err 22\n"), "{reply:?}");
        }
        // Writes need root; reads do not. As root, a thread drops to uid 65534 for itself alone
        // (the raw syscall, not glibc's process-wide setresuid) to be the unprivileged client.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        if crate::sys::uid() == 0 {
            let root = call_at(&path, &Request::Write("mem_limit".into(), "1G".into()));
            assert!(root.is_ok(), "{root:?}");
            let p = path.clone();
            let (read, write) = std::thread::spawn(move || {
                crate::sys::set_thread_uid(65534).expect("setresuid");
                (
                    call_at(&p, &Request::Read("mm_stat".into())),
                    call_at(&p, &Request::Write("mem_limit".into(), "1G".into())),
                )
            })
            .join()
            .unwrap();
            assert!(read.is_ok(), "{read:?}");
            assert!(
                matches!(write, Err(CallError::Refused(ref e)) if e.errno == libc::EPERM),
                "{write:?}"
            );
        } else {
            let w = call_at(&path, &Request::Write("mem_limit".into(), "1G".into()));
            assert!(
                matches!(w, Err(CallError::Refused(ref e)) if e.errno == libc::EPERM),
                "{w:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
