//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! Late answers: acquire calls still on their way when an attempt was decided.
//! A late `OK` joins the lock and is released with it; once the lock is released
//! (or the attempt failed), a late `OK` is released again.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;

use futures_util::StreamExt;
use futures_util::task::AtomicWaker;

use crate::error::NodeError;
use crate::keys::Keys;
use crate::node::{AcquireReply, Call};
use crate::protocol::fan_out::{Fan, Settled, ready_now};
use crate::protocol::redlock::Core;

/// Acquire answers still on their way when the outcome was decided.
pub(crate) type Stragglers<F> = Fan<F>;

/// What the task that drives [`Stragglers`] needs to know about the lock.
#[derive(Default)]
pub(crate) struct Late {
    /// Set when the lock is released (or the attempt failed): a late `OK` must not
    /// outlive it.
    pub(crate) abandoned: AtomicBool,
    /// Set just before a release is sent to every node, pending ones included:
    /// that release's answers then say which late `SET`s it deleted.
    everywhere: AtomicBool,
    /// Bit `i`: that release has come back from node `i` (answered, failed, or
    /// given up), or will never be sent there.
    release_done: AtomicU64,
    /// Bit `i`: ... and node `i` said it deleted this lock's key.
    release_deleted: AtomicU64,
    /// The task driving the late answers, while it waits for a bit above.
    waker: AtomicWaker,
}

/// Nodes beyond the 64 the bits above can name are never judged deleted:
/// their late `OK`s are released again.
const NAMED: usize = u64::BITS as usize;

impl Late {
    /// Marks the lock as released on every node, just before its release is
    /// sent.
    pub(crate) fn releasing_everywhere(&self) {
        self.everywhere.store(true, Ordering::SeqCst);
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// The release sent to every node came back from node `index`; `deleted`:
    /// it deleted this lock's key there.
    pub(crate) fn release_answered(&self, index: usize, deleted: bool) {
        let Some(bit) = 1u64.checked_shl(u32::try_from(index).unwrap_or(u32::MAX)) else {
            return;
        };
        if deleted {
            self.release_deleted.fetch_or(bit, Ordering::SeqCst);
        }
        self.release_done.fetch_or(bit, Ordering::SeqCst);
        self.waker.wake();
    }

    /// The release sent to every node will not come back from any node that
    /// has not answered yet (it could not be sent).
    pub(crate) fn release_never_sent(&self) {
        self.release_done.store(u64::MAX, Ordering::SeqCst);
        self.waker.wake();
    }

    /// The release answers of `release`, as they were when it was decided.
    pub(crate) fn release_answers(&self, settled: &[Option<Settled<bool>>]) {
        for s in settled.iter().flatten() {
            self.release_answered(s.index, matches!(s.result, Ok(true)));
        }
    }

    /// Whether the release sent to every node deleted this lock's key on node
    /// `index`: then a late `SET` there ran before it, and nothing is left of
    /// it. Waits for that node's release answer, which comes once the release
    /// has been sent there. Anything else (no such release, the node said
    /// nothing was deleted, the call failed) means the late `SET` may have
    /// run after the release and must be released again.
    ///
    /// Not judged by the order the calls were first polled in: a `SET` that
    /// found no room on its connection (redis' queue full, a concurrency
    /// limit) goes onto it only when polled again, and the release sent
    /// later may find room first (`algorithm::a_set_overtaken_by_its_release_is_released_again`).
    async fn deleted_by_release(&self, index: usize) -> bool {
        if index >= NAMED || !self.everywhere.load(Ordering::SeqCst) {
            return false;
        }
        let bit = 1u64 << index;
        let done = || {
            (self.release_done.load(Ordering::SeqCst) & bit != 0)
                .then(|| self.release_deleted.load(Ordering::SeqCst) & bit != 0)
        };
        std::future::poll_fn(|cx| {
            if let Some(deleted) = done() {
                return Poll::Ready(deleted);
            }
            self.waker.register(cx.waker());
            match done() {
                Some(deleted) => Poll::Ready(deleted),
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl Core {
    /// Drives the acquire answers that came after the outcome was decided, in a
    /// background task. A late `OK` joins the lock and is released with it; once
    /// the lock is released (or the attempt failed), a late `OK` is released again
    /// unless that release deleted it on its node
    /// ([`Late::deleted_by_release`]). A late error is released too, in case
    /// the `SET` ran. With `quiet` (a failed permit try's, released quietly
    /// itself), a late key is released without announcing it either
    /// (`RELEASE_QUIET`): its waiter would hear its own clean-up (issue 48,
    /// item 3; `model_wake_flag`'s late case).
    pub(crate) fn drive_stragglers<F>(
        &self,
        mut pending: Stragglers<F>,
        late: Option<Arc<Late>>,
        keys: &Keys,
        token: &Arc<str>,
        quiet: bool,
    ) -> Option<Arc<Late>>
    where
        F: Future<Output = Settled<AcquireReply>> + Send + 'static,
    {
        let late = late?;
        // Late errors already in: the `SET` may still land, so they go to the
        // task, which releases them if the lock is released by the time it
        // runs. (A `SET` held up in the network past every release, on a
        // connection since replaced, can still land after them: that key
        // expires with its TTL, the distlock page's delayed-packet case.)
        let mut errors = Vec::new();
        // A held lock whose other answers are in already needs no task: a late
        // answer is acted on only once the lock is released, and an `OK` or a
        // refusal that came back is on the node before that release.
        if !late.abandoned.load(Ordering::SeqCst) {
            errors = ready_now(&mut pending);
            errors.retain(
                |s| matches!(s.result, Err(ref e) if !matches!(e, NodeError::WrongType { .. })),
            );
            if pending.is_empty() && errors.is_empty() {
                return Some(late);
            }
        }
        let (this, state, keys, token) = (
            self.clone(),
            Arc::clone(&late),
            keys.clone(),
            Arc::clone(token),
        );
        self.inner.background.run(async move {
            let mut errors = errors.into_iter();
            loop {
                let s = match errors.next() {
                    Some(s) => s,
                    None => match pending.next().await {
                        Some(s) => s,
                        None => break,
                    },
                };
                if matches!(
                    s.result,
                    Ok(AcquireReply::Busy { .. }) | Err(NodeError::WrongType { .. })
                ) || !state.abandoned.load(Ordering::SeqCst)
                {
                    continue;
                }
                if !state.deleted_by_release(s.index).await {
                    this.release_on(s.index, &keys, &token, quiet).await;
                }
            }
        });
        Some(late)
    }

    /// A background release of one node's late key. Nobody waits on it, so it
    /// gets a longer timeout than a call on the hot path, and one retry: a key it
    /// fails to delete blocks the resource for a whole TTL.
    async fn release_on(&self, index: usize, keys: &Keys, token: &Arc<str>, quiet: bool) {
        let call = match keys {
            Keys::One(key) if quiet => Call::script(
                &crate::node::RELEASE_QUIET,
                Arc::clone(key),
                vec![token.to_string()],
            ),
            _ => Call::release_keys(keys.clone(), Arc::clone(token)),
        };
        let timeout = self.inner.settings.node_timeout.saturating_mul(4);
        for attempt in 1..=2 {
            let (result, _) = self.inner.nodes[index].run(&call, timeout).await;
            tracing::debug!(node = %self.inner.nodes[index].label, attempt, ?result, "late release");
            if result.is_ok() {
                break;
            }
        }
    }
}
