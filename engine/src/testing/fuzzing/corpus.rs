//! The seed corpus of `fuzz/corpus/device_ops/` and the encoding that writes it (arbitrary's,
//! mirrored).

use arbitrary::{Arbitrary, Unstructured};
use uzram_codecs::Algorithm;

use super::{mix, DeviceOp, PageKind, WildOp, MAX_OPS};

/// Appends the bytes that make arbitrary's derived enums pick variant `index` of `count`
/// (a little-endian `u32` scaled by `count`, rounded up).
fn variant(out: &mut Vec<u8>, index: usize, count: usize) {
    let x = ((index as u64) << 32).div_ceil(count as u64);
    out.extend(u32::try_from(x).expect("index < count").to_le_bytes());
}

/// The bytes that [`device_ops`] decodes into `algorithm` and `ops`: how the seed corpus is
/// written. Mirrors arbitrary 1.x's encoding; a unit test checks the round trip.
pub fn encode(algorithm: Algorithm, ops: &[DeviceOp]) -> Vec<u8> {
    const OPS: usize = 16;
    let mut out = Vec::new();
    let alg = Algorithm::ALL
        .iter()
        .position(|&a| a == algorithm)
        .expect("a known algorithm");
    variant(&mut out, alg, Algorithm::ALL.len());
    for op in ops {
        out.push(1); // one more element
        match *op {
            DeviceOp::Write {
                sector,
                sectors,
                kind,
                seed,
            } => {
                variant(&mut out, 0, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
                variant(&mut out, kind as usize, PageKind::ALL.len());
                out.push(seed);
            }
            DeviceOp::Read { sector, sectors } => {
                variant(&mut out, 1, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::Discard { sector, sectors } => {
                variant(&mut out, 2, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::WriteZeroes { sector, sectors } => {
                variant(&mut out, 3, OPS);
                out.extend(sector.to_le_bytes());
                out.push(sectors);
            }
            DeviceOp::Wild {
                op,
                offset,
                len_bytes,
            } => {
                variant(&mut out, 4, OPS);
                variant(&mut out, op as usize, 4);
                out.extend(offset.to_le_bytes());
                out.extend(len_bytes.to_le_bytes());
            }
            DeviceOp::Compact => variant(&mut out, 5, OPS),
            DeviceOp::SetMemLimit { pages } => {
                variant(&mut out, 6, OPS);
                match pages {
                    Some(p) => out.extend([1, p]),
                    None => out.push(0),
                }
            }
            DeviceOp::ResetMemUsedMax => variant(&mut out, 7, OPS),
            DeviceOp::SwitchContext { foreign } => {
                variant(&mut out, 8, OPS);
                out.push(u8::from(foreign));
            }
            DeviceOp::MarkIdle { all } => {
                variant(&mut out, 9, OPS);
                out.push(u8::from(all));
            }
            DeviceOp::Recompress { huge_only } => {
                variant(&mut out, 10, OPS);
                out.push(u8::from(huge_only));
            }
            DeviceOp::Writeback { page, pages, fail } => {
                variant(&mut out, 11, OPS);
                out.extend([page, pages, u8::from(fail)]);
            }
            DeviceOp::FreeSlots { page, pages } => {
                variant(&mut out, 12, OPS);
                out.extend([page, pages]);
            }
            DeviceOp::ReclaimFreed => variant(&mut out, 13, OPS),
            DeviceOp::Restart => variant(&mut out, 14, OPS),
            DeviceOp::Group { max, split } => {
                variant(&mut out, 15, OPS);
                out.extend([max, u8::from(split)]);
            }
        }
    }
    out.push(0); // no more elements
    out
}

/// Decodes what [`device_ops`] would run: the algorithm and the operations.
pub fn decode(data: &[u8]) -> Option<(Algorithm, Vec<DeviceOp>)> {
    let mut u = Unstructured::new(data);
    let algorithm = u.arbitrary::<Algorithm>().ok()?;
    let ops = u
        .arbitrary_iter::<DeviceOp>()
        .and_then(|it| it.take(MAX_OPS).collect::<Result<Vec<_>, _>>())
        .ok()?;
    Some((algorithm, ops))
}

/// `n` operations decoded from a pseudo-random byte stream made from `seed`; memory limits are
/// taken modulo `limit_mod` pages, so that they bite.
pub fn scramble(seed: u64, n: usize, limit_mod: u8) -> Vec<DeviceOp> {
    let bytes: Vec<u8> = (0..n as u64 * 16)
        .map(|i| mix(seed << 32 | i) as u8)
        .collect();
    let mut u = Unstructured::new(&bytes);
    (0..n)
        .map(
            |_| match DeviceOp::arbitrary(&mut u).expect("enough bytes") {
                DeviceOp::SetMemLimit { pages } => DeviceOp::SetMemLimit {
                    pages: pages.map(|p| p % limit_mod),
                },
                op => op,
            },
        )
        .collect()
}

/// The seed corpus of `fuzz/corpus/device_ops/`: a name (the file's), an algorithm and the
/// operations, each file aimed at one behaviour.
fn whole(page: u16, pages: u8, kind: PageKind, seed: u8) -> DeviceOp {
    DeviceOp::Write {
        sector: page * 8,
        sectors: pages * 8,
        kind,
        seed,
    }
}

fn part(sector: u16, sectors: u8, kind: PageKind, seed: u8) -> DeviceOp {
    DeviceOp::Write {
        sector,
        sectors,
        kind,
        seed,
    }
}

fn read(sector: u16, sectors: u8) -> DeviceOp {
    DeviceOp::Read { sector, sectors }
}

fn discard(sector: u16, sectors: u8) -> DeviceOp {
    DeviceOp::Discard { sector, sectors }
}

fn zeroes(sector: u16, sectors: u8) -> DeviceOp {
    DeviceOp::WriteZeroes { sector, sectors }
}

fn limit(pages: Option<u8>) -> DeviceOp {
    DeviceOp::SetMemLimit { pages }
}

/// One page of every kind, then reads across them.
fn kinds() -> Vec<DeviceOp> {
    use PageKind::*;
    let mut kinds: Vec<DeviceOp> = PageKind::ALL
        .iter()
        .enumerate()
        .map(|(i, &k)| whole(i as u16, 1, k, i as u8))
        .collect();
    kinds.extend([
        read(0, 64),
        read(3, 9),
        whole(4, 1, Text, 9),
        whole(1, 1, Noise, 9),
        read(0, 64),
        whole(8, 8, Mixed, 200),
        read(60, 40),
    ]);
    kinds
}

/// One page overwritten with every kind in turn, read around, then freed.
fn overwrite() -> Vec<DeviceOp> {
    use PageKind::*;
    [Same, Noise, Text, Zeros, Pointers, Mixed, Sparse, Noise]
        .iter()
        .enumerate()
        .flat_map(|(i, &k)| [whole(5, 1, k, i as u8), read(40, 8), read(41, 3)])
        .chain([
            discard(40, 8),
            read(40, 8),
            whole(5, 1, Text, 1),
            zeroes(40, 8),
        ])
        .collect()
}

/// Half of 48 pages freed, then compaction.
fn compact() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    (0..48u16)
        .map(|p| whole(p, 1, [Mixed, Text, Pointers][p as usize % 3], p as u8))
        .chain((0..48u16).step_by(2).map(|p| discard(p * 8, 8)))
        .chain([Compact, read(0, 64), read(256, 64)])
        .collect()
}

/// Idle and huge pages recompressed, read back, recompressed again.
fn recompress() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    (0..32u16)
        .map(|p| {
            whole(
                p,
                1,
                [Text, Pointers, Noise, Mixed][p as usize % 4],
                p as u8,
            )
        })
        .chain([
            MarkIdle { all: true },
            Recompress { huge_only: true },
            read(0, 64),
            Recompress { huge_only: false },
            read(0, 255),
            whole(3, 2, Text, 77),
            MarkIdle { all: false },
            Recompress { huge_only: false },
            Compact,
            read(0, 255),
        ])
        .collect()
}

/// Restarts between pages of every kind, written back, recompressed, marked freed, under a
/// memory limit: each successor must hold every page, and go on writing, writing back and
/// compacting.
fn restart() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    (0..24u16)
        .map(|p| whole(p, 1, PageKind::ALL[p as usize % 7], p as u8))
        .chain([
            Restart,
            read(0, 255),
            Writeback {
                page: 0,
                pages: 10,
                fail: false,
            },
            MarkIdle { all: true },
            Recompress { huge_only: false },
            FreeSlots { page: 12, pages: 4 },
            Restart,
            whole(3, 2, Text, 90),
            Writeback {
                page: 10,
                pages: 10,
                fail: false,
            },
            discard(0, 16),
            limit(Some(4)),
            Restart,
            whole(30, 4, Noise, 91),
            Compact,
            SwitchContext { foreign: true },
            Restart,
            read(0, 255),
        ])
        .collect()
}

/// Cold groups: runs of idle text and pointer pages grouped, read, partly rewritten, discarded
/// and marked freed, written back around, split below half, carried over a restart.
fn groups() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    (0..40u16)
        .map(|p| {
            whole(
                p,
                1,
                [Text, Text, Pointers, Sparse, Noise][p as usize % 5],
                p as u8,
            )
        })
        .chain([
            MarkIdle { all: true },
            Group {
                max: 16,
                split: false,
            },
            read(0, 255),
            whole(1, 3, Mixed, 60),
            part(9 * 8 + 3, 2, Sparse, 61),
            discard(12 * 8, 24),
            FreeSlots { page: 20, pages: 3 },
            Writeback {
                page: 16,
                pages: 12,
                fail: false,
            },
            Restart,
            read(0, 255),
            ReclaimFreed,
            Group {
                max: 0,
                split: true,
            },
            MarkIdle { all: true },
            Group {
                max: 5,
                split: false,
            },
            Recompress { huge_only: false },
            Compact,
            Restart,
            read(0, 255),
        ])
        .collect()
}

/// Pages written back (once with failing writes), read, freed, written back again.
fn writeback() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    (0..24u16)
        .map(|p| whole(p, 1, [Text, Noise, Pointers, Same][p as usize % 4], p as u8))
        .chain([
            Writeback {
                page: 0,
                pages: 8,
                fail: true,
            },
            Writeback {
                page: 0,
                pages: 12,
                fail: false,
            },
            read(0, 255),
            whole(2, 2, Text, 50),
            discard(40, 16),
            part(33, 3, Sparse, 4),
            Recompress { huge_only: false },
            Writeback {
                page: 10,
                pages: 20,
                fail: false,
            },
            Compact,
            read(0, 255),
        ])
        .collect()
}

/// Swap freeing slots (marked, as the daemon's probe does) and reusing them: marked pages read
/// as before, a write over a marked page keeps its data through the reclaim, the others are
/// freed; writeback passes marked pages by; marks over written-back and recompressed pages, and
/// under the memory limit.
fn freed_slots() -> Vec<DeviceOp> {
    use DeviceOp::*;
    use PageKind::*;
    vec![
        whole(0, 16, Text, 1),
        whole(16, 4, Noise, 2),
        FreeSlots { page: 2, pages: 8 },
        read(0, 128),
        whole(4, 2, Pointers, 3),
        part(8 * 8 + 1, 2, Sparse, 4),
        ReclaimFreed,
        read(0, 160),
        FreeSlots { page: 12, pages: 2 },
        Writeback {
            page: 10,
            pages: 6,
            fail: false,
        },
        Recompress { huge_only: false },
        FreeSlots { page: 9, pages: 12 },
        limit(Some(3)),
        whole(12, 4, Noise, 5),
        ReclaimFreed,
        whole(12, 4, Noise, 6),
        FreeSlots {
            page: 60,
            pages: 16,
        },
        ReclaimFreed,
        read(0, 255),
    ]
}

#[allow(clippy::too_many_lines)] // a table literal, one row a case
pub fn seeds() -> Vec<(&'static str, Algorithm, Vec<DeviceOp>)> {
    use DeviceOp::*;
    use PageKind::*;
    let (kinds, overwrite, compact) = (kinds(), overwrite(), compact());
    let (recompress, writeback) = (recompress(), writeback());
    let freed = freed_slots();
    let restart = restart();
    let groups = groups();
    vec![
        ("seed-lz4-groups", Algorithm::Lz4, groups.clone()),
        ("seed-zstd-groups", Algorithm::Zstd, groups),
        // Pages rewritten with the very bytes they hold while the pool is at its limit (a
        // case the fuzzer once found); written by `encode`, so that a new operation does not
        // turn it into another input.
        (
            "regression-identical-rewrite-at-limit",
            Algorithm::Lz4,
            vec![
                whole(0, 6, Text, 1),
                whole(6, 2, Noise, 2),
                limit(Some(2)),
                whole(0, 6, Text, 1),
                whole(6, 2, Noise, 2),
                read(0, 64),
            ],
        ),
        ("seed-lz4-restart", Algorithm::Lz4, restart.clone()),
        ("seed-zstd-restart", Algorithm::Zstd, restart),
        ("seed-lz4-freed-slots", Algorithm::Lz4, freed.clone()),
        ("seed-zstd-freed-slots", Algorithm::Zstd, freed),
        ("seed-lz4-writeback", Algorithm::Lz4, writeback.clone()),
        ("seed-zstd-writeback", Algorithm::Zstd, writeback),
        ("seed-lz4-recompress", Algorithm::Lz4, recompress.clone()),
        ("seed-zstd-recompress", Algorithm::Zstd, recompress),
        ("seed-lz4-kinds", Algorithm::Lz4, kinds.clone()),
        ("seed-zstd-kinds", Algorithm::Zstd, kinds),
        (
            "seed-lz4-partial",
            Algorithm::Lz4,
            vec![
                part(1, 1, Text, 1),
                part(7, 2, Noise, 2),
                part(11, 14, Same, 3),
                part(20, 1, Zeros, 0),
                read(0, 40),
                whole(0, 1, Noise, 5),
                part(2, 3, Zeros, 0),
                part(3, 1, Sparse, 6),
                read(0, 16),
                read(5, 1),
            ],
        ),
        (
            "seed-lz4-discard-ends",
            Algorithm::Lz4,
            vec![
                whole(0, 8, Text, 7),
                discard(4, 16),
                discard(24, 40),
                read(0, 64),
                whole(0, 8, Pointers, 8),
                zeroes(4, 16),
                zeroes(31, 2),
                read(0, 64),
            ],
        ),
        (
            "seed-zstd-zeroes",
            Algorithm::Zstd,
            vec![
                zeroes(1, 2),
                zeroes(8, 8),
                whole(2, 2, Pointers, 3),
                zeroes(17, 14),
                zeroes(16, 1),
                read(0, 40),
                zeroes(0, 64),
                read(0, 64),
            ],
        ),
        (
            "seed-lz4-mem-limit",
            Algorithm::Lz4,
            vec![
                limit(Some(4)),
                whole(0, 8, Noise, 1),
                read(0, 64),
                whole(8, 8, Same, 2),
                whole(2, 1, Noise, 3),
                discard(0, 16),
                whole(2, 2, Noise, 4),
                part(26, 4, Text, 5),
                limit(None),
                whole(0, 8, Noise, 6),
                limit(Some(0)),
                read(0, 64),
            ],
        ),
        (
            "seed-zstd-mem-limit-partial",
            Algorithm::Zstd,
            vec![
                whole(0, 8, Text, 3),
                whole(8, 8, Mixed, 4),
                limit(Some(1)),
                part(5, 2, Noise, 9),
                zeroes(9, 3),
                part(72, 2, Text, 40),
                whole(10, 1, Same, 1),
                discard(0, 128),
                whole(0, 1, Text, 1),
                limit(None),
                whole(0, 2, Text, 3),
                part(5, 2, Noise, 9),
                zeroes(9, 3),
                read(0, 128),
            ],
        ),
        (
            "seed-lz4-out-of-range",
            Algorithm::Lz4,
            vec![
                part(508, 8, Noise, 1),
                read(512, 1),
                read(575, 64),
                discard(511, 2),
                zeroes(504, 16),
                Wild {
                    op: WildOp::Read,
                    offset: u64::MAX - 511,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Write,
                    offset: 100,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Discard,
                    offset: 4096,
                    len_bytes: 100,
                },
                Wild {
                    op: WildOp::WriteZeroes,
                    offset: 1 << 40,
                    len_bytes: 512,
                },
                Wild {
                    op: WildOp::Write,
                    offset: 0,
                    len_bytes: 0,
                },
                part(511, 1, Text, 2),
                read(511, 1),
                read(504, 8),
            ],
        ),
        ("seed-lz4-compact", Algorithm::Lz4, compact),
        (
            "seed-zstd-contexts",
            Algorithm::Zstd,
            vec![
                SwitchContext { foreign: true },
                whole(0, 2, Text, 1),
                read(0, 16),
                SwitchContext { foreign: false },
                part(3, 9, Mixed, 2),
                SwitchContext { foreign: true },
                read(0, 16),
                SwitchContext { foreign: true },
                part(12, 1, Noise, 3),
                read(8, 8),
            ],
        ),
        ("seed-lz4-overwrite", Algorithm::Lz4, overwrite),
        (
            "seed-zstd-mem-used-max",
            Algorithm::Zstd,
            vec![
                whole(0, 8, Noise, 1),
                whole(8, 8, Text, 2),
                ResetMemUsedMax,
                discard(0, 64),
                ResetMemUsedMax,
                limit(Some(2)),
                whole(0, 4, Noise, 3),
                Compact,
                limit(None),
            ],
        ),
        ("seed-lz4-scramble", Algorithm::Lz4, scramble(3, 300, 24)),
        ("seed-zstd-scramble", Algorithm::Zstd, scramble(4, 300, 24)),
    ]
}
