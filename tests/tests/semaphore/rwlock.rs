//! `Redlock::rw_lock_with` and friends: readers share, a writer is alone,
//! and a writer is served while readers keep arriving.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Access, Error, LockOptions, RetryPolicy};
use redlock_tests::Cluster;

use super::{Section, most_at_once, ms, on_a_runtime_that_dies, redlock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_each_other_and_never_a_writer() {
    const READERS: usize = 8;
    const WRITERS: usize = 3;
    const ROUNDS: usize = 4;
    let cluster = Cluster::start(3);
    // (is a writer, section)
    let sections: Arc<Mutex<Vec<(bool, Section)>>> = Arc::default();
    let policy = RetryPolicy::deadline(Duration::from_secs(40))
        .with_delay(ms(5))
        .with_jitter(ms(30));
    let tasks: Vec<_> = (0..READERS + WRITERS)
        .map(|client| {
            let rl = redlock(&cluster);
            let (sections, policy) = (Arc::clone(&sections), policy.clone());
            let writer = client >= READERS;
            let access = if writer {
                Access::Exclusive
            } else {
                Access::Shared
            };
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = rl
                        .rw_lock_with("reports/7", access, Duration::from_secs(5), &policy)
                        .await?;
                    let enter = Instant::now();
                    tokio::time::sleep(ms(20)).await;
                    let exit = Instant::now();
                    assert!(lock.is_valid(), "client {client} outlived its validity");
                    sections.lock().unwrap().push((
                        writer,
                        Section {
                            client,
                            enter,
                            exit,
                        },
                    ));
                    rl.unlock(lock).await?;
                }
                Ok::<(), Error>(())
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a client hung")
            .expect("a client panicked")
            .expect("a client failed");
    }
    let sections = sections.lock().unwrap().clone();
    assert_eq!(sections.len(), (READERS + WRITERS) * ROUNDS);
    for (w, ws) in sections.iter().filter(|(w, _)| *w) {
        for (other_is_writer, o) in &sections {
            if o.client == ws.client && o.enter == ws.enter {
                continue;
            }
            assert!(
                o.exit <= ws.enter || ws.exit <= o.enter,
                "writer {} overlapped {} {} (writer: {w})",
                ws.client,
                if *other_is_writer { "writer" } else { "reader" },
                o.client
            );
        }
    }
    let readers: Vec<Section> = sections
        .iter()
        .filter(|(w, _)| !w)
        .map(|(_, s)| *s)
        .collect();
    let most = most_at_once(&readers);
    println!("readers at once: at most {most}");
    assert!(most >= 2, "readers never overlapped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_served_while_readers_keep_arriving() {
    let cluster = Cluster::start(3);
    let stream_for = Duration::from_secs(6);
    let begin = Instant::now();
    // A stream of readers: one every 20 ms, each holding 150 ms, so that
    // without writer preference several always hold.
    let readers = {
        let rl = redlock(&cluster);
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            let (mut refused, mut held) = (0, 0);
            while begin.elapsed() < stream_for {
                let rl = rl.clone();
                tasks.push(tokio::spawn(async move {
                    match rl
                        .try_rw_lock("reports/9", Access::Shared, Duration::from_secs(5))
                        .await
                    {
                        Ok(lock) => {
                            tokio::time::sleep(ms(150)).await;
                            rl.unlock(lock).await.unwrap();
                            true
                        }
                        Err(Error::Busy { .. }) => false,
                        Err(e) => panic!("reader: {e}"),
                    }
                }));
                tokio::time::sleep(ms(20)).await;
            }
            for t in tasks {
                if t.await.unwrap() {
                    held += 1;
                } else {
                    refused += 1;
                }
            }
            (held, refused)
        })
    };
    // Let the readers fill up first.
    let rl = redlock(&cluster);
    let filled = Instant::now() + ms(500);
    tokio::time::sleep_until(filled.into()).await;
    let policy = RetryPolicy::deadline(Duration::from_secs(5))
        .with_delay(ms(10))
        .with_jitter(ms(10));
    let writer = rl
        .rw_lock_with(
            "reports/9",
            Access::Exclusive,
            Duration::from_secs(5),
            &policy,
        )
        .await
        .expect("the writer was starved");
    let served = begin.elapsed();
    tokio::time::sleep(ms(100)).await;
    rl.unlock(writer).await.unwrap();
    let (held, refused) = readers.await.unwrap();
    println!("writer served after {served:?}; readers held {held}, refused {refused}");
    assert!(
        served < stream_for - Duration::from_secs(2),
        "writer served only after {served:?}, as the reader stream ended"
    );
    assert!(held > 10, "only {held} readers held");
    assert!(refused > 0, "no reader was held back for the writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_share_is_free_at_its_expiry() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    on_a_runtime_that_dies(move || async move {
        let rl = redlock_core::Redlock::from_urls(urls).unwrap();
        let guard = rl
            .rw_guard("reports/3", Access::Shared, &LockOptions::new(ms(1500)))
            .await
            .unwrap();
        std::mem::forget(guard);
    });
    let died = Instant::now();
    let rl = redlock(&cluster);
    // Another reader shares it meanwhile.
    let other = rl
        .try_rw_lock("reports/3", Access::Shared, ms(1500))
        .await
        .unwrap();
    rl.unlock(other).await.unwrap();
    let policy = RetryPolicy::deadline(Duration::from_secs(10))
        .with_delay(ms(20))
        .with_jitter(ms(20));
    let writer = rl
        .rw_lock_with("reports/3", Access::Exclusive, ms(1500), &policy)
        .await
        .unwrap();
    let waited = died.elapsed();
    assert!(
        waited >= ms(1200),
        "writer in before the reader expired: {waited:?}"
    );
    assert!(waited <= ms(5000), "writer in only after {waited:?}");
    rl.unlock(writer).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_of_three_down_still_reads_and_writes() {
    let cluster = Cluster::start(3);
    let rl = redlock(&cluster);
    cluster.node(1).kill();
    let ttl = Duration::from_secs(10);
    // A refusal with a node down is busy, or no quorum when the refusing
    // node and the dead one answer first (the mutex's rule).
    let a = rl.try_rw_lock("r", Access::Shared, ttl).await.unwrap();
    let b = rl.try_rw_lock("r", Access::Shared, ttl).await.unwrap();
    assert!(matches!(
        rl.try_rw_lock("r", Access::Exclusive, ttl).await,
        Err(Error::Busy { .. } | Error::NoQuorum { .. })
    ));
    rl.unlock(a).await.unwrap();
    rl.unlock(b).await.unwrap();
    let w = rl.try_rw_lock("r", Access::Exclusive, ttl).await.unwrap();
    assert!(matches!(
        rl.try_rw_lock("r", Access::Shared, ttl).await,
        Err(Error::Busy { .. } | Error::NoQuorum { .. })
    ));
    rl.unlock(w).await.unwrap();
    // The writer's intent went with it: readers are admitted at once.
    let c = rl.try_rw_lock("r", Access::Shared, ttl).await.unwrap();
    rl.unlock(c).await.unwrap();
}
