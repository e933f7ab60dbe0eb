//! A semaphore over N independent masters: at most `permits` holders of a
//! resource at once (issue 41).
//!
//! A per-node count is not enough: with 2 permits on nodes A, B, C, holders
//! x, y, z can each hold a majority (A admits {x, y}, B {y, z}, C {x, z}).
//! So a permit is a *slot*, and each slot is a Redlock mutex of its own, on
//! the resource's key followed by `:redlock-permit:<slot>`. Safety is the
//! mutex's, slot by slot: at most one holder per slot within its validity,
//! and `permits` slots; a holder holds exactly one slot
//! (`tests/tests/model_semaphore.rs` checks both rules). Every step after the
//! slot is chosen (acquire, validity, release of a failed attempt, guard and
//! batched renewal, fencing) is the mutex's, on the slot's key.
//!
//! Which slot: an attempt starts at a random slot and tries the others in
//! turn, each a whole mutex attempt. The slot is named by the client, so all
//! nodes are asked for the same one: without contention the first try
//! succeeds on every node; two clients that ask for one slot at once behave
//! as two mutex contenders (one wins, or neither and both move on).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::acquire_kind::Acquire;
use crate::error::Error;
use crate::metrics::Of;
use crate::protocol::acquire::Ttl;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Redlock;
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

impl Redlock {}

/// A semaphore of this many permits, as the shared wrappers take it
/// (`primitive`).
pub(crate) struct Permits(pub(crate) u32);

impl Acquire for Permits {
    fn of(&self) -> Of {
        Of::Permit
    }

    fn acquire(
        &self,
        redlock: &Redlock,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> impl Future<Output = Result<Lock, Error>> + Send {
        redlock.permit_with_retries(resource, self.0, Ttl::new(ttl, retained), retry)
    }
}

impl Redlock {
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
        self.retry_attempts(&key, ttl.key, retry, latest_start, true, |attempt, flag| {
            self.permit_attempt(&resource, &key, permits, ttl, attempt, flag)
        })
        .await
    }

    /// One attempt: the slots in turn from a random one, each a whole mutex
    /// attempt (a subscribed waiter's sets the resource's waiters flag for
    /// `flag` first, in the same round trip), until one is held. Fails with
    /// the soonest `Busy` if any slot was busy, else with the last error.
    async fn permit_attempt(
        &self,
        resource: &Arc<str>,
        key: &str,
        permits: u32,
        ttl: Ttl,
        attempt: u32,
        flag: Option<Duration>,
    ) -> Result<Lock, Error> {
        let first = rand::rng().random_range(0..permits);
        let mut busy: Option<Error> = None;
        let mut last = None;
        for i in 0..permits {
            let slot = (first + i) % permits;
            let slot_key: Arc<str> = permit_key(key, slot).into();
            match self
                .attempt_flagged(resource, &slot_key, ttl, attempt, flag)
                .await
            {
                Ok(lock) => return Ok(lock),
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
