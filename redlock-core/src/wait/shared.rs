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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Waits;
use crate::error::{Error, Report};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::settings::RetryPolicy;

impl Core {
    /// Attempts (`attempt_once(n, flag)` for the n-th) until one wins or
    /// `retry` gives up, on the one retry loop ([`Core::retry_loop`]):
    /// woken by releases of `key`'s resource when wake-ups are on and the
    /// policy retries, else by polling. `ttl` is the TTL one attempt asks
    /// for (the waiters flag outlives it). With `inline`, a subscribed
    /// waiter's attempt gets the flag's TTL and sets the flag in its own
    /// round trip on each node before it asks (a permit slot's
    /// `Call::waiting_acquire`); else the flag is set, answered, before the
    /// attempt (one round trip more: the read/write scripts take none).
    pub(crate) async fn retry_attempts<F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        inline: bool,
        attempt_once: F,
    ) -> Result<Lock, Error>
    where
        F: FnMut(u32, Option<super::Flag>) -> Fut,
        Fut: Future<Output = Result<Lock, Error>>,
    {
        let keys: [Arc<str>; 1] = [key.into()];
        let waits = Waits::shared(&keys, ttl, inline);
        self.retry_loop(waits, retry, latest_start, Vec::new(), attempt_once)
            .await
    }

    /// [`Core::retry_attempts`] for a permit, whose attempt tries each slot
    /// and puts each try's report in `tries`: the waiter wakes on news that
    /// may free any slot it tried (its error names only one).
    pub(crate) async fn retry_slots<F, Fut>(
        &self,
        key: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        tries: &Mutex<Vec<Report>>,
        attempt_once: F,
    ) -> Result<Lock, Error>
    where
        F: FnMut(u32, Option<super::Flag>) -> Fut,
        Fut: Future<Output = Result<Lock, Error>>,
    {
        let keys: [Arc<str>; 1] = [key.into()];
        let waits = Waits::shared(&keys, ttl, true).with_tries(tries);
        self.retry_loop(waits, retry, latest_start, Vec::new(), attempt_once)
            .await
    }
}
