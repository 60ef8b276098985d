//! uzram's engine: zram's compressed page store as a library.
//!
//! A [`Device`] is a table of 4 KiB pages stored compressed in RAM: same-filled pages live in
//! their slot, incompressible pages are stored raw, the rest are compressed by a per-thread
//! [`IoContext`] stream and kept in a zsmalloc-like pool. It knows nothing of ublk or the kernel:
//! any block tool can embed it (`uzram-engine = "0.1"` in its `Cargo.toml`).
//!
//! ```
//! use uzram_engine::{DeviceSetup, parse_size};
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
//! # Ok::<(), uzram_engine::Error>(())
//! ```
//!
//! [`attrs`] serves zram's sysfs attributes on a device, byte for byte. With the `testing`
//! feature, [`testing`] holds the model harness the fuzz targets, proptests and corpus replay
//! share, and the page generators every test uses.

#![deny(unsafe_code)]

pub mod attrs;
pub mod device;
mod error;
mod size;
#[allow(unsafe_code)] // fcntl and fallocate on a backing file, each with its SAFETY reason
mod sys;
#[cfg(feature = "testing")]
pub mod testing;

pub use device::{
    Adopted, BackingKey, Device, DeviceConfig, DeviceSetup, DeviceStats, FreeMarks, FreedPages,
    GroupEstimate, Growth, IoContext, IoStat, Maintenance, MmStat, PageIndex, Policy, PolicyConfig,
    PolicyStats, Pressure, RecompressRequest, RecompressStats, RecompressType, Region, RegionSize,
    ReserveWait, ShortWrite, SlotFlags, SlotState, MIN_GROUP_PAGES, PAGE_SIZE, SECTOR_SIZE,
};
pub use error::{Error, IoError};
pub use size::{format_size, parse_size};
