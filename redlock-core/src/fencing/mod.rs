//! *Layer 1, values (see `lib.rs`).*
//!
//! Fencing tokens, the client side: a number handed out with every lock that
//! grows from one holder of a resource to the next, so that the protected
//! resource can refuse a write from a holder that was paused past its validity
//! (see [`crate::fence`] for the store side).
//!
//! The protocol is two-phase, on top of the distlock acquire:
//!
//! 1. **read** (in the acquire round trip): the acquire pipeline also returns the
//!    node's counter for the key (`GET`) and its clock (`TIME`);
//! 2. **pick**: `T = max(..) + 1` over the nodes that said OK ([`pick_token`]);
//! 3. **fence** (one more round trip): on every node that may hold the key, a
//!    script raises the counter to `max(counter, T)`, only while the key still
//!    holds this attempt's token. The lock is handed out, with `T`, only once a
//!    quorum applied it within the validity (`Redlock::fence_phase`, in `acquire/fence.rs`).
//!
//! Why it is monotone: a later holder's acquire quorum and an earlier holder's
//! fence quorum share a node. There the earlier fence ran while the earlier key
//! was still present, so before the later `SET NX` succeeded, so before the later
//! `GET` of the counter: the later holder reads at least the earlier `T`. That
//! holds as long as that shared node did not lose its counter, which is what the
//! [`FencingMode`] is about.

use crate::error::NodeError;
use std::fmt;
use std::time::Duration;

/// How fencing tokens stay monotone when a node loses its counters.
///
/// Set with [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing); off by
/// default. Either mode costs a fenced lock one extra round trip at acquire;
/// extend and release are unchanged. [`Redlock::check_nodes`](crate::Redlock::check_nodes) says, per node,
/// whether the mode is sound there ([`FencingCheck`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingMode {
    /// `T = max(counter) + 1`. Monotone as long as no node loses a counter
    /// write it acknowledged: every node must run with `appendonly yes` and
    /// `appendfsync always`. On a node that restarts without its data, tokens
    /// can repeat or go backwards. The counter of a resource the program
    /// names (`acquire`, `try_acquire`, `guard` without a retention) never
    /// expires (about 90 bytes per resource ever locked, per node). The
    /// counter of a per-request resource (the web layers' keys, the
    /// idempotency layer's, or a lock taken with
    /// [`LockOptions::fence_retention`](crate::LockOptions::fence_retention))
    /// expires a bounded time after its last fence: see
    /// [`LockOptions::fence_retention`](crate::LockOptions::fence_retention)
    /// for the rule and why it is sound.
    Durable,
    /// `T = max(counter, TIME in µs) + 1`, from the nodes' own clocks (never the
    /// client's). Monotone without persistence if a restarted node stays down
    /// longer than the clock skew between the nodes, and no node's wall clock
    /// ever steps backwards (an NTP step, a manual `date`): a backward step can
    /// hand out a smaller token after a restart. Tokens are then microsecond
    /// timestamps, not small integers. The counters expire once idle for
    /// [`RedlockBuilder::fence_counter_ttl`](crate::RedlockBuilder::fence_counter_ttl),
    /// which the same clock rule makes safe (see there).
    Hybrid,
}

/// A fencing token: a number that grows from each holder of a resource to the
/// next. Hand it to the protected resource with every write, and let the
/// resource refuse a write whose token is smaller than the last it accepted
/// (see [`crate::fence`]).
///
/// ```
/// use redlock_core::FencingToken;
///
/// let (a, b) = (FencingToken::new(41), FencingToken::new(42));
/// assert!(a < b);
/// assert_eq!(b.to_string(), "42");
/// assert_eq!(b.get(), 42);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token with this value: for the store side, which receives the number
    /// over the wire. Only a lock hands out tokens with the ordering promise.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

/// Whether a node keeps fencing tokens monotone in the handle's
/// [`FencingMode`], as [`Redlock::check_nodes`](crate::Redlock::check_nodes) judged from its persistence
/// settings (`INFO persistence`, `CONFIG GET appendfsync`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingCheck {
    /// The node writes every counter to its append-only file and fsyncs it
    /// before answering (`appendonly yes`, `appendfsync always`): its counters
    /// survive a crash. Sound in both modes.
    Durable,
    /// [`FencingMode::Hybrid`] on a node that may lose its counters: sound only
    /// if a restarted node stays down longer than the clock skew between the
    /// nodes and no node's clock steps backwards.
    ClockBound {
        /// What the node may lose, and why.
        reason: String,
    },
    /// [`FencingMode::Durable`] on a node that may lose its counters: a
    /// restart can make tokens repeat or go backwards.
    Unsound {
        /// What the node may lose, and why.
        reason: String,
    },
    /// The persistence settings could not be read (the node is down, or `INFO`
    /// / `CONFIG` is refused to this user).
    Unknown {
        /// Why they could not be read.
        reason: String,
    },
}

impl FencingCheck {
    /// Whether the mode is sound on the node: [`Durable`](Self::Durable), or
    /// [`ClockBound`](Self::ClockBound) under the assumptions it names.
    pub fn is_sound(&self) -> bool {
        matches!(self, Self::Durable | Self::ClockBound { .. })
    }
}

/// What a fenced acquire read on one node that said OK: its counter for the key
/// and its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceRead {
    pub(crate) counter: u64,
    pub(crate) time_us: u64,
}

/// The counter key of lock key `key`: the byte `0xFF`, `fence:`, then the
/// key's tag (`{tag}`, see `slots`); of a permit slot's key, the slot's key
/// (each slot counts its own holders).
///
/// `0xFF` never occurs in UTF-8, and every key this library locks is a Rust
/// string, so no lock key can ever be a counter key, whatever the resource
/// names. A [`FencingMode::Durable`] counter of a named resource has no
/// expiry: it must outlive every holder; one of a per-request resource
/// expires after [`retained_counter_ttl`]. A [`FencingMode::Hybrid`] counter
/// expires after [`counter_ttl`] without a fence (see there why that is
/// safe).
pub(crate) fn fence_key(key: &str) -> Vec<u8> {
    const PREFIX: &[u8] = b"\xfffence:";
    let key = crate::slots::braced(key);
    let mut k = Vec::with_capacity(PREFIX.len() + key.len());
    k.extend_from_slice(PREFIX);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The smallest [`RedlockBuilder::fence_counter_ttl`](crate::RedlockBuilder::fence_counter_ttl)
/// a handle accepts: one hour.
pub(crate) const MIN_FENCE_COUNTER_TTL: Duration = Duration::from_secs(3600);

/// The default [`RedlockBuilder::fence_counter_ttl`](crate::RedlockBuilder::fence_counter_ttl):
/// one day.
pub(crate) const DEFAULT_FENCE_COUNTER_TTL: Duration = Duration::from_secs(24 * 3600);

/// The retention of a per-request lock's [`FencingMode::Durable`] counter
/// when its policy names none: one day (see
/// [`LockOptions::fence_retention`](crate::LockOptions::fence_retention)).
#[cfg(feature = "http")]
pub(crate) const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long a lock with a retained [`FencingMode::Durable`] counter is held
/// at most when its options set no `max_hold`: one hour. The counter's
/// expiry must cover the hold, so the hold needs a bound.
pub(crate) const RETAINED_HOLD_CAP: Duration = Duration::from_secs(3600);

/// Past a century `PX` would overflow the node's clock arithmetic.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The expiry a fence gives a retained [`FencingMode::Durable`] counter: the
/// hold cap `hold`, the lock's `ttl` and the retention `keep` together
/// (`span`), plus `span / 100` and one second, at most a century.
///
/// Why that is sound. The lock's keys are gone from every node by
/// `hold + ttl` after its fence (the guard stops renewing at `hold`, and no
/// renewal sets more than `ttl`), so a write the nodes guard by the lock
/// key (the idempotency record's) is made by then, and a store that keeps
/// what it accepted for `keep` holds no token of this fence past
/// `hold + ttl + keep`. Each fence sets the expiry anew on the fence
/// quorum, so when the counter is gone on a node of a later acquire's
/// quorum, the last fence that could have raised it there was longer ago
/// than that: no token of the counter can still be compared, and a new one
/// that starts lower is harmless. The hundredth and the second cover the
/// nodes' clocks running at slightly different rates (the record expires by
/// one node's clock, the counter by another's) and the time a renewal's
/// `PEXPIRE` spends on the way; a node whose wall clock steps forward by
/// more expires its counters early, which is the one clock assumption a
/// per-request counter adds to the mode.
pub(crate) fn retained_counter_ttl(hold: Duration, ttl: Duration, keep: Duration) -> Duration {
    let span = hold.saturating_add(ttl).saturating_add(keep);
    span.saturating_add(span / 100)
        .saturating_add(Duration::from_secs(1))
        .min(CENTURY)
}

/// The expiry a fence gives the counter of a lock of `lock_ttl`, or `None`
/// for a counter that never expires ([`FencingMode::Durable`] without
/// `retained`). `retained` is the expiry of a per-request resource's
/// [`FencingMode::Durable`] counter ([`retained_counter_ttl`]); a
/// [`FencingMode::Hybrid`] counter keeps its own rule, already bounded.
///
/// Why a [`FencingMode::Hybrid`] counter may expire. Every token is
/// `max(counters, TIME) + 1` over the nodes read, and at least a
/// microsecond passes between an acquire's reads and its fence (assumption
/// of the mode, see the model check). So, by induction over holders, a
/// counter written at instant `w` of node X's clock holds at most
/// `w + skew`, where `skew` bounds how far any node's clock runs ahead of
/// X's. The counter expires once X's clock reads `w' + ttl`, `w'` its last
/// fence (`w' ≥ w`); X's `TIME` is then past `w + ttl`, and every later
/// token read on X is larger than every token the counter ever held as soon
/// as `ttl ≥ skew`. Expiry thus costs no more than the empty restart the
/// mode already allows after `skew`, and is judged by the same clock that
/// `TIME` reads (a forward step expires keys early but moves `TIME` as far).
///
/// The floor is far above that bound: at least [`MIN_FENCE_COUNTER_TTL`]
/// (an hour, where NTP keeps servers within milliseconds and the mode
/// already assumes no backward step), and at least `lock_ttl` plus that
/// hour, so that a counter never expires under a holder that was fenced
/// with it, and the token order then rests on the counters, not on the
/// clocks, as long as a resource is in use.
pub(crate) fn counter_ttl(
    mode: FencingMode,
    configured: Duration,
    lock_ttl: Duration,
    retained: Option<Duration>,
) -> Option<Duration> {
    match mode {
        FencingMode::Durable => retained.map(|r| r.min(CENTURY)),
        FencingMode::Hybrid => Some(
            configured
                .max(MIN_FENCE_COUNTER_TTL)
                .max(lock_ttl.saturating_add(MIN_FENCE_COUNTER_TTL))
                .min(CENTURY),
        ),
    }
}

/// Fencing step 2: the token for an attempt whose quorum read `reads`, one
/// per node that said OK. `max + 1` over the counters ([`FencingMode::Durable`]),
/// or over counters and clocks ([`FencingMode::Hybrid`]). `None` with no reads.
/// Cannot overflow: the reads are below `u64::MAX` (see `parse_acquire`).
pub(crate) fn pick_token(
    mode: FencingMode,
    reads: impl IntoIterator<Item = FenceRead>,
) -> Option<FencingToken> {
    reads
        .into_iter()
        .map(|r| match mode {
            FencingMode::Durable => r.counter,
            FencingMode::Hybrid => r.counter.max(r.time_us),
        })
        .max()
        .and_then(|m| m.checked_add(1))
        .map(FencingToken)
}

/// Judges a node's persistence for `mode`: `aof` from `INFO persistence`
/// (`aof_enabled`), `fsync` from `CONFIG GET appendfsync`.
pub(crate) fn check_persistence(
    mode: FencingMode,
    aof: Option<bool>,
    fsync: Option<&str>,
) -> FencingCheck {
    let lost = match (aof, fsync) {
        (Some(true), Some(f)) if f.eq_ignore_ascii_case("always") => return FencingCheck::Durable,
        (Some(false), _) => {
            "appendonly is off: a restart empties the node's fence counters".to_owned()
        }
        (Some(true), Some(f)) => format!(
            "appendfsync is {f}, not always: an OS crash or power loss can drop counter writes \
             the node acknowledged"
        ),
        (None, _) => {
            return FencingCheck::Unknown {
                reason: "INFO persistence did not say whether appendonly is on".into(),
            };
        }
        (Some(true), None) => {
            return FencingCheck::Unknown {
                reason: "CONFIG GET appendfsync was refused or empty".into(),
            };
        }
    };
    match mode {
        FencingMode::Durable => FencingCheck::Unsound { reason: lost },
        FencingMode::Hybrid => FencingCheck::ClockBound { reason: lost },
    }
}

/// A node error that names a bad fence read.
pub(crate) fn bad_read(what: &str, v: &redis::Value) -> NodeError {
    NodeError::Protocol(format!("fenced acquire: {what} reply {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(counter: u64, time_us: u64) -> FenceRead {
        FenceRead { counter, time_us }
    }

    #[test]
    fn token_is_one_past_the_largest_read() {
        let reads = [read(5, 100), read(7, 90), read(6, 200)];
        assert_eq!(
            pick_token(FencingMode::Durable, reads),
            Some(FencingToken(8))
        );
        assert_eq!(
            pick_token(FencingMode::Hybrid, reads),
            Some(FencingToken(201))
        );
        assert_eq!(pick_token(FencingMode::Durable, []), None);
    }

    #[test]
    fn hybrid_counters_expire_after_the_floor_durable_ones_never() {
        let h = Duration::from_secs(3600);
        let ms = Duration::from_millis;
        assert_eq!(counter_ttl(FencingMode::Durable, h, ms(5), None), None);
        assert_eq!(
            counter_ttl(
                FencingMode::Hybrid,
                DEFAULT_FENCE_COUNTER_TTL,
                ms(5000),
                None
            ),
            Some(DEFAULT_FENCE_COUNTER_TTL)
        );
        assert_eq!(
            counter_ttl(FencingMode::Hybrid, ms(1), ms(5000), None),
            Some(h + ms(5000))
        );
        assert_eq!(
            counter_ttl(FencingMode::Hybrid, h, 3 * h, Some(ms(1))),
            Some(4 * h),
            "a lock's own TTL plus the hour"
        );
        let century = counter_ttl(FencingMode::Hybrid, Duration::MAX, Duration::MAX, None).unwrap();
        assert!(century < Duration::from_secs(u64::MAX / 1000 / 1000));
    }

    #[test]
    fn retained_durable_counters_cover_hold_ttl_and_retention() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let r = retained_counter_ttl(s(2), s(1), s(1));
        assert_eq!(r, ms(5040), "4 s, its hundredth, and a second");
        assert_eq!(
            counter_ttl(FencingMode::Durable, s(3600), s(1), Some(r)),
            Some(r)
        );
        assert_eq!(
            counter_ttl(FencingMode::Durable, s(3600), s(1), Some(Duration::MAX)),
            Some(CENTURY)
        );
        assert_eq!(
            retained_counter_ttl(Duration::MAX, Duration::MAX, Duration::MAX),
            CENTURY
        );
    }

    #[test]
    fn counter_keys_cannot_be_lock_keys() {
        let k = fence_key("x:fence");
        assert_eq!(k[0], 0xff);
        assert!(std::str::from_utf8(&k).is_err());
        assert_ne!(fence_key("a"), fence_key("b"));
    }

    #[test]
    fn persistence_judged_per_mode() {
        use FencingMode::*;
        assert_eq!(
            check_persistence(Durable, Some(true), Some("always")),
            FencingCheck::Durable
        );
        assert!(matches!(
            check_persistence(Durable, Some(false), Some("always")),
            FencingCheck::Unsound { .. }
        ));
        assert!(matches!(
            check_persistence(Durable, Some(true), Some("everysec")),
            FencingCheck::Unsound { .. }
        ));
        assert!(matches!(
            check_persistence(Hybrid, Some(false), None),
            FencingCheck::ClockBound { .. }
        ));
        assert!(matches!(
            check_persistence(Hybrid, None, None),
            FencingCheck::Unknown { .. }
        ));
        assert!(check_persistence(Hybrid, Some(false), None).is_sound());
        assert!(!check_persistence(Durable, Some(false), None).is_sound());
    }
}
