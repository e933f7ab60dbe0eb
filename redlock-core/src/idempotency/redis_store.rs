//! The default store: records on the lock's own Redis nodes, written and read
//! with the lock's fan-out and quorum (spec step 2, `fan_out/`;
//! `steps::quorum`).
//!
//! - **Write** ([`IdempotencyStore::put`]): on each node, one script writes
//!   the record only while that node's lock key still holds the writer's
//!   token. The write counts only when a quorum applied it and the holder's
//!   validity (less its loss margin) has not run out when that is known.
//! - **Fast read** ([`IdempotencyStore::get`]): one `GET` per node in one
//!   round trip; a record answers only when a quorum of nodes return the very
//!   same bytes. A record on fewer nodes (a write that failed its quorum)
//!   never answers by itself: the request takes the lock path. The flow
//!   sends its fast read with the acquire, as one script per node that also
//!   reads the lock key's holder; on a quorum of nodes that name the new
//!   holder, that read is the read under the lock (`RedisStore::peek`).
//! - **Read under the lock** ([`IdempotencyStore::get_held`]): every node's
//!   answer (each within the node timeout), at least a quorum of them; the
//!   newest record wins. *Newest* is the largest [`Record::order`], then the
//!   larger encoded bytes for a deterministic tie-break. With fencing on,
//!   the order is the writer's fencing token, larger for every later holder.
//!   Without fencing, it is the key's generation, which the writer took under
//!   its lock from a quorum of nodes before it ran the work
//!   (`RedisStore::generation`), larger for every later holder as well: a
//!   record whose write missed its quorum never outranks the record of a
//!   later holder that ran the work again. (Under the lock a record found is
//!   replayed, never replaced, so two different records of one key arise only
//!   when a write failed its quorum and the next holder did not hear from its
//!   nodes.)
//!
//! The record's Redis key is the lock key's tag (`{tag}`, see `slots`)
//! followed by `:record`, the generation's by `:generation`. A record
//! expires after the record TTL (default 24 h), a generation counter after
//! the record TTL too, but never less than an hour (`RedisStore::generation`
//! says why).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use super::key::LookupKey;
use super::record::Record;
use super::redis_read::{newest, quorum_decided, vouched, whole};
use super::store::{Found, IdempotencyStore, StoreError, StoreFuture};
use crate::error::{NodeError, NodeStatus};
use crate::guard::LockHandle;
use crate::node::{Call, RECORD_GENERATION, RECORD_GET, RECORD_PUT, parse_flag};
use crate::protocol::fan_out::Settled;
use crate::redlock::Redlock;

/// The least a generation counter lives (`RedisStore::generation`).
const GENERATION_TTL_FLOOR: Duration = Duration::from_secs(3600);

/// The default record TTL: 24 hours.
pub const DEFAULT_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// Idempotency records on the lock's own Redis nodes (see the module docs of
/// [`crate::idempotency`] for the rule that keeps them right).
///
/// Webhook users: set the record TTL longer than the sender's retry window
/// (Stripe retries for up to 3 days).
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::Redlock;
/// use redlock_core::idempotency::RedisStore;
///
/// # fn run(redlock: Redlock) {
/// let store = RedisStore::new(redlock).record_ttl(Duration::from_secs(4 * 24 * 3600));
/// # let _ = store; }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    pub(super) redlock: Redlock,
    ttl: Duration,
}

impl RedisStore {
    /// A store on `redlock`'s nodes, with the default record TTL (24 h).
    pub fn new(redlock: Redlock) -> Self {
        Self {
            redlock,
            ttl: DEFAULT_RECORD_TTL,
        }
    }

    /// How long a record lives (default 24 h). Whole milliseconds, at least 1,
    /// at most a century (`Duration::MAX` is accepted).
    #[must_use]
    pub fn record_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a record lives: what its lock's Durable fence counter must
    /// outlast (`Idempotency::fence_retention`).
    pub(crate) fn record_ttl_now(&self) -> Duration {
        self.ttl
    }

    /// The Redis key of `key`'s record.
    pub fn record_key(&self, key: &LookupKey) -> String {
        crate::slots::derived(&self.redlock.key_for(key.resource()), ":record")
    }

    /// The Redis key of `key`'s generation counter: the order of the records
    /// written without fencing (see the module docs of
    /// [`idempotency`](crate::idempotency)), expiring after the records (see
    /// `RedisStore::generation`).
    pub fn generation_key(&self, key: &LookupKey) -> String {
        crate::slots::derived(&self.redlock.key_for(key.resource()), ":generation")
    }

    /// The record TTL in whole milliseconds, as the nodes take it: at least
    /// 1, at most a century (Redis refuses an expiry past what its clock can
    /// add; a century is "forever" for a record).
    fn ttl_ms(&self) -> String {
        Self::whole_ms(self.ttl)
    }

    /// The generation counter's TTL in whole milliseconds: the record TTL,
    /// and at least an hour (`RedisStore::generation`).
    fn generation_ttl_ms(&self) -> String {
        Self::whole_ms(self.ttl.max(GENERATION_TTL_FLOOR))
    }

    fn whole_ms(ttl: Duration) -> String {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        ttl.min(CENTURY).as_millis().max(1).to_string()
    }

    /// The generation `holder` takes for `key` before it runs the work
    /// without fencing: the order of the record it then writes, larger than
    /// that of every earlier holder that took one.
    ///
    /// Each node keeps a counter next to the record, which only a holder of
    /// the lock there may touch (the script checks the node's lock key
    /// holds the holder's token), and which never goes down while it lives.
    /// A holder sets the counter on every node to the largest of one more
    /// than itself and the node's clock (whole seconds times 2^20, `TIME`);
    /// its generation `g` is the largest value a quorum of answers gave, and
    /// it is taken only once a quorum of nodes hold at least `g` (a node that
    /// was behind is raised to `g` in a second step). Sound because any two
    /// quorums share a node: an earlier holder left at least its `g₁` on a
    /// quorum, and the next one's step on the shared node gives more than
    /// `g₁`, and it takes at least that.
    ///
    /// The clock keeps that order once the counters have expired (issue 47,
    /// item 11). A counter expires `C` after its last step, while a record
    /// written later by the same holder (its work ran in between) or by a
    /// node that got the write late may still be there; a counter alone would
    /// start again at 1, below that record, which then won over the records
    /// of later holders and changed the key's answer. Now the shared node's
    /// counter, once expired, was last set at least `C` before on its clock,
    /// so its clock part is past every value written before then by at least
    /// `C` less the clocks' skew and one second (the rounding), and the
    /// increments a second's worth of holders can add (2^20). `C` is the
    /// record TTL, and at least an hour, as the fence counters of
    /// [`FencingMode::Hybrid`](crate::FencingMode::Hybrid), which rest on
    /// the same bound: servers whose clocks are within an hour of each other
    /// and never step back. The common case still takes one round trip: on a
    /// new key every node answers the same second's value.
    ///
    /// A holder that cannot get its generation onto a quorum does not run.
    pub(crate) async fn generation(
        &self,
        key: &LookupKey,
        holder: &LockHandle,
    ) -> Result<u64, StoreError> {
        let (n, q) = (
            self.redlock.core.inner.nodes.len(),
            self.redlock.core.inner.quorum,
        );
        let generation_key = self.generation_key(key);
        let ttl_ms = self.generation_ttl_ms();
        let step = |floor: u64, nodes: Vec<usize>| {
            let floor = floor.to_string();
            let call = Arc::new(Call::keys(
                &RECORD_GENERATION,
                &[holder.key().as_bytes(), generation_key.as_bytes()],
                &[
                    holder.token().as_bytes(),
                    ttl_ms.as_bytes(),
                    floor.as_bytes(),
                ],
            ));
            self.redlock
                .core
                .fan_out(&call, parse_generation, nodes.into_iter())
        };
        // Heard until a quorum agrees on the largest value, or every node
        // has answered: most keys are run once, and every node says 1.
        let mut pending = step(0, (0..n).collect());
        let mut values: Vec<u64> = Vec::new();
        let settled = self
            .redlock
            .core
            .settle(&mut pending, |s| {
                if let Ok(Some(v)) = s.result {
                    values.push(v);
                }
                let max = values.iter().copied().max().unwrap_or(0);
                values.iter().filter(|&&v| v == max).count() >= q
            })
            .await;
        // The other nodes still count up (a dropped call could be cancelled
        // before it is sent): a counter only goes up.
        finish_in_background(pending);
        let heard: Vec<u64> = settled
            .iter()
            .flatten()
            .filter_map(|s| s.result.as_ref().ok().copied().flatten())
            .collect();
        if heard.len() < q {
            return Err(self.generation_refused(&settled));
        }
        let g = heard.iter().copied().max().unwrap_or(0);
        let at_g: Vec<usize> = settled
            .iter()
            .flatten()
            .filter(|s| matches!(s.result, Ok(Some(v)) if v >= g))
            .map(|s| s.index)
            .collect();
        if at_g.len() >= q {
            return Ok(g);
        }
        // Raise the nodes that are behind (or did not answer) to `g`.
        let behind: Vec<usize> = (0..n).filter(|i| !at_g.contains(i)).collect();
        let mut pending = step(g, behind);
        let mut raised = at_g.len();
        let settled = self
            .redlock
            .core
            .settle(&mut pending, |s| {
                if matches!(s.result, Ok(Some(v)) if v >= g) {
                    raised += 1;
                }
                raised >= q
            })
            .await;
        finish_in_background(pending);
        if raised >= q {
            Ok(g)
        } else {
            Err(self.generation_refused(&settled))
        }
    }

    /// Why a generation could not be taken: the lock is not the holder's on
    /// enough nodes, or too few answered.
    fn generation_refused(&self, settled: &[Option<Settled<Option<u64>>>]) -> StoreError {
        let q = self.redlock.core.inner.quorum;
        let n = self.redlock.core.inner.nodes.len();
        let not_held = settled
            .iter()
            .flatten()
            .filter(|s| matches!(s.result, Ok(None)))
            .count();
        let report = self.redlock.core.report(settled, |v| {
            if v.is_some() {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        });
        if n - not_held < q {
            StoreError::NotHeld { report }
        } else {
            StoreError::NoQuorum { report }
        }
    }

    /// Every node's `GET` of the record, until `decided` says the outcome is
    /// known.
    async fn read(
        &self,
        key: &LookupKey,
        decided: impl FnMut(&Settled<Option<Vec<u8>>>) -> bool,
    ) -> Vec<Option<Settled<Option<Vec<u8>>>>> {
        let record_key = self.record_key(key);
        let call = Arc::new(Call::keys(&RECORD_GET, &[record_key.as_bytes()], &[]));
        let n = self.redlock.core.inner.nodes.len();
        let mut pending = self.redlock.core.fan_out(&call, parse_bytes, 0..n);
        // Unanswered reads are dropped: a read has nothing to finish.
        self.redlock.core.settle(&mut pending, decided).await
    }
}

/// The generation script's answer: the counter, or `None` where the lock is
/// not the holder's.
fn parse_generation(v: Value) -> Result<Option<u64>, NodeError> {
    match v {
        Value::Nil => Ok(None),
        Value::Int(g) => u64::try_from(g)
            .map(Some)
            .map_err(|_| NodeError::Protocol(format!("generation {g}"))),
        other => Err(NodeError::Protocol(format!("generation reply {other:?}"))),
    }
}

/// Lets the calls a fan-out did not wait for run to their end in the
/// background (a dropped call could be cancelled before it is sent).
fn finish_in_background<F>(mut pending: crate::protocol::fan_out::Fan<F>)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    if !pending.is_empty()
        && let Ok(rt) = tokio::runtime::Handle::try_current()
    {
        rt.spawn(async move { while pending.next().await.is_some() {} });
    }
}

fn parse_bytes(v: Value) -> Result<Option<Vec<u8>>, NodeError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        other => Err(NodeError::Protocol(format!("record reply {other:?}"))),
    }
}

impl IdempotencyStore for RedisStore {
    fn get<'a>(&'a self, key: &'a LookupKey) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let settled = self
                .read(
                    key,
                    quorum_decided(
                        self.redlock.core.inner.quorum,
                        self.redlock.core.inner.nodes.len(),
                        whole,
                    ),
                )
                .await;
            Ok(vouched(&settled, self.redlock.core.inner.quorum, whole))
        })
    }

    fn get_held<'a>(
        &'a self,
        key: &'a LookupKey,
        _holder: &'a LockHandle,
    ) -> StoreFuture<'a, Option<Found>> {
        Box::pin(async move {
            let q = self.redlock.core.inner.quorum;
            let settled = self.read(key, |_| false).await;
            let answered = settled
                .iter()
                .flatten()
                .filter(|s| s.result.is_ok())
                .count();
            if answered < q {
                let report = self.redlock.core.report(&settled, |v| {
                    if v.is_some() {
                        NodeStatus::Ok
                    } else {
                        NodeStatus::NotHeld
                    }
                });
                return Err(StoreError::NoQuorum { report });
            }
            Ok(newest(&settled, q, whole))
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a LookupKey,
        holder: &'a LockHandle,
        record: &'a Record,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            // A holder that already knows it lost the lock writes nothing: a
            // record written after the loss would answer for work this
            // request reports as failed.
            if holder.is_lost() {
                return Err(StoreError::Lost);
            }
            let record_key = self.record_key(key);
            let ttl_ms = self.ttl_ms();
            let call = Arc::new(Call::keys(
                &RECORD_PUT,
                &[holder.key().as_bytes(), record_key.as_bytes()],
                &[
                    holder.token().as_bytes(),
                    &record.encode(),
                    ttl_ms.as_bytes(),
                ],
            ));
            let (n, q) = (
                self.redlock.core.inner.nodes.len(),
                self.redlock.core.inner.quorum,
            );
            let (mut ok, mut not_ok, mut not_held) = (0, 0, 0);
            let mut pending = self.redlock.core.fan_out(&call, parse_flag, 0..n);
            let settled = self
                .redlock
                .core
                .settle(&mut pending, |s| {
                    match s.result {
                        Ok(true) => ok += 1,
                        Ok(false) | Err(NodeError::WrongType { .. }) => {
                            not_ok += 1;
                            not_held += 1;
                        }
                        Err(_) => not_ok += 1,
                    }
                    ok >= q || n - not_ok < q
                })
                .await;
            // The other nodes still get the write (a dropped call could be
            // cancelled before it is sent); it cannot outlive their lock key.
            if !pending.is_empty()
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                rt.spawn(async move { while pending.next().await.is_some() {} });
            }
            if ok >= q {
                // Confirmed on a quorum, but counted only inside the validity.
                return if holder.is_lost() {
                    Err(StoreError::Lost)
                } else {
                    Ok(())
                };
            }
            let report = self.redlock.core.report(&settled, |&b| {
                if b {
                    NodeStatus::Ok
                } else {
                    NodeStatus::NotHeld
                }
            });
            if n - not_held < q {
                Err(StoreError::NotHeld { report })
            } else {
                Err(StoreError::NoQuorum { report })
            }
        })
    }
}
