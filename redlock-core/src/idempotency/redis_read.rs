//! How [`RedisStore`](super::RedisStore) reads (idempotency layer): which
//! record a quorum of the nodes' answers vouches for, the newest record among
//! them, and the reply of the fast read sent with the acquire (`peek.rs`).

use redis::Value;

use super::record::Record;
use super::store::Found;
use crate::error::NodeError;
use crate::protocol::fan_out::Settled;

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
/// (`RedisStore::peek`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Peek {
    pub(super) record: Option<Vec<u8>>,
    pub(super) holder: Option<Vec<u8>>,
}

impl Peek {
    pub(super) fn record(&self) -> &Option<Vec<u8>> {
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
