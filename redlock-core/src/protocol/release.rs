//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! Spec step 5, the release: compare-and-delete on every node, never a bare
//! `DEL`. A release is decided at quorum, as acquire and extend are: it returns
//! once a majority has answered, and the other nodes are driven to the end in
//! the background.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use tracing::Instrument;

use crate::error::{Error, NodeError, NodeStatus, Report};
use crate::keys::Keys;
use crate::node::{Call, RELEASE_QUIET, ReleaseReply, parse_release};
use crate::protocol::fan_out::{Fan, Settled, ready_now, send_now};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::stragglers::Late;

/// What a release confirmed on a quorum of nodes did.
#[derive(Clone)]
#[non_exhaustive]
pub struct Released {
    /// How many nodes deleted the key by the time the release was decided. Fewer
    /// than the quorum means some keys had already expired (or the other nodes
    /// had not answered yet: they are still released, in the background).
    pub deleted: usize,
    /// Each node's answer when the release was decided (`None`: still out),
    /// made into a [`Report`] only when asked.
    settled: Vec<Option<Settled<bool>>>,
    /// The handle whose nodes answered (for their labels).
    redlock: Core,
}

impl Released {
    /// Every node's outcome when the release was decided (`Pending` for the
    /// nodes still answering). Built on each call: a release that nobody
    /// asks about builds none (BENCHMARKS.md at 9debf85, "Where a pair's client CPU
    /// goes").
    pub fn report(&self) -> Report {
        self.redlock.release_report(&self.settled)
    }
}

impl std::fmt::Debug for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Released")
            .field("deleted", &self.deleted)
            .field("report", &self.report())
            .finish()
    }
}

impl PartialEq for Released {
    fn eq(&self, other: &Self) -> bool {
        self.deleted == other.deleted && self.report() == other.report()
    }
}

impl Eq for Released {}

impl Lock {
    /// The same as [`Redlock::unlock`](crate::Redlock::unlock) on this lock's handle.
    ///
    /// # Errors
    /// See [`Redlock::unlock`](crate::Redlock::unlock).
    pub async fn unlock(self) -> Result<Released, Error> {
        let redlock = self.redlock.clone();
        redlock.unlock(self).await
    }
}

impl Core {
    /// Spec step 5 ("release the lock"): compare-and-delete on every node at once.
    /// With a `report` from a failed acquire, nodes that answered "busy" are
    /// skipped (they refused the `SET`, so they never stored this token), and so
    /// are nodes that have not answered yet (their answer is released when it
    /// comes, see [`Redlock::drive_stragglers`]), so a failure returns at once.
    /// Returns every node's answer (`None`: skipped, or still out). `late`:
    /// the lock's late answers, told what this release (sent to every node)
    /// deleted.
    pub(crate) async fn unlock_all(
        &self,
        keys: &Keys,
        token: &Arc<str>,
        acquired: Option<&Report>,
        late: Option<&Late>,
    ) -> Vec<Option<Settled<bool>>> {
        self.unlock_all_as(keys, token, acquired, late, false).await
    }

    /// [`Redlock::unlock_all`]; `quiet`: a key of one resource is released
    /// without announcing it (`RELEASE_QUIET`), for a failed attempt that
    /// took fewer nodes than a quorum.
    pub(crate) async fn unlock_all_as(
        &self,
        keys: &Keys,
        token: &Arc<str>,
        acquired: Option<&Report>,
        late: Option<&Late>,
        quiet: bool,
    ) -> Vec<Option<Settled<bool>>> {
        let skip = |i: usize| {
            acquired.is_some_and(|r| {
                matches!(
                    r.nodes[i].status,
                    NodeStatus::Busy { .. }
                        | NodeStatus::Pending
                        | NodeStatus::Failed(NodeError::WrongType { .. })
                )
            })
        };
        if (0..self.inner.nodes.len()).all(skip) {
            if let Some(late) = late {
                late.release_never_sent();
            }
            return Vec::new();
        }
        let call = Arc::new(match keys {
            Keys::One(key) if quiet => {
                Call::script(&RELEASE_QUIET, Arc::clone(key), vec![token.to_string()])
            }
            _ => Call::release_keys(keys.clone(), Arc::clone(token)),
        });
        let mut pending = self.fan_out(
            &call,
            parse_release,
            (0..self.inner.nodes.len()).filter(|&i| !skip(i)),
        );
        let mut settled = deleted_or_not(self.settle(&mut pending, |_| false).await);
        for s in settled.iter_mut().flatten() {
            // A foreign non-string value at the key is not ours to delete.
            if matches!(s.result, Err(NodeError::WrongType { .. })) {
                s.result = Ok(false);
            }
        }
        if let Some(late) = late {
            late.release_answers(&settled);
            // Every call has ended; a node without an answer got none.
            late.release_never_sent();
        }
        settled
    }

    /// The release that `settled` holds the answers of, as the caller gets
    /// it; its report is built only when asked.
    pub(crate) fn released(&self, settled: Vec<Option<Settled<bool>>>) -> Released {
        Released {
            deleted: deleted(&settled),
            settled,
            redlock: self.clone(),
        }
    }

    /// Every node's outcome in a release's answers (an empty report for a
    /// release that sent nothing).
    pub(crate) fn release_report(&self, settled: &[Option<Settled<bool>>]) -> Report {
        if settled.is_empty() {
            return Report::default();
        }
        self.report(settled, |&d| {
            if d {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        })
    }

    /// Drives a release's remaining nodes to the end in the background:
    /// dropping their calls could cancel them before they are written, leaving
    /// those keys to block the resource for a TTL.
    /// Each answer is also told to the lock's late answers (`late`).
    fn finish_release<F>(&self, mut pending: Fan<F>, key: &Arc<str>, late: Option<Arc<Late>>)
    where
        F: Future<Output = Settled<ReleaseReply>> + Send + 'static,
    {
        let (label, this) = (Arc::clone(key), self.clone());
        let log = move |s: Settled<ReleaseReply>| {
            if let Some(late) = &late {
                late.release_answered(s.index, matches!(s.result, Ok(r) if r.deleted()));
            }
            if let Err(e) = &s.result {
                tracing::debug!(key = %label, node = %this.inner.nodes[s.index].label, error = %e, "late release failed; the key expires with its TTL");
            }
        };
        // The answers already in need no task.
        for s in ready_now(&mut pending) {
            log(s);
        }
        if pending.is_empty() {
            return;
        }
        self.inner.background.run(async move {
            while let Some(s) = pending.next().await {
                log(s);
            }
        });
    }

    /// Releases `lock` (spec step 5): compare-and-delete on every node at once.
    ///
    /// Decided at quorum: it returns `Ok` as soon as a majority of nodes has
    /// answered (deleted, or no longer holding this token), and drives the other
    /// nodes to the end in the background; a minority of failed nodes is logged,
    /// not returned (the distlock page: while a majority is up, clients can
    /// acquire *and release*).
    ///
    /// Cancel-safe: if this future is dropped before it completes (a timeout
    /// around it, a client gone), the `Lock` it owns is dropped with it, and its
    /// `Drop` sends the release again in the background.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when so many nodes failed that the release
    /// could not be confirmed on a quorum; their keys expire with the TTL.
    pub(crate) async fn unlock(&self, mut lock: Lock) -> Result<Released, Error> {
        lock.abandon();
        let span = tracing::debug_span!("redlock.release", resource = %lock.resource);
        let call = Arc::new(Call::release_keys(lock.key_set(), Arc::clone(&lock.token)));
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        let (mut answered, mut failed) = (0, 0);
        let waiting = &self.inner.waiting;
        // Before the release can be announced: on which nodes this handle
        // hears it itself.
        let own = waiting.release_sent(&lock.key);
        let mut pending = self.fan_out(&call, parse_release, 0..n);
        // Once the compare-and-deletes are on the connections, the next local
        // waiter may attempt: its `SET`s run after them on every node. Not
        // while the resource is contended across handles: that waiter would
        // attempt before this release's hand-off window (`wait/handoff.rs`).
        let first = send_now(&mut pending).await;
        if !waiting.handoffs.contended(&lock.key, Instant::now()) {
            waiting.queues.hand_over(&lock.key, &lock.token);
        }
        let settled = self
            .settle_after(first, &mut pending, |s| {
                match s.result {
                    Ok(_) | Err(NodeError::WrongType { .. }) => answered += 1,
                    Err(_) => failed += 1,
                }
                answered >= q || n - failed < q
            })
            .instrument(span.clone())
            .await;
        self.note_hand_off(&lock.key, &own, &settled);
        let settled = deleted_or_not(settled);
        if let Some(late) = &lock.late {
            late.release_answers(&settled);
        }
        // The other nodes still get their compare-and-delete.
        self.finish_release(pending, &lock.key, lock.late.clone());
        // Only now: a future dropped mid-release leaves `Drop` to release.
        lock.released = true;
        // Unless `hand_over` gave it the turn already, the next local waiter
        // attempts now, whatever the outcome: keys that were not deleted are
        // found busy and waited for.
        self.inner.waiting.queues.release(&lock.key, &lock.token);
        let deleted = deleted(&settled);
        // The report is built for a subscriber that asks, or an error.
        span.in_scope(|| {
            if failed > 0 {
                tracing::warn!(deleted, report = %self.release_report(&settled), "release: some nodes failed");
            } else {
                tracing::debug!(deleted, report = %self.release_report(&settled), "released");
            }
        });
        crate::metrics::released(lock.metrics_key(), answered >= q);
        if answered >= q {
            return Ok(self.released(settled));
        }
        Err(Error::ReleaseIncomplete {
            resource: Arc::clone(&lock.resource),
            deleted,
            report: self.release_report(&settled),
        })
    }

    /// Releases `key` on every node in a background task, for the paths that
    /// cannot wait (a `Drop`). Outside a Tokio runtime nothing runs: the keys
    /// expire with their TTL.
    /// `late`: the lock's late answers, told what the release deleted.
    pub(crate) fn spawn_release(&self, keys: &Keys, token: &Arc<str>, late: Option<Arc<Late>>) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let (this, keys, token) = (self.clone(), keys.clone(), Arc::clone(token));
                rt.spawn(async move {
                    this.unlock_all(&keys, &token, None, late.as_deref()).await;
                    this.inner.waiting.queues.release(keys.first(), &token);
                });
            }
            // The keys expire with their TTL; the local queue need not wait.
            // A late `OK` is released again by the task that reads it.
            Err(_) => {
                if let Some(late) = late {
                    late.release_never_sent();
                }
                self.inner.waiting.queues.release(keys.first(), token);
            }
        }
    }
}

impl Core {
    /// A release of `key` was decided with the answers `settled`; `own`:
    /// per node, whether this handle's own subscription hears its
    /// announcement there ([`Waiting::release_sent`](crate::wake::Waiting::release_sent)).
    /// If some node's announcement reached another subscriber, waiters of
    /// another handle were woken: a hand-off window is recorded for the
    /// resource (`wait/handoff.rs`). Where this handle expected to hear
    /// its own announcement and the node says nobody did, it no longer
    /// expects it.
    fn note_hand_off(&self, key: &str, own: &[bool], settled: &[Option<Settled<ReleaseReply>>]) {
        let waiting = &self.inner.waiting;
        let mut woke_others = false;
        for s in settled.iter().flatten() {
            let mine = own.get(s.index).copied().unwrap_or(false);
            let heard = match s.result {
                Ok(ReleaseReply::Deleted { heard }) => heard,
                Ok(ReleaseReply::NotHeld) => 0,
                // Whether it ran is unknown: nothing is undone.
                Err(_) => continue,
            };
            woke_others |= heard > u64::from(mine);
            if mine && heard == 0 {
                waiting.release_unheard(key, s.index);
            }
        }
        if woke_others {
            tracing::debug!(
                key,
                "release woke another handle's waiters: hand-off window"
            );
            waiting.handoffs.record(key, Instant::now());
        }
    }
}

/// A release's answers as whether each node deleted the key.
fn deleted_or_not(settled: Vec<Option<Settled<ReleaseReply>>>) -> Vec<Option<Settled<bool>>> {
    settled
        .into_iter()
        .map(|s| {
            s.map(|s| Settled {
                index: s.index,
                latency: s.latency,
                result: s.result.map(ReleaseReply::deleted),
            })
        })
        .collect()
}

/// How many nodes deleted the key, in a release's answers.
fn deleted(settled: &[Option<Settled<bool>>]) -> usize {
    settled
        .iter()
        .flatten()
        .filter(|s| matches!(s.result, Ok(true)))
        .count()
}
