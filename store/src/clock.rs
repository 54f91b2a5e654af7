//! The clock grant expiries are written and checked on, and a store's check
//! that its clock agrees with the leader's.
//!
//! [`now_ms`] is Unix time in ms read once per process, then advanced by the
//! monotonic clock: a wall-clock step (an operator's `date -s`, NTP stepping
//! after a long outage) moves no expiry, fence or deadline of a running
//! process. NTP's slewing still reaches it, since Linux slews the monotonic
//! clock at the same rate. A process follows a step only when it restarts;
//! the masters then learn of its disagreement from its heartbeats, and a
//! store from the leader's answers ([`ClockCheck`]).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How far a store's clock may be from the leader's before it refuses every
/// grant. The masters' write fence keeps a range `WRITE_FENCE_MARGIN_MS`
/// (10 s) past its grants' expiry: this offset plus a store's
/// `--grant-clock-skew` (at most 5 s) fit in it, with 2 s to spare for a
/// heartbeat's round trip and for the leader that fenced a range not being
/// the one the store compared with.
pub const MAX_CLOCK_OFFSET_MS: u64 = 3_000;

/// Set by the test-only `--unsafe-wall-clock`: see [`read_the_wall_clock_unsafely`].
static WALL_CLOCK_UNSAFELY: AtomicBool = AtomicBool::new(false);

/// TEST ONLY: from now on [`now_ms`] reads the wall clock, and a
/// [`ClockCheck`] never finds the clocks off, as before this module: a
/// step of a master's wall clock then frees fenced ranges early. The
/// chaos suite shows its checker catches that.
pub fn read_the_wall_clock_unsafely() {
    WALL_CLOCK_UNSAFELY.store(true, Ordering::Relaxed);
}

/// Unix ms on this process's steady clock (see the module docs).
pub fn now_ms() -> u64 {
    if WALL_CLOCK_UNSAFELY.load(Ordering::Relaxed) {
        return wall_ms();
    }
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (at, wall) = ANCHOR.get_or_init(|| (Instant::now(), wall_ms()));
    wall.saturating_add(at.elapsed().as_millis() as u64)
}

/// The wall clock, 0 before 1970.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A store's verdict on its clock against the leader's, from the times the
/// leader puts in heartbeat answers. While the clocks are known to differ
/// by more than [`MAX_CLOCK_OFFSET_MS`], the store honours no grant: one
/// behind would honour grants the masters consider expired (and whose
/// ranges they may have placed again), one ahead refuses them anyway.
#[derive(Debug, Default)]
pub struct ClockCheck {
    off: AtomicBool,
    /// The last estimate of the leader's clock minus this one, ms.
    offset_ms: AtomicI64,
}

/// What a heartbeat answer told about the clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockVerdict {
    /// Within [`MAX_CLOCK_OFFSET_MS`] for sure.
    Agrees,
    /// Beyond it for sure.
    Off,
    /// The round trip was too long to tell: the verdict stands.
    Unknown,
}

impl ClockCheck {
    /// Takes a heartbeat's round trip: sent at `sent_ms`, answered with the
    /// leader's `leader_ms`, received at `received_ms` (all but the
    /// leader's on [`now_ms`]). The offset lies between what the two ends
    /// of the round trip give; only a verdict the whole interval supports
    /// changes the state. Returns the verdict and whether it changed.
    pub fn observe(&self, sent_ms: u64, leader_ms: u64, received_ms: u64) -> (ClockVerdict, bool) {
        if leader_ms == 0 || received_ms < sent_ms || WALL_CLOCK_UNSAFELY.load(Ordering::Relaxed) {
            return (ClockVerdict::Unknown, false);
        }
        // i128: any u64 the leader sends is a difference of two u64s.
        let low = i128::from(leader_ms) - i128::from(received_ms);
        let high = i128::from(leader_ms) - i128::from(sent_ms);
        let offset = ((low + high) / 2).clamp(i128::from(i64::MIN), i128::from(i64::MAX));
        self.offset_ms.store(offset as i64, Ordering::Relaxed);
        let max = i128::from(MAX_CLOCK_OFFSET_MS);
        let verdict = if low > max || high < -max {
            ClockVerdict::Off
        } else if low >= -max && high <= max {
            ClockVerdict::Agrees
        } else {
            ClockVerdict::Unknown
        };
        let changed = match verdict {
            ClockVerdict::Off => !self.off.swap(true, Ordering::Relaxed),
            ClockVerdict::Agrees => self.off.swap(false, Ordering::Relaxed),
            ClockVerdict::Unknown => false,
        };
        (verdict, changed)
    }

    /// Whether grants are refused now.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
    }

    /// The last estimate of the leader's clock minus this one, ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_clock_is_near_the_wall_clock_and_never_goes_back() {
        let a = now_ms();
        let b = now_ms();
        assert!(b >= a);
        assert!(a.abs_diff(wall_ms()) < 1_000);
    }

    #[test]
    fn only_a_conclusive_round_trip_changes_the_verdict() {
        let c = ClockCheck::default();
        assert!(!c.is_off(), "no heartbeat yet: grants are honoured");
        // The leader is an hour ahead.
        assert_eq!(
            c.observe(1_000, 3_601_000, 1_010),
            (ClockVerdict::Off, true)
        );
        assert!(c.is_off());
        assert_eq!(c.offset_ms(), 3_599_995);
        // A round trip of 20 s cannot tell 0 s from 20 s: unchanged.
        assert_eq!(
            c.observe(10_000, 30_000, 30_000),
            (ClockVerdict::Unknown, false)
        );
        assert!(c.is_off());
        assert_eq!(
            c.observe(40_000, 42_000, 40_010),
            (ClockVerdict::Agrees, true)
        );
        assert!(!c.is_off());
        // An hour behind, and a master that sends no time.
        assert_eq!(c.observe(3_600_000, 10, 3_600_001).0, ClockVerdict::Off);
        assert_eq!(c.observe(5, 0, 6), (ClockVerdict::Unknown, false));
        assert!(c.is_off());
        // Absurd times from the network are judged, not overflowed.
        assert_eq!(c.observe(0, u64::MAX, 1).0, ClockVerdict::Off);
        assert_eq!(c.observe(u64::MAX - 1, 1, u64::MAX).0, ClockVerdict::Off);
        assert_eq!(c.offset_ms(), i64::MIN);
    }
}
