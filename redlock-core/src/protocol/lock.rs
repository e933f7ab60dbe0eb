//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! A held lock: what the holder knows about it, and its release on drop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::fencing::FencingToken;
use crate::keys::{Keys, Many};
use crate::protocol::redlock::Core;
use crate::protocol::stragglers::Late;

/// A held Redlock lock: the resource, this holder's token, and how long it is valid.
///
/// Dropping a `Lock` without [`Lock::unlock`] spawns the release in the background
/// (when inside a Tokio runtime; otherwise the keys expire with their TTL).
#[must_use = "dropping a Lock releases it in the background; use Redlock::unlock to know the outcome"]
pub struct Lock {
    pub(crate) redlock: Core,
    pub(crate) resource: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) token: Arc<str>,
    pub(crate) started: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) ttl: Duration,
    pub(crate) extensions: u32,
    pub(crate) late: Option<Arc<Late>>,
    pub(crate) released: bool,
    pub(crate) fencing_token: Option<FencingToken>,
    /// When the lock was acquired (the hold time's start; `started` moves with
    /// each extension); `None` once its hold was counted out (`abandon`).
    pub(crate) acquired_at: Option<Instant>,
    /// The resources of a multi-resource lock (`key` is then the first key).
    pub(crate) many: Option<Arc<Many>>,
    /// A fenced multi-resource lock's tokens, one per resource in key order.
    pub(crate) fencing_tokens: Vec<FencingToken>,
    /// Per node, the shortest TTL of an extend sent to it whose answer never
    /// came: its `PEXPIRE` may still land, after a later and longer one sent
    /// on another connection (a reconnect, another runtime's). Empty while
    /// every extend was answered.
    pub(crate) unanswered: Vec<Option<Duration>>,
    /// A permit's or share's count in its gauge, ended with the hold.
    pub(crate) gauged: Option<crate::metrics::Gauged>,
}

impl Lock {
    /// The TTL that a quorum of the nodes which extended the key to `ttl`
    /// (`nodes[i] == Some(true)`) is sure to keep: a node where an earlier,
    /// shorter extend is unanswered counts with that shorter TTL, since it
    /// may land after this one.
    pub(crate) fn quorum_ttl(
        &self,
        ttl: Duration,
        nodes: &[Option<bool>],
        quorum: usize,
    ) -> Duration {
        if self.unanswered.iter().all(|p| p.is_none_or(|p| p >= ttl)) {
            return ttl;
        }
        let mut ttls: Vec<Duration> = nodes
            .iter()
            .enumerate()
            .filter(|(_, extended)| **extended == Some(true))
            .map(|(i, _)| match self.unanswered.get(i).copied().flatten() {
                Some(pending) => pending.min(ttl),
                None => ttl,
            })
            .collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        ttls.get(quorum.saturating_sub(1))
            .copied()
            .unwrap_or(Duration::ZERO)
    }

    /// Notes the nodes that did not answer an extend to `ttl`
    /// (`nodes[i] == None`).
    pub(crate) fn note_unanswered(&mut self, ttl: Duration, nodes: &[Option<bool>]) {
        if nodes.iter().all(Option::is_some) {
            return;
        }
        if self.unanswered.len() < nodes.len() {
            self.unanswered.resize(nodes.len(), None);
        }
        for (slot, answer) in self.unanswered.iter_mut().zip(nodes) {
            if answer.is_none() {
                *slot = Some(slot.map_or(ttl, |pending| pending.min(ttl)));
            }
        }
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource)
            .field("key", &self.key)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .field("ttl", &self.ttl)
            .field("extensions", &self.extensions)
            .field("fencing_token", &self.fencing_token)
            .finish()
    }
}

impl Lock {
    /// The resource name; for a lock on several resources
    /// ([`crate::Redlock::mutex_many`]), the set's label, `{a, b}`.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The Redis key: the key prefix, then the resource; for a lock on
    /// several resources, the first key (see [`Lock::keys`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The resources this lock holds, deduplicated and in key order: one,
    /// or several for a lock taken with [`crate::Redlock::mutex_many`].
    pub fn resources(&self) -> Vec<&str> {
        match &self.many {
            None => vec![&*self.resource],
            Some(many) => many.resources.iter().map(|r| &**r).collect(),
        }
    }

    /// The Redis keys this lock holds, in the order of [`Lock::resources`].
    pub fn keys(&self) -> Vec<&str> {
        match &self.many {
            None => vec![&*self.key],
            Some(many) => many.keys.iter().map(|k| &**k).collect(),
        }
    }

    /// Each resource's fencing token, in the order of [`Lock::resources`]:
    /// with fencing on, a lock on several resources has one token per
    /// resource, each larger than every earlier holder's token for that
    /// resource. Empty without fencing.
    pub fn fencing_tokens(&self) -> Vec<(&str, FencingToken)> {
        match &self.many {
            None => self
                .fencing_token
                .map(|t| (&*self.resource, t))
                .into_iter()
                .collect(),
            Some(many) => many
                .resources
                .iter()
                .map(|r| &**r)
                .zip(self.fencing_tokens.iter().copied())
                .collect(),
        }
    }

    /// The keys to release or extend.
    pub(crate) fn key_set(&self) -> Keys {
        match &self.many {
            None => Keys::One(Arc::clone(&self.key)),
            Some(many) => Keys::Many(Arc::clone(many)),
        }
    }

    /// This holder's random token, the value stored at the key.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// When the winning attempt (or the last extension) was sent.
    pub fn started_at(&self) -> Instant {
        self.started
    }

    /// When the validity ends: after this instant, another client may hold the lock.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The validity left, zero once it has run out.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Whether the validity has not run out yet.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// The TTL of the keys as last set.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many times the lock has been extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    /// This holder's fencing token, when the handle was built with
    /// [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing): larger than
    /// the token of every earlier holder of the resource (under the
    /// [`FencingMode`](crate::FencingMode)'s assumptions). Send it with every
    /// write to the protected resource, which refuses smaller ones (see
    /// [`crate::fence`]). `None` without fencing.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_token
    }

    /// The `key` label of this lock's metrics, with the application's
    /// `metrics_key_label`: the resource's lock key, for a permit's slot or a
    /// read share too, so that one primitive has one label in every metric
    /// (its holders' gauge is labelled so); a lock on several resources, its
    /// first key's.
    pub(crate) fn metrics_key(&self) -> Option<&'static str> {
        if !self.redlock.has_metrics_key() {
            return None;
        }
        match self.many.as_deref().and_then(|m| m.keys.first()) {
            Some(first) => self.redlock.metrics_key(first),
            None => self
                .redlock
                .metrics_key(&self.redlock.key_for(&self.resource)),
        }
    }

    /// Marks the lock released for the straggler task, before the release is
    /// sent, and ends its hold in the metrics. Called by the release and again
    /// by the drop when the release's future is dropped before it ended: the
    /// hold is counted out by the first call only.
    pub(crate) fn abandon(&mut self) {
        self.gauged = None;
        if let Some(acquired_at) = self.acquired_at.take() {
            crate::metrics::held(self.metrics_key(), Some(acquired_at.elapsed()));
        }
        if let Some(late) = &self.late {
            late.releasing_everywhere();
        }
    }

    pub(crate) fn redlock(&self) -> &Core {
        &self.redlock
    }

    pub(crate) fn shared_key(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn shared_token(&self) -> &Arc<str> {
        &self.token
    }

    pub(crate) fn shared_resource(&self) -> &Arc<str> {
        &self.resource
    }

    /// The same as [`Redlock::extend`](crate::Redlock::extend) on this lock's handle.
    ///
    /// # Errors
    /// See [`Redlock::extend`](crate::Redlock::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let redlock = self.redlock.clone();
        redlock.extend(self, ttl).await
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.abandon();
        // Never block in drop.
        self.redlock
            .spawn_release(&self.key_set(), &self.token, self.late.clone());
    }
}
