//! `Redlock::permit_with` and friends: at most `permits` holders.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Error, LockOptions, Redlock, RetryPolicy};
use redlock_tests::{Cluster, timing};

use super::{Section, most_at_once, ms, on_a_runtime_that_dies, redlock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_on_three_permits_never_make_four_holders() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 3;
    let cluster = Cluster::start(3);
    let sections: Arc<Mutex<Vec<Section>>> = Arc::default();
    let policy = RetryPolicy::deadline(Duration::from_secs(40))
        .with_delay(ms(5))
        .with_jitter(ms(40));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let rl = redlock(&cluster);
            let (sections, policy) = (Arc::clone(&sections), policy.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = rl
                        .semaphore("exports", 3)?
                        .acquire_with(Duration::from_secs(5), &policy)
                        .await?;
                    let enter = Instant::now();
                    tokio::time::sleep(ms(15)).await;
                    let exit = Instant::now();
                    assert!(permit.is_valid(), "client {client} outlived its validity");
                    sections.lock().unwrap().push(super::Section {
                        client,
                        enter,
                        exit,
                    });
                    // A release that misses a node's timeout leaves that
                    // slot to expire (5 s); the others then wait for it. It
                    // ends no section late: the section above ended before
                    // the release was sent.
                    match rl.unlock(permit).await {
                        Ok(_) | Err(Error::ReleaseIncomplete { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok::<(), Error>(())
            })
        })
        .collect();
    // Each round waits at most the policy's deadline, then a release.
    let allowed = (Duration::from_secs(40) + timing::PATIENT_NODE_TIMEOUT) * ROUNDS as u32;
    for task in tasks {
        tokio::time::timeout(timing::liveness(allowed), task)
            .await
            .expect("a client hung")
            .expect("a client panicked")
            .expect("a client failed");
    }
    let sections = sections.lock().unwrap().clone();
    assert_eq!(sections.len(), CLIENTS * ROUNDS);
    let most = most_at_once(&sections);
    println!("16 clients, 3 permits: at most {most} holders at once");
    assert!(most <= 3, "{most} holders at once with 3 permits");
    assert!(
        most >= 2,
        "never two holders at once: the permits were not shared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_of_three_down_still_hands_out_every_permit_and_no_more() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    cluster.node(2).kill();
    let ttl = Duration::from_secs(10);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            rl.semaphore("tenant:1", 3)
                .unwrap()
                .try_acquire(ttl)
                .await
                .unwrap(),
        );
    }
    let keys: std::collections::BTreeSet<&str> = held.iter().map(|l| l.key()).collect();
    assert_eq!(keys.len(), 3, "three holders on distinct slots: {keys:?}");
    // Refused: busy, or (the decision can come before the third node's
    // answer, from one busy node and the dead one) no quorum, as the mutex
    // says in that case.
    match rl.semaphore("tenant:1", 3).unwrap().try_acquire(ttl).await {
        Err(Error::Busy { .. } | Error::NoQuorum { .. }) => {}
        other => panic!("a fourth permit: {other:?}"),
    }
    let first = held.remove(0);
    rl.unlock(first).await.unwrap();
    held.push(
        rl.semaphore("tenant:1", 3)
            .unwrap()
            .try_acquire(ttl)
            .await
            .unwrap(),
    );
    for lock in held {
        rl.unlock(lock).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_is_free_at_its_expiry() {
    let cluster = Cluster::start(3);
    // A TTL the patient node timeout fits in (the loss margin).
    let ttl = timing::PATIENT_NODE_TIMEOUT * 2;
    let dead = redlock(&cluster);
    // Two permits, both taken by holders whose process dies holding them
    // (their guards would renew; the renewals die with the runtime). Their
    // keys were set after this instant.
    let started = Instant::now();
    on_a_runtime_that_dies(move || async move {
        let rl = dead;
        for _ in 0..2 {
            let guard = rl
                .semaphore("jobs", 2)
                .unwrap()
                .guard(&LockOptions::new(ttl))
                .await
                .unwrap();
            std::mem::forget(guard);
        }
    });
    let rl = redlock(&cluster);
    // Free once the keys expire: served by a retry with 20 ms delays, within
    // the TTL, a delay and a call.
    let bound = timing::liveness(ttl + ms(40) + timing::PATIENT_NODE_TIMEOUT);
    let policy = RetryPolicy::deadline(bound)
        .with_delay(ms(20))
        .with_jitter(ms(20));
    // Busy while the keys live (a loaded machine may already be past them).
    let permit = match rl.semaphore("jobs", 2).unwrap().try_acquire(ttl).await {
        Err(Error::Busy { .. }) => rl
            .semaphore("jobs", 2)
            .unwrap()
            .acquire_with(ttl, &policy)
            .await
            .unwrap(),
        Err(e) => panic!("{e}"),
        Ok(permit) => permit,
    };
    let waited = started.elapsed();
    // Not before the dead holder's keys expired (they were set after
    // `started`, for the TTL), and within the bound.
    assert!(waited >= ttl, "a permit freed early: after {waited:?}");
    assert!(waited <= bound, "freed only after {waited:?}");
    rl.unlock(permit).await.unwrap();
}

#[tokio::test]
async fn permits_out_of_range_are_refused_before_any_node_is_asked() {
    let cluster = Cluster::start(1);
    let rl = redlock(&cluster);
    for n in [0, redlock_core::MAX_PERMITS + 1] {
        let e = rl.semaphore("x", n);
        assert!(matches!(e, Err(Error::InvalidConfig(_))), "{n}: {e:?}");
    }
    assert!(cluster.node(0).keys().is_empty());
    // Duration::MAX is an input like any other: refused as a TTL, no panic.
    let e = rl
        .semaphore("x", 2)
        .unwrap()
        .try_acquire(Duration::MAX)
        .await;
    assert!(matches!(e, Err(Error::InvalidTtl { .. })), "{e:?}");
    let policy = RetryPolicy::deadline(Duration::MAX).with_delay(Duration::MAX);
    let held = rl
        .semaphore("x", 1)
        .unwrap()
        .acquire_with(Duration::from_secs(5), &policy)
        .await
        .unwrap();
    assert!(matches!(
        rl.semaphore("x", 1)
            .unwrap()
            .acquire_with(
                Duration::from_secs(5),
                &RetryPolicy::attempts(2).with_delay(Duration::MAX)
            )
            .await,
        Err(Error::Busy { .. })
    ));
    rl.unlock(held).await.unwrap();
}

/// Issue 47, item 8: the count is part of the resource on the nodes. A
/// client with `permits(3)` beside holders with `permits(2)` (a rolling
/// deploy, `redlock run --permits 3` next to the application) used to be
/// admitted as a third holder, silently. It is refused with a typed error
/// that names both counts, and takes nothing; the holders' renewals keep the
/// count as long as they hold (several TTLs here); once every permit is gone
/// and the count has expired, the new count holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_count_beside_held_permits_is_refused_with_a_typed_error() {
    let cluster = Cluster::start(3);
    let ttl = Duration::from_millis(1500);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(ttl))
        .build()
        .unwrap();
    let two = rl.semaphore("exports", 2).unwrap();
    let options = LockOptions::new(ttl);
    let (a, b) = (
        two.guard(&options).await.unwrap(),
        two.guard(&options).await.unwrap(),
    );
    let three = rl.semaphore("exports", 3).unwrap();
    let refused = three.try_acquire(ttl).await;
    match &refused {
        Err(Error::PermitsMismatch { asked, found, .. }) => {
            assert_eq!((*asked, found.as_str()), (3, "2"));
        }
        other => panic!("a third holder beside permits(2): {other:?}"),
    }
    // Nothing was taken: the third slot is free on every node.
    assert!(
        cluster
            .nodes()
            .iter()
            .all(|n| n.get("{exports}:redlock-permit:2").is_none()),
        "a slot was taken by the refused client"
    );
    // Past several TTLs (the subject is time: renewals keep the count).
    tokio::time::sleep(ttl * 3).await;
    if !a.is_lost() && !b.is_lost() {
        let again = three
            .acquire_with(ttl, &RetryPolicy::attempts(3).with_delay(ms(50)))
            .await;
        assert!(
            matches!(again, Err(Error::PermitsMismatch { .. })),
            "after renewals: {again:?}"
        );
    }
    a.release().await.unwrap();
    b.release().await.unwrap();
    // The count expires with the last permit's TTL; then 3 it is.
    let end = Instant::now() + timing::liveness(ttl);
    let lock = loop {
        match three.try_acquire(ttl).await {
            Ok(lock) => break lock,
            Err(Error::PermitsMismatch { .. }) if Instant::now() < end => {
                tokio::time::sleep(ms(100)).await;
            }
            other => panic!("the count of the released permits stayed: {other:?}"),
        }
    };
    rl.unlock(lock).await.unwrap();
}
