//! The sector bitmap of one backing file: which sectors hold records, and where the next
//! record goes.

/// The sector bitmap of one file.
pub(super) struct Space {
    used: Vec<u64>,
    /// Sectors of the file.
    pub(super) sectors: u64,
    cursor: u64,
    /// Sectors no record holds.
    pub(super) free: u64,
}

impl Space {
    pub(super) fn new(sectors: u64) -> Space {
        Space {
            used: vec![0; sectors.div_ceil(64) as usize],
            sectors,
            cursor: 0,
            free: sectors,
        }
    }

    pub(super) fn is_used(&self, s: u64) -> bool {
        self.used[(s / 64) as usize] & (1 << (s % 64)) != 0
    }

    pub(super) fn set(&mut self, start: u64, n: u64, used: bool) {
        for s in start..start + n {
            let (w, b) = ((s / 64) as usize, s % 64);
            if used {
                self.used[w] |= 1 << b;
            } else {
                self.used[w] &= !(1 << b);
            }
        }
        if used {
            self.free -= n;
        } else {
            self.free += n;
        }
    }

    /// First fit of `n` contiguous sectors starting on a multiple of `align`, from the cursor
    /// round to it.
    pub(super) fn alloc(&mut self, n: u64, align: u64) -> Option<u64> {
        if n == 0 || n > self.free {
            return None;
        }
        let mut start = self.cursor.next_multiple_of(align);
        let mut scanned = 0;
        while scanned < self.sectors + n + align {
            if start + n > self.sectors {
                scanned += self.sectors.saturating_sub(start);
                start = 0;
                continue;
            }
            // The last used sector in the window: the next start is past it.
            match (start..start + n).rev().find(|&s| self.is_used(s)) {
                None => {
                    self.set(start, n, true);
                    self.cursor = start + n;
                    return Some(start);
                }
                Some(busy) => {
                    let next = (busy + 1).next_multiple_of(align);
                    scanned += next - start;
                    start = next;
                }
            }
        }
        None
    }
}
