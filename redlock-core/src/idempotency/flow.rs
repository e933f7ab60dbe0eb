//! The per-request flow both adapters call, written once:
//!
//! 1. validate the key (missing → 400 or pass through; invalid → 400);
//! 2. fingerprint the request;
//! 3. fast replay check: a record the store vouches for without the lock
//!    (422 on another fingerprint), read in the same round trip as step 4's
//!    acquire, and heard first;
//! 4. take the lock on the lookup key (busy → 409 + `Retry-After`, or wait);
//! 5. read under the lock: another fingerprint → 422, a record → replay
//!    (if it was not durable, written again first with this holder's
//!    order, and answered only once that is on a quorum), none → run (without
//!    fencing, after taking the key's generation, the order of the record it
//!    will write: one more round trip, see `RedisStore::generation`). With the
//!    [`RedisStore`], step 3's read already is this read when a quorum of
//!    nodes ran it after the acquire's `SET` (it reads the lock key's holder
//!    in the same script); otherwise it is read again;
//! 6. after the handler: record the response if its status is stored, while
//!    holding the lock; then release (in the background once the record is
//!    written: a retry replays it by step 3, without the lock).
//!
//! A first request thus costs what the lock alone costs, with the record
//! write in place of the release's round trip; when step 3's read cannot
//! serve as step 5's (a retried acquire, a node answering out of turn), one
//! round trip more.

use std::sync::Arc;

use bytes::Bytes;

use super::fingerprint::{Fingerprint, RequestParts};
use super::key::{IdempotencyKey, KeyError, LookupKey};
use super::policy::IdempotencyPolicy;
use super::record::{Outcome, Record};
use super::redis_store::RedisStore;
use super::rejection::IdempotencyRejection;
use super::store::IdempotencyStore;
use crate::redlock::Redlock;
use crate::request::{self, MissingKeyPolicy, RequestLock};

/// The header a replayed response carries.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The default header of the key.
pub const KEY_HEADER: &str = "idempotency-key";

/// An idempotency layer's engine: the lock handle, the store and the policy.
/// Cheap to clone. Both adapters hold one and call [`Idempotency::begin`] per
/// request.
///
/// ```no_run
/// use redlock_core::Redlock;
/// use redlock_core::idempotency::{Begin, Idempotency, IdempotencyKey, RequestParts};
///
/// # async fn run(redlock: Redlock, headers: http::HeaderMap) {
/// let idem = Idempotency::new(redlock);
/// let key = Some(IdempotencyKey::parse(b"\"order-1\""));
/// let parts = RequestParts { method: "POST", path: "/pay", query: None, headers: &headers, body: b"{}" };
/// match idem.begin(key, None, &parts).await {
///     Ok(Begin::Run(running)) => {
///         // run the handler under `running.lock()`, then:
///         let _ = running.finish(201, std::iter::empty(), Some(bytes::Bytes::from_static(b"ok"))).await;
///     }
///     Ok(Begin::Replay(replay)) => { /* answer replay.status, replay.headers, replay.body */ }
///     Ok(Begin::PassThrough) => { /* no key: run unprotected */ }
///     Err(rejection) => { /* answer rejection.status() with rejection.problem_json() */ }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct Idempotency {
    redlock: Redlock,
    store: Arc<dyn IdempotencyStore>,
    /// The store when it is a [`RedisStore`]: its fast read then also
    /// serves as the read under the lock (step 5) when it can.
    redis: Option<RedisStore>,
    policy: Arc<IdempotencyPolicy>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("redlock", &self.redlock)
            .field("store", &self.store)
            .field("policy", &self.policy)
            .finish()
    }
}

/// How a request goes on after [`Idempotency::begin`].
#[derive(Debug)]
pub enum Begin {
    /// No key, and the policy runs such requests unprotected.
    PassThrough,
    /// Answer with the recorded response.
    Replay(Replay),
    /// Run the handler under the lock, then [`Running::finish`].
    Run(Running),
}

/// A recorded response to replay, byte for byte, with
/// [`REPLAYED_HEADER`]`: true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The status.
    pub status: u16,
    /// The recorded headers.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
}

/// A request running under its idempotency lock.
#[derive(Debug)]
pub struct Running {
    pub(super) lock: RequestLock,
    pub(super) lookup: LookupKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) order: u64,
    pub(super) store: Arc<dyn IdempotencyStore>,
    pub(super) policy: Arc<IdempotencyPolicy>,
}

impl Idempotency {
    /// An engine on `redlock`, recording on its own nodes ([`RedisStore`],
    /// records kept 24 h), with the default [`IdempotencyPolicy`].
    pub fn new(redlock: Redlock) -> Self {
        let redis = RedisStore::new(redlock.clone());
        Self {
            store: Arc::new(redis.clone()),
            redis: Some(redis),
            redlock,
            policy: Arc::new(IdempotencyPolicy::default()),
        }
    }

    /// Records in `store` instead (for example, the application's database,
    /// written in the transaction of the work's effects).
    #[must_use]
    pub fn store(mut self, store: impl IdempotencyStore) -> Self {
        self.redis = (&store as &dyn std::any::Any)
            .downcast_ref::<RedisStore>()
            .cloned();
        self.store = Arc::new(store);
        self
    }

    /// The policy.
    #[must_use]
    pub fn policy(mut self, policy: IdempotencyPolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// The policy in use.
    pub fn current_policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    /// The lock handle.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// The lookup key of `key` within `scope`, in this policy's namespace.
    pub fn lookup_key(&self, scope: Option<&str>, key: &IdempotencyKey) -> LookupKey {
        LookupKey::new(&self.policy.lock.namespace, scope, key)
    }

    /// Steps 1 to 5 of the flow (see the module docs): the request's `key`
    /// as the adapter found it (`None`: no key), its `scope`, and its parts
    /// with the whole body.
    ///
    /// # Errors
    /// An [`IdempotencyRejection`] to answer with (already logged).
    pub async fn begin(
        &self,
        key: Option<Result<IdempotencyKey, KeyError>>,
        scope: Option<&str>,
        parts: &RequestParts<'_>,
    ) -> Result<Begin, IdempotencyRejection> {
        let result = self.begin_inner(key, scope, parts).await;
        if let Err(rejection) = &result {
            rejection.log();
        }
        result
    }

    async fn begin_inner(
        &self,
        key: Option<Result<IdempotencyKey, KeyError>>,
        scope: Option<&str>,
        parts: &RequestParts<'_>,
    ) -> Result<Begin, IdempotencyRejection> {
        let key = match key {
            None => {
                return match self.policy.lock.missing_key {
                    MissingKeyPolicy::PassThrough => Ok(Begin::PassThrough),
                    MissingKeyPolicy::Reject => Err(IdempotencyRejection::MissingKey),
                };
            }
            Some(key) => key.map_err(IdempotencyRejection::InvalidKey)?,
        };
        if let Some(error) = request::idempotency_needs_the_mutex(self.policy.lock.kind) {
            let rejection = request::Rejection::Misconfigured { error };
            rejection.log();
            return Err(rejection.into());
        }
        if parts.body.len() > self.policy.max_request_body {
            return Err(IdempotencyRejection::BodyTooLarge {
                limit: self.policy.max_request_body,
            });
        }
        let fingerprint = self.policy.fingerprinter.fingerprint(parts);
        let lookup = self.lookup_key(scope, &key);
        // The fast read and the acquire go out together, so a first request
        // pays one round trip for both. The read decides first: a record a
        // quorum vouches for is replayed without the lock (the acquire is
        // dropped, which releases whatever it took), and a busy answer is
        // never given before the read has said there is no record.
        let hash = lookup_hash(&lookup, &self.policy);
        let mut acquire = std::pin::pin!(request::acquire_retained(
            Some(&self.redlock),
            Some(request::RequestKey::One(hash)),
            &self.policy.lock,
            self.fence_retention(),
            false,
        ));
        let mut acquired = None;
        let (record, peeked) = {
            let mut read = std::pin::pin!(async {
                match &self.redis {
                    Some(redis) => {
                        let (record, peeked) = redis.peek(&lookup).await;
                        (Ok(record), Some(peeked))
                    }
                    None => (self.store.get(&lookup).await, None),
                }
            });
            std::future::poll_fn(|cx| {
                if acquired.is_none()
                    && let std::task::Poll::Ready(r) = acquire.as_mut().poll(cx)
                {
                    acquired = Some(r);
                }
                read.as_mut().poll(cx)
            })
            .await
        };
        if let Some(record) = record.ok().flatten() {
            return self.replay(record, fingerprint).map(Begin::Replay);
        }
        let lock = match acquired {
            Some(r) => r,
            None => acquire.await,
        }?;
        let Some(lock) = lock else {
            // Fail-open with the nodes unavailable: run unprotected, as the
            // lock policy says.
            return Ok(Begin::PassThrough);
        };
        let holder = lock.handle();
        // The read under the lock: the fast read's own answers when they
        // were heard under this lock (the common first request), else one
        // more round trip.
        let from_peek = match (peeked, &self.redis) {
            (Some(peeked), Some(redis)) => redis.held_from_peek(peeked, &holder).await,
            _ => None,
        };
        let found = match from_peek {
            Some(found) => found,
            None => self
                .store
                .get_held(&lookup, &holder)
                .await
                .map_err(IdempotencyRejection::Store)?,
        };
        let Some(found) = found else {
            let order = match self.order(&lookup, &holder).await {
                Ok(order) => order,
                Err(error) => {
                    lock.release().await;
                    return Err(IdempotencyRejection::Store(error));
                }
            };
            return Ok(Begin::Run(Running {
                lock,
                lookup,
                fingerprint,
                order,
                store: Arc::clone(&self.store),
                policy: Arc::clone(&self.policy),
            }));
        };
        let mut record = found.record;
        if !found.durable && record.fingerprint == fingerprint {
            // A record on fewer than a quorum of nodes is answered only once
            // it is on a quorum, written again under this lock with this
            // holder's order: a record other nodes may hold (a write that
            // missed its quorum, or one this read did not hear) then never
            // outranks it, and no later holder runs the work again, so the
            // key keeps the answer given now. Otherwise the client gets 503
            // and retries.
            let repaired = match self.order(&lookup, &holder).await {
                Ok(order) => {
                    record.order = order;
                    record.fencing_token = holder.fencing_token();
                    self.store.put(&lookup, &holder, &record).await
                }
                Err(error) => Err(error),
            };
            if let Err(error) = repaired {
                lock.release().await;
                return Err(IdempotencyRejection::Store(error));
            }
        }
        lock.release().await;
        self.replay(record, fingerprint).map(Begin::Replay)
    }

    /// The order of a record `holder` writes for `lookup`: its fencing token,
    /// larger for every later holder; without fencing, the key's generation
    /// from the Redis store (`RedisStore::generation`), which is too. A store
    /// of the user's orders its records itself (by the fencing token, in the
    /// transaction of the work's effects), and gets 1.
    async fn order(
        &self,
        lookup: &LookupKey,
        holder: &crate::guard::LockHandle,
    ) -> Result<u64, super::store::StoreError> {
        match (holder.fencing_token(), &self.redis) {
            (Some(token), _) => Ok(token.get()),
            (None, Some(redis)) => redis.generation(lookup, holder).await,
            (None, None) => Ok(1),
        }
    }

    /// How long a token of a key's lock may still be compared once the lock
    /// is gone, for its Durable fence counter (`LockOptions::fence_retention`):
    /// with the [`RedisStore`], its records' TTL (a record is written only
    /// under the lock key, so it is the last thing that holds a token), or
    /// the policy's retention if longer; with another store, the policy's.
    fn fence_retention(&self) -> Option<std::time::Duration> {
        let record_ttl = self.redis.as_ref()?.record_ttl_now();
        let own = self.policy.lock.options.fence_retention;
        Some(own.map_or(record_ttl, |own| own.max(record_ttl)))
    }

    fn replay(
        &self,
        record: Record,
        fingerprint: Fingerprint,
    ) -> Result<Replay, IdempotencyRejection> {
        if record.fingerprint != fingerprint {
            return Err(IdempotencyRejection::Mismatch);
        }
        match record.outcome {
            Outcome::Replayable { headers, body } => Ok(Replay {
                status: record.status,
                headers,
                body,
            }),
            Outcome::NotReplayable => Err(IdempotencyRejection::NotReplayable {
                status: self.policy.not_replayable_status,
                original: record.status,
            }),
        }
    }
}

/// The part of the lookup key after the namespace: what
/// [`request::acquire`] puts the policy's namespace before.
fn lookup_hash(lookup: &LookupKey, policy: &IdempotencyPolicy) -> String {
    let resource = lookup.resource();
    resource
        .strip_prefix(&*policy.lock.namespace)
        .unwrap_or(resource)
        .to_owned()
}
