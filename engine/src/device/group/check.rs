//! The cold groups' part of `Device::check_invariants`: the slots that name a group against
//! the group table, and each group's chunks against the pool.

use std::collections::HashMap;

use uzram_allocator::{Handle, Pool};

use super::table::Entry;

/// The groups an adoption found.
pub(crate) struct Adopted {
    /// Every object they hold, heads and chunks.
    pub(crate) objects: Vec<u64>,
    /// Each head and its table entry.
    pub(crate) entries: Vec<(Handle, Entry)>,
    /// A stamp past every adopted group's, for the next group made: a stamp seen again could
    /// match an I/O context's copy of an adopted group whose head handle is handed out again.
    pub(crate) next_stamp: u32,
}

use crate::device::{Device, SlotFlags, SlotState};

/// The members the slots name, by head: a bit per member, and the page index each one is at.
#[derive(Default)]
pub(crate) struct Members(HashMap<u64, (u16, Vec<(u8, u64)>)>);

impl Members {
    /// Notes that page `index` (state `s`) names member `member` of the group at `head`.
    pub(crate) fn note(
        &mut self,
        index: u64,
        s: &SlotState,
        head: Handle,
        member: u8,
    ) -> Result<(), String> {
        if s.size != 0 || s.flags.contains(SlotFlags::HUGE) {
            return Err(format!(
                "page {index}: grouped with size {} and flags {:?}",
                s.size, s.flags
            ));
        }
        let (bits, at) = self.0.entry(head.to_raw()).or_default();
        let bit = 1u16.checked_shl(u32::from(member)).unwrap_or(0);
        if bit == 0 || *bits & bit != 0 {
            return Err(format!(
                "page {index}: member {member} of group {:#x} named twice or out of range",
                head.to_raw()
            ));
        }
        *bits |= bit;
        at.push((member, index));
        Ok(())
    }
}

impl Members {
    /// The groups the slots name, as an adoption takes them over: each one's header and chunks
    /// checked against the pool ([`super::verify`]), its members within its pages and at the
    /// pages that follow from one first page. Returns every object the groups hold (for the
    /// check that no object is named twice) and the table's entries.
    pub(crate) fn adopt(&self, pool: &Pool, device_pages: u64) -> Result<Adopted, String> {
        let mut objects = Vec::new();
        let mut entries = Vec::with_capacity(self.0.len());
        let mut stamp = 0u32;
        for (&raw, (bits, at)) in &self.0 {
            let head = Handle::from_raw(raw).ok_or("a group at handle 0")?;
            let (header, chunks) =
                super::verify(pool, head).map_err(|e| format!("group {raw:#x}: {e}"))?;
            // Every member at the page its place gives, from one first page, all of the group's
            // pages on the device.
            let first = at.first().and_then(|&(m, i)| i.checked_sub(u64::from(m)));
            let placed = |&&(m, i): &&(u8, u64)| {
                m < header.pages && first.and_then(|f| f.checked_add(u64::from(m))) == Some(i)
            };
            let fits = first.is_some_and(|f| f + u64::from(header.pages) <= device_pages);
            if let Some(&(m, i)) = at.iter().find(|t| !placed(t)).or((!fits).then_some(&at[0])) {
                return Err(format!(
                    "page {i} names member {m} of group {raw:#x}, whose {} pages do not fit there",
                    header.pages
                ));
            }
            let first = first.unwrap_or(0);
            stamp = stamp.max(header.stamp);
            objects.push(raw);
            objects.extend(chunks.into_iter().flatten().map(Handle::to_raw));
            let entry = Entry {
                live: *bits,
                pages: header.pages,
                first,
                frame_len: header.frame_len,
            };
            entries.push((head, entry));
        }
        Ok(Adopted {
            objects,
            entries,
            next_stamp: stamp.wrapping_add(1),
        })
    }
}

impl Device {
    /// Checks the group table against the members the slots name, each group's chunks against
    /// the pool, and the table's byte and page counts. Returns the pool objects the groups hold.
    pub(crate) fn check_groups(&self, members: &Members) -> Result<u64, String> {
        let table = self.groups.snapshot();
        let (mut objects, mut bytes, mut pages) = (0u64, 0u64, 0u64);
        for &(raw, e) in &table {
            let head = Handle::from_raw(raw).ok_or("a group at handle 0")?;
            let (bits, at) = members.0.get(&raw).cloned().unwrap_or_default();
            if bits != e.live {
                return Err(format!(
                    "group {raw:#x}: live members {:#06x}, the slots name {bits:#06x}",
                    e.live
                ));
            }
            if let Some((m, i)) = at.iter().find(|&&(m, i)| e.first + u64::from(m) != i) {
                return Err(format!(
                    "group {raw:#x} starts at page {}, member {m} is page {i}",
                    e.first
                ));
            }
            let (header, _) =
                super::verify(&self.pool, head).map_err(|e| format!("group {raw:#x}: {e}"))?;
            if header.pages != e.pages || header.frame_len != e.frame_len {
                return Err(format!("group {raw:#x}: header and table disagree"));
            }
            objects += u64::from(header.chunks);
            bytes += u64::from(e.frame_len);
            pages += u64::from(e.live.count_ones());
        }
        if let Some(raw) = members
            .0
            .keys()
            .find(|&&h| table.binary_search_by_key(&h, |&(t, _)| t).is_err())
        {
            return Err(format!("the slots name group {raw:#x}, which is not live"));
        }
        let f = self.groups.figures();
        if (f.live, f.bytes, f.pages) != (table.len() as u64, bytes, pages) {
            return Err(format!(
                "group counters {f:?}: the table holds {} groups, {bytes} bytes, {pages} pages",
                table.len()
            ));
        }
        Ok(objects)
    }
}
