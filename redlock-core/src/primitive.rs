//! *Layer 4, beside the mutex (see `lib.rs`).*
//!
//! What the primitives beside the mutex (the semaphore's permits,
//! `semaphore/`, and the read/write lock's shares, `rwlock/`) share around
//! their retrying acquire: the metrics of a call (the mutex's, and the
//! primitive's own gauges of holders and waiters).

use std::future::Future;
use std::time::Instant;

use crate::error::Error;
use crate::metrics::{self, Gauged, Of};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Redlock;
use crate::settings::RetryPolicy;

impl Redlock {
    /// A retrying acquire of `resource` (`acquire`, retrying per `retry`), counted
    /// as the mutex's `lock_with` counts its calls, and in `of`'s gauges: a
    /// waiter while it may retry, a holder from its success until the lock
    /// is released or dropped. The `key` label only with the application's
    /// mapping (`metrics_key_label`), of the resource's lock key.
    pub(crate) async fn counted<Fut>(
        &self,
        resource: &str,
        of: Of,
        retry: &RetryPolicy,
        acquire: Fut,
    ) -> Result<Lock, Error>
    where
        Fut: Future<Output = Result<Lock, Error>>,
    {
        let begin = Instant::now();
        let key = self
            .inner
            .settings
            .metrics_key
            .as_ref()
            .and_then(|_| self.metrics_key(&self.key_for(resource)));
        let waiting =
            (retry.max_attempts > 1).then(|| (metrics::Waiting::start(), Gauged::waiting(of, key)));
        let mut result = acquire.await;
        let outcome = metrics::acquire_outcome(&result);
        metrics::acquired(key, outcome, begin.elapsed(), waiting.is_some());
        if let Ok(lock) = result.as_mut() {
            lock.gauged = Some(Gauged::held(of, key));
        }
        result
    }
}
