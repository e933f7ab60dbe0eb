//! The `redlock` command on a node that is a Redis Cluster
//! (`redis+cluster://` seeds): `run` and `status` through it, and `check`'s
//! findings: fit with every slot served and no replicas, or with replicas
//! that its writes wait for (`?replica_acks=n`), unfit with replicas not
//! waited for, with fewer replicas than waited for, or with a master down.

use std::time::Duration;

use redlock_tests::RedisCluster;

use crate::{PASSWORD, redlock, run_to_end, text, wait_for};

/// A user `locker` with a password on every member, and the cluster node
/// that uses it, seeded by two members.
fn node_with_password(cluster: &RedisCluster) -> String {
    for n in cluster.nodes() {
        n.cmd(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ]);
    }
    let nodes = cluster.nodes();
    format!(
        "redis+cluster://locker:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}",
        nodes[0].port(),
        nodes[1].port()
    )
}

/// Runs `redlock args..` on `node` with a patient node timeout (the
/// subject here is the cluster, not a slow node): its exit code and stdout;
/// no output holds the password.
fn redlock_on(node: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = run_to_end({
        // `redlock` gives the patient node timeout, before the subcommand
        // (after `run ... --` it would be the child command's argument).
        let mut c = redlock(node);
        c.args(args);
        c
    });
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
        "{args:?} printed the password: {stdout}{stderr}"
    );
    (out.status.code(), stdout + &stderr)
}

#[test]
fn check_shows_a_clusters_masters_slots_and_replicas() {
    let cluster = RedisCluster::start(3, 0);
    let node = node_with_password(&cluster);

    let (code, out) = redlock_on(&node, &["run", "--key", "cli-cluster", "--", "true"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = redlock_on(&node, &["status", "cli-cluster"]);
    assert_eq!(code, Some(0), "{out}");

    let (code, out) = redlock_on(&node, &["check"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("redis+cluster://locker:***@127.0.0.1:"),
        "{out}"
    );
    assert!(
        out.contains("cluster_state:ok, 16384 of 16384 slots assigned"),
        "{out}"
    );
    assert_eq!(out.matches("0 replica(s)  ok").count(), 3, "{out}");
    assert!(out.contains("1 of 1 node(s) fit"), "{out}");

    let (code, out) = redlock_on(&node, &["check", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let cluster_view = &v["nodes"][0]["cluster"];
    assert_eq!(cluster_view["state"], "ok", "{out}");
    let masters = cluster_view["masters"].as_array().expect("masters");
    assert_eq!(masters.len(), 3, "{out}");
    let slots: u64 = masters.iter().filter_map(|m| m["slots"].as_u64()).sum();
    assert_eq!(slots, 16384, "{out}");

    // A master down: its slots are served by nobody, the cluster fails.
    cluster.masters()[2].kill();
    let survivor = &cluster.masters()[0];
    // Judged down after the harness's 1 s cluster-node-timeout (and twice
    // that for the failure reports to spread).
    wait_for(
        "cluster_state:fail",
        redlock_tests::timing::liveness(Duration::from_secs(2)),
        || {
            survivor
                .raw::<String>(&["CLUSTER", "INFO"])
                .is_ok_and(|i| i.contains("cluster_state:fail"))
        },
    );
    let (code, out) = redlock_on(&node, &["check"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("cluster_state:fail"), "{out}");
    assert!(out.contains("0 of 1 node(s) fit"), "{out}");
}

#[test]
fn check_says_a_cluster_with_replicas_is_unfit() {
    let cluster = RedisCluster::start(3, 1);
    let node = node_with_password(&cluster);
    let (code, out) = redlock_on(&node, &["check"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        out.matches("has 1 replica(s) and writes do not wait for them")
            .count(),
        3,
        "{out}"
    );
    assert!(
        out.contains("add ?replica_acks=1 to the node's URL"),
        "{out}"
    );
    assert_eq!(
        out.matches("1 replica(s)  unfit: replicas").count(),
        3,
        "{out}"
    );

    // With replica acks of 1: fit, each master's writes waited for.
    // The replicas' acks are waited for as long as the patient node timeout
    // allows (at most three quarters of it): the subject is the fit, not a
    // slow replica.
    let ack_timeout = redlock_tests::timing::PATIENT_NODE_TIMEOUT * 3 / 4;
    let acked = format!(
        "{node}?replica_acks=1&replica_timeout_ms={}",
        ack_timeout.as_millis()
    );
    let (code, out) = redlock_on(&acked, &["check"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.matches("1 replica(s)  ok: writes wait for 1 of 1 replica(s)")
            .count(),
        3,
        "{out}"
    );
    assert!(out.contains("1 of 1 node(s) fit"), "{out}");
    let (code, out) = redlock_on(&acked, &["run", "--key", "cli-acked", "--", "true"]);
    assert_eq!(code, Some(0), "{out}");

    // Acks of 2 with one replica each: unfit, and why.
    let (code, out) = redlock_on(&format!("{node}?replica_acks=2"), &["check"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        out.matches("has 1 replica(s) but writes wait for 2")
            .count(),
        3,
        "{out}"
    );
}
