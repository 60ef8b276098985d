//! A growable table stored in segments that are never reallocated (no copy, no doubling slack).
//!
//! Segments grow geometrically from `min_rows` rows up to `max_rows`, then stay at `max_rows`, so a
//! small table costs little (many size classes hold few objects) and a large one wastes at most one
//! segment. Entries are grouped in rows of `row` entries (one zspage's back-pointers, say) and a row
//! never straddles two segments.

/// Rows of `row` entries, in segments.
pub(crate) struct Table<T> {
    row: usize,
    min_rows: usize,
    max_rows: usize,
    segments: Vec<Box<[T]>>,
    /// Rows in use.
    rows: usize,
    /// Rows the segments hold.
    capacity: usize,
}

impl<T: Default> Table<T> {
    /// An empty table of rows of `row` entries, segments from `min_rows` to `max_rows` rows.
    pub(crate) fn new(row: usize, min_rows: usize, max_rows: usize) -> Table<T> {
        assert!(row > 0 && min_rows > 0 && min_rows <= max_rows);
        Table {
            row,
            min_rows,
            max_rows,
            segments: Vec::new(),
            rows: 0,
            capacity: 0,
        }
    }

    /// Segment and row within it of row `i`.
    fn locate(&self, mut i: usize) -> (usize, usize) {
        let mut seg = 0;
        let mut size = self.min_rows;
        while i >= size {
            i -= size;
            seg += 1;
            size = (size * 2).min(self.max_rows);
            if size == self.max_rows {
                // Constant segments from here on.
                return (seg + i / size, i % size);
            }
        }
        (seg, i)
    }

    /// Appends a row of default entries; returns its index.
    pub(crate) fn push_row(&mut self) -> usize {
        if self.rows == self.capacity {
            let size = match self.segments.last() {
                None => self.min_rows,
                Some(last) => (last.len() / self.row * 2).min(self.max_rows),
            };
            self.segments
                .push((0..size * self.row).map(|_| T::default()).collect());
            self.capacity += size;
        }
        self.rows += 1;
        self.rows - 1
    }

    /// Row `i`.
    pub(crate) fn row(&self, i: usize) -> Option<&[T]> {
        if i >= self.rows {
            return None;
        }
        let (seg, r) = self.locate(i);
        Some(&self.segments[seg][r * self.row..(r + 1) * self.row])
    }

    /// Row `i`, mutable.
    pub(crate) fn row_mut(&mut self, i: usize) -> Option<&mut [T]> {
        if i >= self.rows {
            return None;
        }
        let (seg, r) = self.locate(i);
        Some(&mut self.segments[seg][r * self.row..(r + 1) * self.row])
    }

    /// Entry `i` of a table of one-entry rows.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        debug_assert_eq!(self.row, 1, "entry access to a table of wide rows");
        self.row(i).map(|r| &r[0])
    }

    /// Entry `i`, mutable.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        debug_assert_eq!(self.row, 1, "entry access to a table of wide rows");
        self.row_mut(i).map(|r| &mut r[0])
    }

    /// All entries of the rows in use, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.segments
            .iter()
            .flat_map(|s| s.iter())
            .take(self.rows * self.row)
    }

    /// All entries of the rows in use, mutable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        let n = self.rows * self.row;
        self.segments.iter_mut().flat_map(|s| s.iter_mut()).take(n)
    }

    /// Bytes held, including the segment list.
    pub(crate) fn bytes(&self) -> usize {
        self.capacity * self.row * std::mem::size_of::<T>()
            + self.segments.capacity() * std::mem::size_of::<Box<[T]>>()
    }
}

impl<T: Default> std::ops::Index<usize> for Table<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        self.get(i).expect("table index in bounds")
    }
}

impl<T: Default> std::ops::IndexMut<usize> for Table<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        self.get_mut(i).expect("table index in bounds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_entries_across_segments() {
        let mut t: Table<u32> = Table::new(3, 2, 8);
        for i in 0..100 {
            assert_eq!(t.push_row(), i);
            t.row_mut(i).unwrap().copy_from_slice(&[i as u32, 1, 2]);
        }
        for i in 0..100 {
            assert_eq!(t.row(i).unwrap(), &[i as u32, 1, 2]);
        }
        assert_eq!(t.row(100), None);
        assert_eq!(t.iter().count(), 300);
        assert_eq!(
            t.iter().step_by(3).copied().collect::<Vec<_>>(),
            (0..100).collect::<Vec<u32>>()
        );
    }

    #[test]
    fn segments_grow_then_stay_bounded() {
        let mut t: Table<u64> = Table::new(1, 4, 64);
        for _ in 0..1000 {
            t.push_row();
        }
        // 4 + 8 + 16 + 32 = 60 rows, then 64-row segments: at most one segment of slack.
        assert!(
            t.capacity >= 1000 && t.capacity < 1000 + 64,
            "capacity {}",
            t.capacity
        );
        let mut small: Table<u64> = Table::new(1, 4, 64);
        small.push_row();
        assert_eq!(small.capacity, 4);
    }

    #[test]
    fn locate_matches_push_order() {
        let mut t: Table<usize> = Table::new(1, 1, 16);
        for i in 0..500 {
            t.push_row();
            t[i] = i;
        }
        assert!(t.iter().copied().eq(0..500));
    }
}
