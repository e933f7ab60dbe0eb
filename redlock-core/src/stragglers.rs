//! Late answers: acquire calls still on their way when an attempt was decided.
//! A late `OK` joins the lock and is released with it; once the lock is released
//! (or the attempt failed), a late `OK` is released again.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::StreamExt;

use crate::error::NodeError;
use crate::fan_out::{Fan, Settled, ready_now};
use crate::keys::Keys;
use crate::node::{AcquireReply, Call, Node};
use crate::redlock::Redlock;

/// Acquire answers still on their way when the outcome was decided.
pub(crate) type Stragglers<F> = Fan<F>;

/// What the task that drives [`Stragglers`] needs to know about the lock.
#[derive(Default)]
pub(crate) struct Late {
    /// Set when the lock is released (or the attempt failed): a late `OK` must not
    /// outlive it.
    pub(crate) abandoned: AtomicBool,
    /// Set when the release is about to be sent to every node, pending ones
    /// included: each node's [`Node::sends`] read just before. A late `OK`
    /// is covered by that release if its `SET` was on the connection by then
    /// (numbered at most this) and the release used the same connection.
    released_everywhere: OnceLock<Box<[u64]>>,
}

impl Late {
    /// Marks the lock as released on every node, just before its release is
    /// sent.
    pub(crate) fn releasing_everywhere(&self, nodes: &[Node]) {
        let _ = self
            .released_everywhere
            .set(nodes.iter().map(Node::sends).collect());
        self.abandoned.store(true, Ordering::SeqCst);
    }

    /// Whether the release sent to every node runs after this late `SET` on
    /// its node: the `SET` was on that node's connection before the release
    /// was sent, and the connection is still the one both used. A `SET` that
    /// waited for a connection being opened may go out after a release that
    /// waited for the same one, so that alone is not enough.
    fn covered(&self, s: &Settled<AcquireReply>, node: &Node) -> bool {
        self.released_everywhere.get().is_some_and(|sends| {
            sends
                .get(s.index)
                .is_some_and(|&n| s.sent != 0 && s.sent <= n)
        }) && node.generation() == s.generation
    }
}

impl Redlock {
    /// Drives the acquire answers that came after the outcome was decided, in a
    /// background task. A late `OK` joins the lock and is released with it; once
    /// the lock is released (or the attempt failed), a late `OK` is released again
    /// unless the release already followed it on the same connection
    /// ([`Late::covered`]). A late error
    /// is released too, in case the `SET` ran.
    pub(crate) fn drive_stragglers<F>(
        &self,
        mut pending: Stragglers<F>,
        late: Option<Arc<Late>>,
        keys: &Keys,
        token: &Arc<str>,
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
                if !state.covered(&s, &this.inner.nodes[s.index]) {
                    this.release_on(s.index, &keys, &token).await;
                }
            }
        });
        Some(late)
    }

    /// A background release of one node's late key. Nobody waits on it, so it
    /// gets a longer timeout than a call on the hot path, and one retry: a key it
    /// fails to delete blocks the resource for a whole TTL.
    async fn release_on(&self, index: usize, keys: &Keys, token: &Arc<str>) {
        let call = Call::release_keys(keys.clone(), Arc::clone(token));
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
