//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! The pure steps of the distlock page, with no I/O: the quorum, the token, the
//! validity, the retry delay, and the arithmetic around them. Each is one
//! function a reader can find, and each is unit-tested here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::error::Error;
use crate::settings::{RetryPolicy, Settings};

/// The quorum of `n` nodes: a strict majority, `n / 2 + 1`.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Spec step 3: the validity left to the holder, `ttl - elapsed - drift` with
/// `drift = ttl * drift_factor + fixed_drift`. `None` when nothing is left, which
/// fails the attempt.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, s: &Settings) -> Option<Duration> {
    // The keys live for whole milliseconds (`PX`/`PEXPIRE` take an integer): the
    // sub-millisecond rest of `ttl` is not on the nodes.
    let ttl = whole_millis(ttl);
    let drift = ttl.mul_f64(s.drift_factor).saturating_add(s.fixed_drift);
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// `start + d`, for a `d` that may be as large as `Duration::MAX` (a TTL bound
/// the user lifted): past what an `Instant` can hold it is a century, which is
/// "never" for a lock.
pub(crate) fn instant_after(start: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    start
        .checked_add(d)
        .or_else(|| start.checked_add(CENTURY))
        .unwrap_or(start)
}

/// `d` rounded down to whole milliseconds: what a key set with `PX`/`PEXPIRE`
/// of `d.as_millis()` actually lives.
pub(crate) fn whole_millis(d: Duration) -> Duration {
    Duration::new(d.as_secs(), d.subsec_millis() * 1_000_000)
}

/// Spec step 1: a fresh token of 128 bits from the OS CSPRNG, hex-encoded. A new
/// one for every attempt, so a late reply to an old attempt can never be taken for
/// the current one.
pub(crate) fn new_token() -> Result<Arc<str>, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    // Hex digits on the stack, so the token costs one allocation (the `Arc`).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 32];
    for (i, b) in bytes.into_iter().enumerate() {
        hex[2 * i] = DIGITS[usize::from(b >> 4)];
        hex[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    let hex = std::str::from_utf8(&hex).map_err(|e| Error::Random(e.to_string()))?;
    Ok(Arc::from(hex))
}

/// Spec step 5 ("retry after a random delay"): `delay + uniform(0..=jitter)`.
pub(crate) fn retry_delay(policy: &RetryPolicy) -> Duration {
    let jitter_us = u64::try_from(policy.jitter.as_micros()).unwrap_or(u64::MAX);
    let extra = if jitter_us == 0 {
        0
    } else {
        rand::rng().random_range(0..=jitter_us)
    };
    policy.delay.saturating_add(Duration::from_micros(extra))
}

/// Spec step 5's bound on retrying: whether an attempt may follow attempt
/// number `attempt` at `now`, given the policy's attempt count and the latest
/// instant an attempt may start (the deadline less one acquire round, the
/// fence round of a fencing lock, and one release round).
pub(crate) fn may_retry(
    attempt: u32,
    policy: &RetryPolicy,
    latest_start: Option<Instant>,
    now: Instant,
) -> bool {
    attempt < policy.max_attempts && latest_start.is_none_or(|latest| now < latest)
}

/// When a quorum could be free: the nodes not held by others are free at once, so
/// `busy - (n - quorum)` holders' keys (at least one) must expire first; the wait
/// is that many-th smallest PTTL. `None` when keys without expiry are in the way.
pub(crate) fn busy_retry_after(
    pttls: &mut [Duration],
    busy: usize,
    n: usize,
    quorum: usize,
) -> Option<Duration> {
    let needed = busy.saturating_sub(n - quorum).max(1);
    pttls.sort_unstable();
    pttls.get(needed - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stop_at_the_count_or_the_latest_start() {
        let now = Instant::now();
        let three = RetryPolicy::attempts(3);
        assert!(may_retry(1, &three, None, now));
        assert!(may_retry(2, &three, None, now));
        assert!(!may_retry(3, &three, None, now));
        let later = now + Duration::from_millis(5);
        assert!(may_retry(1, &three, Some(later), now));
        assert!(!may_retry(1, &three, Some(now), now));
        assert!(!may_retry(1, &RetryPolicy::no_retry(), Some(later), now));
    }

    #[test]
    fn quorum_is_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let s = Settings::default();
        let ttl = Duration::from_millis(1000);
        // 1000 - 100 - (10 + 2) = 888
        assert_eq!(
            validity(ttl, Duration::from_millis(100), &s),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(ttl, Duration::from_millis(988), &s), None);
        assert_eq!(validity(ttl, Duration::from_millis(2000), &s), None);
        assert_eq!(
            validity(ttl, Duration::from_millis(987), &s),
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn tokens_are_128_bit_and_fresh() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn retry_delay_stays_in_bounds_and_varies() {
        let p = RetryPolicy::attempts(3)
            .with_delay(Duration::from_millis(50))
            .with_jitter(Duration::from_millis(50));
        let delays: Vec<Duration> = (0..200).map(|_| retry_delay(&p)).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(50) && *d <= Duration::from_millis(100))
        );
        assert!(
            delays.iter().any(|d| *d != delays[0]),
            "jitter must vary the delay"
        );
    }

    #[test]
    fn busy_retry_after_waits_for_enough_holders() {
        let ms = Duration::from_millis;
        // 5 nodes all held by others: 3 keys must expire.
        assert_eq!(
            busy_retry_after(&mut [ms(500), ms(100), ms(300), ms(400), ms(200)], 5, 5, 3),
            Some(ms(300))
        );
        // 3 of 5 held, 2 free: one expiry is enough.
        assert_eq!(
            busy_retry_after(&mut [ms(500), ms(100), ms(300)], 3, 5, 3),
            Some(ms(100))
        );
        // 3 nodes (2 s, 8 s, free): the 2 s key frees a quorum.
        assert_eq!(
            busy_retry_after(&mut [ms(8000), ms(2000)], 2, 3, 2),
            Some(ms(2000))
        );
        assert_eq!(busy_retry_after(&mut [], 3, 5, 3), None);
    }
}
