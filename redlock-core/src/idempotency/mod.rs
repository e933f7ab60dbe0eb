//! Idempotent requests (the `idempotency` feature): the framework-free part
//! of an idempotency layer, which `redlock-tower` and `redlock-actix` share,
//! as [`request`](crate::request) is for the per-request lock.
//!
//! A request carries a key (`Idempotency-Key`, per the IETF httpapi draft,
//! or a webhook's delivery id). The first request with a key runs and its
//! response is recorded; a retry gets the recorded response, byte for byte;
//! a duplicate that arrives while the first is in flight gets 409; the same
//! key with another request gets 422. See [`IdempotencyPolicy`] for the
//! table of defaults, and [`Idempotency::begin`] for the flow.
//!
//! # The rule that keeps records right
//!
//! The in-flight reservation is the quorum lock on the lookup key, so an
//! orphaned request frees its key when its lock expires. **A record is
//! written only by a holder that still holds the lock**: the default
//! [`RedisStore`] writes it on each node by one script that checks the
//! node's lock key still holds the holder's token, and the write counts only
//! when a quorum applied it within the lock's validity. A holder that lost
//! its lock before the write records nothing, and the next copy of the
//! request runs the work. A replay skips the lock only when a quorum of
//! nodes return the same record; otherwise the request takes the lock path,
//! where the newest record wins. *Newest* is by the order a record carries:
//! the writer's fencing token, or without fencing the key's generation, which
//! each holder that runs the work (or writes a found record back) takes under
//! its lock from a quorum of nodes. A record found on fewer than a quorum is
//! answered only once written back onto a quorum with the holder's own
//! order, so a key keeps the answer a client has received.
//!
//! Records expire after the store's TTL (24 h by default). Webhook users:
//! set it longer than the sender's retry window (Stripe retries for up to
//! 3 days).

mod fingerprint;
mod finish;
mod flow;
mod key;
mod peek;
mod policy;
mod record;
mod redis_read;
mod redis_store;
mod rejection;
mod setters;
mod store;

pub use fingerprint::{Fingerprint, Fingerprinter, RequestParts};
pub use flow::{Begin, Idempotency, KEY_HEADER, REPLAYED_HEADER, Replay, Running};
pub use key::{IdempotencyKey, KeyError, LookupKey, MAX_KEY_LEN};
pub use policy::{DEFAULT_BODY_CAP, IdempotencyPolicy, StorePolicy};
pub use record::{Outcome, Record, RecordError};
pub use redis_store::{DEFAULT_RECORD_TTL, RedisStore};
pub use rejection::IdempotencyRejection;
pub use store::{Found, IdempotencyStore, StoreError, StoreFuture};
