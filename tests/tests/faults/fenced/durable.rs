//! The Durable workload: lock nodes with an fsynced AOF, one killed and restarted from it again and again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::FencingMode;
use redlock_tests::{Cluster, RedisNode};

use super::*;

/// The Durable workload for `secs`, killing and restarting lock nodes from
/// their AOF when `kills` is set.
pub(super) fn run_durable(fenced: bool, secs: u64, kills: bool) -> Run {
    let cluster = Cluster::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"]);
    let store = RedisNode::start();
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let clients = spawn_clients(
        &cluster.urls(),
        &store,
        FencingMode::Durable,
        fenced,
        until,
        &tally,
    );
    let mut killed = 0usize;
    if kills {
        while Instant::now() + Duration::from_millis(900) < until && killed < 12 {
            std::thread::sleep(Duration::from_millis(500));
            let node = cluster.node(killed % 3);
            node.kill();
            std::thread::sleep(Duration::from_millis(350));
            node.restart();
            killed += 1;
        }
    }
    join_clients(clients);
    Run {
        counter: counter_of(&store),
        tally,
        kills: killed,
        proxy_faults: 0,
        proxy_dropped: 0,
    }
}

#[test]
pub(super) fn stalled_writers_are_refused_by_the_fence_and_no_update_is_lost() {
    let _turn = crate::HEAVY.blocking_read();
    let run = run_durable(true, 8, true);
    let control = run_durable(false, 4, false);
    eprintln!(
        "fault-fenced mode=durable acquisitions={} stalls={} accepted={} refused_stale={} stale_accepted={} lost_updates={} token_order_violations={} kills={} proxy_faults={} control_lost_updates={} ({})",
        run.acquisitions(),
        run.stalls(),
        run.accepted(),
        run.refused(),
        run.stale_accepted(),
        run.lost(),
        run.order_violations(),
        run.kills,
        run.proxy_faults,
        control.lost(),
        caught(control.lost()),
    );
    assert_fenced(&run, &control);
    assert!(run.kills >= 3, "too few restarts");
}
