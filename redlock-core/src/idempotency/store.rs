//! Where records live: the [`IdempotencyStore`] trait.
//!
//! The promise every store keeps: **a record is written only by a holder
//! that still holds the lock.** The in-flight reservation is the quorum lock
//! on the lookup key (an orphaned request frees its key when its lock
//! expires); the store refuses the write of a holder whose lock is gone, so a
//! holder paused past its validity cannot overwrite the record of the key's
//! next holder. [`RedisStore`](super::RedisStore) checks the lock's token on
//! each node; a database store checks the lock's fencing token
//! (`… WHERE fence <= $token`) in the transaction that writes the work's
//! effects.

use std::future::Future;
use std::pin::Pin;

use super::key::LookupKey;
use super::record::{Record, RecordError};
use crate::error::Report;
use crate::guard::LockHandle;

/// The future a store returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store could not answer or write.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lock is no longer this holder's on enough nodes (its keys expired,
    /// and perhaps went to another holder): the write was refused there.
    #[error("record refused: the lock is no longer held ({report})")]
    NotHeld {
        /// Every node's outcome.
        report: Report,
    },
    /// Too few nodes answered.
    #[error("no quorum of nodes answered ({report})")]
    NoQuorum {
        /// Every node's outcome.
        report: Report,
    },
    /// The holder's validity ran out before the write was confirmed: it does
    /// not count, whatever the nodes did.
    #[error("the lock's validity ran out before the record was confirmed")]
    Lost,
    /// Stored bytes that are not a record.
    #[error("stored record unreadable: {0}")]
    Record(#[from] RecordError),
    /// Any other failure of a store (a user's database, say).
    #[error("store failed: {0}")]
    Backend(String),
}

/// A record found under the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The newest record.
    pub record: Record,
    /// Whether it is stored durably (in the Redis store: on a quorum of
    /// nodes). A record that is not is written again by the holder before it
    /// is replayed, so that the next retry finds it without the lock.
    pub durable: bool,
}

/// A store of idempotency records.
///
/// - [`get`](Self::get) is the fast path, without the lock: it returns a
///   record only when the store can vouch for it on its own (the Redis store:
///   a quorum of nodes return the same record in one round trip). `None`
///   sends the request down the lock path; it is never an error to say
///   `None`. Once [`put`](Self::put) has succeeded, `get` should return that
///   record: the flow then releases the lock in the background, and a retry
///   whose `get` says `None` may still find the lock held (409).
/// - [`get_held`](Self::get_held) reads under the lock: the newest record,
///   wherever it is.
/// - [`put`](Self::put) writes only while `holder` still holds the lock; it
///   succeeds only when the write is confirmed within the lock's validity.
pub trait IdempotencyStore: Send + Sync + std::fmt::Debug + 'static {
    /// The record of `key`, if the store can vouch for it without the lock.
    fn get<'a>(&'a self, key: &'a LookupKey) -> StoreFuture<'a, Option<Record>>;

    /// The newest record of `key`, read while `holder` holds the lock.
    fn get_held<'a>(
        &'a self,
        key: &'a LookupKey,
        holder: &'a LockHandle,
    ) -> StoreFuture<'a, Option<Found>>;

    /// Writes `record` for `key`, only while `holder` holds the lock, and
    /// only if confirmed before its validity ends.
    fn put<'a>(
        &'a self,
        key: &'a LookupKey,
        holder: &'a LockHandle,
        record: &'a Record,
    ) -> StoreFuture<'a, ()>;
}
