//! `redlock run --at-least`: a command that ends early leaves the key until
//! the minimum has passed, so a second run of the same tick is busy (75).

use std::time::{Duration, Instant};

use redlock_tests::Cluster;

use super::{key_on, redlock, run_to_end, text, wait_for};

#[test]
fn run_at_least_keeps_the_key_after_an_early_exit_and_a_second_run_is_busy() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let run = |key: &str, at_least: Option<&str>| {
        let mut c = redlock(&nodes);
        c.args(["run", "--key", key, "--ttl", "10s"]);
        if let Some(d) = at_least {
            c.args(["--at-least", d]);
        }
        c.args(["--", "true"]);
        let started = Instant::now();
        let out = run_to_end(c);
        (out.status.code(), started, text(&out.stderr))
    };

    // Control: without a minimum the key goes with the command.
    assert_eq!(run("tick-control", None).0, Some(0));
    assert_eq!(key_on(&cluster, "tick-control"), 0);
    assert_eq!(run("tick-control", None).0, Some(0));

    let (code, started, stderr) = run("tick", Some("2s"));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(key_on(&cluster, "tick"), 3, "the key is kept on every node");
    for n in cluster.nodes() {
        let pttl = n.pttl("tick");
        assert!((1..=2001).contains(&pttl), "PTTL {pttl} ms");
    }
    let (code, _, stderr) = run("tick", Some("2s"));
    assert_eq!(
        code,
        Some(75),
        "a second run in the minimum is busy: {stderr}"
    );
    wait_for("the key to expire", Duration::from_secs(5), || {
        key_on(&cluster, "tick") == 0
    });
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let (code, _, stderr) = run("tick", Some("2s"));
    assert_eq!(code, Some(0), "after the minimum: {stderr}");
}
