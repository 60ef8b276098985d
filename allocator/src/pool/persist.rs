//! The words of a pool that a successor needs to adopt it, and nothing else.
//!
//! In a pool over a [`Region`], two tables of each class live in the region's metadata area, in
//! chunks tagged with their class, their table and their place in it:
//! - the handle table (one word a handle: live bit, size, slot in the zspage, zspage id), the
//!   truth of where each object is;
//! - the zspage locations (one word a zspage id: live bit, arena, first page), the truth of
//!   where each zspage is.
//!
//! Everything else (back-pointers, free lists, fullness groups, counters, the arenas' bitmaps)
//! stays in the process and is rebuilt from these two at adoption. Each change a successor must
//! see is one word store, made in an order that leaves the two tables describing the objects'
//! bytes at every instant: a handle entry is written after its zspage's location, a zspage's
//! location is cleared before its pages are given back, and a moved object or zspage is copied
//! before the word that points at the copy is written.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::mem::{AtomicChunk, Chunk, PageRun, Region, CHUNK_WORDS};
use crate::table::Table;
use crate::Error;

/// Which table a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Handles = 0,
    Zspages = 1,
}

/// A chunk's tag: table kind, class, place in the table.
fn tag(kind: Kind, class: usize, seq: usize) -> u64 {
    ((kind as u64) << 48) | ((class as u64) << 32) | seq as u64
}

/// The parts of a chunk's tag, if it is one a pool wrote.
pub(super) fn untag(tag: u64) -> Option<(Kind, usize, usize)> {
    let kind = match tag >> 48 {
        0 => Kind::Handles,
        1 => Kind::Zspages,
        _ => return None,
    };
    Some((
        kind,
        ((tag >> 32) & 0xffff) as usize,
        (tag & 0xffff_ffff) as usize,
    ))
}

/// A zspage location word: live | arena << 16 | first page.
const LOC_LIVE: u64 = 1 << 63;

pub(super) fn loc_pack(run: &PageRun) -> u64 {
    loc_word(run.arena(), run.first_page())
}

/// The location word of a zspage at `first` of `arena` (a live word with any other bit set is
/// not one a pool wrote).
pub(super) fn loc_word(arena: u32, first: usize) -> u64 {
    LOC_LIVE | (u64::from(arena) << 16) | (first as u64 & 0xffff)
}

/// (arena, first page) of a live location word.
pub(super) fn loc_unpack(w: u64) -> Option<(u32, usize)> {
    (w & LOC_LIVE != 0).then_some(((w >> 16) as u32, (w & 0xffff) as usize))
}

/// A table of words in a region's chunks. Every access is atomic, so that the release fences
/// of `class_state::persist_order` order these stores for the compiler too: a successor reads
/// them in the order they were made.
pub(super) struct SharedWords {
    region: Region,
    kind: Kind,
    class: usize,
    chunks: Vec<AtomicChunk>,
    len: usize,
}

impl SharedWords {
    pub(super) fn new(region: Region, kind: Kind, class: usize) -> SharedWords {
        SharedWords {
            region,
            kind,
            class,
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// The table a predecessor left, from its chunks in order of their place (`chunks[i]` is
    /// place `i`); its length is every word of them.
    pub(super) fn adopted(
        region: Region,
        kind: Kind,
        class: usize,
        chunks: Vec<Chunk>,
    ) -> SharedWords {
        let len = chunks.len() * CHUNK_WORDS;
        SharedWords {
            region,
            kind,
            class,
            chunks: chunks.into_iter().map(Chunk::into_atomic).collect(),
            len,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Appends a zero word; returns its index.
    pub(super) fn push(&mut self) -> Result<usize, Error> {
        if self.len == self.chunks.len() * CHUNK_WORDS {
            let t = tag(self.kind, self.class, self.chunks.len());
            self.chunks.push(self.region.claim_chunk(t)?.into_atomic());
        }
        self.len += 1;
        Ok(self.len - 1)
    }

    fn word(&self, i: usize) -> Option<&AtomicU64> {
        (i < self.len).then(|| &self.chunks[i / CHUNK_WORDS].words()[i % CHUNK_WORDS])
    }

    pub(super) fn get(&self, i: usize) -> Option<u64> {
        self.word(i).map(|w| w.load(Ordering::Relaxed))
    }

    /// Word `i`; panics past the end (an index the class made).
    pub(super) fn at(&self, i: usize) -> u64 {
        self.get(i).expect("word index in bounds")
    }

    /// Sets word `i`; panics past the end.
    pub(super) fn set(&mut self, i: usize, v: u64) {
        self.word(i)
            .expect("word index in bounds")
            .store(v, Ordering::Relaxed);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).map(|i| self.at(i))
    }

    pub(super) fn bytes(&self) -> usize {
        self.chunks.len() * CHUNK_WORDS * 8
            + self.chunks.capacity() * std::mem::size_of::<AtomicChunk>()
    }
}

/// A class's handle table: in the process, or in a region for a successor.
pub(super) enum Words {
    Local(Table<u64>),
    Shared(SharedWords),
}

impl Words {
    pub(super) fn len(&self) -> usize {
        match self {
            Words::Local(t) => t.len(),
            Words::Shared(s) => s.len(),
        }
    }

    pub(super) fn push(&mut self) -> Result<usize, Error> {
        match self {
            Words::Local(t) => Ok(t.push_row()),
            Words::Shared(s) => s.push(),
        }
    }

    pub(super) fn get(&self, i: usize) -> Option<u64> {
        match self {
            Words::Local(t) => t.get(i).copied(),
            Words::Shared(s) => s.get(i),
        }
    }

    /// Word `i`; panics past the end (an index the class made).
    pub(super) fn at(&self, i: usize) -> u64 {
        self.get(i).expect("handle index in bounds")
    }

    /// Sets word `i`; panics past the end.
    pub(super) fn set(&mut self, i: usize, v: u64) {
        match self {
            Words::Local(t) => t[i] = v,
            Words::Shared(s) => s.set(i, v),
        }
    }

    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        match self {
            Words::Local(t) => Box::new(t.iter().copied()),
            Words::Shared(s) => Box::new(s.iter()),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Words::Local(t) => t.bytes(),
            Words::Shared(s) => s.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        for (k, c, s) in [(Kind::Handles, 0, 0), (Kind::Zspages, 118, 123_456)] {
            assert_eq!(untag(tag(k, c, s)), Some((k, c, s)));
        }
        assert_eq!(untag(2 << 48), None);
    }
}
