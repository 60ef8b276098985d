//! zram's slow path for memory: idle marking and recompression with secondary algorithms
//! (zram's multi-comp), then a compaction that zram leaves to whoever writes `compact`.

use std::str::FromStr;

use uzram_codecs::Algorithm;

use super::{Device, GroupPass, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::{Error, IoError};

/// Which pages a recompression pass looks at (zram's `type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecompressType {
    /// Pages marked idle.
    Idle,
    /// Pages stored raw (huge).
    Huge,
    /// Pages both idle and huge.
    HugeIdle,
}

/// A recompression request in zram's `recompress` syntax:
/// `[type=idle|huge|huge_idle] [threshold=BYTES] [max_pages=N] [algo=NAME | priority=N]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecompressRequest {
    /// Only these pages (all stored pages when `None`).
    pub kind: Option<RecompressType>,
    /// Only pages whose stored object is at least this many bytes.
    pub threshold: Option<usize>,
    /// At most this many pages, the largest objects first.
    pub max_pages: Option<u64>,
    /// Only the secondary algorithm with this name.
    pub algo: Option<Algorithm>,
    /// Only the secondary algorithm of this priority.
    pub priority: Option<u8>,
}

impl FromStr for RecompressRequest {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = |why| Error::InvalidRequest {
            text: text.to_string(),
            why,
        };
        let mut r = RecompressRequest::default();
        for word in text.split_whitespace() {
            let (key, value) = word.split_once('=').ok_or(bad("expected key=value"))?;
            match key {
                "type" => {
                    r.kind = Some(match value {
                        "idle" => RecompressType::Idle,
                        "huge" => RecompressType::Huge,
                        "huge_idle" => RecompressType::HugeIdle,
                        _ => return Err(bad("type is idle, huge or huge_idle")),
                    })
                }
                "threshold" => {
                    let t: usize = value.parse().map_err(|_| bad("threshold is a number"))?;
                    if t == 0 || t > PAGE_SIZE {
                        return Err(bad("threshold is 1..4096 bytes"));
                    }
                    r.threshold = Some(t);
                }
                "max_pages" => {
                    r.max_pages = Some(value.parse().map_err(|_| bad("max_pages is a number"))?)
                }
                "algo" => r.algo = Some(value.parse().map_err(|_| bad("unknown algorithm"))?),
                "priority" => {
                    let p: u8 = value.parse().map_err(|_| bad("priority is 1, 2 or 3"))?;
                    if !(1..=3).contains(&p) {
                        return Err(bad("priority is 1, 2 or 3"));
                    }
                    r.priority = Some(p);
                }
                _ => {
                    return Err(bad(
                        "unknown key (type, threshold, max_pages, algo, priority)",
                    ))
                }
            }
        }
        if r.algo.is_some() && r.priority.is_some() {
            return Err(bad("give algo= or priority=, not both"));
        }
        Ok(r)
    }
}

/// What a recompression pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecompressStats {
    /// Pages that matched the request.
    pub candidates: u64,
    /// Pages now stored by a secondary algorithm in a smaller size class.
    pub recompressed: u64,
    /// Pages no secondary algorithm shrinks: marked INCOMPRESSIBLE and skipped from now on.
    pub incompressible: u64,
    /// Pages left as they were for another reason (changed meanwhile, memory limit).
    pub skipped: u64,
    /// Stored bytes of the recompressed pages before and after.
    pub bytes_before: u64,
    /// See `bytes_before`.
    pub bytes_after: u64,
    /// Pool pages the compaction after the pass freed.
    pub pages_compacted: u64,
    /// Cold groups made before the pages were recompressed one by one (the policy's `groups`).
    pub groups: u64,
    /// Pages put in those groups (not counted in `candidates`).
    pub grouped_pages: u64,
    /// The pool bytes the grouped pages' objects took, less what their groups take.
    pub group_saved: u64,
}

enum Outcome {
    Recompressed { before: usize, after: usize },
    Incompressible,
    Skipped,
}

impl Device {
    /// zram's `idle`: with `None` (`all`) marks every stored page idle; with `Some(secs)` marks
    /// the pages not accessed for `secs` seconds and clears the mark on the others. Same-filled
    /// and empty pages are skipped, as zram does. Returns the pages marked.
    pub fn mark_idle(&self, older_than_secs: Option<u32>) -> u64 {
        let now = self.now();
        let mut marked = 0;
        for (_, slot) in self.slots.iter() {
            if !slot.peek().flags.contains(SlotFlags::STORED) {
                continue;
            }
            let mut g = slot.lock();
            let mut s = g.get();
            if !s.flags.contains(SlotFlags::STORED) {
                continue;
            }
            let idle = older_than_secs.map_or(true, |secs| now.saturating_sub(s.atime) >= secs);
            let was = s.flags.contains(SlotFlags::IDLE);
            if idle {
                s.flags = s.flags | SlotFlags::IDLE;
                marked += 1;
            } else {
                s.flags = s.flags.difference(SlotFlags::IDLE);
            }
            if idle != was {
                g.set(s);
            }
        }
        marked
    }

    /// The secondary algorithms (by priority) configured, as zram's `recomp_algorithm` lists them.
    pub fn recomp_algorithms(&self) -> Vec<(u8, Algorithm)> {
        self.codecs
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(p, c)| c.as_ref().map(|c| (p as u8, c.algorithm())))
            .collect()
    }

    /// zram's `recompress`: recompresses the pages `req` selects, largest objects first, with
    /// the secondary algorithms in priority order, keeping the first result that lands in a
    /// smaller size class; a page no algorithm shrinks is marked INCOMPRESSIBLE. Then compacts
    /// the pool (zram leaves that to a separate `compact`). `ctx` provides the codec streams.
    pub fn recompress(
        &self,
        ctx: &mut IoContext,
        req: &RecompressRequest,
    ) -> Result<RecompressStats, Error> {
        self.recompress_filtered(ctx, req, None, &mut Vec::new())
    }

    /// [`Device::recompress`] of the pages `req` selects that have not been accessed for
    /// `min_age` seconds (the policy's idle recompression; zram's IDLE marks are left alone).
    /// `candidates` is scratch space the caller keeps, so that a thread under memory pressure
    /// does not grow a new list each time.
    pub fn recompress_older(
        &self,
        ctx: &mut IoContext,
        req: &RecompressRequest,
        min_age: u32,
        candidates: &mut Vec<(u16, u64)>,
    ) -> Result<RecompressStats, Error> {
        self.recompress_filtered(ctx, req, Some(min_age), candidates)
    }

    fn recompress_filtered(
        &self,
        ctx: &mut IoContext,
        req: &RecompressRequest,
        min_age: Option<u32>,
        candidates: &mut Vec<(u16, u64)>,
    ) -> Result<RecompressStats, Error> {
        self.fit_context(ctx)?;
        // Its pages are compressed under their slot locks: zstd's workspace is made first.
        ctx.warm_compression().map_err(IoError::Context)?;
        let now = self.now();
        let prios: Vec<u8> = self
            .recomp_algorithms()
            .into_iter()
            .filter(|&(p, a)| {
                req.priority.map_or(true, |q| q == p) && req.algo.map_or(true, |b| b == a)
            })
            .map(|(p, _)| p)
            .collect();
        let Some(&last) = prios.last() else {
            return Err(Error::InvalidRequest {
                text: format!("{req:?}"),
                why: "no recompression algorithm matches (set recomp_algorithm when creating the device)",
            });
        };
        let all_last = self.recomp_algorithms().last().map(|&(p, _)| p) == Some(last);
        let grouped = self.group_cold(ctx, req, last, min_age, now)?;
        candidates.clear();
        for (i, slot) in self.slots.iter() {
            let s = slot.peek();
            if self.eligible(&s, req, &prios, min_age, now) {
                candidates.push((s.size, i));
            }
        }
        // Largest objects first: they gain the most, and max_pages keeps the best of them.
        candidates.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        if let Some(max) = req.max_pages {
            let left = max.saturating_sub(grouped.pages + grouped.changed);
            candidates.truncate(usize::try_from(left).unwrap_or(usize::MAX));
        }
        let mut stats = RecompressStats {
            candidates: candidates.len() as u64,
            groups: grouped.groups,
            grouped_pages: grouped.pages,
            group_saved: grouped.pool_before.saturating_sub(grouped.pool_after),
            ..RecompressStats::default()
        };
        for &(_, index) in candidates.iter() {
            match self.recompress_page(ctx, PageIndex(index), req, &prios, all_last, min_age) {
                Outcome::Recompressed { before, after } => {
                    stats.recompressed += 1;
                    stats.bytes_before += before as u64;
                    stats.bytes_after += after as u64;
                }
                Outcome::Incompressible => stats.incompressible += 1,
                Outcome::Skipped => stats.skipped += 1,
            }
        }
        if stats.recompressed > 0 || stats.grouped_pages > 0 {
            stats.pages_compacted = self.compact();
        }
        Ok(stats)
    }

    /// Before the pages a request selects are recompressed one by one, the cold ones among
    /// them in runs of neighbours are compressed as groups with the codec at `prio`, where the
    /// policy's `groups` is on and the device has no backing store (writeback and eviction can
    /// take grouped pages, each compressed alone, but on the starved build that has not yet
    /// proved better than page by page, see docs/design/cold-groups.md): those aged `min_age`
    /// for the policy, those marked idle for
    /// zram's `recompress` with no type or `type=idle` (and no `threshold`, `algo` or
    /// `priority`). `max_pages` bounds the pages grouped and recompressed together.
    fn group_cold(
        &self,
        ctx: &mut IoContext,
        req: &RecompressRequest,
        prio: u8,
        min_age: Option<u32>,
        now: u32,
    ) -> Result<GroupPass, Error> {
        let Some(pages) = self.policy().groups else {
            return Ok(GroupPass::default());
        };
        // A request that picks pages by size or names a codec asks for page-by-page work.
        let picks = req.threshold.is_some() || req.algo.is_some() || req.priority.is_some();
        if self.backing().is_some()
            || picks
            || !matches!(req.kind, None | Some(RecompressType::Idle))
        {
            return Ok(GroupPass::default());
        }
        let take = |s: &SlotState| match min_age {
            Some(age) => now.saturating_sub(s.atime) >= age,
            None => s.flags.contains(SlotFlags::IDLE),
        };
        let limit = req.max_pages.unwrap_or(u64::MAX);
        self.make_groups_of(ctx, prio, usize::from(pages), limit, &take)
    }

    fn eligible(
        &self,
        s: &SlotState,
        req: &RecompressRequest,
        prios: &[u8],
        min_age: Option<u32>,
        now: u32,
    ) -> bool {
        let f = s.flags;
        // A grouped page is already compressed with its neighbours.
        if !f.contains(SlotFlags::STORED)
            || s.is_grouped()
            || f.contains(SlotFlags::INCOMPRESSIBLE)
            || f.contains(SlotFlags::WB)
            || min_age.is_some_and(|a| now.saturating_sub(s.atime) < a)
        {
            return false;
        }
        let kind_ok = match req.kind {
            None => true,
            Some(RecompressType::Idle) => f.contains(SlotFlags::IDLE),
            Some(RecompressType::Huge) => f.contains(SlotFlags::HUGE),
            Some(RecompressType::HugeIdle) => f.contains(SlotFlags::IDLE | SlotFlags::HUGE),
        };
        kind_ok
            && req.threshold.map_or(true, |t| usize::from(s.size) >= t)
            // Pages already recompressed with the last priority asked for have nothing to try.
            && prios.iter().any(|&p| p > s.prio)
    }

    fn recompress_page(
        &self,
        ctx: &mut IoContext,
        index: PageIndex,
        req: &RecompressRequest,
        prios: &[u8],
        all_last: bool,
        min_age: Option<u32>,
    ) -> Outcome {
        let Some(slot) = self.slot(index) else {
            return Outcome::Skipped;
        };
        let mut g = slot.lock();
        let s = g.get();
        // The page may have changed since the scan.
        if !self.eligible(&s, req, prios, min_age, self.now()) {
            return Outcome::Skipped;
        }
        let (mut scratch, page) = ctx.scratch_and_page();
        if self.decode(&mut scratch, index, &s, page).is_err() {
            return Outcome::Skipped;
        }
        let before = usize::from(s.size);
        let Ok(old_class) = self.pool.class_size(before) else {
            return Outcome::Skipped;
        };
        let mut tried_last = false;
        for &p in prios.iter().filter(|&&p| p > s.prio) {
            tried_last |= p == *prios.last().expect("non-empty");
            let Some(stream) = ctx.streams[usize::from(p)].as_mut() else {
                continue;
            };
            let Ok(n) = stream.compress(&ctx.page, &mut ctx.buf) else {
                continue;
            };
            if n >= self.huge_threshold || self.pool.class_size(n).is_ok_and(|c| c >= old_class) {
                continue;
            }
            let Ok(handle) = self.pool.store(&ctx.buf[..n]) else {
                return Outcome::Skipped;
            };
            let new = SlotState {
                word: handle.to_raw(),
                flags: s.flags.difference(SlotFlags::HUGE) | SlotFlags::STORED,
                prio: p,
                size: n as u16,
                // Not an access: an idle page stays idle (and a candidate for writeback).
                atime: s.atime,
            };
            self.replace(index, &mut g, new);
            return Outcome::Recompressed { before, after: n };
        }
        if tried_last && all_last {
            let mut s = s;
            s.flags = s.flags | SlotFlags::INCOMPRESSIBLE;
            g.set(s);
            return Outcome::Incompressible;
        }
        Outcome::Skipped
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::text_page;
    use super::*;
    use crate::DeviceSetup;

    fn device() -> Device {
        let mut setup = DeviceSetup::new();
        setup
            .set_recomp_algorithm("algo=zstd priority=1 level=9")
            .unwrap();
        setup.init(8 << 20).unwrap()
    }

    #[test]
    fn requests_parse_as_zrams() {
        let r: RecompressRequest = "type=huge_idle threshold=1000 max_pages=5 priority=1"
            .parse()
            .unwrap();
        assert_eq!(r.kind, Some(RecompressType::HugeIdle));
        assert_eq!(
            (r.threshold, r.max_pages, r.priority),
            (Some(1000), Some(5), Some(1))
        );
        for bad in [
            "type=cold",
            "threshold=0",
            "priority=4",
            "algo=zstd priority=1",
            "frob=1",
            "idle",
        ] {
            assert!(bad.parse::<RecompressRequest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn idle_recompression_shrinks_memory_and_keeps_every_page() {
        let d = device();
        // Page by page (groups are tested below).
        d.set_policy("groups=off").unwrap();
        let mut ctx = d.context().unwrap();
        let pages: Vec<[u8; PAGE_SIZE]> = (0..1500).map(text_page).collect();
        for (i, p) in pages.iter().enumerate() {
            d.write(&mut ctx, i as u64 * 4096, p).unwrap();
        }
        let before = d.stats().mm;
        // Only idle pages: none yet.
        let none = d
            .recompress(&mut ctx, &"type=idle".parse().unwrap())
            .unwrap();
        assert_eq!(none.candidates, 0);
        assert_eq!(d.mark_idle(None), 1500);
        // A read clears idle on its page.
        let mut back = vec![0u8; PAGE_SIZE];
        d.read(&mut ctx, 0, &mut back).unwrap();
        let stats = d
            .recompress(&mut ctx, &"type=idle".parse().unwrap())
            .unwrap();
        assert_eq!(stats.candidates, 1499, "{stats:?}");
        assert!(stats.recompressed > 1000, "{stats:?}");
        let after = d.stats().mm;
        assert!(
            after.compr_data_size * 10 < before.compr_data_size * 9,
            "zstd-9 after lz4: {} -> {} bytes",
            before.compr_data_size,
            after.compr_data_size
        );
        assert!(
            after.mem_used_total < before.mem_used_total,
            "compaction ran"
        );
        for (i, p) in pages.iter().enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut back).unwrap();
            assert_eq!(&back, p, "page {i}");
        }
        // Without type= every page is a candidate: only page 0 (read, so not idle) is left,
        // then nothing: pages already at priority 1 have no algorithm left to try.
        let rest = d
            .recompress(&mut ctx, &RecompressRequest::default())
            .unwrap();
        assert_eq!((rest.candidates, rest.recompressed), (1, 1), "{rest:?}");
        let none = d
            .recompress(&mut ctx, &RecompressRequest::default())
            .unwrap();
        assert_eq!(none.candidates, 0, "{none:?}");
        d.check_invariants().unwrap();
    }

    #[test]
    fn pages_no_algorithm_shrinks_become_incompressible() {
        let d = device();
        let mut ctx = d.context().unwrap();
        let noise = crate::testing::pages::noise_page(0x1234_5678_9abc_def1);
        d.write(&mut ctx, 0, &noise).unwrap();
        let s = d
            .recompress(&mut ctx, &"type=huge".parse().unwrap())
            .unwrap();
        assert_eq!((s.candidates, s.incompressible), (1, 1), "{s:?}");
        assert!(d
            .slot_state(PageIndex(0))
            .unwrap()
            .flags
            .contains(SlotFlags::INCOMPRESSIBLE));
        let s = d
            .recompress(&mut ctx, &"type=huge".parse().unwrap())
            .unwrap();
        assert_eq!(s.candidates, 0, "skipped from now on");
        let mut back = vec![0u8; PAGE_SIZE];
        d.read(&mut ctx, 0, &mut back).unwrap();
        assert_eq!(back, noise);
    }

    #[test]
    fn idle_by_age_clears_younger_pages() {
        let d = device();
        let mut ctx = d.context().unwrap();
        d.write(&mut ctx, 0, &text_page(1)).unwrap();
        assert_eq!(d.mark_idle(None), 1);
        // Younger than 1000 s: marking by that age clears it.
        assert_eq!(d.mark_idle(Some(1000)), 0);
        assert!(!d
            .slot_state(PageIndex(0))
            .unwrap()
            .flags
            .contains(SlotFlags::IDLE));
        assert_eq!(d.mark_idle(Some(0)), 1);
        assert!(d
            .slot_state(PageIndex(0))
            .unwrap()
            .flags
            .contains(SlotFlags::IDLE));
    }

    #[test]
    fn idle_recompression_groups_runs_of_idle_pages_first_then_the_rest_page_by_page() {
        let d = device();
        let mut ctx = d.context().unwrap();
        let pages: Vec<[u8; PAGE_SIZE]> = (0..100).map(text_page).collect();
        for (i, p) in pages.iter().enumerate() {
            d.write(&mut ctx, i as u64 * 4096, p).unwrap();
        }
        d.mark_idle(None);
        // Pages 0..40 and 43..100 stay idle; 40..43 are read (a run of 40, then one of 57).
        let mut back = vec![0u8; PAGE_SIZE];
        for i in 40..43 {
            d.read(&mut ctx, i * 4096, &mut back).unwrap();
        }
        let before = d.stats().mm;
        let s = d
            .recompress(&mut ctx, &"type=idle".parse().unwrap())
            .unwrap();
        assert_eq!((s.groups, s.grouped_pages), (7, 97), "{s:?}");
        assert_eq!(s.candidates, 0, "every idle page is grouped: {s:?}");
        assert!(s.group_saved > 0);
        let after = d.stats();
        assert!(after.mm.compr_data_size < before.compr_data_size);
        assert_eq!(after.groups.pages, 97);
        for (i, p) in pages.iter().enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut back).unwrap();
            assert_eq!(&back, p, "page {i}");
        }
        // max_pages bounds the pages grouped and recompressed together; threshold= asks for
        // page-by-page work.
        for i in 0..100u64 {
            d.write(&mut ctx, i * 4096, &pages[i as usize]).unwrap();
        }
        d.mark_idle(None);
        let s = d
            .recompress(&mut ctx, &"type=idle max_pages=10".parse().unwrap())
            .unwrap();
        assert_eq!((s.grouped_pages, s.candidates), (10, 0), "{s:?}");
        let s = d
            .recompress(&mut ctx, &"type=idle max_pages=21".parse().unwrap())
            .unwrap();
        assert_eq!((s.grouped_pages, s.candidates), (21, 0), "{s:?}");
        // Room for fewer than the least group: no group, the rest page by page.
        let s = d
            .recompress(&mut ctx, &"type=idle max_pages=3".parse().unwrap())
            .unwrap();
        assert_eq!((s.grouped_pages, s.candidates), (0, 3), "{s:?}");
        let s = d
            .recompress(&mut ctx, &"type=idle threshold=100".parse().unwrap())
            .unwrap();
        assert_eq!(s.grouped_pages, 0, "{s:?}");
        assert!(s.recompressed > 0, "{s:?}");
        // type=huge makes no groups; nor does a device with groups off.
        d.set_policy("groups=off").unwrap();
        d.mark_idle(None);
        let s = d
            .recompress(&mut ctx, &"type=idle".parse().unwrap())
            .unwrap();
        assert_eq!(s.groups, 0, "{s:?}");
        for (i, p) in pages.iter().enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut back).unwrap();
            assert_eq!(&back, p, "page {i}");
        }
        d.check_invariants().unwrap();
    }
}
