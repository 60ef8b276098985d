//! One request on a queue thread: its op, the engine call, and the one map from engine errors to
//! the errno the kernel gets. Knows nothing of libublk: `ublk` turns the kernel's descriptor into
//! a [`Request`], so all of this tests without a kernel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use uzram_engine::{Device, IoContext, IoError, ReserveWait};

use super::defer::{self, Deferral};
use super::errno::errno;
use super::mailbox;

/// A request's operation, as the block layer names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read sectors into the buffer.
    Read,
    /// Write the buffer's sectors.
    Write,
    /// Make written data durable (nothing to do: the device has no volatile cache).
    Flush,
    /// Forget sectors (swap frees its slots this way).
    Discard,
    /// Write zeroes without a buffer.
    WriteZeroes,
    /// Anything else: refused with EOPNOTSUPP.
    Other(u32),
}

impl Op {
    /// The index of this op's counters in the progress log: read, write, flush, discard
    /// (write-zeroes with it), other.
    pub fn counter(self) -> usize {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Flush => 2,
            Op::Discard | Op::WriteZeroes => 3,
            Op::Other(_) => 4,
        }
    }

    /// The op in a sentence: "a read", "a write", ...
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "a read",
            Op::Write => "a write",
            Op::Flush => "a flush",
            Op::Discard => "a discard",
            Op::WriteZeroes => "a write-zeroes",
            Op::Other(_) => "a request",
        }
    }
}

/// One request from the kernel: an op on `nr_sectors` 512-byte sectors from `start_sector`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// First sector.
    pub start_sector: u64,
    /// Sectors.
    pub nr_sectors: u32,
    /// Swap's (`UBLK_IO_F_SWAP`): a write that fails is kept and tried again later.
    pub swap: bool,
}

/// Requests started and finished, by [`Op::counter`]: what the progress log prints.
pub(super) static STARTED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
pub(super) static FINISHED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Writes that did not come from swap (no `UBLK_IO_F_SWAP`), counted as they start: the swap
/// watcher frees a swap area's old pages after a swapoff only if none came since the device
/// was last seen as swap (a new user's, as mkfs's; see `swapwatch`).
pub(super) static NON_SWAP_WRITES: AtomicU64 = AtomicU64::new(0);

/// How a request's data travels between the kernel and the daemon's buffer.
pub trait Transfer {
    /// Copies a write's data (`data.len()` bytes) from the kernel into `data`.
    fn fetch(&self, data: &mut [u8]) -> std::io::Result<()>;
    /// Copies a read's data to the kernel.
    fn deliver(&self, data: &[u8]) -> std::io::Result<()>;
}

/// The kernel copies: a write's data is in the tag's buffer when the request arrives, and a
/// read's data is taken from it at the commit. Nothing to do here.
pub struct InPlace;

impl Transfer for InPlace {
    fn fetch(&self, _: &mut [u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn deliver(&self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Done: the bytes done or a negative errno, for the kernel.
    Result(i32),
    /// A write put off while the pool's reserve is dry, its first this many bytes stored: its
    /// queue thread keeps it and serves it again (see `defer`).
    PutOff(usize),
}

/// How a request is served: a write put off before comes again with the bytes it stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// Bytes of the write already stored.
    pub from: usize,
    /// Whether the request was put off before (its start was counted then).
    pub again: bool,
    /// How long a write waits for an arena before it is put off.
    pub slice: Duration,
}

impl Attempt {
    /// A request's first.
    pub const FIRST: Attempt = Attempt {
        from: 0,
        again: false,
        slice: defer::DEFER_SLICE,
    };
}

/// Serves one request (from where `attempt` says); a write may be put off (see `defer`).
/// A panic costs this request (EIO), not the queue thread: a dead queue fails every later
/// request on it, and its device can then only be deleted.
pub fn handle(
    device: &Device,
    ctx: &mut IoContext,
    req: Request,
    buf: &mut [u8],
    transfer: &impl Transfer,
    attempt: Attempt,
    deferral: &mut Deferral,
) -> Served {
    if !attempt.again {
        STARTED[req.op.counter()].fetch_add(1, Ordering::Relaxed);
        if matches!(req.op, Op::Write | Op::WriteZeroes) && !req.swap {
            // Before the write lands: a watcher that reads the count unchanged knows that any
            // write it did not count carries a later access second.
            NON_SWAP_WRITES.fetch_add(1, Ordering::SeqCst);
        }
    }
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve_one(device, ctx, req, buf, transfer, attempt, deferral)
    }))
    .unwrap_or_else(|_| {
        super::log(&format!(
            "BUG: serving {} of {} sectors at sector {} panicked (see the message above); failed with EIO",
            req.op.name(),
            req.nr_sectors,
            req.start_sector
        ));
        Served::Result(-libc::EIO)
    });
    if let Served::Result(_) = served {
        FINISHED[req.op.counter()].fetch_add(1, Ordering::Relaxed);
    }
    served
}

fn serve_one(
    device: &Device,
    ctx: &mut IoContext,
    req: Request,
    buf: &mut [u8],
    transfer: &impl Transfer,
    attempt: Attempt,
    deferral: &mut Deferral,
) -> Served {
    // FLUSH carries no meaningful sector: answer it before any range check.
    if req.op == Op::Flush {
        return Served::Result(0);
    }
    let offset = req.start_sector << 9;
    let len = u64::from(req.nr_sectors) << 9;
    ctx.set_reserve_wait(match (req.op, req.swap) {
        (Op::Write, _) => ReserveWait::Slice(attempt.slice),
        (_, true) => ReserveWait::Within(super::SWAP_RESERVE_WAIT),
        (_, false) => ReserveWait::Pool,
    });
    let result = match req.op {
        Op::Read | Op::Write => match buf.get_mut(..len as usize) {
            Some(data) if req.op == Op::Read => device.read(ctx, offset, data),
            Some(data) => match transfer.fetch(data) {
                Ok(()) => return write(device, ctx, req, offset, data, attempt, deferral),
                Err(_) => return Served::Result(copy_failed(req.op, offset, len)),
            },
            None => return Served::Result(-libc::EINVAL),
        },
        Op::Discard => device.discard(offset, len),
        Op::WriteZeroes => device.write_zeroes(ctx, offset, len),
        Op::Flush | Op::Other(_) => return Served::Result(-libc::EOPNOTSUPP),
    };
    match result {
        Ok(()) => {
            if req.op == Op::Read {
                #[cfg(feature = "test-hooks")]
                break_reads_for_tests(offset, &mut buf[..len as usize]);
                if transfer.deliver(&buf[..len as usize]).is_err() {
                    return Served::Result(copy_failed(req.op, offset, len));
                }
            }
            Served::Result(match req.op {
                // At most one buffer (128 KiB): fits.
                Op::Read | Op::Write => len as i32,
                // The kernel ends a discard or write-zeroes that did not fail without looking
                // at a byte count, and theirs can pass i32::MAX (4 GiB in one request).
                _ => 0,
            })
        }
        Err(e) => {
            mailbox::note_failure(req.op.name(), req.swap, offset, len, &e);
            Served::Result(-errno(&e))
        }
    }
}

/// A write, its first `attempt.from` bytes stored already: stored whole, put off (see
/// `defer`), or failed.
fn write(
    device: &Device,
    ctx: &mut IoContext,
    req: Request,
    offset: u64,
    data: &[u8],
    attempt: Attempt,
    deferral: &mut Deferral,
) -> Served {
    let from = attempt.from;
    let rest = data.get(from..).unwrap_or_default();
    let error = match device.write_prefix(ctx, offset + from as u64, rest) {
        // At most one buffer (128 KiB): fits.
        Ok(()) => return Served::Result(data.len() as i32),
        Err(short) => {
            if let IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted { .. }) =
                short.error
            {
                let patience = if req.swap {
                    super::SWAP_RESERVE_WAIT
                } else {
                    super::RESERVE_WAIT
                };
                match deferral.put_off(device.upkeep_progress(), patience, !attempt.again) {
                    Ok(()) => return Served::PutOff(from + short.written),
                    // Reported as the time the memory thread made no progress: what the
                    // write was failed for.
                    Err(stalled_ms) => {
                        IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted {
                            waited_ms: stalled_ms,
                        })
                    }
                }
            } else {
                short.error
            }
        }
    };
    device.count_failed_write(ctx);
    mailbox::note_failure(req.op.name(), req.swap, offset, data.len() as u64, &error);
    Served::Result(-errno(&error))
}

/// The kernel would not take or give a request's data (a request the kernel aborted, as when
/// the device is being deleted): EIO, counted like any failed request.
fn copy_failed(op: Op, offset: u64, len: u64) -> i32 {
    mailbox::note(
        op.name(),
        offset,
        len,
        libc::EIO,
        "the request's data could not be copied from or to the kernel",
    );
    -libc::EIO
}

/// `UZRAM_TEST_BREAK_READS=1` (feature `test-hooks`): a deliberately broken device for proving
/// that the VM checks can fail. Flips one bit in every read of every 61st page. Read once at
/// startup; never set it on a device that holds data you want.
#[cfg(feature = "test-hooks")]
static BREAK_READS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether this daemon corrupts reads on purpose (`UZRAM_TEST_BREAK_READS=1`, feature
/// `test-hooks`; never without it).
pub fn breaks_reads() -> bool {
    #[cfg(feature = "test-hooks")]
    return *BREAK_READS
        .get_or_init(|| std::env::var_os("UZRAM_TEST_BREAK_READS").is_some_and(|v| v == "1"));
    #[cfg(not(feature = "test-hooks"))]
    false
}

#[cfg(feature = "test-hooks")]
fn break_reads_for_tests(offset: u64, data: &mut [u8]) {
    if !breaks_reads() {
        return;
    }
    use uzram_engine::PAGE_SIZE;
    let first = offset / PAGE_SIZE as u64;
    for (i, page) in data.chunks_mut(PAGE_SIZE).enumerate() {
        if (first + i as u64) % 61 == 0 {
            if let Some(b) = page.get_mut(100) {
                *b ^= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uzram_engine::DeviceSetup;

    /// A request's first attempt, which must not be put off.
    fn serve(
        device: &Device,
        ctx: &mut IoContext,
        r: Request,
        buf: &mut [u8],
        transfer: &impl Transfer,
    ) -> i32 {
        let mut deferral = Deferral::default();
        match handle(device, ctx, r, buf, transfer, Attempt::FIRST, &mut deferral) {
            Served::Result(res) => res,
            put_off => panic!("{r:?} was {put_off:?}"),
        }
    }

    fn req(op: Op, start_sector: u64, nr_sectors: u32) -> Request {
        Request {
            op,
            start_sector,
            nr_sectors,
            swap: false,
        }
    }

    #[test]
    fn a_failed_request_is_counted_with_its_cause_not_logged_by_the_io_thread() {
        let device = DeviceSetup::new().init(1 << 20).unwrap();
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 4096];
        let before = mailbox::failed_requests();
        assert_eq!(
            serve(
                &device,
                &mut ctx,
                req(Op::Read, 1 << 20, 8),
                &mut buf,
                &InPlace
            ),
            -libc::EINVAL
        );
        assert!(mailbox::failed_requests() > before);
        assert!(mailbox::latest().is_some());
        let range = IoError::OutOfRange {
            offset: 0,
            len_bytes: 1,
            disksize: 0,
        };
        assert_eq!(
            super::super::errno::cause(&range),
            "beyond the device's size"
        );
        let short =
            IoError::OutOfMemory(uzram_allocator::Error::ReserveExhausted { waited_ms: 1000 });
        assert!(super::super::errno::cause(&short).contains("reserve"));
        assert_eq!(errno(&short), libc::ENOMEM);
    }

    #[test]
    fn flush_is_answered_before_any_range_check() {
        let device = DeviceSetup::new().init(1 << 20).unwrap();
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 4096];
        let mut h = |r: Request| serve(&device, &mut ctx, r, &mut buf, &InPlace);
        // mkswap sends a FLUSH with a meaningless start sector.
        assert_eq!(h(req(Op::Flush, u64::MAX >> 9, 0)), 0);
        assert_eq!(h(req(Op::Read, 1 << 20, 8)), -libc::EINVAL);
        assert_eq!(h(req(Op::Write, 0, 8)), 4096);
        assert_eq!(h(req(Op::Other(99), 0, 8)), -libc::EOPNOTSUPP);
        // A request longer than the buffer is refused, not a panic.
        assert_eq!(h(req(Op::Read, 0, 16)), -libc::EINVAL);
    }

    #[test]
    fn a_discard_of_gigabytes_succeeds_as_zero_bytes() {
        // The kernel's limit for one discard is 4 GiB less a sector: more than i32::MAX bytes.
        let device = DeviceSetup::new().init(5 << 30).unwrap();
        let mut ctx = device.context().unwrap();
        let mut buf = vec![0u8; 4096];
        let sectors = (u32::MAX >> 9) / 8 * 8;
        assert_eq!(
            serve(
                &device,
                &mut ctx,
                req(Op::Discard, 0, sectors),
                &mut buf,
                &InPlace
            ),
            0
        );
        assert_eq!(
            serve(
                &device,
                &mut ctx,
                req(Op::WriteZeroes, 0, sectors),
                &mut buf,
                &InPlace
            ),
            0
        );
    }

    #[test]
    fn a_write_that_finds_the_reserve_dry_is_put_off_until_stored_or_the_memory_thread_is_stuck() {
        let mut setup = DeviceSetup::new();
        setup.set_pool_reserve(2 << 20);
        setup.set_pool_reserve_min(2 << 20);
        setup.set_pool_growth(uzram_engine::Growth::Reserve {
            wait: Duration::from_millis(50),
        });
        let device = setup.init(16 << 20).unwrap();
        device.maintain_memory_with(&mut || {}).unwrap();
        let mut ctx = device.context().unwrap();
        let mut deferral = Deferral::default();
        let noise = |first: u64| -> Vec<u8> {
            (0..32u64 << 12)
                .map(|i| ((first * 4096 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                .collect()
        };
        let mut buf = vec![0u8; 32 << 12];
        let mut swap_write = |first: u64, attempt: Attempt, deferral: &mut Deferral| {
            buf.copy_from_slice(&noise(first));
            let r = Request {
                swap: true,
                ..req(Op::Write, first * 8, 256)
            };
            handle(&device, &mut ctx, r, &mut buf, &InPlace, attempt, deferral)
        };
        // Nobody maps arenas: 128 KiB swap writes of noise until one is put off.
        let mut first = 0;
        let stored = loop {
            match swap_write(first, Attempt::FIRST, &mut deferral) {
                Served::Result(n) if n == 32 << 12 => first += 32,
                Served::PutOff(stored) => break stored,
                other => panic!("{other:?}"),
            }
            assert!(first < 4096, "the reserve never ran out");
        };
        assert!(stored < 32 << 12 && stored % 4096 == 0, "{stored}");
        assert_eq!(device.stats().io.failed_writes, 0);
        // An arena comes: the write goes on from where it stopped, and all of it reads back.
        device.maintain_memory_with(&mut || {}).unwrap();
        let again = |from| Attempt {
            from,
            again: true,
            ..Attempt::FIRST
        };
        assert_eq!(
            swap_write(first, again(stored), &mut deferral),
            Served::Result(32 << 12)
        );
        deferral.over();
        let mut back = vec![0u8; 32 << 12];
        device
            .read(&mut ctx_for_reads(&device), first * 4096, &mut back)
            .unwrap();
        assert!(back == noise(first), "the write put off reads back whole");
        // Dry again, and the memory thread faults nothing in for a swap writer's patience:
        // the write put off fails.
        let mut next = first + 32;
        let stored = loop {
            match swap_write(next, Attempt::FIRST, &mut deferral) {
                Served::PutOff(stored) => break stored,
                Served::Result(n) => assert_eq!(n, 32 << 12),
            }
            next += 32;
            assert!(next < 4096, "the reserve never ran out");
        };
        std::thread::sleep(super::super::SWAP_RESERVE_WAIT);
        assert_eq!(
            swap_write(next, again(stored), &mut deferral),
            Served::Result(-libc::ENOMEM)
        );
        assert_eq!(device.stats().io.failed_writes, 1);
    }

    fn ctx_for_reads(device: &Device) -> IoContext {
        device.context().unwrap()
    }

    /// The kernel's side of `UBLK_F_USER_COPY` for one request: its data, or a copy that fails.
    struct FakeKernel {
        data: std::cell::RefCell<Vec<u8>>,
        fail: bool,
    }

    impl Transfer for FakeKernel {
        fn fetch(&self, data: &mut [u8]) -> std::io::Result<()> {
            if self.fail {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            data.copy_from_slice(&self.data.borrow()[..data.len()]);
            Ok(())
        }
        fn deliver(&self, data: &[u8]) -> std::io::Result<()> {
            if self.fail {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.data.borrow_mut()[..data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    #[test]
    fn user_copy_fetches_a_writes_data_and_delivers_a_reads() {
        let device = DeviceSetup::new().init(1 << 20).unwrap();
        let mut ctx = device.context().unwrap();
        // The daemon's one buffer holds whatever the last request left in it.
        let mut buf = vec![0xEEu8; 16384];
        let page: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let kernel = FakeKernel {
            data: std::cell::RefCell::new(page.clone()),
            fail: false,
        };
        assert_eq!(
            serve(&device, &mut ctx, req(Op::Write, 8, 16), &mut buf, &kernel),
            8192
        );
        *kernel.data.borrow_mut() = vec![0; 8192];
        assert_eq!(
            serve(&device, &mut ctx, req(Op::Read, 8, 16), &mut buf, &kernel),
            8192
        );
        assert_eq!(*kernel.data.borrow(), page);

        // A copy the kernel refuses fails the request with EIO and stores nothing (the buffer
        // holds other bytes, which a write that went ahead would store).
        buf.fill(0x55);
        let broken = FakeKernel {
            data: std::cell::RefCell::new(vec![7; 4096]),
            fail: true,
        };
        let before = mailbox::failed_requests();
        assert_eq!(
            serve(&device, &mut ctx, req(Op::Write, 8, 8), &mut buf, &broken),
            -libc::EIO
        );
        assert_eq!(
            serve(&device, &mut ctx, req(Op::Read, 8, 8), &mut buf, &broken),
            -libc::EIO
        );
        assert!(mailbox::failed_requests() >= before + 2);
        assert_eq!(
            serve(&device, &mut ctx, req(Op::Read, 8, 8), &mut buf, &kernel),
            4096
        );
        assert_eq!(kernel.data.borrow()[..4096], page[..4096]);
    }
}
