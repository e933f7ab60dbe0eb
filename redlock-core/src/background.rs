//! *Layer 1, values (see `lib.rs`).*
//!
//! The calls still on their way after an operation was decided (a release's
//! or an acquire's answers after the quorum) are driven to their end by one
//! task per handle and runtime (`per_runtime.rs`), instead of a task spawned
//! per operation: under
//! load, a spawn per lock+unlock pair is a task allocation and often a wake-up
//! of another worker thread (BENCHMARKS.md at 9debf85, "Client and server CPU per lock").

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

use crate::per_runtime::PerRuntime;

/// A call's remainder, driven in the background.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The handle's background task on each runtime: where jobs are sent.
#[derive(Default)]
pub(crate) struct Background {
    tasks: PerRuntime<Option<mpsc::UnboundedSender<Job>>>,
}

impl Background {
    /// Drives `job` to its end on the handle's task for the current runtime,
    /// starting that task if none runs there. Outside a runtime `job` is
    /// dropped, as a spawn would have been impossible: `false`.
    pub(crate) fn run(&self, job: impl Future<Output = ()> + Send + 'static) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let mut job: Job = Box::pin(job);
        self.tasks.with(
            &rt,
            || None,
            |task| {
                if let Some(tx) = task.as_ref() {
                    match tx.send(job) {
                        Ok(()) => return true,
                        // The task ended (it panicked).
                        Err(mpsc::error::SendError(j)) => job = j,
                    }
                }
                let (tx, rx) = mpsc::unbounded_channel();
                rt.spawn(drive(rx));
                let sent = tx.send(job).is_ok();
                *task = Some(tx);
                sent
            },
        )
    }
}

/// The background task: takes jobs as they come and drives them all, until
/// its handle is gone (or replaced) and every job has ended.
async fn drive(mut rx: mpsc::UnboundedReceiver<Job>) {
    let mut jobs: FuturesUnordered<Job> = FuturesUnordered::new();
    let mut closed = false;
    std::future::poll_fn(|cx| {
        while !closed {
            match rx.poll_recv(cx) {
                Poll::Ready(Some(job)) => jobs.push(job),
                Poll::Ready(None) => closed = true,
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(())) = jobs.poll_next_unpin(cx) {}
        if closed && jobs.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::Background;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Waits up to 10 s for `done` to reach `n`.
    async fn reaches(done: &AtomicUsize, n: usize) -> bool {
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .is_ok()
    }

    #[test]
    fn every_job_ends_even_after_its_handle_is_gone() {
        runtime().block_on(async {
            let background = Background::default();
            let done = Arc::new(AtomicUsize::new(0));
            let mut gates = Vec::new();
            for _ in 0..100 {
                let (tx, rx) = oneshot::channel::<()>();
                let done = Arc::clone(&done);
                assert!(background.run(async move {
                    let _ = rx.await;
                    done.fetch_add(1, Ordering::SeqCst);
                }));
                gates.push(tx);
            }
            // The jobs wait; the handle (and the task's sender) goes away.
            drop(background);
            tokio::task::yield_now().await;
            assert_eq!(done.load(Ordering::SeqCst), 0);
            for gate in gates {
                let _ = gate.send(());
            }
            assert!(reaches(&done, 100).await, "{done:?}");
        });
    }

    #[test]
    fn a_job_of_another_runtime_runs_on_that_runtime() {
        let background = Background::default();
        let done = Arc::new(AtomicUsize::new(0));
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        first.block_on(async {
            let d = Arc::clone(&done);
            assert!(background.run(async move {
                d.fetch_add(1, Ordering::SeqCst);
            }));
            assert!(reaches(&done, 1).await);
        });
        // The first runtime (one thread, outside `block_on`) idles: nothing
        // polls its tasks, so a job from the second must not go to its task.
        let second = runtime();
        second.block_on(async {
            let d = Arc::clone(&done);
            assert!(background.run(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                d.fetch_add(1, Ordering::SeqCst);
            }));
            assert!(reaches(&done, 2).await);
        });
        // And once the first is shut down, its jobs go to a new task.
        drop(first);
        second.block_on(async {
            let d = Arc::clone(&done);
            assert!(background.run(async move {
                d.fetch_add(1, Ordering::SeqCst);
            }));
            assert!(reaches(&done, 3).await);
        });
    }

    #[test]
    fn outside_a_runtime_a_job_is_refused() {
        assert!(!Background::default().run(async {}));
    }
}
