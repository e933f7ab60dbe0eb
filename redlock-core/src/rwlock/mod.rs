//! A read/write lock over N independent masters (issue 41): any number of
//! readers, or one writer, taking turns (issue 48).
//!
//! On each node one script decides an acquire atomically
//! (`node/rwlock_scripts.rs`): a reader is admitted while no writer holds
//! or waits; a writer while no writer and no reader holds, and a writer
//! refused leaves its *intent*, which refuses new readers until it holds or
//! gives up. Across nodes it is the mutex's quorum: a reader's majority and a
//! writer's meet on a node, which admitted only one of them; two writers'
//! meet on a node whose writer key holds one token. So a writer never holds
//! together with a reader or another writer, within their validities. Once
//! readers refused a writer on a majority, every reader that comes later is
//! refused on that majority and cannot hold until the writer is done: the
//! writer waits only for the readers that were there
//! (`tests/models/tests/model_rwlock.rs` checks both, with negative controls).
//!
//! Turns: a refused reader that will try again leaves a *mark* (owed the
//! next read phase when a writer key refused it, else behind the waiting
//! writer whose intent did). When the writer key is gone and readers are
//! owed, the next acquire opens a *read phase* for them: while it is open no
//! writer is admitted, and the readers it names are, through the intent.
//! It ends once each of them has held, or at its expiry, the longest of
//! their hand-off windows ([`handoff_window`]). So writers that re-acquire
//! as soon as they release do not starve readers: a reader refused during a
//! writer's hold goes before the next writer, and one that came behind a
//! waiting writer goes after that writer. Neither mark nor phase admits a
//! reader while a writer key is there, and a writer's checks only gain
//! refusals: exclusion does not depend on them
//! (`tests/models/tests/model_rwlock_phase.rs` checks the order with two
//! writers, with today's rule as negative control).
//!
//! Each reader has a key of its own holding its token with its own expiry,
//! set by the node (`PX`), so a dead reader's share frees itself, and the
//! mutex's release, extension, guard and renewal serve readers unchanged. A
//! writer's key is the resource's lock key: a writer is a mutex holder, with
//! the mutex's fencing token. Readers have no fencing token: they write
//! nothing to fence.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::acquire_kind::Acquire;
use crate::error::{Error, NodeError, NodeStatus};
use crate::fencing::fence_key;
use crate::keys::Keys;
use crate::metrics::Of;
use crate::node::{Call, RwKeys};
use crate::protocol::acquire::{Scripted, Ttl};
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::new_token;
use crate::settings::RetryPolicy;

mod inspect;
pub use inspect::{RwInspection, RwState, RwVerdict};

/// Which side of a read/write lock to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A read share: held together with other readers, never with a writer.
    Shared,
    /// The write lock: held alone.
    Exclusive,
}

/// The keys of `key`'s read/write lock besides the writer key (`key`
/// itself): the key, then a suffix each, as the waiters flag's.
struct Names {
    writer: Arc<str>,
    intent: String,
    index: String,
    waiting: String,
    phase: String,
}

impl Names {
    fn new(key: String) -> Self {
        Self {
            // In the writer's slot (`slots`): the scripts touch them with it.
            intent: crate::slots::derived(&key, ":redlock-intent"),
            index: crate::slots::derived(&key, crate::keys::READERS_SUFFIX),
            waiting: crate::slots::derived(&key, ":redlock-readers-waiting"),
            phase: crate::slots::derived(&key, ":redlock-read-phase"),
            writer: key.into(),
        }
    }

    fn keys(&self) -> RwKeys<'_> {
        RwKeys {
            writer: &self.writer,
            intent: &self.intent,
            index: &self.index,
            waiting: &self.waiting,
            phase: &self.phase,
        }
    }

    fn reader(&self, token: &str) -> String {
        crate::slots::derived(
            &self.writer,
            &format!("{}{token}", crate::keys::READER_INFIX),
        )
    }
}

/// A side of a read/write lock, as the shared wrappers take it
/// (`primitive`).
impl Acquire for Access {
    fn of(&self) -> Of {
        match self {
            Access::Shared => Of::Shared,
            Access::Exclusive => Of::Exclusive,
        }
    }

    fn acquire(
        &self,
        redlock: &Core,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
        retained: Option<Duration>,
    ) -> impl Future<Output = Result<Lock, Error>> + Send {
        redlock.rw_lock_with_retries(resource, *self, Ttl::new(ttl, retained), retry)
    }
}

/// How long a refused writer's intent, or a refused reader's mark, lives
/// from each of its attempts: past its next attempt, which comes within its
/// policy's longest delay (a poll: the delay and its jitter; a woken waiter:
/// its jitter spread), plus that attempt's round trip, and at least the TTL
/// it asks for. Not the TTL alone: with a TTL under the delay, the intent
/// lapsed between attempts and new readers passed the waiting writer. Each
/// attempt renews it; the writer deletes its intent once it holds or gives
/// up, so a writer that died waiting holds new readers back for this long
/// at most. A reader's mark goes into the read phase it is owed, or once it
/// holds.
fn wait_mark_ttl(ttl: Duration, retry: &RetryPolicy, node_timeout: Duration) -> Duration {
    retry
        .delay
        .saturating_add(retry.jitter.saturating_mul(2))
        .max(ttl)
        .saturating_add(node_timeout.saturating_mul(2))
        .saturating_add(Duration::from_secs(1))
}

/// How long a read phase opened for a waiting reader stays open for it: its
/// next attempt after the writer key went. Woken by the writer's release,
/// the reader waits a random part of its jitter, sets its waiters flag and
/// tries (two round trips); missing the wake-up, it polls within its delay
/// and jitter, then the same round trips. Writers are refused meanwhile, so
/// the phase ends early once every reader it admits has held; a reader that
/// died or paused costs the writers this window once (its mark went into
/// the phase). A reader that comes later than this finds the next writer's
/// intent and waits behind it: one writer phase more.
fn handoff_window(retry: &RetryPolicy, node_timeout: Duration) -> Duration {
    retry
        .delay
        .saturating_add(retry.jitter)
        .saturating_add(node_timeout.saturating_mul(2))
}

impl Core {
    async fn rw_lock_with_retries(
        &self,
        resource: &str,
        access: Access,
        ttl: Ttl,
        retry: &RetryPolicy,
    ) -> Result<Lock, Error> {
        self.check_resource(resource)?;
        self.check_ttl(ttl.key)?;
        let resource: Arc<str> = resource.into();
        let names = Names::new(self.key_for(&resource));
        let latest_start = self.latest_start(retry, Instant::now());
        let node_timeout = self.inner.settings.node_timeout;
        match access {
            Access::Shared => {
                // The reader's id: the same in all its attempts, so that its
                // mark and its place in a read phase are its own.
                let reader_id = new_token()?;
                let mark = if retry.max_attempts > 1 {
                    wait_mark_ttl(ttl.key, retry, node_timeout)
                } else {
                    Duration::ZERO
                };
                let wait = (handoff_window(retry, node_timeout), mark);
                let refused = AtomicBool::new(false);
                let result = self
                    .retry_attempts(
                        &names.writer,
                        ttl.key,
                        retry,
                        latest_start,
                        false,
                        |n, _| {
                            if n > 1 {
                                refused.store(true, Ordering::Relaxed);
                            }
                            self.read_attempt(&resource, &names, ttl.key, (&reader_id, wait), n)
                        },
                    )
                    .await;
                // A reader that waited holds or gives up: its marks and its
                // place in a read phase go (the phase may end now), in the
                // background; lost, they expire. Left behind by a reader
                // that gave up, a mark opened a read phase for nobody, and
                // writers were refused for its whole window.
                // (An attempt refused leaves a mark, so one that failed did.)
                if !mark.is_zero() && (result.is_err() || refused.load(Ordering::Relaxed)) {
                    self.spawn_on_every_node(Call::reader_held(&names.keys(), &reader_id));
                }
                result
            }
            Access::Exclusive => {
                // The writer's id: the same in all its attempts, so that its
                // intent is its own from one attempt to the next.
                let writer_id = new_token()?;
                let intent = wait_mark_ttl(ttl.key, retry, node_timeout);
                let result = self
                    .retry_attempts(
                        &names.writer,
                        ttl.key,
                        retry,
                        latest_start,
                        false,
                        |n, _| self.write_attempt(&resource, &names, (ttl, intent), &writer_id, n),
                    )
                    .await;
                // Held or given up: the intent has done its work (a holder's
                // key keeps readers out itself). Deleted where it is still
                // this writer's, in the background; else it expires. A
                // holder also makes the readers marked behind any intent
                // owed: they waited through its phase.
                let intent = Keys::One(names.intent.as_str().into());
                if result.is_ok() {
                    self.spawn_on_every_node(Call::writer_held(&names.keys(), &writer_id));
                } else {
                    self.spawn_release(&intent, &writer_id, None);
                }
                // A node the last attempt had not answered by its decision
                // may run that attempt's script after this release (its call
                // goes out when next polled), and a refused script leaves the
                // intent again: it would hold readers back for its whole TTL.
                // Such a call is driven for one node timeout at most, so the
                // intent is deleted once more after that.
                let unanswered = match &result {
                    Ok(lock) => lock.late.is_some(),
                    Err(e) => e.report().is_some_and(|r| {
                        r.nodes
                            .iter()
                            .any(|n| matches!(n.status, NodeStatus::Pending))
                    }),
                };
                if unanswered && let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let (this, writer_id) = (self.clone(), Arc::clone(&writer_id));
                    let after = self.inner.settings.node_timeout;
                    rt.spawn(async move {
                        tokio::time::sleep(after).await;
                        this.spawn_release(&intent, &writer_id, None);
                    });
                }
                result
            }
        }
    }

    /// Runs `call` on every node in the background, answers unread: what a
    /// holder tells the nodes of the turns (`WRITER_HELD_LUA`,
    /// `READER_HELD_LUA`). Lost, it costs the others a wait bounded by the
    /// keys' expiry, never exclusion.
    fn spawn_on_every_node(&self, call: Call) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        rt.spawn(async move {
            let call = Arc::new(call);
            let ignore = |_: redis::Value| -> Result<(), NodeError> { Ok(()) };
            let mut pending = this.fan_out(&call, ignore, 0..this.inner.nodes.len());
            this.settle(&mut pending, |_| false).await;
        });
    }

    async fn read_attempt(
        &self,
        resource: &Arc<str>,
        names: &Names,
        ttl: Duration,
        (reader_id, (window, mark)): (&str, (Duration, Duration)),
        attempt: u32,
    ) -> Result<Lock, Error> {
        let token = new_token()?;
        let reader: Arc<str> = names.reader(&token).into();
        let call = Call::read_acquire(
            &names.keys(),
            &reader,
            &token,
            ttl.as_millis(),
            reader_id,
            (window.as_millis(), mark.as_millis()),
        );
        let target = Scripted {
            key: reader,
            fenced: false,
        };
        self.attempt_scripted(resource, target, token, Ttl::new(ttl, None), call, attempt)
            .await
    }

    async fn write_attempt(
        &self,
        resource: &Arc<str>,
        names: &Names,
        (ttl, intent): (Ttl, Duration),
        writer_id: &str,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let token = new_token()?;
        let fence = self
            .inner
            .settings
            .fencing
            .map(|_| fence_key(&names.writer));
        let ttl_ms = ttl.key.as_millis();
        let call = Call::write_acquire(
            &names.keys(),
            &token,
            ttl_ms,
            writer_id,
            intent.as_millis(),
            fence.as_deref(),
        );
        let target = Scripted {
            key: Arc::clone(&names.writer),
            fenced: true,
        };
        self.attempt_scripted(resource, target, token, ttl, call, attempt)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A read phase stays open past its reader's next attempt: a poll (its
    /// delay and jitter), then its flag's and its attempt's round trips.
    #[test]
    fn a_read_phase_outlasts_its_readers_next_attempt() {
        let retry = RetryPolicy::deadline(MS * 10_000)
            .with_delay(MS * 100)
            .with_jitter(MS * 100);
        assert_eq!(handoff_window(&retry, MS * 50), MS * 300);
        // A mark outlives the window: the reader is owed until its phase.
        assert!(wait_mark_ttl(MS * 50, &retry, MS * 50) > handoff_window(&retry, MS * 50));
    }

    /// Every key of the turns is in the writer key's cluster slot (its
    /// braced tag), as the scripts need.
    #[test]
    fn the_turns_keys_share_the_writers_slot() {
        for key in [
            crate::slots::lock_key("app:", "reports/7"),
            crate::slots::lock_key("", "a{b}c"),
        ] {
            let tag = crate::slots::tagged(&key).into_owned();
            let names = Names::new(key);
            for derived in [&names.intent, &names.index, &names.waiting, &names.phase] {
                assert!(derived.starts_with(&tag), "{derived} is not under {tag}");
            }
        }
    }
}
