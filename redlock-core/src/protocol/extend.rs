//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! The distlock page's extension: compare-and-pexpire on every node at once,
//! counted only with a quorum inside the current validity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tracing::Instrument;

use crate::error::{Error, NodeError, NodeStatus, Report};
use crate::node::{Call, EXTEND, EXTEND_READER, parse_flag};
use crate::protocol::fan_out::{Fan, Settled};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::{instant_after, validity};

/// What one extend found once it was decided.
pub(crate) struct Extended {
    /// When the outcome was decided.
    pub(crate) now: Instant,
    /// How many nodes extended the key.
    pub(crate) ok: usize,
    /// How many nodes no longer held this lock's token.
    pub(crate) not_held: usize,
    /// The validity the new TTL leaves (`ttl - elapsed - drift`); `None` when
    /// nothing is left.
    pub(crate) validity: Option<Duration>,
    /// Every node's outcome.
    pub(crate) report: Report,
    /// Per node: `Some(true)` extended, `Some(false)` answered without
    /// extending, `None` no answer (its `PEXPIRE` may still land).
    pub(crate) nodes: Vec<Option<bool>>,
}

/// What one node's settled answer says of an extend: see [`Extended::nodes`].
pub(crate) fn answered<T>(
    settled: Option<&Settled<T>>,
    extended: impl FnOnce(&T) -> bool,
) -> Option<bool> {
    match &settled?.result {
        Ok(reply) => Some(extended(reply)),
        Err(NodeError::WrongType { .. }) => Some(false),
        Err(_) => None,
    }
}

impl Core {
    /// Spec step "extend": compare-and-pexpire to `ttl` on every node at once. It
    /// counts only if a quorum agrees before the current validity ends; the new
    /// validity is then `ttl - elapsed - drift` from the call's start.
    ///
    /// # Errors
    /// [`Error::Expired`] if the validity already ran out, [`Error::NotHeld`] when
    /// the key is gone from too many nodes, [`Error::NoQuorum`] when nodes failed,
    /// [`Error::ExtensionLimit`], or a TTL error (a zero TTL is refused before
    /// sending: `PEXPIRE 0` would delete the key).
    pub(crate) async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        self.extend_before(lock, ttl, None).await.0
    }

    /// [`Redlock::extend`], and when its verdict was decided. With a
    /// `deadline` (a renewal's: its holder's, the validity less the loss
    /// margin), it counts only if decided before it: the round is given up
    /// there, and answers that come in the same turn as the deadline, or
    /// after it to a task starved past it, make it `Expired` too. The holder
    /// was told "lost" by then, so neither the lock nor the metrics may count
    /// it as an extension.
    pub(crate) async fn extend_before(
        &self,
        lock: &mut Lock,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> (Result<(), Error>, Instant) {
        let start = match self.check_extend(lock, ttl) {
            Ok(start) => start,
            Err(e) => return (Err(e), Instant::now()),
        };
        // A TTL shorter than what is left shortens the keys on every node that
        // applies it, whatever the outcome here (a late answer, a minority): the
        // validity is lowered to what the new TTL allows before anything is sent,
        // and stays lowered if the extend fails.
        lock.valid_until = lock.valid_until.min(self.extend_cap(ttl, start));
        let span = tracing::debug_span!(
            "redlock.extend",
            resource = %lock.resource,
            extension = lock.extensions.saturating_add(1),
            ttl_ms = ttl.as_millis() as u64,
        );
        let round = self.extend_round(lock, ttl, start, &span);
        let extended = match deadline {
            None => Some(round.await),
            Some(deadline) => tokio::time::timeout_at(deadline.into(), round).await.ok(),
        };
        let (result, decided) = match extended {
            Some(extended) => {
                let decided = extended.now;
                let until = deadline.unwrap_or(lock.valid_until);
                (
                    self.apply_extend(lock, ttl, start, extended, until),
                    decided,
                )
            }
            None => {
                // Given up at the deadline: any node's `PEXPIRE` may still land.
                lock.note_unanswered(ttl, &vec![None; self.inner.nodes.len()]);
                (
                    Err(Error::Expired {
                        resource: Arc::clone(&lock.resource),
                    }),
                    Instant::now(),
                )
            }
        };
        self.extended(lock, &result);
        (result, decided)
    }

    /// What follows every extend's verdict, batched or not: the local queue
    /// and the metrics learn it.
    pub(crate) fn extended(&self, lock: &Lock, result: &Result<(), Error>) {
        // The local queue's turn follows the validity: a lock renewed for many
        // TTLs keeps its local waiters queued for the hand-over at its release
        // instead of sending them to contend (and poll) at its first expiry.
        self.inner
            .waiting
            .queues
            .renew(&lock.key, &lock.token, lock.valid_until);
        let outcome = match result {
            Ok(()) => "extended",
            Err(Error::NotHeld { .. }) => "not_held",
            Err(Error::NoQuorum { .. }) => "no_quorum",
            Err(Error::Expired { .. }) => "expired",
            Err(_) => "error",
        };
        crate::metrics::extended(lock.metrics_key(), outcome);
    }

    /// The latest validity an extend to `ttl` sent from `start` on can leave:
    /// the keys that apply it expire `ttl` after it reaches them, so nothing
    /// may count on the lock past `start + ttl - drift`, whatever the outcome.
    pub(crate) fn extend_cap(&self, ttl: Duration, start: Instant) -> Instant {
        validity(ttl, Duration::ZERO, &self.inner.settings)
            .map_or(start, |v| instant_after(start, v))
    }

    /// Checks that `lock` may be extended now, and returns the extend's start:
    /// the TTL is valid, the extension limit is not reached, and the validity
    /// has not run out.
    pub(crate) fn check_extend(&self, lock: &Lock, ttl: Duration) -> Result<Instant, Error> {
        self.check_ttl(ttl)?;
        if let Some(limit) = self.inner.settings.max_extensions
            && lock.extensions >= limit
        {
            return Err(Error::ExtensionLimit {
                resource: Arc::clone(&lock.resource),
                limit,
            });
        }
        let start = Instant::now();
        if start >= lock.valid_until {
            return Err(Error::Expired {
                resource: Arc::clone(&lock.resource),
            });
        }
        Ok(start)
    }

    /// Sends the compare-and-pexpire to every node at once, settles at quorum
    /// (the other nodes' answers are driven in the background), and logs the
    /// outcome in `span`.
    async fn extend_round(
        &self,
        lock: &Lock,
        ttl: Duration,
        start: Instant,
        span: &tracing::Span,
    ) -> Extended {
        let _enter = span.enter();
        let call = Arc::new(match &lock.many {
            // A reader's or a permit's extend also keeps its index or count
            // alive (`rwlock/`, `semaphore/`).
            None if crate::keys::is_reader_key(&lock.key)
                || crate::keys::is_permit_key(&lock.key) =>
            {
                Call::script(
                    &EXTEND_READER,
                    Arc::clone(&lock.key),
                    vec![lock.token.to_string(), ttl.as_millis().to_string()],
                )
            }
            None => Call::script(
                &EXTEND,
                Arc::clone(&lock.key),
                vec![lock.token.to_string(), ttl.as_millis().to_string()],
            ),
            // A node counts only if every key still holds the token there.
            Some(many) => Call::extend_many(many, &lock.token, ttl.as_millis()),
        });
        drop(_enter);
        let mut pending = self.fan_out(&call, parse_flag, 0..self.inner.nodes.len());
        let (ok, not_held, settled) = self.settle_extends(&mut pending, span).await;
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(start);
        // The nodes that have not answered still get their `PEXPIRE`: dropping
        // their calls now could cancel them before they are written (the redis
        // connection skips a request nobody waits for), leaving those keys to
        // expire early and the lock on a bare quorum.
        if !pending.is_empty()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
        let report = self.report(&settled, |&b| {
            if b {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        });
        let validity = validity(ttl, elapsed, &self.inner.settings);
        let nodes = settled
            .iter()
            .map(|s| answered(s.as_ref(), |&b| b))
            .collect();
        span.in_scope(|| tracing::debug!(ok, elapsed_us = elapsed.as_micros() as u64, validity_ms = validity.map(|v| v.as_millis() as u64), report = %report, "extend"));
        Extended {
            now,
            ok,
            not_held,
            validity,
            report,
            nodes,
        }
    }

    /// Collects the extend's answers until a quorum extended the key or no
    /// longer can: `(ok, not_held, settled)`. A key holding a foreign value
    /// counts as not held.
    async fn settle_extends<F>(
        &self,
        pending: &mut Fan<F>,
        span: &tracing::Span,
    ) -> (usize, usize, Vec<Option<Settled<bool>>>)
    where
        F: Future<Output = Settled<bool>>,
    {
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        let (mut ok, mut not_ok, mut not_held) = (0, 0, 0);
        let settled = self
            .settle(pending, |s| {
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
            .instrument(span.clone())
            .await;
        (ok, not_held, settled)
    }

    /// The extend's verdict: with a quorum decided before `until` (the
    /// current validity, or a renewal's earlier deadline), the lock takes the
    /// new validity, counted from `start`; otherwise the error that says why
    /// not.
    pub(crate) fn apply_extend(
        &self,
        lock: &mut Lock,
        ttl: Duration,
        start: Instant,
        extended: Extended,
        until: Instant,
    ) -> Result<(), Error> {
        let Extended {
            now,
            ok,
            not_held,
            validity,
            report,
            nodes,
        } = extended;
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        // An earlier, shorter extend still unanswered on some of the nodes
        // that extended now may land after this one there: the validity is
        // what a quorum keeps even then.
        let kept = lock.quorum_ttl(ttl, &nodes, q);
        let validity = if kept < ttl {
            crate::protocol::steps::validity(
                kept,
                now.saturating_duration_since(start),
                &self.inner.settings,
            )
        } else {
            validity
        };
        lock.note_unanswered(ttl, &nodes);
        match validity {
            Some(v) if ok >= q && now < lock.valid_until.min(until) => {
                lock.started = start;
                lock.valid_until = instant_after(now, v);
                lock.ttl = ttl;
                lock.extensions = lock.extensions.saturating_add(1);
                Ok(())
            }
            _ if ok >= q => Err(Error::Expired {
                resource: Arc::clone(&lock.resource),
            }),
            _ if n - not_held < q => Err(Error::NotHeld {
                resource: Arc::clone(&lock.resource),
                report,
            }),
            _ => Err(Error::NoQuorum {
                resource: Arc::clone(&lock.resource),
                ok,
                quorum: q,
                report,
            }),
        }
    }
}
