//! Spec step 2: one call sent to every node at once, each under the node
//! timeout, and the answers collected until the outcome is decided.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::Value;

use crate::error::{NodeError, NodeOutcome, NodeStatus, Report};
use crate::node::Call;
use crate::redlock::{Inner, Redlock};

/// One node's settled answer within a fan-out.
pub(crate) struct Settled<T> {
    pub(crate) index: usize,
    pub(crate) latency: Duration,
    /// The node's connection generation the call was sent on.
    pub(crate) generation: u64,
    /// The call's number among the node's sends (see [`crate::node::Ran`]).
    pub(crate) sent: u64,
    pub(crate) result: Result<T, NodeError>,
}

/// One node's call, boxed: for a set of calls kept in a struct, where the
/// call's own type cannot be named.
pub(crate) type NodeFuture<T> = Pin<Box<dyn Future<Output = Settled<T>> + Send>>;

/// Polls every call of `pending` once, so that each node's command is on its
/// connection (over a connection already open) when this returns: what is
/// sent after it on the same connection runs after it on the node. Returns
/// the answers that came at once (a node that failed without a round trip).
pub(crate) async fn send_now<T, F>(pending: &mut FuturesUnordered<F>) -> Vec<Settled<T>>
where
    F: Future<Output = Settled<T>>,
{
    std::future::poll_fn(|cx| {
        let mut ready = Vec::new();
        // `FuturesUnordered` polls each new call once per pass, and returns
        // early only with an answer: loop until it has nothing more at once.
        while let Poll::Ready(Some(s)) = pending.poll_next_unpin(cx) {
            ready.push(s);
        }
        Poll::Ready(ready)
    })
    .await
}

/// The answers of `pending` that are in already, without waiting: what is
/// left after them may need a task to drive it, and often nothing is left.
pub(crate) fn ready_now<T, F>(pending: &mut FuturesUnordered<F>) -> Vec<Settled<T>>
where
    F: Future<Output = Settled<T>>,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut ready = Vec::new();
    if pending.is_empty() {
        return ready;
    }
    // A call still waiting keeps its own wake-up registered with the set; the
    // task that drives the rest later polls the set with a real waker.
    while let Poll::Ready(Some(s)) = pending.poll_next_unpin(&mut cx) {
        ready.push(s);
    }
    ready
}

/// Node `index`'s call, under `timeout`, its reply read by `parse`.
async fn node_call<T>(
    inner: Arc<Inner>,
    call: Arc<Call>,
    index: usize,
    timeout: Duration,
    parse: fn(Value) -> Result<T, NodeError>,
) -> Settled<T> {
    let node = &inner.nodes[index];
    // The connection the call went out on: a call sent while the node had
    // none yet goes out on the one opened for it.
    let before = node.generation();
    let ran = node.run_on(&call, timeout).await;
    let result = ran.result.and_then(parse);
    if let Err(e) = &result {
        crate::metrics::node_error(&node.label, e);
    }
    Settled {
        index,
        latency: ran.latency,
        generation: ran.generation.unwrap_or(before),
        sent: ran.sent,
        result,
    }
}

impl Redlock {
    /// Spec step 2: sends `call` to the given nodes at once, each under the node
    /// timeout. The set holds each call in place (one allocation per call, the
    /// set's own), without a box of its own.
    pub(crate) fn fan_out<T, I>(
        &self,
        call: &Arc<Call>,
        parse: fn(Value) -> Result<T, NodeError>,
        nodes: I,
    ) -> FuturesUnordered<impl Future<Output = Settled<T>> + Send + 'static + use<T, I>>
    where
        T: Send + 'static,
        I: Iterator<Item = usize>,
    {
        let timeout = self.inner.settings.node_timeout;
        nodes
            .map(|index| {
                node_call(
                    Arc::clone(&self.inner),
                    Arc::clone(call),
                    index,
                    timeout,
                    parse,
                )
            })
            .collect()
    }

    /// [`Redlock::fan_out`] with each call boxed, for a set kept in a struct.
    pub(crate) fn fan_out_boxed<T, I>(
        &self,
        call: &Arc<Call>,
        parse: fn(Value) -> Result<T, NodeError>,
        nodes: I,
    ) -> FuturesUnordered<NodeFuture<T>>
    where
        T: Send + 'static,
        I: Iterator<Item = usize>,
    {
        let timeout = self.inner.settings.node_timeout;
        nodes
            .map(|index| {
                Box::pin(node_call(
                    Arc::clone(&self.inner),
                    Arc::clone(call),
                    index,
                    timeout,
                    parse,
                )) as NodeFuture<T>
            })
            .collect()
    }

    /// Collects answers until `decided` says the outcome is known. Nodes that have
    /// not answered by then stay in `pending`.
    pub(crate) async fn settle<T, F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        decided: impl FnMut(&Settled<T>) -> bool,
    ) -> Vec<Option<Settled<T>>>
    where
        F: Future<Output = Settled<T>>,
    {
        self.settle_after(Vec::new(), pending, decided).await
    }

    /// [`Redlock::settle`], starting from the answers `first` that
    /// [`send_now`] already collected.
    pub(crate) async fn settle_after<T, F>(
        &self,
        first: Vec<Settled<T>>,
        pending: &mut FuturesUnordered<F>,
        mut decided: impl FnMut(&Settled<T>) -> bool,
    ) -> Vec<Option<Settled<T>>>
    where
        F: Future<Output = Settled<T>>,
    {
        let mut out: Vec<Option<Settled<T>>> = (0..self.inner.nodes.len()).map(|_| None).collect();
        let put = |out: &mut Vec<Option<Settled<T>>>, s: Settled<T>| {
            if let Some(slot) = out.get_mut(s.index) {
                *slot = Some(s);
            }
        };
        let mut first = first.into_iter();
        loop {
            let s = match first.next() {
                Some(s) => s,
                None => match pending.next().await {
                    Some(s) => s,
                    None => break,
                },
            };
            let done = decided(&s);
            put(&mut out, s);
            if done {
                // Answers collected but not judged stay answered.
                first.for_each(|s| put(&mut out, s));
                break;
            }
        }
        out
    }

    pub(crate) fn report<T>(
        &self,
        settled: &[Option<Settled<T>>],
        status: impl Fn(&T) -> NodeStatus,
    ) -> Report {
        Report {
            nodes: settled
                .iter()
                .enumerate()
                .map(|(index, s)| NodeOutcome {
                    index,
                    node: self.inner.nodes[index].label.clone(),
                    latency: s.as_ref().map_or(Duration::ZERO, |s| s.latency),
                    status: match s {
                        None => NodeStatus::Pending,
                        Some(Settled { result: Ok(v), .. }) => status(v),
                        Some(Settled { result: Err(e), .. }) => NodeStatus::Failed(e.clone()),
                    },
                })
                .collect(),
        }
    }
}
