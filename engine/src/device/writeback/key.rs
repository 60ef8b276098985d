//! The key that seals a device's records on its backing store.

use chacha20poly1305::aead::{AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};

use super::NONCE;

/// The key that seals a device's records on its backing store (ChaCha20-Poly1305, 256 bits).
/// Drawn from the OS for each new device; a device that outlives its process
/// ([`crate::Device::adopt`]) needs its successor given the same key, which the daemon passes in
/// a sealed memfd and never writes to disk. Zeroed when dropped; its `Debug` shows nothing.
#[derive(Clone)]
pub struct BackingKey([u8; KEY_LEN]);

/// Bytes of a [`BackingKey`].
pub const KEY_LEN: usize = 32;

impl BackingKey {
    /// A new key from the OS's random source.
    pub fn generate() -> BackingKey {
        BackingKey(ChaCha20Poly1305::generate_key(&mut OsRng).into())
    }

    /// The key of these bytes (a predecessor's, passed on).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> BackingKey {
        BackingKey(bytes)
    }

    /// Its bytes, to pass to a successor.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    pub(super) fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(&self.0))
    }

    /// What identifies the key without revealing it: the tag of an empty record under a nonce
    /// the counter never reaches (all ones), kept in the region so that a successor given
    /// another key is refused before it reads a page.
    pub(crate) fn check_value(&self) -> [u64; 2] {
        let tag = self
            .cipher()
            .encrypt_in_place_detached(
                Nonce::from_slice(&[0xff; NONCE]),
                b"uzram backing key check",
                &mut [],
            )
            .unwrap_or_default();
        let mut words = [0u64; 2];
        for (w, b) in words.iter_mut().zip(tag.chunks(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(b);
            *w = u64::from_le_bytes(le);
        }
        words
    }
}

impl Drop for BackingKey {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

impl std::fmt::Debug for BackingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackingKey(..)")
    }
}
