//! uzram: a compressed RAM block device engine, zram's behaviour as a library.
//!
//! A [`Device`] is a table of 4 KiB pages stored compressed in RAM: same-filled pages live in
//! their slot, incompressible pages are stored raw, the rest are compressed by a per-thread
//! [`IoContext`] stream and kept in a zsmalloc-like pool. It knows nothing of ublk or the kernel:
//! any block tool can embed it.
//!
//! ```
//! use uzram::{DeviceSetup, parse_size};
//!
//! let mut setup = DeviceSetup::new();
//! setup.set_comp_algorithm("zstd")?;
//! let device = setup.init(parse_size("16M")?)?;
//! let mut ctx = device.context()?;            // one per I/O thread
//!
//! let page = [b"swap me out ".repeat(341), vec![0; 4]].concat();
//! device.write(&mut ctx, 8192, &page)?;
//! let mut back = vec![0; 4096];
//! device.read(&mut ctx, 8192, &mut back)?;
//! assert_eq!(back, page);
//!
//! device.discard(8192, 4096)?;                 // how swap frees a slot
//! print!("{}", device.mm_stat());              // zram's mm_stat line
//! # Ok::<(), uzram::Error>(())
//! ```

pub mod attrs;
pub mod bench;
pub mod cli;
pub mod control;
pub mod corpus;
pub mod ctl;
pub mod device;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod listing;
pub mod pagedump;
pub mod pin;
pub mod setup;
mod size;
#[cfg(feature = "ublk")]
pub mod ublk;

pub use device::{
    Device, DeviceConfig, DeviceSetup, DeviceStats, Growth, IoContext, IoStat, Maintenance, MmStat,
    PageIndex, Policy, PolicyConfig, PolicyStats, Pressure, RecompressRequest, RecompressStats,
    RecompressType, SlotFlags, SlotState, PAGE_SIZE, SECTOR_SIZE,
};
pub use error::Error;
pub use size::{format_size, parse_size};
