//! *Layer 2, local wake-up plumbing (see `lib.rs`).*
//!
//! First come, first served within a process: a FIFO of the local waiters of
//! each key, in front of the remote acquire.
//!
//! Only the waiter at the head (the one holding the key's *turn*) contends on
//! the nodes; the others wait here without any network traffic. A waiter that
//! takes the lock keeps the turn while it holds it, and its release hands the
//! turn to the next local waiter, which then makes a full quorum attempt at
//! once: the lock itself is never handed over locally, only the right to try.
//!
//! A release may hand the turn over *as it is sent* ([`Queues::hand_over`]):
//! the next waiter's `SET`s then travel right behind the release's
//! compare-and-delete on each node's connection, and it takes the lock one
//! round trip sooner. Waiters of other processes only hear of the release
//! once it ran, so a process could keep the lock for as long as it has local
//! waiters; a hand-over is therefore allowed [`HAND_OVER_STREAK`] times in a
//! row, and the next release lets the waiters of every process contend.
//!
//! The turn is advisory, never a safety property: a holder whose validity ran
//! out without a release loses its turn to the next waiter
//! ([`Queues::expire`]), a waiter that waited longer than its budget makes one
//! attempt off the queue, and `try_acquire` never queues.

#[cfg(redlock_loom)]
use loom::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering, fence},
};
#[cfg(not(redlock_loom))]
use std::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering, fence},
};

use std::collections::{HashMap, VecDeque};
use std::ops::DerefMut;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Who may contend for a key now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Turn {
    /// A local waiter, contending on the nodes.
    Waiter(u64),
    /// A local holder that took the lock with its turn, until its release, or
    /// until its validity `until` ends if it never releases.
    Holder { token: Arc<str>, until: Instant },
}

#[derive(Debug)]
struct Waiting {
    id: u64,
    waker: Option<Waker>,
}

/// How many releases in a row may hand the turn over as they are sent (see the
/// module docs): a process that wins the lock keeps it for at most this many
/// more holds before its next waiter contends with the other processes'.
pub(crate) const HAND_OVER_STREAK: u32 = 1;

#[derive(Debug, Default)]
struct KeyQueue {
    /// The waiters behind the turn, oldest first.
    waiting: VecDeque<Waiting>,
    turn: Option<Turn>,
    /// How many of the last releases handed the turn over as they were sent.
    streak: u32,
    /// A local release that did not hold the turn (a `try_acquire` holder, or a
    /// holder whose turn had expired) happened while the head was contending:
    /// the head should attempt again at once.
    kicked: bool,
    head_waker: Option<Waker>,
    /// The token whose release, as it was sent, handed the turn on
    /// ([`Queues::hand_over`]). Its decided release must not kick the head:
    /// every waiter that got the turn since attempts after the release was
    /// sent, and a kick would cost it one of its attempts for nothing.
    handed: Option<Arc<str>>,
}

impl KeyQueue {
    /// Gives the turn to the oldest waiter, if any.
    fn pass(&mut self) {
        self.turn = None;
        self.kicked = false;
        self.head_waker = None;
        if let Some(next) = self.waiting.pop_front() {
            self.turn = Some(Turn::Waiter(next.id));
            if let Some(w) = next.waker {
                w.wake();
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.turn.is_none() && self.waiting.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    keys: HashMap<Arc<str>, KeyQueue>,
}

/// The local FIFOs of one [`Redlock`](crate::Redlock) handle, one per key with
/// waiters; a key without waiters or a turn holder takes no memory.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    state: Mutex<State>,
    /// How many keys have a queue (`state.keys.len()`), written with `state`
    /// locked. Every release reads it without the lock ([`Queues::idle`]):
    /// with no local waiter anywhere, a release, an extend or a renewal
    /// takes no lock shared by every task of the handle.
    queued: AtomicUsize,
}

impl Queues {
    fn state(&self) -> impl DerefMut<Target = State> + '_ {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether no key has a local queue, read without the lock.
    ///
    /// A release reads it once its compare-and-deletes are on the nodes'
    /// connections, and a waiter's [`Queues::join`] writes it before its
    /// `SET`s go out, each side behind a `SeqCst` fence. So either the release
    /// sees the waiter's queue (and takes the lock, as it always did), or its
    /// fence comes first, and then every `SET` of that waiter is queued
    /// behind the release's compare-and-delete on each connection: the
    /// waiter's attempt runs after the release and needs no kick.
    /// Model-checked in `queue::tests::loom_tests`.
    fn idle(&self) -> bool {
        fence(Ordering::SeqCst);
        self.queued.load(Ordering::Relaxed) == 0
    }

    /// Runs `f` on the key's queue, then frees the entry if it became idle.
    fn with_key<R>(&self, key: &str, f: impl FnOnce(&mut KeyQueue) -> R) -> Option<R> {
        let mut state = self.state();
        let q = state.keys.get_mut(key)?;
        let r = f(q);
        if q.is_idle() {
            state.keys.remove(key);
            self.queued.store(state.keys.len(), Ordering::Relaxed);
        }
        Some(r)
    }

    /// Joins the back of `key`'s queue; the first waiter of an idle key gets
    /// the turn at once. Returns the waiter's id.
    pub(crate) fn join(&self, key: &Arc<str>) -> u64 {
        let id = {
            let mut state = self.state();
            let id = state.next_id;
            state.next_id = state.next_id.wrapping_add(1);
            let q = state.keys.entry(Arc::clone(key)).or_default();
            if q.is_idle() {
                q.turn = Some(Turn::Waiter(id));
            } else {
                q.waiting.push_back(Waiting { id, waker: None });
            }
            self.queued.store(state.keys.len(), Ordering::Relaxed);
            id
        };
        // Before this waiter's first `SET` is sent (see `Queues::idle`).
        fence(Ordering::SeqCst);
        id
    }

    /// Ready once waiter `id` holds the turn. A waiter no longer in the queue
    /// is ready too: nothing would ever wake it.
    pub(crate) fn poll_turn(&self, key: &str, id: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state();
        let Some(q) = state.keys.get_mut(key) else {
            return Poll::Ready(());
        };
        if q.turn == Some(Turn::Waiter(id)) {
            return Poll::Ready(());
        }
        match q.waiting.iter_mut().find(|w| w.id == id) {
            Some(w) => {
                w.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }

    /// The holder of `token` had its validity moved to `until` (an extend, or
    /// a renewal of a guarded lock): its turn lasts as long, so that a lock
    /// held for many TTLs keeps its local waiters queued for the hand-over.
    pub(crate) fn renew(&self, key: &str, token: &str, until: Instant) {
        // The holder joined before it took the lock: if no key has a queue,
        // this one has none either.
        if self.idle() {
            return;
        }
        self.with_key(key, |q| {
            if let Some(Turn::Holder { token: t, until: u }) = &mut q.turn
                && **t == *token
            {
                *u = until;
            }
        });
    }

    /// The token and validity end of the local holder that has the turn, if
    /// any: a waiter times [`Queues::expire`] by it.
    pub(crate) fn holder(&self, key: &str) -> Option<(Arc<str>, Instant)> {
        match &self.state().keys.get(key)?.turn {
            Some(Turn::Holder { token, until }) => Some((Arc::clone(token), *until)),
            _ => None,
        }
    }

    /// Waiter `id` gives up (it timed out, failed, or its future was dropped):
    /// out of the queue, and if it held the turn, the turn goes to the next.
    pub(crate) fn leave(&self, key: &str, id: u64) {
        self.with_key(key, |q| {
            if q.turn == Some(Turn::Waiter(id)) {
                q.pass();
            } else {
                q.waiting.retain(|w| w.id != id);
            }
        });
    }

    /// Waiter `id` took the lock: it keeps the turn as the holder of `token`
    /// until [`Queues::release`] (or [`Queues::expire`] after `until`).
    /// Returns false if it did not hold the turn.
    pub(crate) fn hold(&self, key: &str, id: u64, token: &Arc<str>, until: Instant) -> bool {
        self.with_key(key, |q| {
            if q.turn != Some(Turn::Waiter(id)) {
                return false;
            }
            q.turn = Some(Turn::Holder {
                token: Arc::clone(token),
                until,
            });
            q.kicked = false;
            q.head_waker = None;
            q.handed = None;
            true
        })
        .unwrap_or(false)
    }

    /// The release of `token` has just been sent, and its commands are on the
    /// nodes' connections: if a waiter is queued and the streak allows, its
    /// turn comes now, so that its `SET`s follow the release on every
    /// connection. Returns whether the turn was handed over. Either way
    /// [`Queues::release`] follows once the release is decided.
    pub(crate) fn hand_over(&self, key: &str, token: &str) -> bool {
        if self.idle() {
            return false;
        }
        self.with_key(key, |q| {
            let holder = match &q.turn {
                Some(Turn::Holder { token: t, .. }) if **t == *token => Arc::clone(t),
                _ => return false,
            };
            if q.waiting.is_empty() || q.streak >= HAND_OVER_STREAK {
                return false;
            }
            q.streak = q.streak.saturating_add(1);
            q.pass();
            q.handed = Some(holder);
            true
        })
        .unwrap_or(false)
    }

    /// The lock of `token` was released in this process: its turn goes to the
    /// next waiter (unless [`Queues::hand_over`] gave it already), and a head
    /// that is contending is told to attempt at once, unless it got the turn
    /// from this very release's hand-over (then its attempt follows the
    /// release already).
    pub(crate) fn release(&self, key: &str, token: &str) {
        if self.idle() {
            return;
        }
        self.with_key(key, |q| match &q.turn {
            Some(Turn::Holder { token: t, .. }) if **t == *token => {
                q.streak = 0;
                q.pass();
            }
            Some(Turn::Waiter(_)) if q.handed.as_deref() == Some(token) => {
                q.handed = None;
            }
            Some(Turn::Waiter(_)) => {
                q.kicked = true;
                if let Some(w) = q.head_waker.take() {
                    w.wake();
                }
            }
            _ => {}
        });
    }

    /// The holder of `token` kept its turn past its validity without a
    /// release: the next waiter gets the turn (and contends on the nodes).
    /// Read against the validity now in the queue, which a renewal may have
    /// moved since the waiter looked.
    pub(crate) fn expire(&self, key: &str, token: &str) {
        self.with_key(key, |q| {
            if matches!(&q.turn, Some(Turn::Holder { token: t, until }) if **t == *token && Instant::now() >= *until)
            {
                q.pass();
            }
        });
    }

    /// Ready when a local release happened since the last call while waiter
    /// `id` held the turn (see [`Queues::release`]).
    pub(crate) fn poll_kick(&self, key: &str, id: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.state();
        let Some(q) = state.keys.get_mut(key) else {
            return Poll::Pending;
        };
        if q.turn != Some(Turn::Waiter(id)) {
            return Poll::Pending;
        }
        if std::mem::take(&mut q.kicked) {
            return Poll::Ready(());
        }
        q.head_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Forgets a kick that came before the attempt now starting: that attempt
    /// sees the release anyway.
    pub(crate) fn clear_kick(&self, key: &str, id: u64) {
        self.with_key(key, |q| {
            if q.turn == Some(Turn::Waiter(id)) {
                q.kicked = false;
            }
        });
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.state().keys.is_empty()
    }
}

/// A waiter's place in a key's queue. Dropping it (the waiter timed out, failed
/// or was cancelled) leaves the queue, passing the turn on if it had it.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    queues: &'a Queues,
    key: Arc<str>,
    id: u64,
    done: bool,
}

impl<'a> Place<'a> {
    pub(crate) fn join(queues: &'a Queues, key: &Arc<str>) -> Self {
        Self {
            id: queues.join(key),
            queues,
            key: Arc::clone(key),
            done: false,
        }
    }

    /// Completes once this waiter holds the turn.
    pub(crate) async fn turn(&self) {
        std::future::poll_fn(|cx| self.queues.poll_turn(&self.key, self.id, cx)).await;
    }

    /// Completes at a local release while this waiter holds the turn.
    pub(crate) async fn kicked(&self) {
        std::future::poll_fn(|cx| self.queues.poll_kick(&self.key, self.id, cx)).await;
    }

    pub(crate) fn clear_kick(&self) {
        self.queues.clear_kick(&self.key, self.id);
    }

    /// The local holder whose release this waiter awaits, if any.
    pub(crate) fn holder(&self) -> Option<(Arc<str>, Instant)> {
        self.queues.holder(&self.key)
    }

    pub(crate) fn expire(&self, token: &str) {
        self.queues.expire(&self.key, token);
    }

    /// This waiter took the lock of `token`: its turn stays with the lock
    /// until the lock's release.
    pub(crate) fn hold(mut self, token: &Arc<str>, until: Instant) {
        if self.queues.hold(&self.key, self.id, token, until) {
            self.done = true;
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.queues.leave(&self.key, self.id);
        }
    }
}

#[cfg(test)]
mod tests;
