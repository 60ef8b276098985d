//! A device before it has a disksize ([`DeviceSetup`]) and what it is made of
//! ([`DeviceConfig`]).

use uzram_codecs::{Algorithm, AlgorithmParams, Codec, CodecParams};

use super::{Device, Growth, PolicyConfig, PoolConfig, PAGE_SIZE};
use crate::Error;

/// How a device compresses and what it may use.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The primary algorithm (zram's `comp_algorithm`).
    pub algorithm: Algorithm,
    /// Its parameters (zram's `algorithm_params`): level, dictionary.
    pub params: CodecParams,
    /// zram's `mem_limit` in bytes; `None` for none.
    pub mem_limit: Option<u64>,
    /// The allocator's tunables.
    pub pool: PoolConfig,
    /// zram's `recomp_algorithm`: the secondary algorithms by priority 1..=3 (`[0]` is
    /// priority 1), each with its parameters.
    pub secondary: [Option<(Algorithm, CodecParams)>; 3],
    /// zram's `backing_dev`: files (created 0600 if missing, sized to the disksize if empty) or
    /// block devices that written-back pages go to; more than one are striped.
    pub backing_devs: Vec<std::path::PathBuf>,
    /// Overwrite backing devices that hold data uzram did not write (a filesystem, a swap
    /// area): off, they are refused.
    pub backing_force: bool,
    /// The key that seals the backing store's records. `None`: a new one is drawn, which
    /// only a device outside a region may do (a successor adopting one in a region needs the
    /// same key, and the process that made it must have it to pass on). A key given to
    /// [`Device::new`] must be new ([`super::writeback::BackingKey::generate`]) and serve that
    /// one device: each device's nonces start again at 1 in epoch 0, so a key reused for a
    /// second device would repeat them. Only its successors ([`Device::adopt`]) take it again.
    pub backing_key: Option<super::writeback::BackingKey>,
    /// The automatic tiering policy (uzram's `policy` attribute).
    pub policy: PolicyConfig,
    /// Keep the slot table and the pool in this memfd region, so that another process can adopt
    /// the device ([`Device::adopt`]); size it with [`Device::region_size`]. `None`: in the
    /// process's own memory.
    pub region: Option<uzram_allocator::Region>,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig {
            algorithm: Algorithm::Lz4,
            params: CodecParams::default(),
            mem_limit: None,
            pool: PoolConfig::default(),
            secondary: Default::default(),
            backing_devs: Vec::new(),
            backing_force: false,
            backing_key: None,
            policy: PolicyConfig::default(),
            region: None,
        }
    }
}

/// A device before it has a disksize: zram's state after `reset` or hot-add, when the algorithm
/// and its parameters may still change. [`DeviceSetup::init`] turns it into a [`Device`], whose
/// algorithm is fixed for life.
#[derive(Debug, Clone, Default)]
pub struct DeviceSetup {
    config: DeviceConfig,
}

impl DeviceSetup {
    /// A setup with zram's defaults (lz4, no limit).
    pub fn new() -> DeviceSetup {
        DeviceSetup::default()
    }

    /// zram's `comp_algorithm`: picks the primary algorithm by name; resets its parameters.
    pub fn set_comp_algorithm(&mut self, name: &str) -> Result<(), Error> {
        self.config.algorithm = name.trim().parse()?;
        self.config.params = CodecParams::default();
        Ok(())
    }

    /// zram's `algorithm_params` for the primary algorithm: `[algo=NAME] [priority=0] level=N
    /// dict=PATH`. The codec is built once here to check the parameters.
    pub fn set_algorithm_params(&mut self, text: &str) -> Result<(), Error> {
        let mut p: AlgorithmParams = text.parse()?;
        if let (Some(algo), None) = (p.algo, p.priority) {
            // zram's rule: `algo=` names the algorithm (primary or secondary) the parameters are
            // for; it never changes which algorithms the device has.
            p.priority = if self.config.algorithm == algo {
                Some(0)
            } else {
                let found = self
                    .config
                    .secondary
                    .iter()
                    .position(|s| s.as_ref().is_some_and(|(a, _)| *a == algo));
                Some(found.ok_or_else(|| Error::InvalidRequest {
                    text: text.to_string(),
                    why: "algo= names neither the primary algorithm nor a recompression algorithm (set those first)",
                })? as u8
                    + 1)
            };
        }
        if let Some(prio) = p.priority.filter(|&p| p != 0) {
            // Parameters of a recompression algorithm, which must be set first (zram's rule).
            let slot = &mut self.config.secondary[usize::from(prio) - 1];
            let Some((algorithm, _)) = slot.clone() else {
                return Err(Error::NoRecompAlgorithm { priority: prio });
            };
            if p.algo.is_some_and(|a| a != algorithm) {
                return Err(Error::InvalidRequest {
                    text: text.to_string(),
                    why: "algo= is not the recompression algorithm of that priority",
                });
            }
            let params = p.load_codec_params()?;
            Codec::new(algorithm, params.clone())?;
            *slot = Some((algorithm, params));
            return Ok(());
        }
        let algorithm = self.config.algorithm;
        if p.algo.is_some_and(|a| a != algorithm) {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why: "algo= is not the primary algorithm, which priority=0 names",
            });
        }
        let params = p.load_codec_params()?;
        Codec::new(algorithm, params.clone())?;
        self.config.params = params;
        Ok(())
    }

    /// Keeps the device in `region` (see [`DeviceConfig::region`]).
    pub fn set_region(&mut self, region: uzram_allocator::Region) {
        self.config.region = Some(region);
    }

    /// The device this setup describes that a predecessor left in its region (see
    /// [`Device::adopt`]).
    pub fn adopt(self, disksize: u64) -> Result<(Device, super::Adopted), Error> {
        Device::adopt(self.config, disksize)
    }

    /// zram's `mem_limit` (0 or `None` for none).
    pub fn set_mem_limit(&mut self, bytes: Option<u64>) {
        self.config.mem_limit = bytes.filter(|&b| b > 0);
    }

    /// zram's `backing_dev`: where `writeback` puts pages. Opened (and checked) at init.
    /// Replaces any file given before.
    pub fn set_backing_dev(&mut self, path: &std::path::Path) {
        self.config.backing_devs = vec![path.to_path_buf()];
    }

    /// Whether a backing device that holds data uzram did not write is overwritten (`true`) or
    /// refused (the default).
    pub fn set_backing_force(&mut self, force: bool) {
        self.config.backing_force = force;
    }

    /// Checks the backing devices as opening them will (their kind, size and label; see
    /// [`super::writeback::check_backing`]) without writing anything: for validating a plan before a
    /// device is started.
    pub fn check_backing(&self) -> Result<(), Error> {
        for path in &self.config.backing_devs {
            super::writeback::check_backing(path, self.config.backing_force)?;
        }
        Ok(())
    }

    /// The key of the backing store's records (see [`DeviceConfig::backing_key`]).
    pub fn set_backing_key(&mut self, key: super::writeback::BackingKey) {
        self.config.backing_key = Some(key);
    }

    /// Adds a backing file to stripe over (at most [`writeback::MAX_FILES`]).
    pub fn add_backing_dev(&mut self, path: &std::path::Path) {
        self.config.backing_devs.push(path.to_path_buf());
    }

    /// The tiering policy (see [`PolicyConfig`]): `key=value ...` as the `policy` attribute
    /// takes it.
    pub fn set_policy(&mut self, text: &str) -> Result<(), Error> {
        self.config.policy.update(text)
    }

    /// zram's `recomp_algorithm`: `algo=NAME [priority=1..3] [level=N] [dict=PATH]` adds (or
    /// replaces) the secondary algorithm of that priority (1 when not given); a bare `NAME` is
    /// `algo=NAME`.
    pub fn set_recomp_algorithm(&mut self, text: &str) -> Result<(), Error> {
        if text.trim().is_empty() {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why: "names no algorithm: give NAME (zstd, lz4) or algo=NAME [priority=1..3]",
            });
        }
        // A bare name is shorthand for algo=NAME (priority 1).
        let text = if text.contains('=') {
            text.to_string()
        } else {
            format!("algo={}", text.trim())
        };
        let text = text.as_str();
        let p: AlgorithmParams = text.parse()?;
        let algorithm = p.algo.ok_or(Error::InvalidRequest {
            text: text.to_string(),
            why: "algo=NAME is required",
        })?;
        let prio = p.priority.unwrap_or(1);
        if prio == 0 {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why: "priority 0 is the primary algorithm (comp_algorithm)",
            });
        }
        let params = p.load_codec_params()?;
        Codec::new(algorithm, params.clone())?;
        self.config.secondary[usize::from(prio) - 1] = Some((algorithm, params));
        Ok(())
    }

    /// Pool memory (bytes, rounded up to 2 MiB arenas) kept mapped and empty against the next
    /// writes: on demand, mapped at init; with [`Growth::Reserve`], the most the reserve grows
    /// to under a burst of writes (see [`DeviceSetup::set_pool_reserve_min`]).
    pub fn set_pool_reserve(&mut self, bytes: u64) {
        self.config.pool.reserve_arenas = Self::arenas(bytes);
    }

    /// With [`Growth::Reserve`]: the reserve the pool starts with and shrinks back to when
    /// writes stop drawing on it (bytes, rounded up to 2 MiB arenas; at most the reserve's
    /// most). With 0 a fresh or idle device holds no pool memory: its first write that needs a
    /// new arena waits for [`Device::maintain_memory`] to map one.
    pub fn set_pool_reserve_min(&mut self, bytes: u64) {
        let arena = (uzram_allocator::ARENA_PAGES * PAGE_SIZE) as u64;
        self.config.pool.reserve_min_arenas = bytes.div_ceil(arena) as usize;
    }

    fn arenas(bytes: u64) -> usize {
        let arena = (uzram_allocator::ARENA_PAGES * PAGE_SIZE) as u64;
        bytes.div_ceil(arena).max(1) as usize
    }

    /// How the pool gets memory: on demand (the default, for embedders), or from a reserve that
    /// a maintenance thread keeps filled ([`Device::maintain_memory`]), so that the I/O path never
    /// maps memory itself: what a swap device's daemon needs.
    pub fn set_pool_growth(&mut self, growth: Growth) {
        self.config.pool.growth = growth;
    }

    /// The configuration so far.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// zram's `disksize`: initialises the device. The size is rounded up to whole pages, as zram
    /// does; 0 is refused.
    pub fn init(self, disksize: u64) -> Result<Device, Error> {
        Device::new(self.config, disksize)
    }
}
