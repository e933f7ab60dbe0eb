//! The idempotency layer's fast read with the lock key ([`RedisStore::peek`]),
//! and the read under the lock it can stand in for
//! ([`RedisStore::held_from_peek`]): the store's methods that use the read
//! rules of `redis_read` on the store's nodes.

use std::sync::Arc;

use super::key::LookupKey;
use super::record::Record;
use super::redis_read::{Peek, newest, parse_peek, quorum_decided, vouched};
use super::redis_store::RedisStore;
use super::store::Found;
use crate::guard::LockHandle;
use crate::node::{Call, RECORD_PEEK};
use crate::protocol::fan_out::{DynFan, Settled};

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
        let (n, q) = (
            self.redlock.core.inner.nodes.len(),
            self.redlock.core.inner.quorum,
        );
        let mut pending = self.redlock.core.fan_out_boxed(&call, parse_peek, 0..n);
        let by_record = quorum_decided(q, n, Peek::record);
        let answers = self.redlock.core.settle(&mut pending, by_record).await;
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
        let q = self.redlock.core.inner.quorum;
        if peeked.lock_key != holder.key() {
            return None;
        }
        let Peeked {
            mut answers,
            mut pending,
            ..
        } = peeked;
        let rest = self.redlock.core.settle(&mut pending, |_| false).await;
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
