//! A waiting writer's intent lasts between its attempts (issue 48, item 4).
//! It got the writer's lock TTL, so with a TTL shorter than the retry delay
//! it lapsed between two attempts and a new reader passed the waiting writer,
//! against writer preference. The intent now lives past the writer's next
//! attempt, and is gone once the writer holds.

use std::time::Duration;

use redlock_core::{Access, Error, Redlock, RetryPolicy};
use redlock_tests::{Cluster, timing};

use crate::ms;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_intent_outlives_a_ttl_shorter_than_its_delay() {
    let cluster = Cluster::start(3);
    // The writer's TTL is the subject, and it is short: the most patient
    // node timeout it allows. A slow node's honest answers (an error, not a
    // share) are accepted below; only a share would break the promise.
    const TTL: Duration = Duration::from_millis(200);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::patient_node_timeout_for(TTL))
        .build()
        .unwrap();
    // The intent key: the lock key, braced (one slot), and the suffix.
    let intent = format!("{{{}}}:redlock-intent", rl.key_for("doc"));
    // A reader holds until the check below (nothing releases meanwhile, so
    // the writer is never woken: it retries at its 1 s delay). Its TTL is
    // within the writer's wait, or the writer would not wait for it.
    // Retried: a node timeout this short can miss a quorum on a loaded
    // machine, and the subject is the writer's intent, not this acquire.
    let reader = rl
        .rw_lock("doc", Access::Shared)
        .acquire_with(
            Duration::from_secs(20),
            &RetryPolicy::deadline(timing::settled()),
        )
        .await
        .unwrap();
    let writer = {
        let rl = rl.clone();
        tokio::spawn(async move {
            let retry = RetryPolicy::deadline(Duration::from_secs(30))
                .with_delay(ms(1000))
                .with_jitter(Duration::ZERO);
            rl.rw_lock("doc", Access::Exclusive)
                .acquire_with(TTL, &retry)
                .await
        })
    };
    // Its first refusal left the intent on a quorum.
    let intended =
        redlock_tests::util::eventually(timing::settled(), || cluster.count_with_key(&intent) >= 2)
            .await;
    assert!(intended, "the writer's intent never appeared");
    // Past the writer's lock TTL, before its next attempt: new readers are
    // still held back.
    tokio::time::sleep(ms(300)).await;
    assert!(!writer.is_finished(), "the writer stopped waiting");
    if let Ok(share) = rl
        .rw_lock("doc", Access::Shared)
        .try_acquire(Duration::from_secs(5))
        .await
    {
        panic!("a new reader passed the waiting writer: {share:?}");
    }
    // The first reader leaves: the writer takes the lock, and its intent
    // goes.
    rl.unlock(reader).await.unwrap();
    let held = match writer.await.unwrap() {
        Ok(held) => held,
        // A slow node's honest answer at the writer's last attempt.
        Err(e @ (Error::NoQuorum { .. } | Error::NoValidity { .. })) => {
            eprintln!("the writer's wait ended on a slow node: {e}");
            return;
        }
        Err(e) => panic!("the writer: {e}"),
    };
    assert_eq!(
        cluster.settled_count(&intent, 0).await,
        0,
        "the intent outlived the wait"
    );
    rl.unlock(held).await.unwrap();
}
