//! *Layer 2, one master's call scheduling (see `lib.rs`).*
//!
//! Coalescing (issue 50): the operations that many tasks of one process
//! send to one node while its connection is busy go out together, as one
//! call, when it is free again. This module is the hand-off alone, without
//! any I/O: which operation goes out at once, which waits, which batch goes
//! next and who sends it. `node/coalesce.rs` puts it on a node's connection.
//!
//! # How a batch is decided
//!
//! Like TCP without Nagle, or a write buffer flushed whenever its socket is
//! free, never by a timer:
//!
//! - An operation that finds the coalescer idle (nothing in flight, nothing
//!   queued) takes the [`Turn`] and goes out **alone, at once**, by its own
//!   caller: a lone lock waits for nobody.
//! - An operation that finds a call in flight is **queued**, and its caller
//!   waits for its answer on a channel of its own.
//! - When the call in flight ends (answered, failed, or its caller gone), the
//!   [`Turn`] takes the operations queued meanwhile, oldest first, up to
//!   [`Limits`] (a number of operations and of bytes, so that one call never
//!   holds the node long), and hands them to the coalescer's driver, which
//!   sends them as one call, answers each, and goes on with the next batch
//!   until the queue is empty; then the coalescer is idle again.
//!
//! A call that is not batched (a pipeline, a script over several keys, a
//! native command) goes at once, without the turn, when everything before
//! it is written: nothing is queued, and the call in flight, if any, is on
//! its connection ([`Turn::written`]). Otherwise it queues a waiter
//! ([`Coalescer::after_queue`]): the batch before it ends before it, and
//! it gets the [`Turn`] when that batch is answered, sends its call holding
//! it, and passes it on. So nothing overtakes what
//! queued before it: a holder's release queued behind a busy connection
//! reaches the node before the next holder's fenced or waiting acquire.
//!
//! At most **one** call is in flight per coalescer. Two would let a second
//! batch start while the first is on the wire, which hides one round trip of
//! latency when the node is idle between them, but halves the batch sizes
//! under load, and the per-call cost (the node parsing, dispatching and
//! answering a command; the client's wake-ups) is what coalescing saves. On a
//! loaded node the one call in flight is always full; on an idle one, the lone
//! operation is never delayed. What waits behind a busy connection waits at
//! most for the call in flight, which it would have waited for anyway behind
//! redis' pipelining on the same socket.
//!
//! # Cancellation
//!
//! A caller whose future is dropped while its operation is queued only drops
//! its receiver: the operation is skipped when its batch is taken
//! ([`Pending::abandoned`]), and if it was taken already its answer goes
//! nowhere. Nobody else's answer moves. The [`Turn`] is a guard: dropped
//! without [`Turn::next`] saying the queue is empty (its caller or driver
//! was cancelled mid-call), it passes the queue on to a new driver, so no
//! queued operation is ever left without a sender. Each operation's answer
//! channel is used once (a `oneshot`), so none is answered twice.

#[cfg(redlock_loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(redlock_loom))]
use std::sync::{Mutex, MutexGuard};

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};

/// An operation waiting in a coalescer's queue.
pub(crate) trait Pending {
    /// What it adds to its batch's request, in bytes (keys and arguments).
    fn bytes(&self) -> usize;
    /// Whether its caller stopped waiting for it (its receiver is gone):
    /// then it is not sent.
    fn abandoned(&self) -> bool;
    /// Whether it is not an operation but a caller waiting for the turn,
    /// to send a call of its own that is not batched once everything
    /// queued before it is out ([`Coalescer::after_queue`]): a batch ends
    /// before it.
    fn waits_for_turn(&self) -> bool {
        false
    }
    /// Gives the turn to this caller (it [`waits_for_turn`](Self::waits_for_turn)).
    /// A caller gone meanwhile drops it, which passes the queue on.
    fn take_turn(self, turn: Turn<Self>)
    where
        Self: Sized,
    {
        drop(turn);
    }
}

/// What the front of a queue gives.
enum Taken<P> {
    /// The next batch.
    Batch(Vec<P>),
    /// A caller waiting for the turn, first in line.
    Turn(P),
    /// Nothing is queued.
    Empty,
}

/// The bounds of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// At most this many operations.
    pub(crate) ops: usize,
    /// At most this many bytes of operations ([`Pending::bytes`]); an
    /// operation larger than this goes in a batch alone.
    pub(crate) bytes: usize,
}

/// Starts the driver of a batch: it sends `batch` as one call, answers each
/// operation, and goes on with [`Turn::next`] until that says the queue is
/// empty. It owns `turn` while it runs; dropped early (its task cancelled),
/// the turn passes the queue on. A driver that cannot start (no runtime)
/// calls [`Turn::give_up`].
pub(crate) type Start<P> = dyn Fn(Turn<P>, Vec<P>) + Send + Sync;

/// The queue of one node's pending operations of one kind.
pub(crate) struct Coalescer<P: Pending> {
    state: Mutex<State<P>>,
    limits: Limits,
    start: Box<Start<P>>,
}

struct State<P> {
    /// A call is in flight: someone holds the [`Turn`].
    busy: bool,
    /// ... and has not written its call yet ([`Turn::written`]): a call
    /// that is not batched then waits for it ([`Coalescer::after_queue`]).
    unsent: bool,
    /// The operations that came while it was, oldest first.
    queue: VecDeque<P>,
}

impl<P: Pending> Coalescer<P> {
    /// An idle coalescer whose batches are at most `limits`, each sent by
    /// the driver `start` starts.
    pub(crate) fn new(limits: Limits, start: Box<Start<P>>) -> Self {
        Self {
            state: Mutex::new(State {
                busy: false,
                unsent: false,
                queue: VecDeque::new(),
            }),
            limits: Limits {
                ops: limits.ops.max(1),
                bytes: limits.bytes,
            },
            start,
        }
    }

    fn state(&self) -> MutexGuard<'_, State<P>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An operation arrives. Idle: the caller gets the [`Turn`] and sends its
    /// operation alone, now (`make` is not called). Busy: `make`'s operation
    /// is queued (`None`), and the caller waits for the answer it gave
    /// `make`'s operation a way to send.
    pub(crate) fn enter(self: &Arc<Self>, make: impl FnOnce() -> P) -> Option<Turn<P>> {
        let mut state = self.state();
        if state.busy {
            state.queue.push_back(make());
            return None;
        }
        state.busy = true;
        state.unsent = true;
        Some(Turn {
            coalescer: Some(Arc::clone(self)),
            written: false,
        })
    }

    /// A call that is not batched arrives (a pipeline, a script over
    /// several keys, a native command). When everything that came before
    /// it is written (nothing queued, and the call in flight, if any, on
    /// its connection), it goes at once, without the turn (`true`).
    /// Otherwise `make`'s waiter is queued behind what is (`false`), and
    /// gets the [`Turn`] once that is out and answered
    /// ([`Pending::take_turn`]): a release queued for a key is never
    /// overtaken by the next acquire of that key sent directly.
    pub(crate) fn after_queue(&self, make: impl FnOnce() -> P) -> bool {
        let mut state = self.state();
        if !state.busy || (state.queue.is_empty() && !state.unsent) {
            return true;
        }
        state.queue.push_back(make());
        false
    }

    /// The next batch out of `state`'s queue, oldest first, within the
    /// limits, and ending before a caller waiting for the turn; or that
    /// caller, when it is first. Abandoned entries are dropped on the way.
    fn take(&self, state: &mut State<P>) -> Taken<P> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(p) = state.queue.front() {
            if p.abandoned() {
                state.queue.pop_front();
                continue;
            }
            if p.waits_for_turn() {
                if batch.is_empty()
                    && let Some(p) = state.queue.pop_front()
                {
                    return Taken::Turn(p);
                }
                break;
            }
            let more = bytes.saturating_add(p.bytes());
            if batch.len() >= self.limits.ops || (!batch.is_empty() && more > self.limits.bytes) {
                break;
            }
            bytes = more;
            if let Some(p) = state.queue.pop_front() {
                batch.push(p);
            }
        }
        if batch.is_empty() {
            Taken::Empty
        } else {
            Taken::Batch(batch)
        }
    }

    /// How many operations are queued (abandoned ones included).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether a call is in flight.
    #[cfg(test)]
    pub(crate) fn is_busy(&self) -> bool {
        self.state().busy
    }
}

/// The right to the one call in flight. Whoever holds it sends: the lone
/// caller its own operation, a driver its batch. Dropped, it passes the
/// queue on (see the module docs).
pub(crate) struct Turn<P: Pending> {
    /// `None` once given back ([`Turn::next`] found the queue empty, or
    /// [`Turn::give_up`]).
    coalescer: Option<Arc<Coalescer<P>>>,
    /// Whether its holder said its current call is written.
    written: bool,
}

impl<P: Pending> Turn<P> {
    /// The call in flight ended: the next batch, which the holder sends, or
    /// `None` when this turn is spent: nothing is queued (the coalescer is
    /// idle again), or the caller first in line waits for the turn itself
    /// and now has it.
    pub(crate) fn next(&mut self) -> Option<Vec<P>> {
        let coalescer = self.coalescer.as_ref()?;
        let mut state = coalescer.state();
        self.written = false;
        state.unsent = true;
        match coalescer.take(&mut state) {
            Taken::Batch(batch) => Some(batch),
            Taken::Empty => {
                state.busy = false;
                state.unsent = false;
                drop(state);
                self.coalescer = None;
                None
            }
            Taken::Turn(waiter) => {
                // Handed over outside the lock: a waiter gone meanwhile
                // drops the turn, which takes the lock to pass it on.
                drop(state);
                let turn = Turn {
                    coalescer: self.coalescer.take(),
                    written: false,
                };
                waiter.take_turn(turn);
                None
            }
        }
    }

    /// Its holder's call is on its connection (its send was polled once:
    /// whatever is sent on the connection after it goes after it), so a
    /// call that is not batched need not wait for it. Once per call: only
    /// the first takes the lock.
    pub(crate) fn written(&mut self) {
        if std::mem::replace(&mut self.written, true) {
            return;
        }
        if let Some(coalescer) = &self.coalescer {
            coalescer.state().unsent = false;
        }
    }

    /// No driver can run (no runtime to run it on): every queued operation
    /// is dropped, which tells its caller it went unanswered, and the
    /// coalescer is idle again.
    pub(crate) fn give_up(mut self) {
        if let Some(coalescer) = self.coalescer.take() {
            let dropped = {
                let mut state = coalescer.state();
                state.busy = false;
                state.unsent = false;
                std::mem::take(&mut state.queue)
            };
            // Dropped outside the lock: a sender's drop wakes its receiver.
            drop(dropped);
        }
    }
}

impl<P: Pending> Drop for Turn<P> {
    fn drop(&mut self) {
        // The call in flight is over (answered or abandoned): whatever queued
        // behind it goes to a driver now.
        let Some(next) = self.next() else {
            return;
        };
        let Some(coalescer) = self.coalescer.take() else {
            return;
        };
        let turn = Turn {
            coalescer: Some(Arc::clone(&coalescer)),
            written: false,
        };
        (coalescer.start)(turn, next);
    }
}

#[cfg(test)]
mod tests;
