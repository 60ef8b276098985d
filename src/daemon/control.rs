//! The control socket's answers: zram's attributes, the listing's figures, reset.

use std::sync::Arc;

use uzram_engine::attrs::{self, AttrError, DaemonInfo};
use uzram_engine::Device;

use super::swapwatch::claim_unused;
use super::{log, ServeError};
use crate::common::control::{self, Request};
use crate::common::{block_path, socket_path, RUN_DIR};

/// Binds the control socket of device `id` and answers it from a thread; `stop` stops the
/// device (a reset).
pub(super) fn control_thread(
    id: u32,
    device: Arc<Device>,
    streams: usize,
    stop: fn(u32),
    restart: (u64, String),
) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let setup = |what, source| ServeError::Setup { what, source };
    std::fs::create_dir_all(RUN_DIR).map_err(|e| setup("create /run/uzram", e))?;
    let path = socket_path(id);
    // A socket left by a killed daemon of an earlier device with this id.
    crate::common::remove_socket(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| setup("bind the control socket", e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| setup("open the control socket to all users", e))?;
    // zram's attribute forms follow the kernel's (debug_stat changed in 6.14).
    let kernel = crate::common::running_release()
        .ok()
        .and_then(|r| crate::common::release_line(&r));
    std::thread::Builder::new()
        .name("uzram-control".into())
        .spawn(move || {
            // An I/O flusher though it serves no I/O, as every thread of the daemon is (see
            // `super::io_flusher`).
            let info = || {
                let slot_free = super::slotfree::status();
                DaemonInfo {
                    streams,
                    rss_bytes: super::watchdog::rss_bytes(),
                    pid: std::process::id(),
                    slot_free_probe: slot_free
                        .is_some_and(|s| matches!(s.mode, super::slotfree::Mode::Probe)),
                    slot_free_marked: slot_free.map_or(0, |s| s.marked()),
                    restarts: restart.0,
                    last_restart: restart.1.clone(),
                    writes_put_off: super::defer::DEFERRED.load(std::sync::atomic::Ordering::Relaxed),
                    kernel,
                    round_trips: super::roundtrip::totals(),
                }
            };
            control::serve(&listener, |request| {
                match request {
                    Request::Read(name) => attrs::read(&device, &info(), name),
                    // zram's reset takes a non-zero number.
                    Request::Write(name, value) if name == "reset" => {
                        match value.trim().parse::<u64>() {
                            Ok(n) if n > 0 => reset(id, stop),
                            _ => Err(AttrError::new(libc::EINVAL, "reset takes a non-zero number")),
                        }
                    }
                    Request::Write(name, value) => {
                        attrs::write(&device, name, value).map(|()| String::new())
                    }
                    Request::Reset => reset(id, stop),
                    Request::Info => {
                        let i = info();
                        let s = device.stats();
                        let p = device.policy_stats();
                        let bd_used: u64 = device
                            .backing()
                            .map_or(0, |b| b.files().iter().map(|f| f.used_bytes).sum());
                        Ok(format!(
                            "name={}\npid={}\nalgorithm={}\ndisksize={}\nstreams={}\nrss={}\nbd_used={bd_used}\nevicted={}\nrecompressed={}\nwritten_back={}\nslot_free={}\nslot_freed={}\nrestarts={}\nlast_restart={}\nmm_stat={}",
                            block_path(id),
                            i.pid,
                            device.algorithm().name(),
                            device.disksize(),
                            i.streams,
                            i.rss_bytes,
                            p.evicted_pages,
                            p.recompressed_pages,
                            p.age_wb_pages + p.watermark_wb_pages + p.host_wb_pages + p.spilled_pages,
                            if i.slot_free_probe { "probe" } else { "discard" },
                            s.notice_freed_pages,
                            i.restarts,
                            i.last_restart,
                            s.mm
                        ))
                    }
                }
            });
        })
        .map(drop)
        .map_err(|e| setup("start the control thread", e))
}

/// A reset request: refused while the device is in use; otherwise the device is stopped (the
/// claim on it held until then) and the daemon exits.
fn reset(id: u32, stop: fn(u32)) -> Result<String, AttrError> {
    let claim = claim_unused(id).map_err(|m| AttrError::new(libc::EBUSY, m))?;
    log(&format!("{}: reset requested, stopping", block_path(id)));
    std::thread::spawn(move || {
        stop(id);
        drop(claim);
    });
    Ok(String::new())
}
