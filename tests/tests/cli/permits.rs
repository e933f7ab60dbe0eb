//! `redlock run --permits N` (issue 41): N holders of a key at once, the next
//! one busy (exit 75), as `consul lock -n`.

use std::time::Duration;

use std::time::Instant;

use redlock_tests::{Cluster, timing};

use super::{finish, redlock, run_to_end, text, to_end, to_start, wait_for};

#[test]
fn two_permits_run_two_commands_and_turn_the_third_away() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    // Each command holds its permit until the gate opens.
    let start = || {
        let mut c = redlock(&nodes);
        c.args([
            "run",
            "--key",
            "batch",
            "--permits",
            "2",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
        ]);
        c.arg(format!(
            "while [ ! -e {} ]; do sleep 0.02; done",
            gate.display()
        ));
        c.spawn().expect("spawn redlock run")
    };
    let (a, b) = (start(), start());
    let slot = |i: u32| format!("{{batch}}:redlock-permit:{i}");
    wait_for("both permits held", to_start(), || {
        cluster.count_with_key(&slot(0)) >= 2 && cluster.count_with_key(&slot(1)) >= 2
    });
    let mut third = redlock(&nodes);
    third.args(["run", "--key", "batch", "--permits", "2", "--", "true"]);
    let out = run_to_end(third);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    std::fs::write(&gate, b"").unwrap();
    for (child, name) in [(a, "first"), (b, "second")] {
        let out = finish(child, to_end(Duration::ZERO), name);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
}

/// `redlock status KEY --permits N` and `--rw`: the slots a library holder
/// holds (by fingerprint, never the token), the readers, and the verdicts, as
/// a table and as JSON.
#[test]
fn status_with_permits_and_rw_shows_slots_readers_and_the_verdict() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    // The binary first (the first test to ask builds it, which can take
    // longer than the TTLs below), then the holders.
    drop(redlock(&nodes));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Patient: other tests load the machine.
    let rl = redlock_core::Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    let retry = redlock_core::RetryPolicy::deadline(timing::liveness(timing::PATIENT_NODE_TIMEOUT));
    let shared = redlock_core::Access::Shared;
    let asked = Instant::now();
    let (permit, readers) = rt.block_on(async {
        let permit = rl
            .semaphore("report", 2)
            .unwrap()
            .acquire_with(ttl, &retry)
            .await
            .unwrap();
        let readers = [
            rl.rw_lock("doc", shared)
                .acquire_with(ttl, &retry)
                .await
                .unwrap(),
            rl.rw_lock("doc", shared)
                .acquire_with(ttl, &retry)
                .await
                .unwrap(),
        ];
        (permit, readers)
    });
    // Each acquire returned at quorum: wait for the last node's `SET`s.
    let on_every_node = |key: &str| cluster.count_with_key(key) == 3;
    wait_for("every node's keys", timing::settled(), || {
        on_every_node(permit.key()) && readers.iter().all(|r| on_every_node(r.key()))
    });
    let fingerprint = redlock_core::token_fingerprint(permit.token());
    let status = |args: &[&str]| {
        let mut c = redlock(&nodes);
        c.arg("status").args(args);
        let out = run_to_end(c);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };

    let table = status(&["report", "--permits", "2"]);
    assert!(
        table.contains("1 of 2 permit(s) held, 1 free, 0 unclear"),
        "{table}"
    );
    assert!(
        table.contains(&format!("held by {fingerprint} on 3 node(s)")),
        "{table}"
    );
    assert!(
        !table.contains(permit.token()),
        "the token is never shown: {table}"
    );
    // The count the holder's semaphore keeps on the nodes (issue 47 item 8),
    // and a warning when it is not the one asked about. The count is
    // written at quorum: every node has it once its answer has come.
    let counted = |table: &str| table.matches("=2").count() == 3;
    let end = Instant::now() + timing::settled();
    let mut table = status(&["report", "--permits", "2"]);
    while !counted(&table) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        table = status(&["report", "--permits", "2"]);
    }
    assert!(
        table.contains("count kept by the nodes:") && counted(&table),
        "{table}"
    );
    assert!(!table.contains("WARNING"), "{table}");
    let other = status(&["report", "--permits", "3"]);
    assert!(
        other.contains("WARNING: the holders use another count than --permits 3"),
        "{other}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&status(&["report", "--permits", "2", "--json"])).unwrap();
    assert_eq!(v["counts"].as_array().map(Vec::len), Some(3), "{v}");
    assert!(
        v["counts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["count"] == "2"),
        "{v}"
    );
    assert_eq!(v["verdict"]["held"], 1);
    assert_eq!(v["verdict"]["free"], 1);
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2);
    let held: Vec<_> = slots
        .iter()
        .filter(|s| s["verdict"]["state"] == "held")
        .collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["key"], permit.key());
    assert_eq!(held[0]["verdict"]["holder"], fingerprint.as_str());

    let table = status(&["doc", "--rw"]);
    assert!(
        table.contains("read by 2 reader(s) on a quorum, readers on 3 node(s)"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&status(&["doc", "--rw", "--json"])).unwrap();
    assert_eq!(v["verdict"]["state"], "read");
    assert_eq!(v["verdict"]["readers"], 2);
    assert_eq!(v["writer_waiting"], 0);
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(n["readers"], 2, "{n}");
        // At most the TTL, and no less than what is left of it since the
        // readers were asked for.
        let pttl = n["readers_pttl_ms"].as_u64().unwrap();
        let left = ttl.saturating_sub(asked.elapsed());
        assert!(
            pttl <= 30_000 && u128::from(pttl) >= left.as_millis(),
            "PTTL {pttl} ms, at least {left:?} expected: {n}"
        );
    }
    // Not both at once.
    let mut c = redlock(&nodes);
    c.args(["status", "doc", "--rw", "--permits", "2"]);
    assert_ne!(run_to_end(c).status.code(), Some(0));

    rt.block_on(async {
        rl.unlock(permit).await.unwrap();
        for r in readers {
            rl.unlock(r).await.unwrap();
        }
    });
    let table = status(&["doc", "--rw"]);
    assert!(table.contains("  free\n"), "{table}");
}

/// After the command exits, `redlock run` sends a second release that waits
/// for every node, so that no key outlives it but on a node that failed.
/// Under `--permits` it named the resource's own key, which a permit holder
/// never holds, so the slot key of a node whose first release was lost
/// stayed until its TTL (issue 47, item 9). Judged from the commands each
/// node ran: both release passes name the slot key the permit held.
#[test]
fn the_second_release_of_a_permit_names_its_slot_key() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let monitors: Vec<_> = cluster.nodes().iter().map(|n| n.monitor()).collect();
    let out = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["run", "--key", "tally", "--permits", "2", "--", "true"]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Each release pass runs the compare-and-delete's GET on the key it
    // names, inside the script (`[0 lua] "GET" "<key>"`).
    for (i, m) in monitors.into_iter().enumerate() {
        let lines = m.stop();
        let gets = |key: &str| {
            let needle = format!("lua] \"GET\" \"{key}");
            lines.iter().filter(|l| l.contains(&needle)).count()
        };
        assert_eq!(
            gets("{tally}\""),
            0,
            "node {i}: a release named the resource's own key: {lines:#?}"
        );
        assert!(
            gets("{tally}:redlock-permit:") >= 2,
            "node {i}: both release passes name the permit's slot key: {lines:#?}"
        );
    }
}
