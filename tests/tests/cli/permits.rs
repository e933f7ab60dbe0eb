//! `redlock run --permits N` (issue 41): N holders of a key at once, the next
//! one busy (exit 75), as `consul lock -n`.

use std::time::Duration;

use redlock_tests::Cluster;

use super::{finish, redlock, run_to_end, text, wait_for};

#[test]
fn two_permits_run_two_commands_and_turn_the_third_away() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
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
            "sleep",
            "3",
        ]);
        c.spawn().expect("spawn redlock run")
    };
    let (a, b) = (start(), start());
    let slot = |i: u32| format!("{{batch}}:redlock-permit:{i}");
    wait_for("both permits held", Duration::from_secs(10), || {
        cluster.count_with_key(&slot(0)) >= 2 && cluster.count_with_key(&slot(1)) >= 2
    });
    let mut third = redlock(&nodes);
    third.args(["run", "--key", "batch", "--permits", "2", "--", "true"]);
    let out = run_to_end(third);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    for (child, name) in [(a, "first"), (b, "second")] {
        let out = finish(child, Duration::from_secs(20), name);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
}
