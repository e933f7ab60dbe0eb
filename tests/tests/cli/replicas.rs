//! `redlock check` on a node that is one primary with a replica behind a
//! failover endpoint (`redlock_tests::replicas`): unfit without replica acks
//! (a failover can hand a held lock out again), fit with `?replica_acks=1`,
//! and unfit again after the failover, while the promoted replica has no
//! replica of its own to ack its writes.

use std::time::Duration;

use redlock_tests::replicas::ReplicaGroup;

use crate::{redlock, run_to_end, text};

/// `redlock check` on the one node `url`: its exit code and its table.
fn check(url: &str) -> (Option<i32>, String) {
    let out = run_to_end({
        let mut c = redlock(url);
        // The patient node timeout `redlock` gives: the subject is the
        // replicas, not a slow node.
        c.arg("check");
        c
    });
    (out.status.code(), text(&out.stdout))
}

#[test]
fn check_says_a_primary_with_a_replica_is_fit_only_with_replica_acks() {
    // The proxies' tasks run on this runtime while the command runs.
    let rt = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    let group = rt.block_on(ReplicaGroup::start());
    let plain = group.url();
    let acked = format!("{plain}?replica_acks=1&replica_timeout_ms=50");

    let (code, out) = check(&plain);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("1 replica(s) attached and writes do not wait for them")
            && out.contains("?replica_acks=1"),
        "{out}"
    );

    let (code, out) = check(&acked);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("ok: writes wait for 1 of 1 replica(s)"),
        "{out}"
    );
    assert!(out.contains("1 of 1 node(s) fit"), "{out}");

    rt.block_on(group.failover());
    let (code, out) = check(&acked);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("writes wait for 1 replica(s) but 0 attached"),
        "{out}"
    );
    drop(group);
    rt.shutdown_timeout(Duration::from_secs(1));
}

#[test]
fn check_says_whether_a_nodes_waitaof_acks_can_be_met() {
    // Redis before 7.2 has no WAITAOF.
    let bin = redlock_tests::redis_server_binary();
    let old = redlock_tests::RedisNode::start_binary(&bin, &["--appendonly", "yes"], &[]);
    if old
        .raw::<redis::Value>(&["WAITAOF", "1", "0", "10"])
        .is_err()
    {
        let (code, out) = check(&format!("{}?waitaof=1", old.url()));
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("lacks it"), "{out}");
    }
    let Some(valkey) = redlock_tests::servers::valkey_or_skip(
        "check_says_whether_a_nodes_waitaof_acks_can_be_met",
    ) else {
        return;
    };
    let no_aof = redlock_tests::RedisNode::start_binary(&valkey, &[], &[]);
    let (code, out) = check(&format!("{}?waitaof=1", no_aof.url()));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("appendonly is off"), "{out}");
    let aof = redlock_tests::RedisNode::start_binary(&valkey, &["--appendonly", "yes"], &[]);
    let (code, out) = check(&format!("{}?waitaof=1", aof.url()));
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("ok: writes wait for 0 of 0 replica(s) and this master's AOF (WAITAOF)"),
        "{out}"
    );
}
