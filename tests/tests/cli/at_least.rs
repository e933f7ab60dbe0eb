//! `redlock run --at-least`: a command that ends early leaves the key until
//! the minimum has passed, so a second run of the same tick is busy (75).

use std::time::{Duration, Instant};

use redlock_tests::Cluster;

use redlock_tests::timing;

use super::{redlock, run_to_end, settled_on, text, wait_for};

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
    assert_eq!(settled_on(&cluster, "tick-control", 0), 0);
    assert_eq!(run("tick-control", None).0, Some(0));

    let minimum = Duration::from_secs(2);
    let (code, started, stderr) = run("tick", Some("2s"));
    // The minimum ends no sooner than this: the acquire began after it.
    let until = started + minimum;
    assert_eq!(code, Some(0), "{stderr}");
    // Every node answered the shortening before the run ended; a key gone
    // already is only allowed once the minimum had passed.
    for n in cluster.nodes() {
        let pttl = n.pttl("tick");
        if pttl == -2 {
            assert!(Instant::now() >= until, "the key went before the minimum");
            continue;
        }
        assert!((1..=2001).contains(&pttl), "PTTL {pttl} ms");
    }
    let (code, _, stderr) = run("tick", Some("2s"));
    match code {
        Some(75) => {}
        // A loaded machine may start the second run past the minimum.
        Some(0) if Instant::now() >= until => {}
        _ => panic!("a second run in the minimum is busy: {code:?}: {stderr}"),
    }
    wait_for("the key to expire", timing::liveness(minimum), || {
        cluster.count_with_key("tick") == 0
    });
    assert!(started.elapsed() >= Duration::from_millis(1900));
    let (code, _, stderr) = run("tick", Some("2s"));
    assert_eq!(code, Some(0), "after the minimum: {stderr}");
}
