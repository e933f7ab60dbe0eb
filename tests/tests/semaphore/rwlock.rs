//! `Redlock::rw_lock_with` and friends: readers share, a writer is alone,
//! and a writer is served while readers keep arriving.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Access, Error, LockOptions, RetryPolicy};
use redlock_tests::{Cluster, timing};

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
                        .rw_lock("reports/7", access)
                        .acquire_with(Duration::from_secs(5), &policy)
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
    const HOLD: Duration = Duration::from_millis(150);
    let cluster = Cluster::start(3);
    // The writer waits for the readers inside at its arrival to leave, then
    // its attempt: within this bound, also its retry deadline.
    let writer_bound = timing::liveness(HOLD + timing::PATIENT_NODE_TIMEOUT * 2);
    // The readers keep arriving until a while after the writer was served,
    // and for at most this long: a writer served only as the stream ends
    // was starved.
    let stream_for = writer_bound * 2;
    let begin = Instant::now();
    let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A stream of readers: one every 20 ms, each holding 150 ms, so that
    // without writer preference several always hold.
    let readers = {
        let rl = redlock(&cluster);
        let (holding, stop) = (Arc::clone(&holding), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            let (mut refused, mut held) = (0, 0);
            while begin.elapsed() < stream_for && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (rl, holding) = (rl.clone(), Arc::clone(&holding));
                tasks.push(tokio::spawn(async move {
                    match rl
                        .rw_lock("reports/9", Access::Shared)
                        .try_acquire(Duration::from_secs(5))
                        .await
                    {
                        Ok(lock) => {
                            holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(HOLD).await;
                            holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
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
    // Let the readers fill up first: two of them holding at once.
    let filled = redlock_tests::util::eventually(timing::liveness(HOLD), || {
        holding.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    assert!(filled, "two readers never held at once");
    let rl = redlock(&cluster);
    let policy = RetryPolicy::deadline(writer_bound)
        .with_delay(ms(10))
        .with_jitter(ms(10));
    let writer = rl
        .rw_lock("reports/9", Access::Exclusive)
        .acquire_with(Duration::from_secs(5), &policy)
        .await
        .expect("the writer was starved");
    let served = begin.elapsed();
    tokio::time::sleep(ms(100)).await;
    rl.unlock(writer).await.unwrap();
    // Part of the scenario: readers keep coming for a while after the writer.
    tokio::time::sleep(ms(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (held, refused) = readers.await.unwrap();
    println!("writer served after {served:?}; readers held {held}, refused {refused}");
    assert!(
        served < stream_for,
        "writer served only after {served:?}, as the reader stream ended"
    );
    assert!(held > 10, "only {held} readers held");
    assert!(refused > 0, "no reader was held back for the writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_share_is_free_at_its_expiry() {
    let cluster = Cluster::start(3);
    // A TTL the patient node timeout fits in (the loss margin).
    let ttl = timing::PATIENT_NODE_TIMEOUT * 2;
    let dead = redlock(&cluster);
    // The dead reader's keys were set after this instant.
    let started = Instant::now();
    on_a_runtime_that_dies(move || async move {
        let rl = dead;
        let guard = rl
            .rw_lock("reports/3", Access::Shared)
            .guard(&LockOptions::new(ttl))
            .await
            .unwrap();
        std::mem::forget(guard);
    });
    let rl = redlock(&cluster);
    // Another reader shares it meanwhile.
    let other = rl
        .rw_lock("reports/3", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    rl.unlock(other).await.unwrap();
    // Served by a retry with 20 ms delays once the share expires: within
    // the TTL, a delay and a call.
    let bound = timing::liveness(ttl + ms(40) + timing::PATIENT_NODE_TIMEOUT);
    let policy = RetryPolicy::deadline(bound)
        .with_delay(ms(20))
        .with_jitter(ms(20));
    let writer = rl
        .rw_lock("reports/3", Access::Exclusive)
        .acquire_with(ttl, &policy)
        .await
        .unwrap();
    let waited = started.elapsed();
    // The dead share was set after `started`, for the TTL.
    assert!(
        waited >= ttl,
        "writer in before the reader expired: {waited:?}"
    );
    assert!(waited <= bound, "writer in only after {waited:?}");
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
    let a = rl
        .rw_lock("r", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    let b = rl
        .rw_lock("r", Access::Shared)
        .try_acquire(ttl)
        .await
        .unwrap();
    assert!(matches!(
        rl.rw_lock("r", Access::Exclusive).try_acquire(ttl).await,
        Err(Error::Busy { .. } | Error::NoQuorum { .. })
    ));
    rl.unlock(a).await.unwrap();
    rl.unlock(b).await.unwrap();
    // The refused writer's intent goes in the background too, and until
    // then it turns another writer away (`Busy`, with the intent's TTL):
    // retried, within a bound far below that TTL.
    let w = match rl
        .rw_lock("r", Access::Exclusive)
        .acquire_with(ttl, &RetryPolicy::deadline(timing::settled()))
        .await
    {
        Ok(w) => w,
        Err(e) => panic!(
            "{e:?}; node 0 holds {}; node 2 holds {}",
            describe_keys(cluster.node(0)),
            describe_keys(cluster.node(2))
        ),
    };
    assert!(matches!(
        rl.rw_lock("r", Access::Shared).try_acquire(ttl).await,
        Err(Error::Busy { .. } | Error::NoQuorum { .. })
    ));
    rl.unlock(w).await.unwrap();
    // The refused writer's intent is deleted once it gave up (in the
    // background, so on a loaded machine a moment later): readers are
    // admitted long before it would have expired (its TTL covers this
    // 10 s TTL and more).
    let c = match rl
        .rw_lock("r", Access::Shared)
        .acquire_with(ttl, &RetryPolicy::deadline(timing::settled()))
        .await
    {
        Ok(c) => c,
        Err(e) => panic!(
            "{e:?}; node 0 holds {}; node 2 holds {}",
            describe_keys(cluster.node(0)),
            describe_keys(cluster.node(2))
        ),
    };
    rl.unlock(c).await.unwrap();
}

/// Every key of `node` with its type, PTTL and (for a string) value, for a
/// failure's message.
fn describe_keys(node: &redlock_tests::RedisNode) -> String {
    node.keys()
        .iter()
        .map(|k| {
            let kind: String = node.raw(&["TYPE", k]).unwrap_or_default();
            let value = match kind.as_str() {
                "string" => node.get(k).unwrap_or_default(),
                "set" => format!(
                    "{:?}",
                    node.raw::<Vec<String>>(&["SMEMBERS", k])
                        .unwrap_or_default()
                ),
                _ => String::new(),
            };
            format!("{k} ({kind}, pttl {}) = {value}", node.pttl(k))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Issue 48: two writers that re-acquire as soon as they release, each on a
/// handle of its own, and a reader that waits. Before read phases, the
/// writers handed the lock to each other (the waiting one's intent refused
/// the reader in every gap) and the reader waited out its deadline. Now a
/// writer's release hands the lock to the readers it held back: the reader
/// holds within the writer hold it came in, a second one at most (it may
/// come in the gap, behind the waiting writer), and its own hand-off window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_that_re_acquire_at_once_do_not_starve_a_waiting_reader() {
    const HOLD: Duration = Duration::from_millis(50);
    let cluster = Cluster::start(3);
    let reader_policy = RetryPolicy::deadline(Duration::from_secs(60))
        .with_delay(ms(50))
        .with_jitter(ms(20));
    // The reader's hand-off window (`rwlock/`): its delay, jitter and two
    // node timeouts.
    let window = ms(50) + ms(20) + timing::PATIENT_NODE_TIMEOUT * 2;
    let bound = timing::liveness(HOLD * 2 + window);
    let reader_policy = reader_policy.with_deadline(bound);
    let ttl = Duration::from_secs(5);
    // (is a writer, section)
    let sections: Arc<Mutex<Vec<(bool, Section)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = Arc::new(tokio::sync::Notify::new());
    let writers: Vec<_> = (0..2)
        .map(|client| {
            let rl = redlock(&cluster);
            let (sections, stop, held) =
                (Arc::clone(&sections), Arc::clone(&stop), Arc::clone(&held));
            tokio::spawn(async move {
                let policy = RetryPolicy::deadline(bound)
                    .with_delay(ms(5))
                    .with_jitter(ms(5));
                let (mut holds, mut busy) = (0, 0);
                // Bounded by the reader's wait, and by the stop once it held.
                let end = Instant::now() + bound * 2;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < end {
                    let lock = match rl
                        .rw_lock("turns", Access::Exclusive)
                        .acquire_with(ttl, &policy)
                        .await
                    {
                        Ok(lock) => lock,
                        // The other writer's turns: not this test's subject.
                        Err(Error::Busy { .. } | Error::NoQuorum { .. }) => {
                            busy += 1;
                            continue;
                        }
                        Err(e) => panic!("writer {client}: {e}"),
                    };
                    let enter = Instant::now();
                    held.notify_one();
                    tokio::time::sleep(HOLD).await;
                    let exit = Instant::now();
                    assert!(lock.is_valid(), "writer {client} outlived its validity");
                    sections.lock().unwrap().push((
                        true,
                        Section {
                            client,
                            enter,
                            exit,
                        },
                    ));
                    rl.unlock(lock).await.unwrap();
                    holds += 1;
                }
                (holds, busy)
            })
        })
        .collect();
    // The reader comes while a writer holds.
    held.notified().await;
    let rl = redlock(&cluster);
    let asked = Instant::now();
    let read = rl
        .rw_lock("turns", Access::Shared)
        .acquire_with(ttl, &reader_policy)
        .await;
    let waited = asked.elapsed();
    let read = match read {
        Ok(lock) => {
            let enter = Instant::now();
            tokio::time::sleep(HOLD).await;
            let exit = Instant::now();
            assert!(lock.is_valid(), "the reader outlived its validity");
            rl.unlock(lock).await.unwrap();
            Ok(Section {
                client: 2,
                enter,
                exit,
            })
        }
        Err(e) => Err(e),
    };
    // The writers keep going a moment after the reader: the writer after
    // the read phase comes in.
    let writer_holds = sections.lock().unwrap().len();
    let more = redlock_tests::util::eventually(timing::liveness(window + HOLD * 2), || {
        sections.lock().unwrap().len() > writer_holds
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut counts = Vec::new();
    for w in writers {
        counts.push(w.await.expect("a writer panicked"));
    }
    let mut sections = sections.lock().unwrap().clone();
    if let Ok(section) = &read {
        sections.push((false, *section));
    }
    // Safety, whatever happened: a writer alone.
    for (_, ws) in sections.iter().filter(|(w, _)| *w) {
        for (other_is_writer, o) in &sections {
            if o.client == ws.client && o.enter == ws.enter {
                continue;
            }
            assert!(
                o.exit <= ws.enter || ws.exit <= o.enter,
                "writer {} overlapped {} {}",
                ws.client,
                if *other_is_writer { "writer" } else { "reader" },
                o.client
            );
        }
    }
    // Key hygiene: every key the turns left on a node expires.
    for n in cluster.nodes() {
        for k in n.keys() {
            assert_ne!(n.pttl(&k), -1, "{k} has no expiry");
        }
    }
    println!("reader waited {waited:?} (bound {bound:?}); writers (holds, busy): {counts:?}");
    if let Err(e) = read {
        panic!(
            "the reader waited {waited:?} and was refused: {e}; writers (holds, busy): {counts:?}"
        );
    }
    assert!(
        waited <= bound,
        "the reader held only after {waited:?} (bound {bound:?})"
    );
    assert!(more, "no writer held after the reader");
}
