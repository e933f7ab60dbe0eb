//! One renewal schedule per [`Redlock`](crate::Redlock) handle and Tokio
//! runtime: the auto-extension of every [`LockGuard`](crate::LockGuard) taken
//! on that runtime, batched. Per runtime, so that a runtime whose thread is
//! blocked (an actix worker running blocking code) stops only its own
//! renewals, never another's (`per_runtime.rs`).
//!
//! A single task owns every guarded lock's [`Renewal`] and one timer queue.
//! When renewals fall due (at the same grid point, see `renew::renew_point`)
//! they go out together, up to [`BATCH`] keys per script call per node
//! (`extend_batch.rs`); each lock keeps its own validity, loss signal, cap and
//! quorum count. A guard talks to the task by messages only, so no lock's
//! state is shared beyond its [`Shared`](super::handle::Shared) atomics, and a
//! release waits for a renewal of its lock in flight, as before.
//!
//! The task lives while the handle or one of its guards does (a guarded lock
//! holds the handle). If it ends any way but by its handle being dropped (a
//! panic, its runtime shutting down), every lock it held is told "lost"
//! ([`LostOnExit`](super::renew::LostOnExit)), and the next guard starts a
//! new task.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::renew::{Due, Renewal};
use crate::error::Error;
use crate::per_runtime::PerRuntime;
use crate::protocol::extend_batch::{BATCH, BatchOutcome};
use crate::protocol::lock::Lock;
use crate::protocol::release::Released;

/// A handle's renewal schedule: the way to its task on each runtime, started
/// on demand.
#[derive(Default)]
pub(crate) struct Schedule {
    next_id: AtomicU64,
    tasks: PerRuntime<Option<mpsc::UnboundedSender<Command>>>,
}

/// A guard's message to the schedule.
pub(super) enum Command {
    /// Renew this lock from now on.
    Add(u64, Box<Renewal>),
    /// Stop renewing and hand the lock back for its release (after a renewal
    /// in flight).
    Release(u64, oneshot::Sender<Handback>),
    /// Stop renewing and release in the background (the guard was dropped);
    /// with an instant, keep the keys until it instead while it is ahead
    /// (a job's minimum hold).
    Drop(u64, Option<Instant>),
}

/// What a guard's release gets back.
pub(super) enum Handback {
    /// The lock, still held as far as the renewals know: the guard releases it.
    /// (Boxed: a lock is far larger than a join handle.)
    Lock(Box<Lock>),
    /// The lock was lost; its release is under way.
    Releasing(JoinHandle<Result<Released, Error>>),
}

/// A guard's place in the schedule.
pub(super) struct Ticket {
    id: u64,
    task: mpsc::UnboundedSender<Command>,
}

impl Ticket {
    /// Stops the renewals and returns the lock (or its release under way);
    /// `None` if the schedule's task ended.
    pub(super) async fn release(self) -> Option<Handback> {
        let (tx, rx) = oneshot::channel();
        self.task.send(Command::Release(self.id, tx)).ok()?;
        rx.await.ok()
    }

    /// Stops the renewals; the schedule releases the lock, or keeps its keys
    /// until `keep` while that is ahead. Never blocks.
    pub(super) fn drop_lock(&self, keep: Option<Instant>) {
        // A task that ended dropped the lock already (its keys expire).
        let _ = self.task.send(Command::Drop(self.id, keep));
    }
}

impl Schedule {
    /// Hands `renewal` to `rt`'s schedule task, starting the task if none
    /// runs there.
    pub(super) fn add(&self, rt: &tokio::runtime::Handle, renewal: Renewal) -> Option<Ticket> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut command = Command::Add(id, Box::new(renewal));
        self.tasks.with(
            rt,
            || None,
            |task| {
                // Twice at most: the task that ran may have ended (a panic, or
                // its runtime shutting down).
                for _ in 0..2 {
                    if let Some(tx) = task.as_ref() {
                        match tx.send(command) {
                            Ok(()) => {
                                return Some(Ticket {
                                    id,
                                    task: tx.clone(),
                                });
                            }
                            Err(mpsc::error::SendError(c)) => command = c,
                        }
                    }
                    let (tx, rx) = mpsc::unbounded_channel();
                    rt.spawn(drive(rx));
                    *task = Some(tx);
                }
                // Dropped here, the renewal tells its holder "lost".
                None
            },
        )
    }
}

/// A lock's place in the task.
enum Entry {
    /// Waiting for its renewal point (it is in the timer queue).
    Idle(Box<Renewal>),
    /// In a batch under way; what to do once it is back.
    InFlight(After),
    /// Lost; its release is under way.
    Releasing(Option<JoinHandle<Result<Released, Error>>>),
}

/// What a lock in flight does once its batch is back.
enum After {
    Keep,
    Release(oneshot::Sender<Handback>),
    Drop(Option<Instant>),
}

type Batch = Vec<(u64, Box<Renewal>, Duration)>;
type BatchFuture = Pin<Box<dyn Future<Output = Vec<(u64, Box<Renewal>, BatchOutcome)>> + Send>>;

/// The schedule's task state.
#[derive(Default)]
struct Task {
    entries: HashMap<u64, Entry>,
    /// `(renew_at, id)` of every idle lock.
    timers: BTreeSet<(Instant, u64)>,
    batches: FuturesUnordered<BatchFuture>,
}

/// The schedule's task: runs until every sender is gone.
async fn drive(mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut task = Task::default();
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
        let next = task.timers.first().map(|&(at, _)| at);
        if let Some(at) = next {
            let at = tokio::time::Instant::from_std(at);
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
        }
        tokio::select! {
            command = commands.recv() => match command {
                Some(command) => task.command(command),
                None => break,
            },
            Some(done) = task.batches.next(), if !task.batches.is_empty() => task.returned(done),
            () = &mut sleep, if next.is_some() => task.tick(),
        }
    }
}

/// Ends a dropped guard's `lock` in a task of its own: its keys kept until
/// `keep` while that is ahead (a job's minimum hold, see
/// `LockGuard::release_at_least`), else released.
fn spawn_end(lock: Lock, keep: Option<Instant>) {
    let now = Instant::now();
    match keep.filter(|&until| until > now) {
        Some(until) => {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let left = until.saturating_duration_since(Instant::now());
                    if let Err(e) = super::keep::keep_until(lock, left, until).await {
                        tracing::debug!(error = %e, "a dropped job's lock kept to its minimum");
                    }
                });
            }
        }
        None => {
            spawn_unlock(lock);
        }
    }
}

/// Releases `lock` in a task of its own, for a holder that may ask for the
/// outcome later.
fn spawn_unlock(lock: Lock) -> Option<JoinHandle<Result<Released, Error>>> {
    let redlock = lock.redlock().clone();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => Some(rt.spawn(async move { redlock.unlock(lock).await })),
        // Dropped, the lock releases itself if it can.
        Err(_) => None,
    }
}

impl Task {
    fn command(&mut self, command: Command) {
        match command {
            Command::Add(id, renewal) => {
                self.timers.insert((renewal.renew_at, id));
                self.entries.insert(id, Entry::Idle(renewal));
            }
            Command::Release(id, reply) => match self.entries.remove(&id) {
                Some(Entry::Idle(renewal)) => {
                    self.timers.remove(&(renewal.renew_at, id));
                    let _ = reply.send(Handback::Lock(Box::new(renewal.finish())));
                }
                Some(Entry::InFlight(_)) => {
                    self.entries
                        .insert(id, Entry::InFlight(After::Release(reply)));
                }
                Some(Entry::Releasing(Some(release))) => {
                    let _ = reply.send(Handback::Releasing(release));
                }
                Some(Entry::Releasing(None)) | None => {}
            },
            Command::Drop(id, keep) => match self.entries.remove(&id) {
                Some(Entry::Idle(renewal)) => {
                    self.timers.remove(&(renewal.renew_at, id));
                    spawn_end(renewal.finish(), keep);
                }
                Some(Entry::InFlight(_)) => {
                    self.entries.insert(id, Entry::InFlight(After::Drop(keep)));
                }
                Some(Entry::Releasing(_)) | None => {}
            },
        }
    }

    /// The earliest renewal point came: every lock due goes out, [`BATCH`] to
    /// a call, and the last call is filled up with the locks due next, within
    /// their [`Renewal::slack`]. Locks taken together are renewed in full
    /// batches, and a handle with many locks sends about one call per node per
    /// [`BATCH`] renewals.
    fn tick(&mut self) {
        let now = Instant::now();
        let mut batch: Batch = Vec::new();
        let mut waiting = Vec::new();
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                // Filling the last call: the next lock, if it may go early.
                let early = !batch.is_empty()
                    && matches!(self.entries.get(&id), Some(Entry::Idle(r))
                        if at.checked_sub(r.slack()).is_some_and(|from| from <= now));
                if !early {
                    break;
                }
            }
            self.timers.pop_first();
            let Some(Entry::Idle(mut renewal)) = self.entries.remove(&id) else {
                continue;
            };
            match renewal.due() {
                Due::Renew(ttl) => {
                    self.entries.insert(id, Entry::InFlight(After::Keep));
                    batch.push((id, renewal, ttl));
                    if batch.len() == BATCH {
                        self.send(std::mem::take(&mut batch));
                    }
                }
                // Put back after this pass, so a point already passed is not
                // taken again in it.
                Due::Wait => waiting.push((id, renewal)),
                Due::Lost => {
                    let release = spawn_unlock(renewal.finish());
                    self.entries.insert(id, Entry::Releasing(release));
                }
            }
        }
        if !batch.is_empty() {
            self.send(batch);
        }
        for (id, mut renewal) in waiting {
            // Not before the next millisecond: the timer's resolution.
            renewal.renew_at = renewal
                .renew_at
                .max(now.checked_add(Duration::from_millis(1)).unwrap_or(now));
            self.timers.insert((renewal.renew_at, id));
            self.entries.insert(id, Entry::Idle(renewal));
        }
    }

    /// Sends `batch` to every node (one script call each).
    fn send(&mut self, mut batch: Batch) {
        let Some(redlock) = batch.first().map(|(_, r, _)| r.lock.redlock().clone()) else {
            return;
        };
        self.batches.push(Box::pin(async move {
            let outcomes = {
                let mut locks: Vec<(&mut Lock, Duration, Instant)> = batch
                    .iter_mut()
                    .map(|(_, renewal, ttl)| {
                        let deadline = renewal.deadline();
                        (&mut renewal.lock, *ttl, deadline)
                    })
                    .collect();
                redlock.extend_batch(&mut locks).await
            };
            batch
                .into_iter()
                .zip(outcomes)
                .map(|((id, renewal, _), outcome)| (id, renewal, outcome))
                .collect()
        }));
    }

    /// A batch is back: each lock learns its outcome, then is renewed again,
    /// released, or handed back to its guard.
    fn returned(&mut self, done: Vec<(u64, Box<Renewal>, BatchOutcome)>) {
        for (id, mut renewal, outcome) in done {
            let held = renewal.settled(outcome.decided, outcome.result);
            let after = match self.entries.remove(&id) {
                Some(Entry::InFlight(after)) => after,
                _ => After::Keep,
            };
            match (after, held) {
                (After::Keep, true) => {
                    self.timers.insert((renewal.renew_at, id));
                    self.entries.insert(id, Entry::Idle(renewal));
                }
                (After::Keep, false) => {
                    let release = spawn_unlock(renewal.finish());
                    self.entries.insert(id, Entry::Releasing(release));
                }
                (After::Release(reply), _) => {
                    let _ = reply.send(Handback::Lock(Box::new(renewal.finish())));
                }
                (After::Drop(keep), true) => spawn_end(renewal.finish(), keep),
                (After::Drop(_), false) => {
                    spawn_unlock(renewal.finish());
                }
            }
        }
    }
}
