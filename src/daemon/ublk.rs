//! The only module that talks to libublk (cargo feature `ublk`): adds the device, sets its
//! block parameters, runs one thread per queue and deletes the device when serving ends.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDesc, BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, UblkFlags, UblkIORes};
use uzram_engine::Device;

use super::defer::Deferral;
use super::io::{self, Attempt, Op, Request, Served};
use super::roundtrip::{self, QueueCounts};
use super::{log, ServeArgs, ServeError, MAX_IO_BYTES};
use crate::common::{block_path, socket_path};

/// The device's block parameters, set explicitly: 4 KiB blocks, no volatile cache,
/// non-rotational, discard and write-zeroes in one segment at 4 KiB granularity.
fn set_params(dev: &mut UblkDev, disksize: u64) {
    let max_sectors = dev.dev_info.max_io_buf_bytes >> 9;
    dev.tgt.dev_size = disksize;
    dev.tgt.params = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs: 0,
            logical_bs_shift: 12,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors,
            dev_sectors: disksize >> 9,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 4096,
            max_discard_sectors: u32::MAX >> 9,
            max_write_zeroes_sectors: u32::MAX >> 9,
            max_discard_segments: 1,
            reserved0: 0,
        },
        ..Default::default()
    };
}

/// The kernel's descriptor as the engine-facing [`Request`].
fn request(iod: &sys::ublksrv_io_desc) -> Request {
    let op = match iod.op_flags & 0xff {
        sys::UBLK_IO_OP_READ => Op::Read,
        sys::UBLK_IO_OP_WRITE => Op::Write,
        sys::UBLK_IO_OP_FLUSH => Op::Flush,
        sys::UBLK_IO_OP_DISCARD => Op::Discard,
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes,
        other => Op::Other(other),
    };
    Request {
        op,
        start_sector: iod.start_sector,
        nr_sectors: iod.nr_sectors,
        swap: iod.op_flags & sys::UBLK_IO_F_SWAP != 0,
    }
}

/// A queue thread's start: an I/O flusher with its stack faulted in and its own [`IoContext`].
fn queue_start(qid: u16, device: &Device) -> Option<uzram_engine::IoContext> {
    if let Err(e) = super::io_flusher() {
        log(&format!("queue {qid}: {e}"));
        return None;
    }
    super::heap::serve_from_io_heap();
    super::pin::prefault_stack::<{ super::pin::STACK_PREFAULT }>();
    match device.context() {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            log(&format!("queue {qid}: {e}"));
            None
        }
    }
}

/// `UBLK_F_USER_COPY`: a request's data is read from and written to the ublk char device
/// (`/dev/ublkcN`) at the request's own position, through the queue thread's one buffer.
struct UserCopy<'a> {
    cdev: &'a std::fs::File,
    pos: u64,
    counts: &'a QueueCounts,
}

impl io::Transfer for UserCopy<'_> {
    fn fetch(&self, data: &mut [u8]) -> std::io::Result<()> {
        self.counts.copy();
        self.cdev.read_exact_at(data, self.pos)
    }
    fn deliver(&self, data: &[u8]) -> std::io::Result<()> {
        self.counts.copy();
        self.cdev.write_all_at(data, self.pos)
    }
}

/// Serves queue `qid` with `UBLK_F_USER_COPY`: one request at a time through one buffer of
/// [`MAX_IO_BYTES`], whatever the depth (the kernel holds the other requests' data until the
/// thread copies it).
fn user_copy_queue(qid: u16, dev: &UblkDev, device: &Device, buf: &mut [u8]) {
    let Some(mut ctx) = queue_start(qid, device) else {
        return;
    };
    let counts = roundtrip::for_queue_thread(qid);
    let cdev = match crate::sys::dup_fd(dev.tgt.fds[0]) {
        Ok(f) => f,
        Err(e) => return log(&format!("queue {qid}: the char device: {e}")),
    };
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(None)))
    {
        Ok(q) => q,
        Err(e) => return log(&format!("queue {qid}: {e}")),
    };
    let handler = move |q: &UblkQueue, tag: u16, attempt: Attempt, deferral: &mut Deferral| {
        let transfer = UserCopy {
            cdev: &cdev,
            pos: UblkIOCtx::ublk_user_copy_pos(qid, tag, 0),
            counts,
        };
        let served = io::handle(
            device,
            &mut ctx,
            request(q.get_iod(tag)),
            &mut *buf,
            &transfer,
            attempt,
            deferral,
        );
        if let Served::Result(res) = served {
            heap_low(device);
            counts.request();
            if let Err(e) =
                q.complete_io_cmd_unified(tag, BufDesc::Slice(&[]), Ok(UblkIORes::Result(res)))
            {
                log(&format!("queue {qid}: completing tag {tag}: {e}"));
            }
        }
        served
    };
    serve_queue(qid, &queue, counts, handler);
}

/// Serves queue `qid` on a kernel without `UBLK_F_USER_COPY` (before Linux 6.5): a locked
/// buffer of [`MAX_IO_BYTES`] per tag, which the kernel copies into and out of.
fn per_tag_queue(qid: u16, dev: &UblkDev, device: &Device) {
    let Some(mut ctx) = queue_start(qid, device) else {
        return;
    };
    let counts = roundtrip::for_queue_thread(qid);
    let mut bufs = dev.alloc_queue_io_bufs();
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => return log(&format!("queue {qid}: {e}")),
    };
    // The buffer of `tag` is this thread's from the fetch completion until the commit: the
    // kernel copied a write's data in before completing the fetch, and copies a read's data out
    // only after the commit. The buffers never move (each is its own allocation).
    let handler = move |q: &UblkQueue, tag: u16, attempt: Attempt, deferral: &mut Deferral| {
        let io_buf = &mut bufs[usize::from(tag)];
        let served = io::handle(
            device,
            &mut ctx,
            request(q.get_iod(tag)),
            io_buf,
            &io::InPlace,
            attempt,
            deferral,
        );
        if let Served::Result(res) = served {
            heap_low(device);
            counts.request();
            if let Err(e) = q.complete_io_cmd_unified(
                tag,
                BufDesc::Slice(io_buf.as_slice()),
                Ok(UblkIORes::Result(res)),
            ) {
                log(&format!("queue {qid}: completing tag {tag}: {e}"));
            }
        }
        served
    };
    serve_queue(qid, &queue, counts, handler);
}

/// Serves `queue` until it is down: each request the kernel hands over goes to `handler`
/// (with its tag), which completes it, or puts a write off (see `defer`) for this loop to
/// hand over again each round until it is done. libublk's `UblkQueue::wait_and_handle_io`,
/// but a wait that a signal interrupts, or that found the kernel short of memory, is waited
/// out, and while writes are put off the loop does not block for requests: it waits for the
/// pool's next arena instead (a slice at most) and then serves whatever came meanwhile.
fn serve_queue(
    qid: u16,
    queue: &UblkQueue,
    counts: &QueueCounts,
    mut handler: impl FnMut(&UblkQueue, u16, Attempt, &mut Deferral) -> Served,
) {
    // Writes put off, as (tag, bytes stored): one per tag at most, so never more than the
    // depth (allocated here, not on the way).
    let mut put_off: Vec<(u16, usize)> = Vec::with_capacity(queue.get_depth() as usize);
    let mut deferral = Deferral::default();
    loop {
        let to_wait = usize::from(put_off.is_empty());
        counts.enter();
        let handled = queue.flush_and_wake_io_tasks(
            |user_data, cqe, _last| {
                if user_data & libublk::UblkUringData::Target as u64 == 0
                    && cqe.result() == sys::UBLK_IO_RES_OK as i32
                {
                    let tag = UblkIOCtx::user_data_to_tag(user_data) as u16;
                    // With writes put off, the reserve is dry: a new write joins them at once
                    // rather than hold the requests behind it for a slice of its own.
                    let attempt = Attempt {
                        slice: if put_off.is_empty() {
                            Attempt::FIRST.slice
                        } else {
                            Duration::ZERO
                        },
                        ..Attempt::FIRST
                    };
                    if let Served::PutOff(stored) = handler(queue, tag, attempt, &mut deferral) {
                        put_off.push((tag, stored));
                    }
                }
            },
            to_wait,
        );
        match handled {
            Ok(_) => {}
            Err(libublk::UblkError::IOError(e)) if e.raw_os_error() == Some(libc::EINTR) => {}
            // Transient: the kernel could not allocate for the ring (an I/O flusher's
            // allocation under memory pressure), or its completion queue overflowed. Waited
            // out, never the end of a device that may hold swap.
            Err(libublk::UblkError::IOError(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
                ) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            // The queue is down (the device is being deleted), or the ring failed.
            Err(libublk::UblkError::QueueIsDown) => return,
            Err(e) => {
                return log(&format!(
                    "queue {qid}: {e} ({} writes put off left to the kernel)",
                    put_off.len()
                ))
            }
        }
        if !put_off.is_empty() {
            again(queue, &mut put_off, &mut handler, &mut deferral);
        }
    }
}

/// One round for the writes put off, oldest first: the first waits a slice for an arena (the
/// loop's wait while any is put off), the others follow without waiting as long as each is
/// done (stored, or failed: a memory thread judged stuck fails them all in one round); the
/// first still put off ends the round, so a dry reserve costs one write's copy and compression
/// a round, not every one's.
fn again(
    queue: &UblkQueue,
    put_off: &mut Vec<(u16, usize)>,
    handler: &mut impl FnMut(&UblkQueue, u16, Attempt, &mut Deferral) -> Served,
    deferral: &mut Deferral,
) {
    let mut slice = Attempt::FIRST.slice;
    let mut dry = false;
    put_off.retain_mut(|(tag, stored)| {
        if dry {
            return true;
        }
        let attempt = Attempt {
            from: *stored,
            again: true,
            slice: std::mem::take(&mut slice),
        };
        match handler(queue, *tag, attempt, deferral) {
            Served::PutOff(now) => {
                *stored = now;
                dry = true;
                true
            }
            Served::Result(_) => false,
        }
    });
    if put_off.is_empty() {
        deferral.over();
    }
}

/// Asks the memory thread for a round when this request found the I/O heap low.
fn heap_low(device: &Device) {
    if super::heap::take_low() {
        device.request_maintenance();
    }
}

/// Whether the kernel's ublk driver copies through the char device (Linux 6.5 and later say
/// so in their features; older ones cannot be asked).
fn kernel_has_user_copy() -> bool {
    UblkCtrl::get_features().is_some_and(|f| f & u64::from(sys::UBLK_F_USER_COPY) != 0)
}

/// Stops device `id` (its queues end, so `run_target` returns).
fn stop(id: u32) {
    if let Ok(ctrl) = UblkCtrl::new_simple(id as i32) {
        let _ = ctrl.kill_dev();
    }
}

/// A worker: creates the device (or, with `--recover N`, takes device N over from a worker that
/// died, after adopting its state), prints `/dev/ublkbN` once it serves I/O, and serves until
/// the device is stopped (SIGTERM/SIGINT delete it). A device with a backing store opens its
/// files with the key the supervisor passed (`--worker-key-fd`).
pub fn serve_worker(args: &ServeArgs) -> Result<(), ServeError> {
    let super::Started {
        device,
        in_region,
        adopted,
        recover,
        signals,
        slot_free,
    } = super::start(args)?;
    let (recover, restart) = match recover.filter(|_| in_region) {
        Some((id, restarts, cause)) => (Some(id), (restarts, cause)),
        None => (None, (0, "none".to_string())),
    };
    let log_fd = args
        .log_fd
        .and_then(|fd| crate::sys::take_inherited_fd(fd).ok());
    super::watchdog::step(super::watchdog::Step::Control);
    // A successor serves the device as it was made: the kernel's queue count (libublk needs
    // it to be the builder's), depth and flags.
    let queues = match recover {
        Some(id) => UblkCtrl::new_simple(id as i32)
            .map(|c| c.dev_info().nr_hw_queues)
            .map_err(|e| ServeError::Ublk(format!("/dev/ublkc{id}: {e}")))?,
        None => super::queues(args),
    };
    roundtrip::start(queues.into());
    let user_copy = kernel_has_user_copy();
    if !user_copy {
        log(&format!(
            "this kernel's ublk cannot copy through the daemon (UBLK_F_USER_COPY, Linux 6.5): \
             each of the {} tags has a locked {} KiB buffer",
            u32::from(queues) * u32::from(args.depth),
            MAX_IO_BYTES >> 10
        ));
    }
    let ctrl = new_ctrl(args, recover, queues, user_copy, in_region)?;
    let id = ctrl.dev_info().dev_id;
    if let Some(id) = recover {
        super::watchdog::step(super::watchdog::Step::Recovery);
        start_recovery(&ctrl, id)?;
    }
    super::watchdog::step(super::watchdog::Step::Threads);
    // A signal that arrived since `start` blocked them waits, pending, for this thread.
    std::thread::spawn(move || {
        signals.wait();
        stop(id);
    });
    let control =
        super::control::control_thread(id, Arc::clone(&device), queues.into(), stop, restart);
    if let Err(e) = control {
        let _ = ctrl.del_dev();
        return Err(e);
    }
    super::swapwatch::swap_watch_thread(id, Arc::clone(&device));
    let disksize = device.disksize();
    let detached = args.detached;
    super::watchdog::step(super::watchdog::Step::Queues);
    let served = run_target(
        &ctrl,
        disksize,
        move |qid, dev: &UblkDev, buf: &mut [u8]| {
            if user_copy {
                user_copy_queue(qid, dev, &device, buf)
            } else {
                per_tag_queue(qid, dev, &device)
            }
        },
        move |ctrl: &UblkCtrl| {
            on_serving(
                ctrl,
                log_fd,
                adopted.as_deref(),
                in_region,
                slot_free,
                detached,
            );
        },
    );
    // Delete the device whether serving ended by a signal or failed: never leave one behind.
    let _ = UblkCtrl::new_simple(id as i32).and_then(|c| c.del_dev());
    crate::common::remove_socket(&socket_path(id));
    log(&format!("{} deleted", block_path(id)));
    served.map_err(|e| ServeError::Ublk(format!("serving {}: {e}", block_path(id))))
}

/// Makes the calling thread's io_uring as `UblkQueue::new` would for a queue of `depth` tags
/// (libublk's thread-local ring, which the queue then finds made): a queue thread started
/// ahead does it, so that a takeover asks the kernel for no ring.
pub(super) fn prepare_queue_ring(depth: u16) {
    use io_uring::{cqueue, squeue, IoUring};
    let made = libublk::ublk_init_task_ring(|cell| {
        if cell.get().is_none() {
            let ring = IoUring::<squeue::Entry, cqueue::Entry>::builder()
                .setup_cqsize(u32::from(depth))
                .setup_coop_taskrun()
                .build(u32::from(depth))
                .map_err(libublk::UblkError::IOError)?;
            cell.set(std::cell::RefCell::new(ring))
                .map_err(|_| libublk::UblkError::OtherError(-libc::EEXIST))?;
        }
        Ok(())
    });
    if let Err(e) = made {
        log(&format!(
            "warning: a queue thread's ring could not be made ahead ({e}): it is made when the queue starts"
        ));
    }
}

/// libublk's `UblkCtrl::run_target`, with the queues served by the threads this worker started
/// ahead (`crew`: a takeover starts no thread and faults in no stack or buffer while the
/// device's I/O waits), and without libublk's JSON description of the device (written to tmpfs
/// before a recovery ends, it allocated a page cache page while the device waited; nothing of
/// uzram reads it). Returns once every queue is down.
fn run_target(
    ctrl: &UblkCtrl,
    disksize: u64,
    serve: impl Fn(u16, &UblkDev, &mut [u8]) + Send + Sync + Clone + 'static,
    serving: impl FnOnce(&UblkCtrl),
) -> Result<(), libublk::UblkError> {
    let dev = Arc::new(UblkDev::new(
        ctrl.get_name(),
        |dev| {
            set_params(dev, disksize);
            Ok(())
        },
        ctrl,
    )?);
    // Every queue's thread first, then their jobs: a failure leaves nothing holding the device.
    let nr = dev.dev_info.nr_hw_queues;
    let members = super::crew::take(usize::from(nr), dev.dev_info.queue_depth)
        .map_err(libublk::UblkError::IOError)?;
    let mut queues = Vec::with_capacity(members.len());
    for (qid, m) in (0..nr).zip(members) {
        let (dev, serve) = (Arc::clone(&dev), serve.clone());
        // One thread a queue (libublk's io_thread_idx stays 0).
        let (tid, handle) = m
            .run(Box::new(move |buf| serve(qid, &dev, buf)))
            .map_err(libublk::UblkError::IOError)?;
        ctrl.set_thread_affinity(qid, tid);
        queues.push(handle);
    }
    ctrl.start_dev(&dev)?;
    serving(ctrl);
    for q in queues {
        let _ = q.join();
    }
    // The device may have been deleted from elsewhere: ENOENT is normal here.
    let _ = ctrl.stop_dev();
    Ok(())
}

/// The device's control, built (added, or for a successor, `recover`, set to be recovered):
/// `queues` of `args.depth` tags, with user copy where the kernel has it, and recovery where
/// the device lives in a region.
fn new_ctrl(
    args: &ServeArgs,
    recover: Option<u32>,
    queues: u16,
    user_copy: bool,
    in_region: bool,
) -> Result<UblkCtrl, ServeError> {
    // In a region the kernel holds the device's I/O when this process dies, and hands the
    // requests it had taken to the successor (reissued: a page written twice is the same page).
    let recovery = if in_region {
        u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE)
    } else {
        0
    };
    let (ctrl_flags, mut dev_flags) = if user_copy {
        (
            u64::from(sys::UBLK_F_USER_COPY) | recovery,
            UblkFlags::UBLK_DEV_F_ADD_DEV,
        )
    } else {
        (
            recovery,
            UblkFlags::UBLK_DEV_F_ADD_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER,
        )
    };
    if recover.is_some() {
        dev_flags.remove(UblkFlags::UBLK_DEV_F_ADD_DEV);
        dev_flags.insert(UblkFlags::UBLK_DEV_F_RECOVER_DEV);
    }
    UblkCtrlBuilder::default()
        .name("uzram")
        .id(recover.map_or(args.id.unwrap_or(-1), |id| id as i32))
        .nr_queues(queues)
        .depth(args.depth)
        .io_buf_bytes(MAX_IO_BYTES)
        .ctrl_flags(ctrl_flags)
        .dev_flags(dev_flags)
        .build()
        .map_err(|e| ServeError::Ublk(format!("cannot add the device: {e}")))
}

/// Starts the recovery of device `id` (its I/O held since its worker died).
fn start_recovery(ctrl: &UblkCtrl, id: u32) -> Result<(), ServeError> {
    // Everything that can fail was done (the state adopted) before this: Linux 6.12 has no
    // way back from a recovery that fails after it started.
    match ctrl.start_user_recover() {
        Ok(r) if r >= 0 => super::kmsg(&format!(
            "/dev/ublkb{id}: successor {} takes the device over",
            std::process::id()
        )),
        Ok(r) => {
            return Err(ServeError::Ublk(format!(
                "/dev/ublkc{id}: cannot start its recovery: {}",
                std::io::Error::from_raw_os_error(-r)
            )))
        }
        Err(e) => {
            return Err(ServeError::Ublk(format!(
                "/dev/ublkc{id}: cannot start its recovery: {e}"
            )))
        }
    }
    Ok(())
}

/// Once the device is served: the successor's messages go to the log again, the start is
/// said, and the probe watches the device's swap area.
fn on_serving(
    ctrl: &UblkCtrl,
    log_fd: Option<std::os::fd::OwnedFd>,
    adopted: Option<&str>,
    in_region: bool,
    slot_free: Result<super::slotfree::Loaded, String>,
    detached: bool,
) {
    super::watchdog::SERVING.store(true, std::sync::atomic::Ordering::Relaxed);
    // Served again: messages may wait for the device now.
    if let Some(fd) = log_fd {
        let _ = crate::sys::redirect_stderr(fd);
    }
    if let Some(said) = adopted {
        log(&format!(
            "{said}; served after {}",
            super::watchdog::steps_taken()
        ));
    }
    if in_region {
        // libublk's description of the device, on tmpfs, as an older uzram left it (this one
        // writes none: `run_target`): a successor's libublk would read it before serving, and
        // its page may be in swap on this very device. The kernel's own description
        // (GET_DEV_INFO) is what a successor needs.
        let _ = std::fs::remove_file(format!(
            "{}/{:04}.json",
            UblkCtrl::run_dir(),
            ctrl.dev_info().dev_id
        ));
    }
    super::disable_writeback_throttling(ctrl.dev_info().dev_id);
    super::shorten_request_timeout(ctrl.dev_info().dev_id);
    super::watch_slot_frees(slot_free, &ctrl.get_bdev_path());
    // `uzram --find` may have gone: serving goes on without its answer.
    let _ = crate::common::output::outln(ctrl.get_bdev_path());
    log(&format!("{} serving", ctrl.get_bdev_path()));
    if detached {
        // `uzram --find` has its answer: close its pipe.
        super::redirect_stdout_to_null();
    }
}

/// Whether device `id` waits for a daemon (`UBLK_S_DEV_QUIESCED`: the one that served it died,
/// its I/O is held) rather than being served (`LIVE`); `None` when it cannot be asked (gone).
pub fn is_quiesced(id: u32) -> Option<bool> {
    served_by(id).map(|(quiesced, _)| quiesced)
}

/// Whether device `id` exists: its control device's node (no system call that allocates: a
/// control ring can fail for memory in a swap storm, and that is no answer).
pub fn exists(id: u32) -> bool {
    std::path::Path::new(&format!("/dev/ublkc{id}")).exists()
}

/// Device `id`'s state as the kernel has it: whether it is quiesced, and the pid of the last
/// daemon that started or recovered it; `None` if it is gone. One that exists but cannot be
/// asked (no memory for a control ring) reads as served by no one, not quiesced: not gone.
pub fn served_by(id: u32) -> Option<(bool, i32)> {
    let asked = UblkCtrl::new_simple(id as i32).and_then(|ctrl| {
        ctrl.read_dev_info()?;
        let info = ctrl.dev_info();
        Ok((
            u32::from(info.state) == sys::UBLK_S_DEV_QUIESCED,
            info.ublksrv_pid,
        ))
    });
    match asked {
        Ok(state) => Some(state),
        Err(_) if exists(id) => Some((false, 0)),
        Err(_) => None,
    }
}

/// Deletes device `id` whose daemon is gone (killed): what `uzram --reset` does for a dead
/// device. The kernel has already stopped the disk; this removes the control device.
pub fn remove_dead(id: u32) -> Result<(), ServeError> {
    let ctrl = UblkCtrl::new_simple(id as i32)
        .map_err(|e| ServeError::Ublk(format!("/dev/ublkc{id}: {e}")))?;
    let _ = ctrl.kill_dev();
    ctrl.del_dev()
        .map(drop)
        .map_err(|e| ServeError::Ublk(format!("deleting /dev/ublkc{id}: {e}")))?;
    crate::common::remove_socket(&socket_path(id));
    Ok(())
}
