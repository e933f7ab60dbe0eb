//! The `tls` feature on real TLS-only `redis-server` nodes (`--port 0
//! --tls-port`, a password, a certificate from a throwaway CA): `rediss://`
//! nodes lock and unlock, an unknown CA is a clean per-node error (not a panic
//! in rustls), and the password never shows in errors or `Debug` output.

use std::time::{Duration, Instant};

use deadpool_redis::{Manager, Pool, Runtime};
use redis::{AsyncConnectionConfig, TlsCertificates};
use redlock_core::{Error, NodeError, Redlock};
use redlock_tests::{TestCa, TlsRedisNode, timing};

const PASSWORD: &str = "tls-node-s3cret";

/// How long a background connection attempt of a handle with the patient
/// node timeout may take (ten node timeouts, `node/connection.rs`).
const CONNECT_LIMIT: Duration = Duration::from_secs(20);

fn nodes(ca: &TestCa) -> Vec<TlsRedisNode> {
    (0..3).map(|_| TlsRedisNode::start(ca, PASSWORD)).collect()
}

fn url(node: &TlsRedisNode) -> String {
    format!("rediss://:{PASSWORD}@127.0.0.1:{}", node.port())
}

fn trust(ca: &TestCa) -> TlsCertificates {
    TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.ca_pem()),
    }
}

#[track_caller]
fn assert_no_password(texts: &[String]) {
    for t in texts {
        assert!(!t.contains(PASSWORD), "the password shows in: {t}");
    }
}

/// Locks, sees the lock busy, unlocks and locks again over `rl`, once every
/// node's connection is up. On a cold connection (a TLS handshake) the first
/// acquire returns at a quorum while the third node's `SET` waits for the
/// handshake with the release, and either may go out first: that ordering is
/// not this test's subject.
async fn lock_cycle(rl: &Redlock, key: &str) {
    // A call waits one node timeout for the connection; the attempt itself
    // (a debug build's TLS handshake, on a loaded machine) goes on in the
    // background for up to ten: until every node is connected, a check may
    // honestly answer `Timeout`.
    let until = Instant::now() + timing::liveness(CONNECT_LIMIT);
    let infos = loop {
        let infos = rl.check_nodes().await.expect("check the TLS nodes");
        let pending = infos
            .iter()
            .any(|i| matches!(i.error, Some(NodeError::Timeout(_))));
        if !pending || Instant::now() >= until {
            break infos;
        }
    };
    assert!(infos.iter().all(|i| i.error.is_none()), "{infos:?}");
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("TLS nodes must grant the lock: {e}"));
    let busy = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .expect_err("the lock is held");
    assert!(matches!(busy, Error::Busy { .. }), "{busy:?}");
    assert_no_password(&[
        format!("{busy}"),
        format!("{busy:?}"),
        format!("{rl:?}"),
        format!("{lock:?}"),
    ]);
    let released = rl.unlock(lock).await.unwrap();
    redlock_tests::util::assert_released(&released, 3);
    // The released key is free again at once on the nodes that confirmed it.
    let again = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap();
    rl.unlock(again).await.unwrap();
}

/// `RedlockBuilder::tls_url` with the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_lock_and_unlock_with_a_private_ca() {
    if redlock_tests::tls::skip_without_tls(
        "core::tls::tls_nodes_lock_and_unlock_with_a_private_ca",
    ) {
        return;
    }
    let ca = TestCa::generate();
    let nodes = nodes(&ca);
    let mut builder = Redlock::builder().node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT);
    for n in &nodes {
        builder = builder.tls_url(url(n), trust(&ca)).unwrap();
    }
    assert_no_password(&[format!("{builder:?}")]);
    let rl = builder.build().unwrap();
    lock_cycle(&rl, "tls-private-ca").await;
}

/// Pools the application built itself (redis' `Client::build_with_tls`) work
/// too: the feature brings a crypto provider rustls can find on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_lock_and_unlock_through_application_pools() {
    if redlock_tests::tls::skip_without_tls(
        "core::tls::tls_nodes_lock_and_unlock_through_application_pools",
    ) {
        return;
    }
    let ca = TestCa::generate();
    let nodes = nodes(&ca);
    let mut builder = Redlock::builder().node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT);
    for n in &nodes {
        let client = redis::Client::build_with_tls(url(n), trust(&ca)).unwrap();
        let manager = Manager::new_with_config(
            client.get_connection_info().clone(),
            AsyncConnectionConfig::new(),
        )
        .unwrap();
        let pool = Pool::builder(manager)
            .runtime(Runtime::Tokio1)
            .build()
            .unwrap();
        builder = builder.labeled_pool(format!("127.0.0.1:{}", n.port()), pool);
    }
    let rl = builder.build().unwrap();
    lock_cycle(&rl, "tls-app-pools").await;
}

/// A plain `rediss://` URL checks the server against the system's roots, which
/// do not hold the throwaway CA: every node fails with a connect error that
/// says why, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_node_with_an_unknown_ca_is_a_connect_error() {
    if redlock_tests::tls::skip_without_tls(
        "core::tls::tls_node_with_an_unknown_ca_is_a_connect_error",
    ) {
        return;
    }
    let ca = TestCa::generate();
    let nodes = nodes(&ca);
    let rl = Redlock::builder()
        .urls(nodes.iter().map(url))
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();
    // Until the background connection attempts fail their handshakes, a
    // call may answer `Timeout` (see `lock_cycle`).
    let until = Instant::now() + timing::liveness(CONNECT_LIMIT);
    let err = loop {
        let err = rl
            .mutex("tls-unknown-ca")
            .try_acquire(Duration::from_secs(10))
            .await
            .expect_err("the server's CA is not trusted");
        let pending = err
            .report()
            .is_some_and(|r| r.errors().any(|(_, e)| matches!(e, NodeError::Timeout(_))));
        if !pending || Instant::now() >= until {
            break err;
        }
    };
    let report = err.report().unwrap_or_else(|| panic!("{err:?}"));
    assert!(matches!(err, Error::NoQuorum { .. }), "{err:?}");
    for (_, e) in report.errors() {
        match e {
            NodeError::Connect(m) => assert!(m.to_lowercase().contains("certificate"), "{m}"),
            other => panic!("expected a connect error, got {other:?}"),
        }
    }
    assert_no_password(&[format!("{err}"), format!("{err:?}"), format!("{rl:?}")]);
}

/// Issue 18 ("Also"): `rediss://…/#insecure` used to build, then fail every
/// connect with redis-rs' "Cannot create insecure client without
/// tls-rustls-insecure feature". It is refused at build time, with a reason
/// that says how to trust a private CA, and without the password.
#[test]
fn an_insecure_tls_url_is_refused_with_what_to_do_instead() {
    let err = Redlock::builder()
        .url("rediss://:hunter2secret@127.0.0.1:6380/#insecure")
        .build()
        .expect_err("#insecure is not supported");
    let Error::InvalidUrl { reason, .. } = &err else {
        panic!("expected InvalidUrl, got {err:?}");
    };
    assert!(
        reason.contains("tls_url") && reason.contains("SSL_CERT_FILE"),
        "{reason}"
    );
    for shown in [format!("{err}"), format!("{err:?}")] {
        assert!(!shown.contains("hunter2secret"), "password shown: {shown}");
    }
}
