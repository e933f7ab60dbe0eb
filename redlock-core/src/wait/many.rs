//! Spec step 4's retry by wake-up for a set of resources (the waiting
//! layer): the waiter subscribes to every key's release channel and sleeps
//! until a release of any key may have freed a quorum, or a fallback timer
//! fires.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, select_all};

use super::{fallback, flag_ttl};
use crate::error::{Error, NodeError};
use crate::keys::Many;
use crate::node::Call;
use crate::protocol::acquire::Ttl;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::may_retry;
use crate::settings::RetryPolicy;
use crate::wake::{Found, Subscription};

impl Core {
    /// Spec step 4's retry for a set, by wake-up: after a failed attempt the
    /// waiter subscribes to every key's release channel, tries once more (a
    /// release between the two is not missed), then sleeps until a release
    /// of any key is heard on enough of the nodes it found busy, or a
    /// fallback timer (the holder's expiry, the policy's delay) fires.
    pub(crate) async fn lock_many_by_wake_up(
        &self,
        many: &Arc<Many>,
        ttl: Ttl,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
    ) -> Result<Lock, Error> {
        let waiting = &self.inner.waiting;
        let mut subscriptions: Option<Vec<Subscription<'_>>> = None;
        let mut attempt = 1;
        loop {
            for s in subscriptions.iter_mut().flatten() {
                s.mark_seen();
            }
            if subscriptions.is_some() {
                // Subscribed: the keys' waiters flags first, answered before
                // the attempt, so that a release after it announces itself
                // (one round trip more per attempt of a waiting set: the
                // all-or-none script cannot take them, or a user refused
                // the flags' keys could not lock).
                let node_timeout = self.inner.settings.node_timeout;
                let flag = flag_ttl(ttl.key, retry, node_timeout, Instant::now(), latest_start);
                self.set_waiters_flags(&many.keys, flag).await;
            }
            let err = match self.attempt_many(many, ttl, attempt).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            let now = Instant::now();
            if !may_retry(attempt, retry, latest_start, now) {
                return Err(err);
            }
            attempt += 1;
            let Some(subs) = subscriptions.as_mut() else {
                let mut subs: Vec<Subscription<'_>> = many
                    .keys
                    .iter()
                    .filter_map(|k| waiting.subscribe(k))
                    .collect();
                let limit = latest_start.map_or(self.inner.settings.node_timeout, |l| {
                    l.saturating_duration_since(now)
                        .min(self.inner.settings.node_timeout)
                });
                join_all(subs.iter_mut().map(|s| s.ready(limit))).await;
                subscriptions = Some(subs);
                continue;
            };
            let Some(wake) = fallback(&err, now, retry, latest_start) else {
                return Err(err);
            };
            let found = Found::from_report(err.report());
            let any_release = async {
                if subs.is_empty() {
                    return std::future::pending().await;
                }
                select_all(subs.iter_mut().map(|s| Box::pin(s.woken(&found)))).await;
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {}
                () = any_release => {}
            }
        }
    }

    /// Sets the waiters flags of `keys` on every node, for `flag`, and
    /// waits for the answers (at most a node timeout). A node that refuses
    /// them or does not answer only loses the wake-up there.
    pub(super) async fn set_waiters_flags(&self, keys: &[Arc<str>], flag: Duration) {
        let flag_ms = u64::try_from(flag.as_millis()).unwrap_or(u64::MAX);
        let call = Arc::new(Call::waiters_flags(keys, flag_ms));
        let ignore = |_: redis::Value| -> Result<(), NodeError> { Ok(()) };
        let mut pending = self.fan_out(&call, ignore, 0..self.inner.nodes.len());
        self.settle(&mut pending, |_| false).await;
    }
}
