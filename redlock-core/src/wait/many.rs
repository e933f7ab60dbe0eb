//! The waiting layer's part of a set of resources: the waiters flags of
//! every key, set by a round of their own before a subscribed waiter's
//! attempt (the all-or-none script cannot take them, or a user refused the
//! flags' keys could not lock), and the set's retrying acquire on the one
//! retry loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Waits;
use crate::error::{Error, NodeError};
use crate::keys::{Many, Named};
use crate::node::Call;
use crate::protocol::acquire::Ttl;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::settings::RetryPolicy;

impl Core {
    /// Spec step 4's retry for a set: a waiter hears the release of any of
    /// its keys, and sleeps until one is heard on enough of the nodes it
    /// found busy, or a fallback timer fires ([`Core::retry_loop`]).
    pub(crate) async fn wait_set(
        &self,
        many: &Arc<Many>,
        ttl: Ttl,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
    ) -> Result<Lock, Error> {
        let waits = Waits::set(&many.keys, ttl.key);
        self.retry_loop(waits, retry, latest_start, Vec::new(), |n, _| {
            self.attempt_many(many, ttl, n)
        })
        .await
    }

    /// Sets a deferring mutex waiter's flag of `key` on `nodes`, for `flag`,
    /// naming it as `named` if the flag named nobody or a less patient
    /// waiter (`Call::defer_flag`), and waits for the answers (at most a
    /// node timeout).
    pub(super) async fn set_defer_flags(
        &self,
        key: &str,
        flag: Duration,
        named: Named,
        nodes: Vec<usize>,
    ) {
        let flag_ms = u64::try_from(flag.as_millis()).unwrap_or(u64::MAX);
        let call = Arc::new(Call::defer_flag(key, &named.value(), flag_ms));
        let ignore = |_: redis::Value| -> Result<(), NodeError> { Ok(()) };
        let mut pending = self.fan_out(&call, ignore, nodes.into_iter());
        self.settle(&mut pending, |_| false).await;
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
