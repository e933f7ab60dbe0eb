//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! Spec steps 1 to 4, the acquire: a fresh token, `SET NX PX` on every node at
//! once, the quorum and validity check, the release of a failed attempt, and
//! retries after a random delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::error::{Error, NodeStatus, Report};
use crate::fencing::fence_key;
use crate::keys::Keys;
use crate::metrics;
use crate::node::{Call, parse_acquire};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::{busy_retry_after, new_token};
use crate::settings::RetryPolicy;

mod attempt;
mod fence;
mod many;
mod scripted;
use attempt::Attempt;
pub(crate) use scripted::Scripted;

/// An attempt's key TTL, and the expiry its fence gives a per-request
/// resource's Durable counter (`None`: a named resource's, or no such
/// counter; see `LockOptions::fence_retention`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ttl {
    pub(crate) key: Duration,
    pub(crate) retained: Option<Duration>,
}

impl Ttl {
    pub(crate) fn new(key: Duration, retained: Option<Duration>) -> Self {
        Self { key, retained }
    }
}

impl Core {
    /// The mutex's retrying acquire, counted in the metrics
    /// ([`Primitive::acquire_with`](crate::Primitive::acquire_with));
    /// `retained` is the expiry a fence gives a
    /// per-request resource's Durable counter (`None`: a named resource,
    /// see `LockOptions::fence_retention`).
    pub(crate) async fn lock_with_retained(
        &self,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> Result<Lock, Error> {
        let begin = Instant::now();
        let waiting = (retry.max_attempts > 1).then(metrics::Waiting::start);
        let result = self.lock_with_retries(resource, ttl, retry, retained).await;
        let key = self
            .inner
            .settings
            .metrics_key
            .as_ref()
            .and_then(|_| self.metrics_key(&self.key_for(resource)));
        let outcome = metrics::acquire_outcome(&result);
        metrics::acquired(key, outcome, begin.elapsed(), waiting.is_some());
        result
    }

    /// [`Redlock::lock_with_retained`] without its metrics: the checks, then attempts
    /// until one wins or the policy gives up.
    async fn lock_with_retries(
        &self,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> Result<Lock, Error> {
        self.check_resource(resource)?;
        self.check_ttl(ttl)?;
        let resource: Arc<str> = resource.into();
        // Without a prefix the key is the resource: one allocation, not three.
        let key: Arc<str> = if crate::slots::is_plain(&self.inner.settings.key_prefix, &resource) {
            Arc::clone(&resource)
        } else {
            self.key_for(&resource).into()
        };
        let begin = Instant::now();
        let latest_start = self.latest_start(retry, begin);
        self.wait_mutex(
            &resource,
            &key,
            Ttl::new(ttl, retained),
            retry,
            begin,
            latest_start,
        )
        .await
    }

    /// The last moment an attempt may start for the retry's deadline: the
    /// last attempt must be able to finish inside it, with its acquire
    /// round, the fence round of a fencing lock, and, if it fails, the
    /// release round of the failed attempt; each bounded by the node
    /// timeout. A deadline past the end of time is no deadline.
    pub(crate) fn latest_start(&self, retry: &RetryPolicy, begin: Instant) -> Option<Instant> {
        let rounds = if self.inner.settings.fencing.is_some() {
            3
        } else {
            2
        };
        retry
            .deadline
            .and_then(|d| begin.checked_add(d))
            .map(|end| {
                end.checked_sub(self.inner.settings.node_timeout.saturating_mul(rounds))
                    .unwrap_or(begin)
            })
    }

    /// One acquire attempt: spec steps 1 to 4.
    pub(crate) async fn attempt(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: Ttl,
        attempt: u32,
    ) -> Result<Lock, Error> {
        self.attempt_flagged(resource, key, ttl, attempt, None)
            .await
    }

    /// [`Redlock::attempt`]; with `flag`, a waiter's, which first sets the
    /// key's waiters flag for that long on every node, with the waiter's
    /// name if it has one (see [`Call::waiting_acquire`]).
    pub(crate) async fn attempt_flagged(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: Ttl,
        attempt: u32,
        flag: Option<(Duration, Option<&str>)>,
    ) -> Result<Lock, Error> {
        let span = acquire_span(resource, attempt, ttl);
        self.attempt_steps(resource, key, ttl, flag)
            .instrument(span)
            .await
    }

    /// Spec steps 1 to 4 inside the attempt's span: a fresh token, the `SET`s
    /// sent to every node at once and settled at quorum, the validity judged
    /// (after the fence phase of a fencing lock), then the lock, or the release
    /// of the failed attempt.
    async fn attempt_steps(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: Ttl,
        flag: Option<(Duration, Option<&str>)>,
    ) -> Result<Lock, Error> {
        let token = new_token()?;
        let ttl_ms = ttl.key.as_millis();
        let fencing = self.inner.settings.fencing.map(|_| fence_key(key));
        let call = Arc::new(match (flag, &fencing) {
            (None, None) => Call::acquire(key, &token, ttl_ms),
            (None, Some(fence)) => Call::fenced_acquire(key, &token, ttl_ms, fence),
            (Some((flag, name)), fence) => {
                let flag_ms = u64::try_from(flag.as_millis()).unwrap_or(u64::MAX);
                Call::waiting_acquire(key, &token, ttl_ms, fence.as_deref(), flag_ms, name)
            }
        });
        let start = Instant::now();
        let pending = self.fan_out(&call, parse_acquire, 0..self.inner.nodes.len());
        let keys = Keys::One(Arc::clone(key));
        Attempt::new(self, resource, key, keys, token, ttl, start)
            .run(pending)
            .await
    }

    /// Why an attempt failed: too late for any validity once a quorum said OK;
    /// otherwise busy or no quorum, from the nodes' answers.
    fn acquire_error(
        &self,
        resource: &Arc<str>,
        ok: usize,
        elapsed: Duration,
        ttl: Duration,
        report: Report,
    ) -> Error {
        let q = self.inner.quorum;
        if ok >= q {
            return Error::NoValidity {
                resource: Arc::clone(resource),
                elapsed,
                ttl,
            };
        }
        let mut busy: Vec<Duration> = Vec::new();
        let mut busy_count = 0;
        for n in &report.nodes {
            if let NodeStatus::Busy { pttl } = n.status {
                busy_count += 1;
                busy.extend(pttl);
            }
        }
        // Busy when the other holders alone make a quorum impossible, or when the
        // nodes that answered (ours and theirs) make one: the backend is up.
        if ok + busy_count >= q || self.inner.nodes.len() - busy_count < q {
            Error::Busy {
                resource: Arc::clone(resource),
                retry_after: busy_retry_after(&mut busy, busy_count, self.inner.nodes.len(), q),
                report,
            }
        } else {
            Error::NoQuorum {
                resource: Arc::clone(resource),
                ok,
                quorum: q,
                report,
            }
        }
    }
}

/// One acquire attempt's span: the resource, the attempt's number and TTL,
/// and the outcome fields the attempt fills in (`elapsed_us`, `validity_ms`,
/// `ok`). The mutex's and the scripted primitives' attempts share it.
fn acquire_span(resource: &Arc<str>, attempt: u32, ttl: Ttl) -> tracing::Span {
    tracing::debug_span!(
        "redlock.acquire",
        resource = %resource,
        attempt,
        ttl_ms = ttl.key.as_millis() as u64,
        elapsed_us = tracing::field::Empty,
        validity_ms = tracing::field::Empty,
        ok = tracing::field::Empty,
    )
}
