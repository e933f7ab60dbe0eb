//! No advantage to the releaser (issue 48): a handle whose release woke
//! another handle's waiter does not take the resource straight back; its
//! own next acquire waits for a hand-off window first, so the woken waiter
//! gets the turn. A release that woke nobody else adds no delay.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Lock, Redlock, RetryPolicy};
use redlock_tests::util::LogCapture;
use redlock_tests::{Cluster, timing};
use tracing::instrument::WithSubscriber;

use super::*;

/// What happened, in the order it happened (each entry with when).
#[derive(Clone, Default)]
struct Order(Arc<Mutex<Vec<(&'static str, Instant)>>>);

impl Order {
    fn push(&self, what: &'static str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((what, Instant::now()));
    }

    fn names(&self) -> Vec<&'static str> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(w, _)| *w)
            .collect()
    }

    fn at(&self, what: &str) -> Option<Instant> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|(w, _)| *w == what)
            .map(|(_, t)| *t)
    }
}

/// Waits until a waiter is subscribed to `channel_key`'s channel on every
/// node and the waiters flag `flag` is on every node: only then does a
/// release there announce itself to it.
async fn until_flagged(cluster: &Cluster, channel_key: &str, flag: &str) {
    let flagged = redlock_tests::util::eventually(timing::settled(), || {
        (0..cluster.len())
            .all(|n| subscribers(cluster, n, channel_key) >= 1 && cluster.node(n).pttl(flag) > 0)
    })
    .await;
    assert!(
        flagged,
        "the waiter never subscribed and flagged {flag} on every node"
    );
}

/// How one release-and-retake went: the order of the holds, and how long after
/// the release the woken waiter held.
struct HandedOff {
    order: Vec<&'static str>,
    woken_after: Option<Duration>,
}

/// Handle `a` holds `held`; another handle's waiter (`waiter`, already
/// started: it pushes "B holds" and "B releases" to `order`, releasing at
/// once) is woken by its release; once `before_release` has run, `a`
/// releases and at once acquires again (`a_acquire`), releasing at once
/// too. Returns the order of the holds.
async fn release_and_retake<FA, FR>(
    cluster: &Cluster,
    a: &Redlock,
    held: Lock,
    (channel_key, flag): (&str, &str),
    (waiter, order): (tokio::task::JoinHandle<()>, Order),
    before_release: FR,
    a_acquire: impl FnOnce() -> FA,
) -> HandedOff
where
    FA: Future<Output = Result<Lock, redlock_core::Error>> + Send + 'static,
    FR: Future<Output = ()>,
{
    until_flagged(cluster, channel_key, flag).await;
    assert!(!waiter.is_finished(), "B held while A did");
    before_release.await;
    order.push("A releases");
    a.unlock(held).await.expect("A's release");
    let retake = {
        let (order, a, acquire) = (order.clone(), a.clone(), a_acquire());
        tokio::spawn(async move {
            let lock = acquire.await.expect("A's acquire gave up");
            order.push("A holds");
            a.unlock(lock).await.expect("A's second release");
        })
    };
    let bound = timing::liveness(2 * far());
    tokio::time::timeout(bound, waiter)
        .await
        .expect("B hung")
        .expect("B's task");
    tokio::time::timeout(bound, retake)
        .await
        .expect("A hung")
        .expect("A's task");
    let woken_after = order
        .at("B holds")
        .zip(order.at("A releases"))
        .map(|(b, a)| b.saturating_duration_since(a));
    HandedOff {
        order: order.names(),
        woken_after,
    }
}

/// B holds first; A holds only once B is releasing (it cannot hold before:
/// exclusion).
const WANT: [&str; 4] = ["A releases", "B holds", "B releases", "A holds"];

/// How long B's process is not scheduled when A releases: a woken waiter of
/// another process on a busy machine. A's acquire right after its release
/// takes a round trip or two, far less.
const DESCHEDULED: Duration = Duration::from_millis(50);

/// The mutex: A holds; B, another handle in a runtime of its own (another
/// process, on one thread), waits by wake-up. B's thread is not scheduled
/// for [`DESCHEDULED`] from just before A's release, and A acquires again
/// at once. B holds first, and A only after B released. Before the hand-off
/// window, A's attempt came long before the woken B's, and A held first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_releaser_leaves_the_mutex_to_the_waiter_it_woke() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "handoff:mutex";
    let held = a.mutex(key).try_acquire(far()).await.unwrap();
    assert_eq!(cluster.settled_count(held.key(), 3).await, 3);
    let order = Order::default();
    let (freeze, frozen) = (
        tokio::sync::oneshot::channel::<()>(),
        tokio::sync::oneshot::channel::<()>(),
    );
    let b_process = {
        let order = order.clone();
        let (freeze, frozen) = (freeze.1, frozen.0);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("B's runtime");
            rt.block_on(async move {
                tokio::spawn(async move {
                    if freeze.await.is_ok() {
                        let _ = frozen.send(());
                        // Part of the scenario: the whole process stops.
                        std::thread::sleep(DESCHEDULED);
                    }
                });
                let lock = b
                    .mutex(key)
                    .acquire_with(far(), &never_polls())
                    .await
                    .expect("the woken waiter gave up");
                order.push("B holds");
                order.push("B releases");
                b.unlock(lock).await.expect("B's release");
            });
        })
    };
    let waiter = tokio::task::spawn_blocking(move || b_process.join().expect("B's thread"));
    let a2 = a.clone();
    let (freeze, frozen) = (freeze.0, frozen.1);
    let run = release_and_retake(
        &cluster,
        &a,
        held,
        (key, &channels::flag(key)),
        (waiter, order),
        async move {
            freeze.send(()).expect("B's runtime is gone");
            frozen.await.expect("B never stopped");
        },
        move || async move { a2.mutex(key).acquire_with(far(), &never_polls()).await },
    )
    .await;
    println!("mutex: B held {:?} after A's release", run.woken_after);
    assert_eq!(run.order, WANT, "the releaser took the mutex back");
}

/// A policy that does not poll within [`far`], spreading woken attempts over
/// `jitter`.
fn spread_over(jitter: Duration) -> RetryPolicy {
    RetryPolicy::deadline(2 * far())
        .with_delay(far())
        .with_jitter(jitter)
}

/// The same for permits (one permit, both handles waiting with a jitter over
/// which the woken spread their attempts; B in the test's runtime): the
/// woken B holds first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_releaser_leaves_the_permit_to_the_waiter_it_woke() {
    let cluster = Cluster::start(3);
    let (a, b) = (cluster.patient_redlock(), cluster.patient_redlock());
    let key = "handoff:permits";
    let held = a
        .semaphore(key, 1)
        .unwrap()
        .try_acquire(far())
        .await
        .unwrap();
    assert_eq!(cluster.settled_count(held.key(), 3).await, 3);
    let retry = spread_over(ms(200));
    let order = Order::default();
    let waiter = {
        let (order, retry) = (order.clone(), retry.clone());
        tokio::spawn(async move {
            let lock = b
                .semaphore(key, 1)
                .unwrap()
                .acquire_with(far(), &retry)
                .await
                .expect("the woken waiter gave up");
            order.push("B holds");
            order.push("B releases");
            b.unlock(lock).await.expect("B's release");
        })
    };
    let a2 = a.clone();
    let run = release_and_retake(
        &cluster,
        &a,
        held,
        (key, &channels::flag(key)),
        (waiter, order),
        async {},
        move || async move { a2.semaphore(key, 1)?.acquire_with(far(), &retry).await },
    )
    .await;
    println!("permits: B held {:?} after A's release", run.woken_after);
    assert_eq!(run.order, WANT, "the releaser took the permit back");
}

/// A `redlock_core=debug` subscriber writing into `log`.
fn capture(log: &LogCapture) -> impl tracing::Subscriber + Send + Sync + 'static {
    let log = log.clone();
    tracing_subscriber::fmt()
        .with_env_filter("redlock_core=debug")
        .with_ansi(false)
        .with_writer(move || log.clone())
        .finish()
}

/// What the library logs when a release records a hand-off window, and
/// when an acquire waits one out.
const WINDOW: &str = "hand-off window";

/// A release that woke no other handle's waiter adds no delay to the
/// releaser's next acquire: no hand-off window is recorded or waited out
/// (the library's debug log of the releaser and its waiters says so, which
/// a window applied by mistake cannot pass, however short), and the
/// re-acquire is served within one wake-up. First with nobody waiting, then
/// with a waiter of the releaser's own handle (its subscription is the
/// handle's own, and not counted as another's), for permits and the mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_release_that_woke_nobody_else_adds_no_delay() {
    let cluster = Cluster::start(3);
    let a = cluster.patient_redlock();
    let log = LogCapture::default();
    for (key, permits) in [
        ("handoff:nobody:permit", true),
        ("handoff:nobody:mutex", false),
    ] {
        // Holds `key` from `a`, with one task's retrying acquire.
        let acquire = move |a: Redlock| async move {
            if permits {
                a.semaphore(key, 1)?
                    .acquire_with(far(), &never_polls())
                    .await
            } else {
                a.mutex(key).acquire_with(far(), &never_polls()).await
            }
        };
        let held = if permits {
            a.semaphore(key, 1).unwrap().try_acquire(far()).await
        } else {
            a.mutex(key).try_acquire(far()).await
        }
        .unwrap();
        assert_eq!(cluster.settled_count(held.key(), 3).await, 3);

        // Nobody waits.
        let began = Instant::now();
        let again = async {
            a.unlock(held).await.unwrap();
            acquire(a.clone()).await.unwrap()
        }
        .with_subscriber(capture(&log))
        .await;
        let took = began.elapsed();
        assert!(
            took < woken_within(),
            "{key}: re-acquired {took:?} after a release nobody heard"
        );

        // Only a waiter of the same handle. (`again` may hold a bare
        // quorum: on a loaded machine its `SET` can reach a node before the
        // release's delete, sent first, does.)
        let local = tokio::spawn(
            {
                let a = a.clone();
                async move {
                    let lock = acquire(a.clone()).await?;
                    a.unlock(lock).await?;
                    Ok::<_, redlock_core::Error>(())
                }
            }
            .with_subscriber(capture(&log)),
        );
        let flag = channels::flag(key);
        if !permits {
            // A mutex waiter queued behind its own handle's holder makes no
            // attempt, so leaves no flag; one left by an earlier waiter
            // makes the release announce itself all the same.
            let subscribed = redlock_tests::util::eventually(timing::settled(), || {
                (0..cluster.len()).all(|n| subscribers(&cluster, n, key) >= 1)
            })
            .await;
            assert!(subscribed, "{key}: the local waiter never subscribed");
            for node in cluster.nodes() {
                let _: redis::Value = node.raw(&["SET", &flag, "1", "PX", "60000"]).unwrap();
            }
        }
        until_flagged(&cluster, key, &flag).await;
        let published = || {
            (0..3)
                .map(|n| channels::publishes(&cluster, n))
                .sum::<u64>()
        };
        let before = published();
        let began = Instant::now();
        async {
            a.unlock(again).await.unwrap();
            let lock = acquire(a.clone()).await.unwrap();
            a.unlock(lock).await.unwrap();
        }
        .with_subscriber(capture(&log))
        .await;
        let took = began.elapsed();
        tokio::time::timeout(woken_within(), local)
            .await
            .expect("the local waiter hung")
            .unwrap()
            .unwrap();
        // Served at once, or once the local waiter held and released.
        assert!(
            took < 2 * woken_within(),
            "{key}: re-acquired {took:?} after a release only its own handle's waiter heard"
        );
        assert!(
            published() > before,
            "{key}: the release reached no subscriber, so it tested nothing"
        );
        let text = log.text();
        assert!(
            !text.contains(WINDOW),
            "{key}: a hand-off window with no other handle waiting:\n{text}"
        );
    }
}
