//! *Layer 4, beside the mutex (see `lib.rs`).*
//!
//! What the primitives beside the mutex share (the semaphore's permits,
//! `semaphore/`, and the read/write lock's shares, `rwlock/`): each gives
//! only its retrying acquire ([`Acquire`]), and gets here that acquire
//! counted in the metrics (the mutex's, and the primitive's own gauges of
//! holders and waiters). The verbs (`try_acquire`, `guard`, `run`) are the
//! primitive value's (`primitive/`). The mutex keeps its own acquire: it
//! takes its queue, and its metrics have no gauge of their own.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::metrics::{self, Gauged, Of};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::settings::RetryPolicy;

/// A primitive's retrying acquire: attempts until one wins or `retry` gives
/// up, with the primitive's own checks.
pub(crate) trait Acquire {
    /// Which gauges count its holders and waiters.
    fn of(&self) -> Of;

    /// Takes it on `resource` for `ttl`, retrying per `retry`; a fenced
    /// key's Durable counter expires after `retained` when set (a guard's
    /// `fence_retention`, see `LockOptions::retained_counter_ttl`).
    fn acquire(
        &self,
        redlock: &Core,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> impl Future<Output = Result<Lock, Error>> + Send;
}

impl Core {
    /// `*_with`: `what`'s retrying acquire of `resource`, counted as the
    /// mutex's acquire counts its calls, and in `what`'s gauges: a waiter
    /// while it may retry, a holder from its success until the lock is
    /// released or dropped. The `key` label only with the application's
    /// mapping (`metrics_key_label`), of the resource's lock key.
    pub(crate) async fn acquire_with<P: Acquire>(
        &self,
        what: &P,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> Result<Lock, Error> {
        let begin = Instant::now();
        let of = what.of();
        let key = self
            .inner
            .settings
            .metrics_key
            .as_ref()
            .and_then(|_| self.metrics_key(&self.key_for(resource)));
        let waiting =
            (retry.max_attempts > 1).then(|| (metrics::Waiting::start(), Gauged::waiting(of, key)));
        let mut result = what.acquire(self, resource, ttl, retry, retained).await;
        let outcome = metrics::acquire_outcome(&result);
        metrics::acquired(key, outcome, begin.elapsed(), waiting.is_some());
        if let Ok(lock) = result.as_mut() {
            lock.gauged = Some(Gauged::held(of, key));
        }
        result
    }
}
