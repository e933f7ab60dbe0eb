//! Spec steps 1 to 4 over several resources at once: one token for all of
//! them, and on each node one script that sets every key only if none exists
//! (`ACQUIRE_MANY_LUA`), so a node counts for the quorum only if it holds
//! them all. The rest (settle at quorum, validity, release of a failed
//! attempt, late answers, retry) is the single-key path's own ([`Attempt`]).
//!
//! Why this cannot deadlock: no client ever holds part of a set on a node
//! while it waits for the rest. Two holders of sets that share a key never
//! overlap: each needs a quorum of nodes holding every key of its set, two
//! quorums share a node, and on that node the shared key holds one token.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use tracing::Instrument;

use super::Ttl;
use super::attempt::{Attempt, Round};
use crate::error::Error;
use crate::fencing::{FencingMode, fence_key};
use crate::keys::{Keys, MAX_RESOURCES, Many, Resources};
use crate::metrics;
use crate::node::{Call, parse_acquire_many};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::new_token;
use crate::settings::RetryPolicy;
use std::collections::BTreeMap;

impl Core {
    /// Checks, deduplicates and orders the resources of a multi-resource lock.
    ///
    /// # Errors
    /// [`Error::NoResources`] for an empty set, [`Error::EmptyResource`] for an
    /// empty name, [`Error::TooManyResources`] past [`MAX_RESOURCES`].
    pub(crate) fn resources<I, R>(&self, resources: I) -> Result<Resources, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let mut by_key: BTreeMap<String, Arc<str>> = BTreeMap::new();
        for r in resources {
            let r = r.as_ref();
            self.check_resource(r)?;
            by_key.entry(self.key_for(r)).or_insert_with(|| r.into());
            if by_key.len() > MAX_RESOURCES {
                return Err(Error::TooManyResources { max: MAX_RESOURCES });
            }
        }
        if by_key.len() <= 1 {
            return match by_key.into_values().next() {
                Some(r) => Ok(Resources::One(r.to_string())),
                None => Err(Error::NoResources),
            };
        }
        let (keys, resources): (Vec<Arc<str>>, Vec<Arc<str>>) =
            by_key.into_iter().map(|(k, r)| (Arc::from(k), r)).unzip();
        let label = format!("{{{}}}", resources.join(", "));
        Ok(Resources::Many(Arc::new(Many {
            resources: resources.into(),
            keys: keys.into(),
            label: label.into(),
        })))
    }
}

impl Core {
    /// The retrying acquire of a checked set (see
    /// [`Redlock::lock_many_with_retained`]), counted in the metrics.
    pub(crate) async fn lock_set(
        &self,
        many: &Arc<Many>,
        ttl: Ttl,
        retry: &RetryPolicy,
    ) -> Result<Lock, Error> {
        let begin = Instant::now();
        let waiting = (retry.max_attempts > 1).then(metrics::Waiting::start);
        let result = self.lock_many_with_retries(many, ttl, retry).await;
        let key = self
            .inner
            .settings
            .metrics_key
            .as_ref()
            .and_then(|_| self.metrics_key(&many.keys[0]));
        let outcome = metrics::acquire_outcome(&result);
        metrics::acquired(key, outcome, begin.elapsed(), waiting.is_some());
        result
    }

    /// The attempts of a multi-resource lock until one wins or the policy
    /// gives up (the one retry loop, `wait/`).
    async fn lock_many_with_retries(
        &self,
        many: &Arc<Many>,
        ttl: Ttl,
        retry: &RetryPolicy,
    ) -> Result<Lock, Error> {
        self.check_ttl(ttl.key)?;
        let latest_start = self.latest_start(retry, Instant::now());
        self.wait_set(many, ttl, retry, latest_start).await
    }

    /// One acquire attempt on a set: spec steps 1 to 4, with the
    /// all-or-none script as step 2.
    pub(crate) async fn attempt_many(
        &self,
        many: &Arc<Many>,
        ttl: Ttl,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let span = tracing::debug_span!(
            "redlock.acquire",
            resource = %many.label,
            attempt,
            ttl_ms = ttl.key.as_millis() as u64,
            elapsed_us = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
            ok = tracing::field::Empty,
        );
        async {
            let token = new_token()?;
            let fence_keys = self
                .inner
                .settings
                .fencing
                .map(|_| many.keys.iter().map(|k| fence_key(k)).collect());
            let call = Arc::new(Call::acquire_many(
                many,
                &token,
                ttl.key.as_millis(),
                fence_keys,
            ));
            let start = Instant::now();
            let pending = self.fan_out(&call, parse_acquire_many, 0..self.inner.nodes.len());
            Attempt::new(
                self,
                &many.label,
                &many.keys[0],
                Keys::Many(Arc::clone(many)),
                token,
                ttl,
                start,
            )
            .run(pending)
            .await
        }
        .instrument(span)
        .await
    }
}

impl Attempt<'_> {
    /// Fencing steps 2 and 3 for a set: the fence phase of each key, all at
    /// once, each picking its key's token from the counters the OK nodes
    /// read for that key. Held only if every key was fenced on a quorum; the
    /// validity is what the slowest phase left.
    pub(super) async fn fence_many(&self, many: &Many, mode: FencingMode, round: &mut Round) {
        let phases = many.keys.iter().enumerate().map(|(i, key)| {
            self.redlock.fence_phase(
                &many.resources[i],
                key,
                &self.token,
                mode,
                &round.settled,
                self.start,
                self.ttl,
                self.retained,
                i,
            )
        });
        let mut tokens = Vec::with_capacity(many.keys.len());
        for fenced in join_all(phases).await {
            match fenced {
                Ok(f) => {
                    round.elapsed = round.elapsed.max(f.elapsed);
                    round.validity = round.validity.min(Some(f.validity));
                    tokens.push(f.token);
                }
                Err(e) => {
                    round.fencing = Err(e);
                    return;
                }
            }
        }
        round.fencing = Ok(tokens.first().copied());
        round.fencing_all = tokens;
    }
}
