//! *Layer 4, waiting (see `lib.rs`).*
//!
//! Spec step 4's "retry", by wake-up instead of polling: a waiter queues
//! behind the other waiters of its process for the key (`queue/`); at the
//! head it contends on the nodes, and between attempts it sleeps until
//! releases heard on the nodes it found busy may have freed a quorum
//! (`wake/`), with fallback timers for what no message announces:
//!
//! - the holder's remaining PTTL from the busy answer (an expiry publishes
//!   nothing);
//! - the retry policy's delay, as a safety-net poll (pub/sub is at-most-once);
//! - a node's subscription lost or regained (its messages may be lost);
//! - a release in this process by a holder that did not queue (`try_acquire`).
//!
//! The retry policy keeps its meaning: every attempt counts against
//! `max_attempts`, and the deadline bounds the whole wait, queue included.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::error::Error;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::{may_retry, retry_delay};
use crate::queue::Place;
use crate::settings::RetryPolicy;
use crate::wake::{Found, Subscription};

mod many;
mod shared;

impl Core {
    /// The mutex's acquire (`Redlock::lock_with_retained`) for a policy that retries, when wake-ups are on.
    /// `latest_start` is when the last attempt must start by (the deadline
    /// less one acquire round, the fence round of a fencing lock, and one
    /// release round).
    pub(crate) async fn lock_by_wake_up(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: crate::protocol::acquire::Ttl,
        retry: &RetryPolicy,
        begin: Instant,
        latest_start: Option<Instant>,
    ) -> Result<Lock, Error> {
        let waiting = &self.inner.waiting;
        let place = Place::join(&waiting.queues, key);
        // An attempts-only policy gets, in the queue, the time its attempts
        // would have taken by polling.
        let turn_by = latest_start.or_else(|| begin.checked_add(turn_budget(retry)));
        let mut subscription: Option<Subscription<'_>> = None;
        if place.turn().now_or_never().is_none() {
            // Behind other local waiters: the key is contended, so subscribe
            // now, and the subscription is ready when the turn comes. Every
            // queued waiter holds it, so it lives from one local holder to
            // the next instead of being dropped and made again at each turn.
            subscription = waiting.subscribe(key);
            if !wait_turn(&place, turn_by, retry).await {
                drop((subscription, place));
                // Out of time behind other local waiters: one attempt of its
                // own, so that the error says who holds the lock and for how
                // long.
                return self.attempt(resource, key, ttl, 1).await;
            }
        }
        let mut attempt = 1;
        // Whether the subscription has been waited for once: a node that
        // confirms later (or never: paused, down) wakes the waiter then.
        let mut readied = false;
        loop {
            place.clear_kick();
            // Whether a release from here on is sure to be heard: every node
            // that can has confirmed the subscription.
            let covered = subscription.as_mut().is_some_and(|s| {
                s.mark_seen();
                readied || s.confirmed()
            });
            // Subscribed: the attempt leaves the waiters flag on the nodes
            // first, so that a release after it announces itself.
            let flag = subscription.as_ref().map(|_| {
                let node_timeout = self.inner.settings.node_timeout;
                flag_ttl(ttl.key, retry, node_timeout, Instant::now(), latest_start)
            });
            let err = match self
                .attempt_flagged(resource, key, ttl, attempt, flag)
                .await
            {
                Ok(lock) => {
                    place.hold(lock.shared_token(), lock.valid_until());
                    return Ok(lock);
                }
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            let now = Instant::now();
            if !may_retry(attempt, retry, latest_start, now) {
                return Err(err);
            }
            attempt += 1;
            if !covered {
                if subscription.is_none() {
                    subscription = waiting.subscribe(key);
                }
                if let Some(s) = subscription.as_mut() {
                    // Subscribed on every node before the next attempt, so a
                    // release that lands between the failed attempt and the
                    // subscription is seen by that attempt. Not past the
                    // last moment for an attempt.
                    let limit = latest_start.map_or(self.inner.settings.node_timeout, |l| {
                        l.saturating_duration_since(now)
                            .min(self.inner.settings.node_timeout)
                    });
                    s.ready(limit).await;
                    readied = true;
                    continue;
                }
            }
            let Some(wake) = fallback(&err, now, retry, latest_start) else {
                // A delay past the end of time and nothing else to wait for.
                return Err(err);
            };
            let found = Found::from_report(err.report());
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {}
                () = woken(&mut subscription, &found) => {}
                () = place.kicked() => {}
            }
        }
    }
}

/// When a waiter whose attempt failed with `err` at `now` tries again if no
/// release wakes it first: the safety-net poll, the holder's expiry (an expiry
/// publishes nothing), or the last moment for an attempt. `None` if none of
/// them is within the end of time.
pub(crate) fn fallback(
    err: &Error,
    now: Instant,
    retry: &RetryPolicy,
    latest_start: Option<Instant>,
) -> Option<Instant> {
    let poll = now.checked_add(retry_delay(retry));
    // Keys live whole milliseconds; one more and the key is gone.
    let expiry = match err {
        Error::Busy {
            retry_after: Some(d),
            ..
        } => now.checked_add(d.saturating_add(Duration::from_millis(1))),
        _ => None,
    };
    [poll, expiry, latest_start].into_iter().flatten().min()
}

/// How long a waiter's flag lives from an attempt at `now`: as long as the
/// waiter may still wait (until `latest_start`, its last attempt, or without
/// a deadline every delay of its policy at its longest), and at least its
/// longest poll delay, plus a TTL, a few node timeouts and a second; at most
/// a day. Not just until its next attempt: an attempt that does not reach a
/// node (down, timed out) does not set the flag there again, and a release
/// there must still announce itself to this waiter. A flag left by a waiter
/// that gave up costs the next release one `PUBLISH`.
pub(crate) fn flag_ttl(
    ttl: Duration,
    retry: &RetryPolicy,
    node_timeout: Duration,
    now: Instant,
    latest_start: Option<Instant>,
) -> Duration {
    const MAX_FLAG_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    let wait = match latest_start {
        Some(last) => last.saturating_duration_since(now),
        None => turn_budget(retry),
    };
    wait.max(retry.delay.saturating_add(retry.jitter))
        .saturating_add(ttl)
        .saturating_add(node_timeout.saturating_mul(3))
        .saturating_add(Duration::from_secs(1))
        .min(MAX_FLAG_TTL)
}

/// The time an attempts-only policy would have spent polling: every delay at
/// its longest.
fn turn_budget(retry: &RetryPolicy) -> Duration {
    retry
        .delay
        .saturating_add(retry.jitter)
        .saturating_mul(retry.max_attempts.saturating_sub(1))
}

async fn woken(subscription: &mut Option<Subscription<'_>>, found: &Found) {
    match subscription {
        Some(s) => s.woken(found).await,
        None => std::future::pending().await,
    }
}

/// Waits for the waiter's turn until `by`. Returns whether it got it. A local
/// holder that keeps its turn past its validity without releasing loses it
/// here, so a lost release can delay the queue by one validity at most.
async fn wait_turn(place: &Place<'_>, by: Option<Instant>, retry: &RetryPolicy) -> bool {
    loop {
        let holder = place.holder();
        // The holder may change while this waiter sleeps without a wake-up
        // for it (the turn went to another waiter that then took the lock):
        // look again now and then. No network in this loop.
        let recheck = Instant::now().checked_add(
            retry_delay(retry).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        );
        let timer = [holder.as_ref().map(|h| h.1), by, recheck]
            .into_iter()
            .flatten()
            .min();
        let sleep = async {
            match timer {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = place.turn() => return true,
            () = sleep => {}
        }
        let now = Instant::now();
        if let Some((token, until)) = holder
            && now >= until
        {
            place.expire(&token);
        }
        if by.is_some_and(|by| now >= by) {
            // One last look: the turn may have come with the deadline.
            return place.turn().now_or_never().is_some();
        }
    }
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// The flag outlives the whole wait, not just the next poll: a deadline
    /// 30 s away keeps it past 30 s even with a 1 s delay.
    #[test]
    fn a_flag_lives_as_long_as_its_waiter_may_wait() {
        let now = Instant::now();
        let retry = RetryPolicy::deadline(S * 30).with_delay(S);
        let ttl = flag_ttl(S * 5, &retry, S / 10, now, Some(now + S * 29));
        assert!(ttl >= S * 29 + S * 5, "{ttl:?}");
        // Past the last attempt: the poll delay and the TTL remain.
        let ttl = flag_ttl(S * 5, &retry, S / 10, now + S * 40, Some(now + S * 29));
        assert!(ttl >= S * 5 && ttl < S * 29, "{ttl:?}");
        // Without a deadline: every delay of its attempts.
        let retry = RetryPolicy::attempts(11).with_delay(S);
        let ttl = flag_ttl(S, &retry, S / 10, now, None);
        assert!(ttl >= S * 10, "{ttl:?}");
        // Nothing past a day, whatever the inputs.
        let retry = RetryPolicy::deadline(Duration::MAX).with_delay(Duration::MAX);
        let ttl = flag_ttl(Duration::MAX, &retry, Duration::MAX, now, None);
        assert_eq!(ttl, S * 24 * 60 * 60);
    }
}
