//! Spec step 4's retry by wake-up for a permit or a share (`semaphore/`,
//! `rwlock/`): attempts that are not the mutex's `SET`, on keys derived from
//! the resource's lock key (a permit slot, a reader's key).
//!
//! Every such key announces its release on its resource's channel and clears
//! its resource's waiters flag (`slots`: its tag is its resource's), and so do
//! a writer's key (the lock key itself) and a writer's intent. So a waiter
//! subscribes to the resource's one channel and, while subscribed, sets the
//! resource's one flag on every node before each attempt (answered before
//! the attempt starts, as a set of resources does in `many.rs`): a release
//! of any slot, any reader or the writer that runs on a node after the
//! waiter's refused attempt there finds the flag, or a release in between
//! found it and was heard. No local queue: several local holders are the
//! point, so a release wakes every waiter, and each waits a random part of
//! its policy's jitter before it tries. A wake-up only starts the next
//! attempt; the attempt decides.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::{fallback, flag_ttl};
use crate::error::Error;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::may_retry;
use crate::settings::RetryPolicy;
use crate::wake::{Found, Subscription};

impl Core {
    /// Attempts (`attempt_once(n, flag)` for the n-th) until one wins or
    /// `retry` gives up: woken by releases of `key`'s resource when wake-ups
    /// are on and the policy retries, else by polling. `ttl` is the TTL one
    /// attempt asks for (the waiters flag outlives it). With `inline`, a
    /// subscribed waiter's attempt gets the flag's TTL and sets the flag in
    /// its own round trip on each node before it asks (a permit slot's
    /// `Call::waiting_acquire`); else the flag is set here, answered, before
    /// the attempt (one round trip more: the read/write scripts take none).
    pub(crate) async fn retry_attempts<F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        inline: bool,
        mut attempt_once: F,
    ) -> Result<Lock, Error>
    where
        F: FnMut(u32, Option<Duration>) -> Fut,
        Fut: Future<Output = Result<Lock, Error>>,
    {
        if retry.max_attempts <= 1 || !self.inner.waiting.enabled() {
            return self
                .poll_attempts(retry, latest_start, |n| attempt_once(n, None))
                .await;
        }
        let flag_keys: [Arc<str>; 1] = [key.into()];
        let node_timeout = self.inner.settings.node_timeout;
        let mut subscription: Option<Subscription<'_>> = None;
        let mut subscribed = false;
        let mut attempt = 1;
        loop {
            let mut flag = None;
            if let Some(s) = subscription.as_mut() {
                s.mark_seen();
                let ttl = flag_ttl(ttl, retry, node_timeout, Instant::now(), latest_start);
                if inline {
                    flag = Some(ttl);
                } else {
                    self.set_waiters_flags(&flag_keys, ttl).await;
                }
            }
            let err = match attempt_once(attempt, flag).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            let now = Instant::now();
            if !may_retry(attempt, retry, latest_start, now) {
                return Err(err);
            }
            attempt += 1;
            if !subscribed {
                // Subscribed on every node (or out of patience) before the
                // next attempt, so a release that lands between the failed
                // attempt and the subscription is seen by that attempt.
                subscribed = true;
                subscription = self.inner.waiting.subscribe(key);
                if let Some(s) = subscription.as_mut() {
                    let limit = latest_start.map_or(node_timeout, |l| {
                        l.saturating_duration_since(now).min(node_timeout)
                    });
                    s.ready(limit).await;
                    continue;
                }
            }
            let Some(wake) = fallback(&err, now, retry, latest_start) else {
                return Err(err);
            };
            let found = Found::from_report(err.report());
            let released = async {
                match subscription.as_mut() {
                    Some(s) => s.woken(&found).await,
                    None => std::future::pending().await,
                }
            };
            let woken = tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => false,
                () = released => true,
            };
            if woken && !retry.jitter.is_zero() {
                // A freed permit or share wakes every waiter of the resource
                // at once (no local queue here): the policy's jitter spreads
                // their attempts, as it spreads polls.
                let spread = rand::rng().random_range(Duration::ZERO..=retry.jitter);
                if let Some(until) = Instant::now().checked_add(spread) {
                    let until = latest_start.map_or(until, |l| until.min(l));
                    tokio::time::sleep_until(until.into()).await;
                }
            }
        }
    }
}
