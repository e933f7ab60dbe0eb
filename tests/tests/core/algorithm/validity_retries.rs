//! Steps 3 and 4: the validity left after drift and elapsed time, and the retries.

use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_tests::Cluster;

use super::*;

// ---------------------------------------------------------------- 3. validity

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn validity_subtracts_drift_and_elapsed_time() {
    let cluster = Cluster::start(3);
    let rl = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    let ttl = Duration::from_secs(10);
    let asked = Instant::now();
    let lock = rl.mutex("validity").try_acquire(ttl).await.unwrap();
    let call = asked.elapsed();
    let remaining = lock.remaining();
    let drift = ttl.mul_f64(0.01) + ms(2);
    assert!(remaining <= ttl - drift, "{remaining:?} ignores the drift");
    // No more than the call's own time (and the drift) is taken off.
    assert!(
        lock.valid_until() + call + ms(1) >= asked + (ttl - drift),
        "{remaining:?} is shorter than the TTL less the drift and the call's {call:?}"
    );
    assert!(lock.valid_until() <= lock.started_at() + (ttl - drift));
    assert!(lock.is_valid());
    let token = lock.token().to_owned();
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_holding("validity", &token)
            == 3)
    );
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn no_validity_left_fails_and_releases_every_key() {
    let cluster = Cluster::start(3);
    let ttl = Duration::from_secs(1);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(ttl))
        .fixed_drift(ttl)
        .build()
        .unwrap();
    warm_up(&cluster, &rl).await;
    let key = "no-validity";
    let monitor = cluster.node(0).monitor();
    let err = rl.mutex(key).try_acquire(ttl).await.unwrap_err();
    assert!(
        matches!(&err, Error::NoValidity { ttl: t, .. } if *t == ttl),
        "{err:?}"
    );
    assert!(
        cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0),
        "the failed attempt left keys"
    );
    // The keys were really set, then released with the same token.
    let cmds = stop_commands(monitor);
    let acquires = acquire_calls(&cmds, key);
    assert_eq!(acquires.len(), 1, "{cmds:?}");
    // (A node still pending at the decision is released twice: by the failed
    // attempt and by the late-answer handler. Both carry the attempt's token.)
    let releases = release_calls(&cmds, key);
    assert!(
        !releases.is_empty() && releases.iter().all(|t| *t == acquires[0].0),
        "{cmds:?}"
    );
}

// ---------------------------------------------------------------- 4. retries

/// Every attempt counts against `max_attempts`, in both ways of waiting. Polling
/// spaces the attempts by the delay. Waking on release makes the second attempt
/// at once, once subscribed (so that a release in between is not missed); the
/// delay then only spaces the safety-net polls of a holder that never releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn retry_attempts_are_counted_and_spaced() {
    let cluster = Cluster::start(3);
    let holder = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    // The subject is the count and the spacing of the attempts, not a slow
    // node: every attempt's calls are answered.
    let node_timeout = PATIENT_NODE_TIMEOUT;
    for (wake, min_took) in [(false, ms(150)), (true, ms(100))] {
        let rl = Redlock::builder()
            .urls(cluster.urls())
            .node_timeout(node_timeout)
            .wake_on_release(wake)
            .build()
            .unwrap();
        warm_up(&cluster, &rl).await;
        let key = format!("retry-attempts-{wake}");
        let held = held_everywhere(&cluster, &holder, &key, Duration::from_secs(10)).await;
        let monitor = cluster.node(0).monitor();
        let policy = RetryPolicy::attempts(4)
            .with_delay(ms(50))
            .with_jitter(Duration::ZERO);
        let t0 = Instant::now();
        let err = rl
            .mutex(&key)
            .acquire_with(Duration::from_secs(5), &policy)
            .await
            .unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(err, Error::Busy { .. }), "{err:?}");
        assert!(took >= min_took, "wake={wake}: took {took:?}");
        // Each attempt: an acquire round and a release round, then the delay.
        let allowed = 4 * (2 * node_timeout + ms(50));
        assert!(took < timing::liveness(allowed), "took {took:?}");
        let cmds = stop_commands(monitor);
        let ours: Vec<_> = acquire_calls(&cmds, &key)
            .into_iter()
            .filter(|(t, _)| t != held.token())
            .collect();
        assert_eq!(ours.len(), 4, "wake={wake}: {cmds:?}");
        assert_eq!(cluster.count_holding(&key, held.token()), 3);
        redlock_tests::util::assert_released(&holder.unlock(held).await.unwrap(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn retry_deadline_bounds_the_total_time() {
    let cluster = Cluster::start(3);
    let holder = ready(&cluster, PATIENT_NODE_TIMEOUT).await;
    // The node timeout is part of the deadline's arithmetic, so it stays
    // short; a node that misses it makes the answer NoQuorum, not Busy.
    let node_timeout = ms(100);
    let rl = ready(&cluster, node_timeout).await;
    let deadline = ms(400);
    let key = "retry-deadline";
    let held = held_everywhere(&cluster, &holder, key, Duration::from_secs(10)).await;
    let t0 = Instant::now();
    let err = rl
        .mutex(key)
        .acquire_with(Duration::from_secs(5), &RetryPolicy::deadline(deadline))
        .await
        .unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(err, Error::Busy { .. } | Error::NoQuorum { .. }),
        "{err:?}"
    );
    // The last attempt starts no later than the deadline less two node
    // timeouts (its acquire round and the release of a failed attempt).
    assert!(
        took >= deadline - 2 * node_timeout,
        "gave up before the deadline: {took:?}"
    );
    assert!(
        took < timing::liveness(deadline),
        "overran the deadline: {took:?}"
    );
    redlock_tests::util::assert_released(&holder.unlock(held).await.unwrap(), 3);
}
