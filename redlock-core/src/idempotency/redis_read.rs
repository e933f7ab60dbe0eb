//! How [`RedisStore`] reads (idempotency layer): which record a quorum of
//! the nodes' answers vouches for, the newest record among them, and the
//! fast read sent with the acquire (`RedisStore::peek`).

use std::sync::Arc;

use redis::Value;

use super::key::LookupKey;
use super::record::Record;
use super::redis_store::RedisStore;
use super::store::Found;
use crate::error::NodeError;
use crate::guard::LockHandle;
use crate::node::{Call, RECORD_PEEK};
use crate::protocol::fan_out::{DynFan, Settled};

/// Where an answer's record bytes are: the whole answer of a `GET`, a part
/// of a peek's.
pub(super) type RecordBytes<T> = fn(&T) -> &Option<Vec<u8>>;

/// The answers grouped by their record bytes: each distinct value and how
/// many nodes gave it.
pub(super) fn tally<T>(
    settled: &[Option<Settled<T>>],
    bytes: RecordBytes<T>,
) -> Vec<(&Option<Vec<u8>>, usize)> {
    let mut groups: Vec<(&Option<Vec<u8>>, usize)> = Vec::new();
    for s in settled.iter().flatten() {
        if let Ok(v) = s.result.as_ref().map(bytes) {
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, c)) => *c += 1,
                None => groups.push((v, 1)),
            }
        }
    }
    groups
}

/// The fast read's rule for when it is decided: one answer has a quorum, or
/// none can reach one any more.
pub(super) fn quorum_decided<T>(
    q: usize,
    n: usize,
    bytes: RecordBytes<T>,
) -> impl FnMut(&Settled<T>) -> bool {
    let mut answers: Vec<Option<Vec<u8>>> = Vec::new();
    let mut settled_count = 0;
    move |s| {
        settled_count += 1;
        if let Ok(v) = s.result.as_ref().map(bytes) {
            answers.push(v.clone());
        }
        let best = answers
            .iter()
            .map(|a| answers.iter().filter(|b| *b == a).count())
            .max()
            .unwrap_or(0);
        best >= q || best + (n - settled_count) < q
    }
}

/// The record a quorum of answers agree on, if any. A quorum agreeing on
/// bytes that do not decode is not a record to replay: the lock path
/// decides.
pub(super) fn vouched<T>(
    settled: &[Option<Settled<T>>],
    q: usize,
    bytes: RecordBytes<T>,
) -> Option<Record> {
    tally(settled, bytes)
        .into_iter()
        .find(|(_, c)| *c >= q)
        .and_then(|(v, _)| v.as_deref())
        .and_then(|bytes| Record::decode(bytes).ok())
}

/// The newest record among the answers (see the module docs), and whether a
/// quorum of them hold it.
pub(super) fn newest<T>(
    settled: &[Option<Settled<T>>],
    q: usize,
    bytes: RecordBytes<T>,
) -> Option<Found> {
    let groups = tally(settled, bytes);
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
    newest.map(|(record, _, count)| Found {
        record,
        durable: count >= q,
    })
}

/// One node's answer to the fast read with the lock key
/// ([`RedisStore::peek`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Peek {
    record: Option<Vec<u8>>,
    holder: Option<Vec<u8>>,
}

impl Peek {
    fn record(&self) -> &Option<Vec<u8>> {
        &self.record
    }
}

/// A `GET`'s answer is the record bytes.
pub(super) fn whole(v: &Option<Vec<u8>>) -> &Option<Vec<u8>> {
    v
}

pub(super) fn parse_peek(v: Value) -> Result<Peek, NodeError> {
    match v {
        Value::Array(items) if items.len() == 2 => {
            let mut items = items.into_iter();
            let mut next = || match items.next() {
                Some(Value::BulkString(b)) => Ok(Some(b)),
                Some(Value::Nil) | None => Ok(None),
                Some(other) => Err(NodeError::Protocol(format!("record peek reply {other:?}"))),
            };
            Ok(Peek {
                record: next()?,
                holder: next()?,
            })
        }
        other => Err(NodeError::Protocol(format!("record peek reply {other:?}"))),
    }
}

/// What [`RedisStore::peek`] heard, and the calls it has not heard yet,
/// kept for the read under the lock.
pub(crate) struct Peeked {
    lock_key: String,
    answers: Vec<Option<Settled<Peek>>>,
    pending: DynFan<Peek>,
}

impl RedisStore {
    /// The fast read ([`IdempotencyStore::get`]), each node also telling who
    /// holds the lock key there, in the same step as it reads the record.
    /// Sent with the acquire, it serves as the read under the lock too
    /// ([`RedisStore::held_from_peek`]) on every node where it ran after the
    /// acquire's `SET`.
    pub(crate) async fn peek(&self, key: &LookupKey) -> (Option<Record>, Peeked) {
        let lock_key = self.redlock.key_for(key.resource());
        let record_key = crate::slots::derived(&lock_key, ":record");
        let call = Arc::new(Call::keys(
            &RECORD_PEEK,
            &[record_key.as_bytes(), lock_key.as_bytes()],
            &[],
        ));
        let (n, q) = (self.redlock.inner.nodes.len(), self.redlock.inner.quorum);
        let mut pending = self.redlock.fan_out_boxed(&call, parse_peek, 0..n);
        let by_record = quorum_decided(q, n, Peek::record);
        let answers = self.redlock.settle(&mut pending, by_record).await;
        let vouched = vouched(&answers, q, Peek::record);
        let peeked = Peeked {
            lock_key,
            answers,
            pending,
        };
        (vouched, peeked)
    }

    /// The read under `holder`'s lock ([`IdempotencyStore::get_held`]) from
    /// a [`RedisStore::peek`] sent with its acquire, when that is exact.
    /// Like `get_held`, it hears every node (each within the node timeout):
    /// the answers the peek had not waited for are awaited now.
    ///
    /// Exact means a quorum of nodes answered the peek while their lock key
    /// already held `holder`'s token. On such a node no one else could write
    /// a record since the `SET` (a record is written only under the writer's
    /// own token there), and the holder has written none yet, so its answer
    /// is the node's record under the lock; a record written at a quorum
    /// before the lock shows on one of them. The other nodes' answers count
    /// as `get_held` counts those of nodes the holder does not hold: a record
    /// there is taken if it is the newest. `None`: not exact (the peek ran
    /// before the `SET` on too many nodes, as on a retried acquire); read
    /// again.
    pub(crate) async fn held_from_peek(
        &self,
        peeked: Peeked,
        holder: &LockHandle,
    ) -> Option<Option<Found>> {
        let q = self.redlock.inner.quorum;
        if peeked.lock_key != holder.key() {
            return None;
        }
        let Peeked {
            mut answers,
            mut pending,
            ..
        } = peeked;
        let rest = self.redlock.settle(&mut pending, |_| false).await;
        for (slot, late) in answers.iter_mut().zip(rest) {
            if slot.is_none() {
                *slot = late;
            }
        }
        let under_lock = answers
            .iter()
            .flatten()
            .filter(|s| {
                s.result
                    .as_ref()
                    .is_ok_and(|p| p.holder.as_deref() == Some(holder.token().as_bytes()))
            })
            .count();
        (under_lock >= q).then(|| newest(&answers, q, Peek::record))
    }
}
