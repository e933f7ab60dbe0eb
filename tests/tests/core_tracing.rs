//! `redlock-core`'s tracing on real `redis-server` processes: acquire, extend and
//! release run in spans named `redlock.acquire`, `redlock.extend` and
//! `redlock.release`, and a node password from the URL is never logged nor shown
//! by `Debug`.
//!
//! The test runs on a current-thread runtime so that the thread-local capturing
//! subscriber also sees what spawned tasks log, and in a binary of its own:
//! tracing caches each callsite's interest process-wide, so other tests hitting
//! the same callsites from other threads at once can hide events from a
//! thread-scoped subscriber.

use std::time::Duration;

use redlock_core::Redlock;
use redlock_tests::Cluster;
use redlock_tests::util::LogCapture as Capture;

const PASSWORD: &str = "hunter2secret";

#[tokio::test(flavor = "current_thread")]
async fn spans_are_named_and_the_password_is_never_logged() {
    let cluster = Cluster::start(3);
    for node in cluster.nodes() {
        node.cmd(&["CONFIG", "SET", "requirepass", PASSWORD]);
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://:{PASSWORD}@127.0.0.1:{}", n.port()))
        .collect();

    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let capture = capture.clone();
            move || capture.clone()
        })
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let builder = Redlock::builder()
        .urls(urls.clone())
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT);
    let builder_debug = format!("{builder:?}");
    let redlock = builder.build().unwrap();
    let mut lock = redlock
        .mutex("traced")
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("the password from the URL authenticates");
    redlock
        .extend(&mut lock, Duration::from_secs(10))
        .await
        .unwrap();
    let lock_debug = format!("{lock:?}");
    let released = redlock.unlock(lock).await.unwrap();
    assert!(
        released.deleted + released.report().pending_count() >= 2,
        "{released:?}"
    );
    // Let spawned late-answer handlers log too: the last node has answered
    // the release once no node holds the key.
    assert_eq!(cluster.settled_count("traced", 0).await, 0, "released");

    let logged = capture.text();
    for span in ["redlock.acquire", "redlock.extend", "redlock.release"] {
        assert!(logged.contains(span), "no {span} span in:\n{logged}");
    }
    assert!(!logged.contains(PASSWORD), "password logged:\n{logged}");
    let redlock_debug = format!("{redlock:?}");
    let port = cluster.node(0).port().to_string();
    assert!(redlock_debug.contains(&port), "{redlock_debug}");
    for shown in [&redlock_debug, &builder_debug, &lock_debug] {
        assert!(!shown.contains(PASSWORD), "password in Debug: {shown}");
    }
}
