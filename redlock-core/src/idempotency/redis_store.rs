//! The default store: records on the lock's own Redis nodes, written and read
//! with the lock's fan-out and quorum (spec step 2, `fan_out.rs`;
//! `steps::quorum`).
//!
//! - **Write** ([`IdempotencyStore::put`]): on each node, one script writes
//!   the record only while that node's lock key still holds the writer's
//!   token. The write counts only when a quorum applied it and the holder's
//!   validity (less its loss margin) has not run out when that is known.
//! - **Fast read** ([`IdempotencyStore::get`]): one `GET` per node in one
//!   round trip; a record answers only when a quorum of nodes return the very
//!   same bytes. A record on fewer nodes (a write that failed its quorum)
//!   never answers by itself: the request takes the lock path.
//! - **Read under the lock** ([`IdempotencyStore::get_held`]): every node's
//!   answer (each within the node timeout), at least a quorum of them; the
//!   newest record wins. *Newest* is the largest [`Record::order`], then the
//!   larger encoded bytes for a deterministic tie-break. With fencing on,
//!   the order is the writer's fencing token, larger for every later holder.
//!   Without fencing, the flow writes one more than the largest order it read
//!   under its lock, so a later holder that saw an earlier record orders
//!   after it. (Under the lock a record found is replayed, never replaced, so
//!   two different records of one key arise only when a write failed its
//!   quorum and the next holder did not hear from its nodes.)
//!
//! The record's Redis key is the lock's key followed by `:record`; it
//! expires after the record TTL (default 24 h).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use super::key::LookupKey;
use super::record::Record;
use super::store::{Found, IdempotencyStore, StoreError, StoreFuture};
use crate::error::{NodeError, NodeStatus};
use crate::fan_out::Settled;
use crate::guard::LockHandle;
use crate::node::{Call, RECORD_GET, RECORD_PUT, parse_flag};
use crate::redlock::Redlock;

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
    redlock: Redlock,
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

    /// The Redis key of `key`'s record.
    pub fn record_key(&self, key: &LookupKey) -> String {
        format!("{}:record", self.redlock.key_for(key.resource()))
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
        let n = self.redlock.inner.nodes.len();
        let mut pending = self.redlock.fan_out(&call, parse_bytes, 0..n);
        // Unanswered reads are dropped: a read has nothing to finish.
        self.redlock.settle(&mut pending, decided).await
    }
}

fn parse_bytes(v: Value) -> Result<Option<Vec<u8>>, NodeError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        other => Err(NodeError::Protocol(format!("record reply {other:?}"))),
    }
}

/// The answers grouped by value: each distinct answer and how many nodes
/// gave it.
fn tally(settled: &[Option<Settled<Option<Vec<u8>>>>]) -> Vec<(&Option<Vec<u8>>, usize)> {
    let mut groups: Vec<(&Option<Vec<u8>>, usize)> = Vec::new();
    for s in settled.iter().flatten() {
        if let Ok(v) = &s.result {
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, c)) => *c += 1,
                None => groups.push((v, 1)),
            }
        }
    }
    groups
}

impl IdempotencyStore for RedisStore {
    fn get<'a>(&'a self, key: &'a LookupKey) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let (n, q) = (self.redlock.inner.nodes.len(), self.redlock.inner.quorum);
            let mut answers: Vec<Option<Vec<u8>>> = Vec::new();
            let mut settled_count = 0;
            // Decided when one answer has a quorum, or none can reach one.
            let settled = self
                .read(key, |s| {
                    settled_count += 1;
                    if let Ok(v) = &s.result {
                        answers.push(v.clone());
                    }
                    let best = answers
                        .iter()
                        .map(|a| answers.iter().filter(|b| *b == a).count())
                        .max()
                        .unwrap_or(0);
                    best >= q || best + (n - settled_count) < q
                })
                .await;
            let agreed = tally(&settled)
                .into_iter()
                .find(|(_, c)| *c >= q)
                .and_then(|(v, _)| v.as_deref());
            match agreed {
                // A quorum agreeing on bytes that do not decode is not a
                // record to replay: the lock path decides.
                Some(bytes) => Ok(Record::decode(bytes).ok()),
                None => Ok(None),
            }
        })
    }

    fn get_held<'a>(
        &'a self,
        key: &'a LookupKey,
        _holder: &'a LockHandle,
    ) -> StoreFuture<'a, Option<Found>> {
        Box::pin(async move {
            let q = self.redlock.inner.quorum;
            let settled = self.read(key, |_| false).await;
            let answered = settled
                .iter()
                .flatten()
                .filter(|s| s.result.is_ok())
                .count();
            if answered < q {
                let report = self.redlock.report(&settled, |v| {
                    if v.is_some() {
                        NodeStatus::Ok
                    } else {
                        NodeStatus::NotHeld
                    }
                });
                return Err(StoreError::NoQuorum { report });
            }
            let groups = tally(&settled);
            let newest = groups
                .iter()
                .filter_map(|(v, c)| {
                    let bytes = v.as_deref()?;
                    match Record::decode(bytes) {
                        Ok(r) => Some((r, bytes, *c)),
                        Err(error) => {
                            tracing::warn!(%error, "unreadable idempotency record ignored");
                            None
                        }
                    }
                })
                .max_by(|(a, ab, _), (b, bb, _)| a.order.cmp(&b.order).then(ab.cmp(bb)));
            Ok(newest.map(|(record, _, count)| Found {
                record,
                durable: count >= q,
            }))
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
            // Redis refuses an expiry past what its clock can add; a century
            // is "forever" for a record.
            const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
            let ttl_ms = self.ttl.min(CENTURY).as_millis().max(1).to_string();
            let call = Arc::new(Call::keys(
                &RECORD_PUT,
                &[holder.key().as_bytes(), record_key.as_bytes()],
                &[
                    holder.token().as_bytes(),
                    &record.encode(),
                    ttl_ms.as_bytes(),
                ],
            ));
            let (n, q) = (self.redlock.inner.nodes.len(), self.redlock.inner.quorum);
            let (mut ok, mut not_ok, mut not_held) = (0, 0, 0);
            let mut pending = self.redlock.fan_out(&call, parse_flag, 0..n);
            let settled = self
                .redlock
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
            let report = self.redlock.report(&settled, |&b| {
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
