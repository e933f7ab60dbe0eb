//! *Layer 3, the Redlock steps (see `lib.rs`).*
//!
//! Spec step 2: one call sent to every node at once, each under the node
//! timeout, and the answers collected until the outcome is decided.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::Stream;
use redis::Value;

use crate::error::{NodeError, NodeOutcome, NodeStatus, Report};
use crate::node::Call;
use crate::protocol::redlock::{Core, Inner};

/// One node's settled answer within a fan-out.
#[derive(Clone)]
pub(crate) struct Settled<T> {
    pub(crate) index: usize,
    pub(crate) latency: Duration,
    pub(crate) result: Result<T, NodeError>,
}

/// The calls of one fan-out, at most one per node, each in a box of its
/// own, polled together by the task that awaits them, and each answer
/// returned as it comes (a [`Stream`]).
///
/// A wake-up polls every pending call once, as `join_all` polls a few
/// futures, and keeps every answer that pass found in the call's place: the
/// answers are then handed out one by one without polling the calls still
/// pending again for each (which a first version did, at about three passes
/// per wake-up).
///
/// Not `FuturesUnordered`: that set gives each call a task of its own (a
/// reference count, a queued flag, a place in a ready queue, its own waker
/// and wake-up of the set's), which a `perf` profile of the 64-task bench
/// put at about 6 µs of 67 per lock+unlock pair, for sets of five
/// (BENCHMARKS.md at 9debf85, "Where a pair's client CPU goes"). `join_all` waits for
/// every call, and `select_all` panics on an empty set and hands its `Vec`
/// back after each answer: neither serves a set that is settled at quorum
/// and then handed on.
pub(crate) struct Fan<F: Future + ?Sized> {
    calls: Vec<Slot<F>>,
    /// How long after its first poll each call gives up (it reads the clock
    /// when polled; see [`crate::node::Node::run_until`]), and the one timer
    /// that wakes the task polling the set by then: set at the end of the
    /// set's first poll, which is every call's first, to `timeout` after
    /// that. `None`: the calls bring their own timers.
    timeout: Option<Duration>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How many times a wake-up of the deadline's timer that found a call not
/// yet past it (the timer's clock rounds to the millisecond) sets the timer
/// again before the set wakes itself instead.
const REARMS: usize = 3;

/// A call of a [`Fan`]: on its way, or answered and not handed out yet.
enum Slot<F: Future + ?Sized> {
    Pending(Pin<Box<F>>),
    Answered(F::Output),
}

/// A fan-out whose calls' type cannot be named: for a set kept in a struct.
#[cfg(feature = "idempotency")]
pub(crate) type DynFan<T> = Fan<dyn Future<Output = Settled<T>> + Send>;

impl<F: Future + ?Sized> Fan<F> {
    /// Whether every answer has been handed out.
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls of `calls`, each of which gives up `timeout` after its
    /// first poll without a timer of its own (`None`: each has its own
    /// timer): the set wakes its task then.
    fn with_timeout<I: IntoIterator<Item = Pin<Box<F>>>>(
        calls: I,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            calls: calls.into_iter().map(Slot::Pending).collect(),
            timeout,
            timer: None,
        }
    }
}

#[cfg(feature = "idempotency")]
impl<T, F: Future<Output = Settled<T>> + Send + 'static> Fan<F> {
    /// The same set, its calls' type erased (no call is boxed again).
    fn into_dyn(self) -> DynFan<T> {
        Fan {
            calls: self
                .calls
                .into_iter()
                .map(|slot| match slot {
                    Slot::Pending(call) => {
                        Slot::Pending(call as Pin<Box<dyn Future<Output = Settled<T>> + Send>>)
                    }
                    Slot::Answered(out) => Slot::Answered(out),
                })
                .collect(),
            timeout: self.timeout,
            timer: self.timer,
        }
    }
}

/// Polls every pending call of `calls` once, keeping each answer in its
/// place; then hands out the first answer kept.
fn poll_calls<F: Future + ?Sized>(
    calls: &mut Vec<Slot<F>>,
    cx: &mut Context<'_>,
) -> Option<F::Output> {
    for slot in calls.iter_mut() {
        if let Slot::Pending(call) = slot
            && let Poll::Ready(out) = call.as_mut().poll(cx)
        {
            *slot = Slot::Answered(out);
        }
    }
    take_answer(calls)
}

/// The first answer kept in `calls`, out of the set. The order of the others
/// does not matter: each answer says its node.
fn take_answer<F: Future + ?Sized>(calls: &mut Vec<Slot<F>>) -> Option<F::Output> {
    let i = calls.iter().position(|c| matches!(c, Slot::Answered(_)))?;
    match calls.swap_remove(i) {
        Slot::Answered(out) => Some(out),
        Slot::Pending(_) => None,
    }
}

// Nothing in a `Fan` is pinned in place: each call is pinned in its own box,
// and an answer kept is never pinned.
impl<F: Future + ?Sized> Unpin for Fan<F> {}

impl<F: Future + ?Sized> Stream for Fan<F> {
    type Item = F::Output;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.calls.is_empty() {
            return Poll::Ready(None);
        }
        if let Some(out) = take_answer(&mut self.calls) {
            return Poll::Ready(Some(out));
        }
        if let Some(out) = poll_calls(&mut self.calls, cx) {
            return Poll::Ready(Some(out));
        }
        // Every call is pending: the timer must wake this task when they
        // give up. Set after the first poll of every call, it is due no
        // earlier than any of them (none at all when `timeout` is too long
        // to add to now: neither are they).
        let Some(timeout) = self.timeout else {
            return Poll::Pending;
        };
        let this = &mut *self;
        let timer = match &mut this.timer {
            Some(timer) => timer,
            None => match Instant::now().checked_add(timeout) {
                Some(deadline) => this
                    .timer
                    .insert(Box::pin(tokio::time::sleep_until(deadline.into()))),
                None => return Poll::Pending,
            },
        };
        for _ in 0..REARMS {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Past the deadline: every call now gives up when polled.
            if let Some(out) = poll_calls(&mut this.calls, cx) {
                return Poll::Ready(Some(out));
            }
            // Woken a little before a call's clock says so.
            let again = tokio::time::Instant::now() + Duration::from_millis(1);
            timer.as_mut().reset(again);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A set of calls that each bring their own timer.
impl<F: Future + ?Sized> FromIterator<Pin<Box<F>>> for Fan<F> {
    fn from_iter<I: IntoIterator<Item = Pin<Box<F>>>>(calls: I) -> Self {
        Self::with_timeout(calls, None)
    }
}

/// Polls every call of `pending` once, so that each node's command is on its
/// connection (over a connection already open) when this returns: what is
/// sent after it on the same connection runs after it on the node. Returns
/// the answers that came at once (a node that failed without a round trip).
pub(crate) async fn send_now<T, F>(pending: &mut Fan<F>) -> Vec<Settled<T>>
where
    F: Future<Output = Settled<T>> + ?Sized,
{
    std::future::poll_fn(|cx| {
        let mut ready = Vec::new();
        // A pass polls every call, and returns early only with an answer:
        // loop until it has nothing more at once.
        while let Poll::Ready(Some(s)) = pending.poll_next_unpin(cx) {
            ready.push(s);
        }
        Poll::Ready(ready)
    })
    .await
}

/// The answers of `pending` that are in already, without waiting: what is
/// left after them may need a task to drive it, and often nothing is left.
pub(crate) fn ready_now<T, F>(pending: &mut Fan<F>) -> Vec<Settled<T>>
where
    F: Future<Output = Settled<T>> + ?Sized,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut ready = Vec::new();
    if pending.is_empty() {
        return ready;
    }
    // A call still waiting is left with a waker that does nothing: the task
    // that drives the rest polls every call again, with its own, first.
    while let Poll::Ready(Some(s)) = pending.poll_next_unpin(&mut cx) {
        ready.push(s);
    }
    ready
}

/// Node `index`'s call, given up `timeout` after its first poll (its
/// fan-out's timer wakes it then), its reply read by `parse`.
async fn node_call<T>(
    inner: Arc<Inner>,
    call: Arc<Call>,
    index: usize,
    timeout: Duration,
    parse: fn(Value) -> Result<T, NodeError>,
) -> Settled<T> {
    let node = &inner.nodes[index];
    let ran = node.run_until(&call, timeout).await;
    let result = ran.result.and_then(parse);
    if let Err(e) = &result {
        crate::metrics::node_error(&node.label, e);
    }
    Settled {
        index,
        latency: ran.latency,
        result,
    }
}

impl Core {
    /// Spec step 2: sends `call` to the given nodes at once, each under the node
    /// timeout (one allocation per call, its box).
    pub(crate) fn fan_out<T, I>(
        &self,
        call: &Arc<Call>,
        parse: fn(Value) -> Result<T, NodeError>,
        nodes: I,
    ) -> Fan<impl Future<Output = Settled<T>> + Send + 'static + use<T, I>>
    where
        T: Send + 'static,
        I: Iterator<Item = usize>,
    {
        let timeout = self.inner.settings.node_timeout;
        let calls = nodes.map(|index| {
            Box::pin(node_call(
                Arc::clone(&self.inner),
                Arc::clone(call),
                index,
                timeout,
                parse,
            ))
        });
        Fan::with_timeout(calls, Some(timeout))
    }

    /// [`Redlock::fan_out`] with each call boxed, for a set kept in a struct.
    #[cfg(feature = "idempotency")]
    pub(crate) fn fan_out_boxed<T, I>(
        &self,
        call: &Arc<Call>,
        parse: fn(Value) -> Result<T, NodeError>,
        nodes: I,
    ) -> DynFan<T>
    where
        T: Send + 'static,
        I: Iterator<Item = usize>,
    {
        self.fan_out(call, parse, nodes).into_dyn()
    }

    /// Collects answers until `decided` says the outcome is known. Nodes that have
    /// not answered by then stay in `pending`.
    pub(crate) async fn settle<T, F>(
        &self,
        pending: &mut Fan<F>,
        decided: impl FnMut(&Settled<T>) -> bool,
    ) -> Vec<Option<Settled<T>>>
    where
        F: Future<Output = Settled<T>> + ?Sized,
    {
        self.settle_after(Vec::new(), pending, decided).await
    }

    /// [`Redlock::settle`], starting from the answers `first` that
    /// [`send_now`] already collected.
    pub(crate) async fn settle_after<T, F>(
        &self,
        first: Vec<Settled<T>>,
        pending: &mut Fan<F>,
        mut decided: impl FnMut(&Settled<T>) -> bool,
    ) -> Vec<Option<Settled<T>>>
    where
        F: Future<Output = Settled<T>> + ?Sized,
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

#[cfg(all(test, not(redlock_loom)))]
mod tests;
