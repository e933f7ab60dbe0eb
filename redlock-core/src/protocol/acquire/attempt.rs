//! One acquire attempt after its `SET`s are sent: settle at quorum, fence,
//! judge validity, and release what a failed attempt took.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::{Error, NodeStatus};
use crate::fencing::FencingToken;
use crate::keys::Keys;
use crate::node::AcquireReply;
use crate::protocol::fan_out::Settled;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::{instant_after, validity};
use crate::protocol::stragglers::{Late, Stragglers};

/// Releases an attempt's keys on every node if the attempt's future is dropped
/// before it returns: a caller that goes away mid-acquire (a client gone while
/// its request waits, a timeout around `lock`) must not leave a lock that nobody
/// holds for a whole TTL. The release goes over the same per-node connections as
/// the `SET`s, after them.
pub(super) struct ReleaseOnDrop<'a> {
    pub(super) redlock: &'a Core,
    pub(super) keys: Keys,
    pub(super) token: Arc<str>,
    pub(super) armed: bool,
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.redlock.spawn_release(&self.keys, &self.token, None);
        }
    }
}

/// One acquire attempt from the moment its `SET`s are sent: what its later steps
/// share.
pub(super) struct Attempt<'a> {
    pub(super) redlock: &'a Core,
    pub(super) resource: &'a Arc<str>,
    pub(super) key: &'a Arc<str>,
    /// The attempt's fresh token (spec step 1).
    pub(super) token: Arc<str>,
    pub(super) ttl: Duration,
    /// The expiry the fence gives a per-request resource's Durable counter.
    pub(super) retained: Option<Duration>,
    /// When the `SET`s were sent: the validity counts from here.
    pub(super) start: Instant,
    /// Armed until the attempt is decided, so that dropping it mid-way releases
    /// its keys.
    pub(super) cleanup: ReleaseOnDrop<'a>,
    /// Whether a fencing handle fences this attempt (not a reader's).
    pub(super) fenced: bool,
}

/// What an attempt's `SET`s (and the fence phase of a fencing lock) found.
pub(super) struct Round {
    /// How many nodes said OK.
    pub(super) ok: usize,
    /// The answers that came before the outcome was decided, in node order.
    pub(super) settled: Vec<Option<Settled<AcquireReply>>>,
    /// The time since the `SET`s were sent, to the end of the last phase.
    pub(super) elapsed: Duration,
    /// The validity left (spec step 3); `None` when nothing is.
    pub(super) validity: Option<Duration>,
    /// The fencing token (`None` without fencing), or why the fence phase failed.
    pub(super) fencing: Result<Option<FencingToken>, Error>,
    /// A fenced multi-resource lock's tokens, one per key in key order
    /// (`fencing` holds the first); empty otherwise.
    pub(super) fencing_all: Vec<FencingToken>,
}

impl Round {
    /// The validity and fencing token of an attempt that holds the lock: a
    /// quorum said OK, validity is left, and no fence phase failed.
    pub(super) fn held(&self, quorum: usize) -> Option<(Duration, Option<FencingToken>)> {
        match (self.ok >= quorum, self.validity, &self.fencing) {
            (true, Some(validity), Ok(fencing_token)) => Some((validity, *fencing_token)),
            _ => None,
        }
    }
}

impl<'a> Attempt<'a> {
    /// The attempt whose `SET`s for `keys` with `token` were sent at
    /// `start`, armed to release them if dropped before it is decided.
    pub(super) fn new(
        redlock: &'a Core,
        resource: &'a Arc<str>,
        key: &'a Arc<str>,
        keys: Keys,
        token: Arc<str>,
        ttl: super::Ttl,
        start: Instant,
    ) -> Self {
        Attempt {
            redlock,
            resource,
            key,
            ttl: ttl.key,
            retained: ttl.retained,
            start,
            cleanup: ReleaseOnDrop {
                redlock,
                keys,
                token: Arc::clone(&token),
                armed: true,
            },
            token,
            fenced: true,
        }
    }
}

impl Attempt<'_> {
    /// Spec step 3's count: collects the `SET` answers until a quorum said OK or
    /// no longer can, and the validity that leaves.
    pub(super) async fn settle_sets<F>(&self, pending: &mut Stragglers<F>) -> Round
    where
        F: Future<Output = Settled<AcquireReply>>,
    {
        let (n, q) = (self.redlock.inner.nodes.len(), self.redlock.inner.quorum);
        let (mut ok, mut not_ok) = (0, 0);
        let settled = self
            .redlock
            .settle(pending, |s| {
                if s.result.as_ref().is_ok_and(AcquireReply::acquired) {
                    ok += 1;
                } else {
                    not_ok += 1;
                }
                ok >= q || n - not_ok < q
            })
            .await;
        let elapsed = self.start.elapsed();
        Round {
            ok,
            settled,
            elapsed,
            validity: validity(self.ttl, elapsed, &self.redlock.inner.settings),
            fencing: Ok(None),
            fencing_all: Vec::new(),
        }
    }

    /// A fencing lock counts as held only once its token is fenced on a quorum
    /// within the validity: one more round trip, after a quorum with validity
    /// left. Its elapsed time and validity then replace those of the `SET`s.
    pub(super) async fn fence(&self, round: &mut Round) {
        let settings = &self.redlock.inner.settings;
        let (true, true, Some(_), Some(mode)) = (
            self.fenced,
            round.ok >= self.redlock.inner.quorum,
            round.validity,
            settings.fencing,
        ) else {
            return;
        };
        if let Keys::Many(many) = &self.cleanup.keys {
            return self.fence_many(many, mode, round).await;
        }
        round.fencing = self
            .redlock
            .fence_phase(
                self.resource,
                self.key,
                &self.token,
                mode,
                &round.settled,
                self.start,
                self.ttl,
                self.retained,
                0,
            )
            .await
            .map(|f| {
                round.elapsed = f.elapsed;
                round.validity = Some(f.validity);
                Some(f.token)
            });
    }

    /// Spec steps 3 and 4 once the `SET`s are sent: settle at quorum, fence,
    /// then the lock, or the release of the failed attempt. Shared by the
    /// single- and multi-resource acquires, which differ only in the call.
    pub(super) async fn run<F>(self, mut pending: Stragglers<F>) -> Result<Lock, Error>
    where
        F: Future<Output = Settled<AcquireReply>> + Send + 'static,
    {
        let mut round = self.settle_sets(&mut pending).await;
        self.fence(&mut round).await;
        let late = (!pending.is_empty()).then(|| Arc::new(Late::default()));
        let span = tracing::Span::current();
        span.record("elapsed_us", round.elapsed.as_micros() as u64);
        span.record("ok", round.ok);
        match round.held(self.redlock.inner.quorum) {
            Some((validity, fencing_token)) => {
                span.record("validity_ms", validity.as_millis() as u64);
                Ok(self.into_lock(pending, late, &round, validity, fencing_token))
            }
            None => Err(self.release_failed(pending, late, round).await),
        }
    }

    /// The lock of an attempt that holds it. The `SET`s still on their way join
    /// it (see [`Redlock::drive_stragglers`]).
    pub(super) fn into_lock<F>(
        mut self,
        pending: Stragglers<F>,
        late: Option<Arc<Late>>,
        round: &Round,
        validity: Duration,
        fencing_token: Option<FencingToken>,
    ) -> Lock
    where
        F: Future<Output = Settled<AcquireReply>> + Send + 'static,
    {
        let redlock = self.redlock;
        tracing::debug!(report = %redlock.report(&round.settled, acquire_status), "acquired");
        // From here the `Lock` (and its `Drop`) owns the release.
        self.cleanup.armed = false;
        let late = redlock.drive_stragglers(pending, late, &self.cleanup.keys, &self.token, false);
        // Labelled by the resource's lock key, as the lock's other metrics
        // (`Lock::metrics_key`): a permit's slot key is not a label of its own.
        let label = redlock
            .has_metrics_key()
            .then(|| redlock.metrics_key(&redlock.key_for(self.resource)))
            .flatten();
        crate::metrics::held(label, None);
        Lock {
            redlock: redlock.clone(),
            resource: Arc::clone(self.resource),
            key: Arc::clone(self.key),
            token: self.token,
            started: self.start,
            valid_until: instant_after(self.start, round.elapsed.saturating_add(validity)),
            ttl: self.ttl,
            extensions: 0,
            late,
            released: false,
            fencing_token,
            acquired_at: Some(Instant::now()),
            many: match &self.cleanup.keys {
                Keys::Many(many) => Some(Arc::clone(many)),
                Keys::One(_) => None,
            },
            fencing_tokens: round.fencing_all.clone(),
            unanswered: Vec::new(),
            gauged: None,
        }
    }

    /// Spec step 4: a failed attempt is released wherever it may have landed:
    /// now on the nodes that answered, and on the others as their answers come.
    /// Returns why it failed.
    pub(super) async fn release_failed<F>(
        mut self,
        pending: Stragglers<F>,
        late: Option<Arc<Late>>,
        round: Round,
    ) -> Error
    where
        F: Future<Output = Settled<AcquireReply>> + Send + 'static,
    {
        let redlock = self.redlock;
        if let Some(late) = &late {
            late.abandoned.store(true, Ordering::SeqCst);
        }
        // A permit slot's attempt that took fewer nodes than a quorum: the
        // key never held the slot, and its release wakes nobody
        // (`RELEASE_QUIET`), nor does the release of its late answers: the
        // waiter would hear either as a release on another slot's busy node
        // (issue 48, item 3; `model_wake_flag`). A mutex's clean-up
        // still announces itself: a waiter it refused retries at once
        // instead of at its delay, which the fault suite's contended
        // workloads rely on (with every clean-up quiet, its sets were not
        // taken once in three loaded runs).
        let quiet = round.ok < redlock.inner.quorum
            && matches!(&self.cleanup.keys, Keys::One(k) if crate::keys::is_permit_key(k));
        redlock.drive_stragglers(pending, late, &self.cleanup.keys, &self.token, quiet);
        let report = redlock.report(&round.settled, acquire_status);
        redlock
            .unlock_all_as(&self.cleanup.keys, &self.token, Some(&report), None, quiet)
            .await;
        self.cleanup.armed = false;
        tracing::debug!(report = %report, "attempt failed");
        match round.fencing {
            Err(e) => e,
            Ok(_) => {
                redlock.acquire_error(self.resource, round.ok, round.elapsed, self.ttl, report)
            }
        }
    }
}

pub(super) fn acquire_status(r: &AcquireReply) -> NodeStatus {
    match r {
        AcquireReply::Acquired { .. } | AcquireReply::AcquiredMany { .. } => NodeStatus::Ok,
        AcquireReply::Busy { pttl_ms } => NodeStatus::Busy {
            pttl: u64::try_from(*pttl_ms).ok().map(Duration::from_millis),
        },
    }
}
