//! A pool a predecessor process left in a region, rebuilt from the tables it kept there.

use std::sync::atomic::Ordering;

use super::class_state::ClassState;
use super::{persist, Pool, PoolConfig};
use crate::mem::USER_CHUNK_TAG;
use crate::Error;

impl Pool {
    /// The pool a predecessor process left in `config.region` (see [`Region`]), rebuilt from the
    /// handle tables and zspage locations it kept there: every object it held is readable
    /// through the same [`Handle`], at the same bytes. `config` is the predecessor's (the
    /// zspage length must be the same). Refused with [`Error::RegionRefused`], naming the value,
    /// when anything it left does not add up; a refusal writes nothing to the region.
    /// Arena places the adopted pool does not use are emptied.
    pub fn adopt(config: PoolConfig) -> Result<Pool, Error> {
        let Some(region) = config.region.clone() else {
            return Err(Error::InvalidConfig {
                what: "region",
                value: 0,
            });
        };
        let (mut pool, premapped, prefault) = Pool::build(&config)?;
        // Until it is adopted, dropping it (a refusal) must leave the region as it was.
        pool.left = true;
        let refused = |reason: String| Error::RegionRefused { reason };
        let classes = pool.classes.len();
        // Each class's two tables, their chunks in place order.
        let mut tables: Vec<[Vec<(usize, crate::mem::Chunk)>; 2]> =
            (0..classes).map(|_| [Vec::new(), Vec::new()]).collect();
        for (tag, chunk) in region.take_adopted_chunks(|t| t < USER_CHUNK_TAG) {
            let Some((kind, class, seq)) = persist::untag(tag).filter(|t| t.1 < classes) else {
                return Err(refused(format!(
                    "metadata chunk {} has tag {tag:#x}: not a handle or zspage table of one of this pool's {classes} classes",
                    chunk.index()
                )));
            };
            tables[class][kind as usize].push((seq, chunk));
        }
        {
            let mut arenas = pool.arenas.lock();
            let mut wanted = std::collections::BTreeSet::new();
            let mut sorted: Vec<[Vec<crate::mem::Chunk>; 2]> = Vec::with_capacity(classes);
            for (class, kinds) in tables.into_iter().enumerate() {
                let mut out: [Vec<crate::mem::Chunk>; 2] = [Vec::new(), Vec::new()];
                for (k, chunks) in kinds.into_iter().enumerate() {
                    out[k] = crate::mem::in_place_order(chunks).map_err(|(seq, i)| {
                        let table = ["handle", "zspage location"][k];
                        refused(format!(
                            "class {class}: its {table} table has chunk {seq} where chunk {i} belongs"
                        ))
                    })?;
                }
                for chunk in &out[persist::Kind::Zspages as usize] {
                    wanted.extend(
                        chunk
                            .iter()
                            .filter_map(|&w| persist::loc_unpack(w))
                            .map(|l| l.0),
                    );
                }
                sorted.push(out);
            }
            for &arena in &wanted {
                let mapping = region.map_existing(arena).map_err(|e| {
                    refused(format!(
                        "a zspage names arena {arena}, which cannot be mapped: {e}"
                    ))
                })?;
                arenas.insert(mapping);
            }
            let mut pages_used = 0;
            let mut new_classes = Vec::with_capacity(classes);
            for (class, [handles, locations]) in sorted.into_iter().enumerate() {
                let spec = pool.table.classes()[class];
                let min_size = match class {
                    0 => 1,
                    _ => pool.table.classes()[class - 1].size + 1,
                };
                let state = ClassState::adopt(
                    class,
                    spec,
                    &region,
                    persist::SharedWords::adopted(
                        region.clone(),
                        persist::Kind::Handles,
                        class,
                        handles,
                    ),
                    persist::SharedWords::adopted(
                        region.clone(),
                        persist::Kind::Zspages,
                        class,
                        locations,
                    ),
                    min_size,
                    &mut arenas,
                )
                .map_err(|e| refused(format!("class {class} (size {}): {e}", spec.size)))?;
                new_classes.push(state);
            }
            // Every class passed, and every zspage's run is marked: only now may pages go back
            // (a zspage with no object), since no arena can look empty while a later class
            // still holds a run in it.
            for state in &mut new_classes {
                state.finish_adopt(&mut arenas);
                pages_used += (state.live_zspages * state.spec.pages_per_zspage) as u64;
            }
            drop(arenas);
            for (slot, state) in pool.classes.iter().zip(new_classes) {
                *slot.lock() = state;
            }
            pool.pages_used.store(pages_used, Ordering::Relaxed);
            pool.max_pages_used.store(pages_used, Ordering::Relaxed);
        }
        pool.check_invariants().map_err(refused)?;
        // The reserve before anything is owned: a failure here still leaves the region whole.
        pool.premap(premapped, prefault)?;
        // From here the pool is adopted: what it does not hold leaves the region.
        pool.left = false;
        pool.arenas.lock().own_adopted();
        region.punch_unclaimed();
        Ok(pool)
    }
}
