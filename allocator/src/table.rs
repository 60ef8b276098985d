//! A growable table stored in fixed-size segments that are never reallocated: growing copies
//! nothing and leaves no doubling slack, so metadata costs what it stores plus at most one partly
//! used segment (many size classes hold few objects, so small segments matter). Entries are grouped
//! in rows of `row` entries (one zspage's back-pointers, say); a row never straddles two segments.

/// Rows of `row` entries, in segments of `seg_rows` rows.
pub(crate) struct Table<T> {
    row: usize,
    seg_rows: usize,
    segments: Vec<Box<[T]>>,
    /// Rows in use.
    rows: usize,
}

impl<T: Default> Table<T> {
    /// An empty table of rows of `row` entries, allocated `seg_rows` rows at a time.
    pub(crate) fn new(row: usize, seg_rows: usize) -> Table<T> {
        assert!(row > 0 && seg_rows > 0);
        Table {
            row,
            seg_rows,
            segments: Vec::new(),
            rows: 0,
        }
    }

    /// Appends a row of default entries; returns its index.
    pub(crate) fn push_row(&mut self) -> usize {
        if self.rows == self.segments.len() * self.seg_rows {
            self.segments.push(
                (0..self.seg_rows * self.row)
                    .map(|_| T::default())
                    .collect(),
            );
        }
        self.rows += 1;
        self.rows - 1
    }

    /// Rows in use.
    pub(crate) fn len(&self) -> usize {
        self.rows
    }

    /// Row `i`.
    pub(crate) fn row(&self, i: usize) -> Option<&[T]> {
        if i >= self.rows {
            return None;
        }
        let r = i % self.seg_rows;
        Some(&self.segments[i / self.seg_rows][r * self.row..(r + 1) * self.row])
    }

    /// Row `i`, mutable.
    pub(crate) fn row_mut(&mut self, i: usize) -> Option<&mut [T]> {
        if i >= self.rows {
            return None;
        }
        let r = i % self.seg_rows;
        Some(&mut self.segments[i / self.seg_rows][r * self.row..(r + 1) * self.row])
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
        self.segments.len() * self.seg_rows * self.row * std::mem::size_of::<T>()
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
        let mut t: Table<u32> = Table::new(3, 4);
        for i in 0..100 {
            assert_eq!(t.push_row(), i);
            t.row_mut(i).unwrap().copy_from_slice(&[i as u32, 1, 2]);
        }
        for i in 0..100 {
            assert_eq!(t.row(i).unwrap(), &[i as u32, 1, 2]);
        }
        assert_eq!(t.row(100), None);
        assert_eq!(t.iter().count(), 300);
        assert!(t.iter().step_by(3).copied().eq(0..100));
    }

    #[test]
    fn slack_is_at_most_one_segment() {
        let mut t: Table<u64> = Table::new(1, 64);
        t.push_row();
        assert_eq!(t.segments.len(), 1);
        for _ in 1..1000 {
            t.push_row();
        }
        assert_eq!(t.segments.len(), 1000usize.div_ceil(64));
        for i in 0..1000 {
            t[i] = i as u64;
        }
        assert!(t.iter().copied().eq(0..1000));
    }
}
