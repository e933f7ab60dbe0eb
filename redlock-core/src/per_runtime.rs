//! *Layer 1, values (see `lib.rs`).*
//!
//! What a handle keeps once per Tokio runtime that uses it: each node's
//! connection, the renewal schedule and the background task.
//!
//! redis' multiplexed connection drives its socket from a task on the runtime
//! that opened it, and a task runs only when its runtime's threads do. An
//! application may run several runtimes over one handle (actix-web runs one
//! single-threaded runtime per worker): if they shared one connection or one
//! renewal task, a worker that blocks its thread would stall the calls,
//! renewals and releases of every other worker. Each runtime therefore gets its
//! own, and a thread that blocks delays only the locks of its own runtime. An
//! application with one runtime pays one lookup per use.
//!
//! An entry lives while its runtime does: a small task on that runtime holds
//! the other end of the entry's `alive` channel, and is dropped with the
//! runtime, so the entries of runtimes shut down are found closed and dropped
//! when the next runtime comes.

use std::sync::{Mutex, PoisonError};

use tokio::runtime::{Handle, Id};
use tokio::sync::oneshot;

/// One runtime's value.
struct Entry<T> {
    runtime: Id,
    /// Closed once the runtime is shut down (see the module docs).
    alive: oneshot::Sender<()>,
    value: T,
}

/// A value per Tokio runtime.
pub(crate) struct PerRuntime<T> {
    entries: Mutex<Vec<Entry<T>>>,
}

impl<T> Default for PerRuntime<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Vec::new()),
        }
    }
}

impl<T> PerRuntime<T> {
    /// Runs `f` on `rt`'s value, made by `make` if `rt` has none yet.
    pub(crate) fn with<R>(
        &self,
        rt: &Handle,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        let id = rt.id();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let at = match entries.iter().position(|e| e.runtime == id) {
            Some(at) => at,
            None => {
                entries.retain(|e| !e.alive.is_closed());
                let (alive, gone) = oneshot::channel::<()>();
                // Ends when the entry is dropped; dropped unpolled when the
                // runtime shuts down, which closes `alive`.
                rt.spawn(async move {
                    let _ = gone.await;
                });
                entries.push(Entry {
                    runtime: id,
                    alive,
                    value: make(),
                });
                entries.len() - 1
            }
        };
        f(&mut entries[at].value)
    }
}

#[cfg(all(test, not(redlock_loom)))]
impl<T> PerRuntime<T> {
    fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::PerRuntime;

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn each_runtime_has_its_own_value_and_a_shut_down_one_is_dropped() {
        let per: PerRuntime<u32> = PerRuntime::default();
        let first = current_thread();
        let second = current_thread();
        assert_eq!(per.with(first.handle(), || 1, |v| *v), 1);
        assert_eq!(per.with(second.handle(), || 2, |v| *v), 2);
        // Found again, not made again.
        assert_eq!(per.with(first.handle(), || 9, |v| *v), 1);
        assert_eq!(per.len(), 2);
        drop(first);
        let third = current_thread();
        assert_eq!(per.with(third.handle(), || 3, |v| *v), 3);
        assert_eq!(per.with(second.handle(), || 9, |v| *v), 2);
        assert_eq!(per.len(), 2, "the shut-down runtime's entry is dropped");
    }
}
