//! Parking a slot lock's waiters on the slot's address: two calls into parking_lot_core, with
//! the engine's backing-file calls in `sys` its only `unsafe`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Parks the calling thread on `key` (a slot's address) while every bit of `bits` is set in
/// `word`, checked under parking_lot's queue lock, so a wake between the check and the park is
/// not lost.
pub(crate) fn wait(key: usize, word: &AtomicU64, bits: u64) {
    // SAFETY: the validate closure only loads an atomic; neither closure panics or calls into
    // parking_lot. The key is a slot's address, which `wake_all` unparks.
    unsafe {
        parking_lot_core::park(
            key,
            || word.load(Ordering::Relaxed) & bits == bits,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        );
    }
}

/// Wakes every thread parked on `key`.
pub(crate) fn wake_all(key: usize) {
    // SAFETY: unpark_all has no preconditions beyond a key; the key is the slot address its
    // waiters parked on.
    unsafe {
        parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN);
    }
}
