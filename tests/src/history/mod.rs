//! Histories of a fault run, and the checkers that judge them.
//!
//! Every event is stamped with `CLOCK_MONOTONIC` nanoseconds ([`now_ns`]). That is
//! the clock [`Instant`] reads on Linux, and it is one clock for the whole
//! machine, so events logged by separate client processes, by the fault proxies
//! and by the nemesis can be compared directly. A library [`Instant`] (such as
//! `Lock::valid_until`) is converted with [`instant_ns`].
//!
//! A history is a list of [`Event`]s, kept as JSON lines ([`write_jsonl`],
//! [`read_jsonl`]) so a soak run can be checked again later ([`check`], and the
//! `fault_recheck` binary).
//!
//! # The checkers
//!
//! * **Overlap.** Per resource, each lock (one token) held the interval
//!   `[acquired, min(release started, validity deadline − loss margin, loss
//!   noticed))`, where `acquired` is when the acquire call returned and the
//!   deadline is the validity the library reported to the holder: for a manual
//!   lock the acquire's, raised by each successful extension; for a guard the
//!   one its holder observed last (a renewal near `max_hold` can lower it). A
//!   guard's loss margin (0 for manual locks) is there because its holder is told
//!   "lost" at `valid_until − margin` and the library may release the keys from
//!   then on. No two intervals of one resource may intersect.
//! * **Late writes.** Every counted write happened inside its own lock's interval.
//! * **Holder view.** An [`Event::HolderWrite`] is a write the store did not
//!   check: the holder checked `is_lost()` (false), then wrote. A write whose
//!   check passed and that followed it without a stall must fall inside its own
//!   interval and inside no other holder's interval, and the chain of such
//!   writes (in store order, each reading the previous one's value) must not
//!   break, nor end below the final count. Writes the workload stalled between
//!   the check and the write (gap over half the TTL) are counted apart as
//!   `stalled_after_check`: no client-side check can stop them, only fencing;
//!   a broken link caused by one is not counted as a lost update.
//! * **Lost updates.** The clients run a non-atomic read, sleep, write+1 on a
//!   fault-free store. The store runs the validity check and the write as one step
//!   under its own mutex (or `flock`), against the shared monotonic clock, so a
//!   write is counted exactly when it was made inside the validity. The final
//!   count of each resource must equal the number of counted writes, and the
//!   writes, in store order, must each have read the previous write's value.
//! * **Validity not overstated.** For every successful acquire and extension:
//!   the library's own start lies inside the call (`t0 ≤ started ≤ t1`), and the
//!   reported deadline is at most `started + ttl − drift`. For acquisitions the
//!   start must also precede the first time any proxy saw the fresh token on the
//!   wire, and the deadline must be at most `first sighting + ttl − drift`: the
//!   key cannot have been set on any node before that, so it cannot expire before
//!   `first sighting + ttl`. For auto-extended guards, whose calls the harness
//!   does not see, every observed deadline must be at most the latest sighting of
//!   the token before the observation, plus `ttl − drift`.
//! * **Liveness.** After the faults heal, every resource is acquired within
//!   `TTL + retry budget`.
//! * **Ghost keys.** A key that a node set after its client gave up expires
//!   within the TTL.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use nix::time::{ClockId, clock_gettime};

mod check;
mod event;
mod holder;
pub mod shared;
#[cfg(test)]
mod tests;
mod verdict;

use check::*;
pub use check::{GHOST_SLACK_NS, check};
pub use event::*;
use holder::*;
pub use verdict::*;
/// Nanoseconds on `CLOCK_MONOTONIC`, the machine-wide clock [`Instant`] uses.
///
/// # Panics
/// If the clock cannot be read (never on Linux).
pub fn now_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("read CLOCK_MONOTONIC");
    let secs = u64::try_from(ts.tv_sec()).expect("monotonic seconds are positive");
    let nanos = u64::try_from(ts.tv_nsec()).expect("nanoseconds are positive");
    secs * 1_000_000_000 + nanos
}

/// One pairing of an [`Instant`] with [`now_ns`], taken once per process.
struct Calibration {
    instant: Instant,
    ns: u64,
    /// How far apart the two readings that bracket `instant` were: the most the
    /// pairing can be off by, twice over.
    width: u64,
}

static CALIBRATION: LazyLock<Calibration> = LazyLock::new(|| {
    let mut best: Option<Calibration> = None;
    for _ in 0..64 {
        let a = now_ns();
        let instant = Instant::now();
        let b = now_ns();
        let width = b.saturating_sub(a);
        if best.as_ref().is_none_or(|c| width < c.width) {
            best = Some(Calibration {
                instant,
                ns: a + width / 2,
                width,
            });
        }
    }
    best.expect("at least one sample")
});

/// Converts an [`Instant`] of this process to [`now_ns`] nanoseconds.
///
/// Both read `CLOCK_MONOTONIC`; the conversion is off by at most
/// [`calibration_error_ns`].
pub fn instant_ns(i: Instant) -> u64 {
    let c = &*CALIBRATION;
    if i >= c.instant {
        c.ns + duration_ns(i - c.instant)
    } else {
        c.ns.saturating_sub(duration_ns(c.instant - i))
    }
}

/// The most [`instant_ns`] can be off by in this process (plus one nanosecond).
pub fn calibration_error_ns() -> u64 {
    CALIBRATION.width / 2 + 1
}

/// A duration in whole nanoseconds (saturating).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
