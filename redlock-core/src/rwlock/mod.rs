//! A read/write lock over N independent masters (issue 41): any number of
//! readers, or one writer, with writer preference.
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
//! Each reader has a key of its own holding its token with its own expiry,
//! set by the node (`PX`), so a dead reader's share frees itself, and the
//! mutex's release, extension, guard and renewal serve readers unchanged. A
//! writer's key is the resource's lock key: a writer is a mutex holder, with
//! the mutex's fencing token. Readers have no fencing token: they write
//! nothing to fence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire_kind::Acquire;
use crate::error::{Error, NodeStatus};
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
}

impl Names {
    fn new(key: String) -> Self {
        Self {
            // In the writer's slot (`slots`): the scripts touch them with it.
            intent: crate::slots::derived(&key, ":redlock-intent"),
            index: crate::slots::derived(&key, crate::keys::READERS_SUFFIX),
            writer: key.into(),
        }
    }

    fn keys(&self) -> RwKeys<'_> {
        RwKeys {
            writer: &self.writer,
            intent: &self.intent,
            index: &self.index,
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

/// How long a refused writer's intent lives from each of its attempts: past
/// its next attempt, which comes within its policy's longest delay (a poll:
/// the delay and its jitter; a woken waiter: its jitter spread), plus that
/// attempt's round trip, and at least the TTL it asks for. Not the TTL
/// alone: with a TTL under the delay, the intent lapsed between attempts and
/// new readers passed the waiting writer. Each attempt renews it; the writer
/// deletes it once it holds or gives up, so a writer that died waiting holds
/// new readers back for this long at most.
fn intent_ttl(ttl: Duration, retry: &RetryPolicy, node_timeout: Duration) -> Duration {
    retry
        .delay
        .saturating_add(retry.jitter.saturating_mul(2))
        .max(ttl)
        .saturating_add(node_timeout.saturating_mul(2))
        .saturating_add(Duration::from_secs(1))
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
        match access {
            Access::Shared => {
                self.retry_attempts(
                    &names.writer,
                    ttl.key,
                    retry,
                    latest_start,
                    false,
                    |n, _| self.read_attempt(&resource, &names, ttl.key, n),
                )
                .await
            }
            Access::Exclusive => {
                // The writer's id: the same in all its attempts, so that its
                // intent is its own from one attempt to the next.
                let writer_id = new_token()?;
                let intent = intent_ttl(ttl.key, retry, self.inner.settings.node_timeout);
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
                // this writer's, in the background; else it expires.
                let intent = Keys::One(names.intent.as_str().into());
                self.spawn_release(&intent, &writer_id, None);
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

    async fn read_attempt(
        &self,
        resource: &Arc<str>,
        names: &Names,
        ttl: Duration,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let token = new_token()?;
        let reader: Arc<str> = names.reader(&token).into();
        let call = Call::read_acquire(&names.keys(), &reader, &token, ttl.as_millis());
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
