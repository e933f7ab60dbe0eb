//! A semaphore over N independent masters: at most `permits` holders of a
//! resource at once (issue 41).
//!
//! A per-node count is not enough: with 2 permits on nodes A, B, C, holders
//! x, y, z can each hold a majority (A admits {x, y}, B {y, z}, C {x, z}).
//! So a permit is a *slot*, and each slot is a Redlock mutex of its own, on
//! the resource's key followed by `:redlock-permit:<slot>`. Safety is the
//! mutex's, slot by slot: at most one holder per slot within its validity,
//! and `permits` slots; a holder holds exactly one slot
//! (`tests/models/tests/model_semaphore.rs` checks both rules). Every step after the
//! slot is chosen (acquire, validity, release of a failed attempt, guard and
//! batched renewal, fencing) is the mutex's, on the slot's key.
//!
//! Which slot: an attempt starts at a random slot and tries the others in
//! turn, each a whole mutex attempt. The slot is named by the client, so all
//! nodes are asked for the same one: without contention the first try
//! succeeds on every node; two clients that ask for one slot at once behave
//! as two mutex contenders (one wins, or neither and both move on).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::acquire_kind::Acquire;
use crate::error::{Error, NodeError, NodeStatus, Report};
use crate::fencing::fence_key;
use crate::metrics::Of;
use crate::node::Call;
use crate::protocol::acquire::{Scripted, Ttl};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::new_token;
use crate::settings::RetryPolicy;

mod inspect;
pub use inspect::{PermitsInspection, PermitsVerdict};

/// The most permits one semaphore may have: each is a slot an attempt may
/// try in turn, one round trip each.
pub const MAX_PERMITS: u32 = 64;

/// The key of slot `slot` of the semaphore whose resource key is `key`:
/// `{tag}:redlock-permit:<slot>` (`slots`), in the resource's cluster slot,
/// and announcing its release on the resource's channel.
pub(crate) fn permit_key(key: &str, slot: u32) -> String {
    crate::slots::derived(key, &format!(":redlock-permit:{slot}"))
}

/// A semaphore of this many permits, as the shared wrappers take it
/// (`primitive`).
pub(crate) struct Permits(pub(crate) u32);

impl Acquire for Permits {
    fn of(&self) -> Of {
        Of::Permit
    }

    fn acquire(
        &self,
        redlock: &Core,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> impl Future<Output = Result<Lock, Error>> + Send {
        redlock.permit_with_retries(resource, self.0, Ttl::new(ttl, retained), retry)
    }
}

impl Core {
    async fn permit_with_retries(
        &self,
        resource: &str,
        permits: u32,
        ttl: Ttl,
        retry: &RetryPolicy,
    ) -> Result<Lock, Error> {
        self.check_resource(resource)?;
        self.check_ttl(ttl.key)?;
        check_permits(permits)?;
        let resource: Arc<str> = resource.into();
        let key = self.key_for(&resource);
        let latest_start = self.latest_start(retry, Instant::now());
        let tries = Mutex::new(Vec::new());
        self.retry_slots(
            &key,
            ttl.key,
            retry,
            latest_start,
            &tries,
            |attempt, flag| {
                let flag = flag.map(|f: crate::wait::Flag| f.ttl);
                self.permit_attempt(&resource, &key, permits, ttl, (attempt, flag), &tries)
            },
        )
        .await
    }

    /// One attempt: the slots in turn from a random one, each a whole mutex
    /// attempt by the permit script (which checks and keeps the semaphore's
    /// count first, and for a subscribed waiter sets the resource's waiters
    /// flag for `flag`, in the same step), until one is held. Fails with
    /// the soonest `Busy` if any slot was busy, else with the last error;
    /// with [`Error::PermitsMismatch`] at once if a node keeps another
    /// count. Each slot's report goes in `tries`, for the wait that follows
    /// (a release that frees any of them is news).
    async fn permit_attempt(
        &self,
        resource: &Arc<str>,
        key: &str,
        permits: u32,
        ttl: Ttl,
        (attempt, flag): (u32, Option<Duration>),
        tries: &Mutex<Vec<Report>>,
    ) -> Result<Lock, Error> {
        tries.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let first = rand::rng().random_range(0..permits);
        let mut busy: Option<Error> = None;
        let mut last = None;
        for i in 0..permits {
            let slot = (first + i) % permits;
            let slot_key: Arc<str> = permit_key(key, slot).into();
            let tried = self
                .slot_attempt(resource, &slot_key, permits, ttl, attempt, flag)
                .await;
            if let Err(e) = &tried
                && let Some(report) = e.report()
            {
                tries
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(report.clone());
            }
            match tried {
                Ok(lock) => return Ok(lock),
                Err(e) if mismatch(&e).is_some() => {
                    let found = mismatch(&e).unwrap_or_default();
                    let report = e.report().cloned().unwrap_or_default();
                    return Err(Error::PermitsMismatch {
                        resource: Arc::clone(resource),
                        asked: permits,
                        found,
                        report,
                    });
                }
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e @ Error::Busy { .. }) => busy = Some(sooner(busy, e)),
                Err(e) => last = Some(e),
            }
        }
        match (busy, last) {
            (Some(e), _) | (None, Some(e)) => Err(e),
            (None, None) => Err(Error::InvalidConfig("no permit slot".into())),
        }
    }
}

impl Core {
    /// One slot's attempt: the permit script on every node, then the
    /// mutex's steps on the slot's key ([`Redlock::attempt_scripted`]).
    async fn slot_attempt(
        &self,
        resource: &Arc<str>,
        slot_key: &Arc<str>,
        permits: u32,
        ttl: Ttl,
        attempt: u32,
        flag: Option<Duration>,
    ) -> Result<Lock, Error> {
        let token = new_token()?;
        let count = crate::slots::derived(slot_key, crate::keys::PERMITS_SUFFIX);
        let flag_key = crate::keys::waiters_flag(slot_key);
        let flag_ms = flag.map_or(0, |f| {
            u64::try_from(f.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        let fence = self.inner.settings.fencing.map(|_| fence_key(slot_key));
        let call = Call::permit_acquire(
            slot_key,
            &count,
            (&token, ttl.key.as_millis()),
            permits,
            (&flag_key, flag_ms),
            fence.as_deref(),
        );
        let target = Scripted {
            key: Arc::clone(slot_key),
            fenced: true,
        };
        self.attempt_scripted(resource, target, token, ttl, call, attempt)
            .await
    }
}

/// The count a node keeps for the semaphore, when `e` says one refused the
/// attempt for another.
fn mismatch(e: &Error) -> Option<String> {
    e.report()?.nodes.iter().find_map(|n| match &n.status {
        NodeStatus::Failed(NodeError::PermitsMismatch { found }) => Some(found.clone()),
        _ => None,
    })
}

/// `permits` within 1 to [`MAX_PERMITS`].
pub(crate) fn check_permits(permits: u32) -> Result<(), Error> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::InvalidConfig(format!(
            "permits must be 1 to {MAX_PERMITS}, not {permits}"
        )));
    }
    Ok(())
}

/// Of two `Busy` errors, the one whose slot frees first (a known time wins
/// over an unknown one).
fn sooner(a: Option<Error>, b: Error) -> Error {
    match a {
        Some(a) => match (a.retry_after(), b.retry_after()) {
            (Some(x), Some(y)) if y < x => b,
            (None, Some(_)) => b,
            _ => a,
        },
        None => b,
    }
}
