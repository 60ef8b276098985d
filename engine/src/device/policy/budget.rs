//! The writeback budget: bytes per day, as a bucket that refills continuously.

/// The budget of bytes per day: a bucket that refills continuously, full at the start.
#[derive(Debug, Default)]
pub(super) struct Budget {
    per_day: Option<u64>,
    tokens: i64,
    /// Device clock (seconds) of the last refill.
    last: u32,
}

impl Budget {
    pub(super) fn set(&mut self, per_day: Option<u64>, now: u32) {
        if self.per_day != per_day {
            self.per_day = per_day;
            self.tokens = per_day.map_or(0, |d| d.min(i64::MAX as u64) as i64);
            self.last = now;
        }
    }

    pub(super) fn refill(&mut self, now: u32) {
        if let Some(d) = self.per_day {
            let dt = u64::from(now.saturating_sub(self.last));
            let add = (u128::from(d) * u128::from(dt) / 86400).min(i64::MAX as u128) as i64;
            let cap = d.min(i64::MAX as u64) as i64;
            self.tokens = self.tokens.saturating_add(add).min(cap);
        }
        self.last = now;
    }

    /// Whether a write may start (one batch may overdraw the bucket, the next waits).
    pub(super) fn allows(&mut self, now: u32) -> bool {
        self.refill(now);
        self.per_day.is_none() || self.tokens > 0
    }

    pub(super) fn charge(&mut self, bytes: u64) {
        if self.per_day.is_some() {
            self.tokens = self
                .tokens
                .saturating_sub(bytes.min(i64::MAX as u64) as i64);
        }
    }

    pub(super) fn left(&self) -> Option<u64> {
        self.per_day.map(|_| self.tokens.max(0) as u64)
    }
}
