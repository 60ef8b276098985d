//! The slot-free probe's BPF array from the daemon's side: mapped as shared atomics, or one
//! word stored through the `bpf` system call. Part of `sys` (the binary's `unsafe`).

use std::io;
use std::os::fd::AsRawFd;

/// `len` words of a BPF array map mapped shared, read and write, as atomics: the slot-free
/// probe's marks, which the kernel sets while the daemon reads and clears them. Unmapped on
/// drop.
#[derive(Debug)]
pub struct SharedWords {
    at: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; it is never
// reallocated while a `SharedWords` lives, so any thread may use the words.
unsafe impl Send for SharedWords {}
// SAFETY: as above; `&SharedWords` only hands out `&[AtomicU64]`.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps the first `len` 8-byte words of the BPF map `fd`, which must be what its
    /// `/proc/self/fdinfo` says: an array (`map_type` 2) of 8-byte values, mappable
    /// (`BPF_F_MMAPABLE`), of at least `len` entries. Anything else (a file that could be
    /// truncated under the mapping, or written without atomics) is refused.
    pub fn map_bpf_array(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> io::Result<SharedWords> {
        check_bpf_array(fd, len as u64)?;
        let bytes = len
            .checked_mul(8)
            .filter(|&b| b > 0)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a new mapping at an address the kernel picks, of a descriptor borrowed for
        // the call; no existing memory is touched. The result is checked.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = std::ptr::NonNull::new(at.cast()).ok_or_else(|| io::Error::other("mmap at 0"))?;
        Ok(SharedWords { at, len })
    }

    /// The words.
    pub fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: `at` is a live mapping of `len` words, page-aligned (so aligned for
        // AtomicU64), readable and writable, that stays mapped while `self` lives; it is a BPF
        // array (`map_bpf_array` checked), whose size never changes, and whose words the
        // kernel touches only as whole aligned words (slotfree.bpf.c's atomics and its one
        // plain load of the target word; the `bpf` system call's copy of one 8-byte value), so
        // shared references to atomics over it are sound.
        unsafe { std::slice::from_raw_parts(self.at.as_ptr(), self.len) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping `map_bpf_array` made, whole; no reference to it outlives `self`.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len * 8) };
    }
}

/// Whether `fd` is what its `/proc/self/fdinfo` says is a mappable BPF array (`map_type` 2,
/// `BPF_F_MMAPABLE`) of 8-byte values, at least `entries` of them; an error naming what it is
/// otherwise.
fn check_bpf_array(fd: std::os::fd::BorrowedFd<'_>, entries: u64) -> io::Result<()> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let num = |name: &str| {
        let v = field(name)?;
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse::<u64>().ok(),
        }
    };
    const BPF_MAP_TYPE_ARRAY: u64 = 2;
    const BPF_F_MMAPABLE: u64 = 1 << 10;
    let ok = num("map_type") == Some(BPF_MAP_TYPE_ARRAY)
        && num("value_size") == Some(8)
        && num("map_flags").is_some_and(|f| f & BPF_F_MMAPABLE != 0)
        && num("max_entries").is_some_and(|n| n >= entries);
    if !ok {
        return Err(io::Error::other(format!(
            "not a mappable BPF array of {entries} words: {}",
            info.split_whitespace().collect::<Vec<_>>().join(" ")
        )));
    }
    Ok(())
}

/// Stores `value` in entry `index` of the BPF array `fd` of 8-byte values
/// (`BPF_MAP_UPDATE_ELEM`): one word, without mapping the map.
pub fn bpf_array_store(fd: std::os::fd::BorrowedFd<'_>, index: u32, value: u64) -> io::Result<()> {
    check_bpf_array(fd, u64::from(index) + 1)?;
    /// The kernel's `union bpf_attr` as the map-element commands read it.
    #[repr(C)]
    struct MapElem {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    let map_fd = u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::other("bad descriptor"))?;
    let attr = MapElem {
        map_fd,
        _pad: 0,
        key: std::ptr::addr_of!(index) as u64,
        value: std::ptr::addr_of!(value) as u64,
        flags: 0, // BPF_ANY
    };
    // SAFETY: `attr` and the key and value it points to live across the call, which only reads
    // them. The kernel reads the map's key and value sizes from those pointers: an array's key
    // is 4 bytes, and `check_bpf_array` above made sure its values are 8, the sizes of `index`
    // and `value`. The result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            std::ptr::addr_of!(attr),
            std::mem::size_of::<MapElem>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    /// A new mappable BPF array of `entries` 8-byte values (`BPF_MAP_CREATE`).
    fn bpf_array(entries: u32) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        #[repr(C)]
        struct Create {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        let attr = Create {
            map_type: 2,
            key_size: 4,
            value_size: 8,
            max_entries: entries,
            map_flags: 1 << 10,
        };
        // SAFETY: `attr` lives across the call, which only reads it; the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0, // BPF_MAP_CREATE
                std::ptr::addr_of!(attr),
                std::mem::size_of::<Create>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor the kernel just returned, owned by nothing else.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
    }

    #[test]
    fn a_word_stored_through_the_system_call_is_seen_in_the_mapping() {
        let map = match bpf_array(16) {
            Ok(map) => map,
            // Not allowed to make one (not root, or a sandbox without CAP_BPF): nothing to
            // test here; the VM's recover checks use the daemon's probe.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EPERM | libc::EACCES | libc::ENOSYS)
                ) =>
            {
                eprintln!("skipped: BPF_MAP_CREATE refused: {e}");
                return;
            }
            Err(e) => panic!("BPF_MAP_CREATE: {e}"),
        };
        let words = SharedWords::map_bpf_array(map.as_fd(), 16).unwrap();
        words.words()[0].store(7, Ordering::Relaxed);
        words.words()[3].store(9, Ordering::Relaxed);
        bpf_array_store(map.as_fd(), 0, 0).unwrap();
        bpf_array_store(map.as_fd(), 15, 42).unwrap();
        let seen: Vec<u64> = words
            .words()
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(&seen[..4], [0, 0, 0, 9]);
        assert_eq!(seen[15], 42);
        // Past its entries, or on what is not such a map: refused, nothing written.
        assert!(bpf_array_store(map.as_fd(), 16, 1).is_err());
        assert!(SharedWords::map_bpf_array(map.as_fd(), 17).is_err());
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(bpf_array_store(null.as_fd(), 0, 0).is_err());
    }
}
