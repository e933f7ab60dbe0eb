//! The acquire's secondary reads (PTTL, TYPE) refused by ACL: the acquire judges by the SET alone.

use std::time::Duration;

use redlock_core::Error;
use redlock_tests::{Cluster, RedisNode};

use super::*;

// ------------------------------------- acquire secondary errors (issue 10, B)

/// A user allowed `SET`, the scripts and the handshake, but not `PTTL` or `TYPE`.
pub(super) const LOCKER_PASSWORD: &str = "locker-s3cret-pw";

pub(super) fn add_locker_user(node: &RedisNode) {
    node.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        &format!(">{LOCKER_PASSWORD}"),
        "~*",
        "+@connection",
        "+set",
        "+get",
        "+del",
        "+pexpire",
        "+eval",
        "+evalsha",
        "+info",
        "+ping",
    ]);
}

/// `SET` said OK but `PTTL` and `TYPE` were refused: the node holds the key, so
/// it counts as acquired. When `SET` said nil, it is busy with no known PTTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn acquire_judges_by_set_when_pttl_and_type_are_refused() {
    let cluster = Cluster::start(3);
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| {
            add_locker_user(n);
            format!("redis://locker:{LOCKER_PASSWORD}@127.0.0.1:{}", n.port())
        })
        .collect();
    // Every node answers: the subject is the refused PTTL and TYPE.
    let rl = build(urls, redlock_tests::timing::PATIENT_NODE_TIMEOUT);
    let key = "acl-no-pttl";
    let lock = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("SET said OK on every node: {e}"));
    let token = lock.token().to_owned();
    assert!(cluster.wait_until(
        redlock_tests::timing::settled(),
        |c| c.count_holding(key, &token) == 3
    ));

    let err = rl
        .mutex(key)
        .try_acquire(Duration::from_secs(10))
        .await
        .expect_err("the key is held");
    let shown = [
        format!("{err}"),
        format!("{err:?}"),
        format!("{rl:?}"),
        format!("{lock:?}"),
    ];
    match &err {
        Error::Busy { report, .. } => {
            assert!(report.busy_count() >= 2, "{report}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    for s in &shown {
        assert!(!s.contains(LOCKER_PASSWORD), "password shown: {s}");
    }
    redlock_tests::util::assert_released(&rl.unlock(lock).await.unwrap(), 3);
    assert!(
        cluster.wait_until(redlock_tests::timing::settled(), |c| c.count_with_key(key)
            == 0)
    );
}
