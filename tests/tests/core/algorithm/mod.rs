//! The Redlock algorithm requirements of `redlock-core`, proven on real
//! `redis-server` processes: fresh 128-bit tokens, fan-out with early return,
//! validity arithmetic, retry bounds, compare-and-delete release (with the
//! `NOSCRIPT` fallback), extension, and the "busy" information.

use std::time::Duration;

use redlock_core::{Lock, Redlock};
use redlock_tests::Cluster;
use redlock_tests::monitor::{Monitor, parse_monitor_line};
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};

mod release;
mod token_fan_out;
mod validity_retries;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// Connects to every node (`check_nodes` caches one connection per node), then
/// locks and unlocks another resource to load the scripts. After this, every call
/// is one `EVALSHA` on one connection per node, so a late acquire answer can never
/// be overtaken by the release of the same lock.
async fn warm_up(cluster: &Cluster, redlock: &Redlock) {
    let infos = redlock.check_nodes().await.unwrap();
    assert!(infos.iter().all(|i| i.error.is_none()), "{infos:?}");
    let lock = held_everywhere(cluster, redlock, "warm-up", Duration::from_secs(60)).await;
    redlock_tests::util::assert_released(
        &redlock.unlock(lock).await.unwrap(),
        redlock.node_count(),
    );
}

/// A built and warmed-up handle.
async fn ready(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    let rl = redlock(cluster, node_timeout);
    warm_up(cluster, &rl).await;
    rl
}

/// Takes the lock with every node holding the token, so that the exact counts
/// asserted afterwards do not depend on answer timing. A node that answers after
/// the quorum still joins the lock, so this waits (bounded) for it; on a loaded
/// machine its answer may even time out and be released, and then the lock is
/// taken again (at most 5 times).
async fn held_everywhere(cluster: &Cluster, redlock: &Redlock, key: &str, ttl: Duration) -> Lock {
    for _ in 0..5 {
        let lock = redlock.mutex(key).try_acquire(ttl).await.unwrap();
        let token = lock.token().to_owned();
        if cluster.wait_until(timing::settled(), |c| {
            c.count_holding(key, &token) == c.len()
        }) {
            // The late answers have landed; give their background handler a
            // moment to see them, so it does not race the test's own release.
            tokio::time::sleep(ms(200)).await;
            return lock;
        }
        let _ = redlock.unlock(lock).await;
        assert!(cluster.wait_until(timing::settled(), |c| c.count_with_key(key) == 0));
    }
    panic!("5 locks in a row did not reach every node");
}

/// Puts a value this library did not write at `key` on node `i`.
fn occupy(cluster: &Cluster, i: usize, key: &str, value: &str) {
    cluster.node(i).cmd(&["SET", key, value, "PX", "10000"]);
}

/// Stops the recorder and returns the commands clients sent (not Lua's).
fn stop_commands(monitor: Monitor) -> Vec<Vec<String>> {
    monitor
        .stop()
        .iter()
        .filter(|l| !l.contains(" lua]"))
        .filter_map(|l| parse_monitor_line(l))
        .collect()
}

fn is_script_call(c: &[String]) -> bool {
    c[0].eq_ignore_ascii_case("EVALSHA") || c[0].eq_ignore_ascii_case("EVAL")
}

/// Acquire calls on `key`, as `(token, ttl_ms)`: `SET key token NX PX ttl_ms`.
fn acquire_calls(cmds: &[Vec<String>], key: &str) -> Vec<(String, String)> {
    cmds.iter()
        .filter(|c| c.len() == 6)
        .filter_map(|c| {
            if c[0].eq_ignore_ascii_case("SET")
                && c[1] == key
                && c[3].eq_ignore_ascii_case("NX")
                && c[4].eq_ignore_ascii_case("PX")
            {
                Some((c[2].clone(), c[5].clone()))
            } else {
                None
            }
        })
        .collect()
}

/// Release calls on `key`: `EVALSHA sha 1 key token` with the release
/// script's SHA, or `EVAL` of its body (the script deletes the key's waiters
/// flag with it, by a name it builds). Returns the tokens.
fn release_calls(cmds: &[Vec<String>], key: &str) -> Vec<String> {
    // The release, and a failed attempt's quiet one.
    let scripts = [
        redlock_core::__RELEASE_LUA,
        redlock_core::__RELEASE_QUIET_LUA,
    ];
    let shas = scripts.map(|s| {
        redlock_core::deadpool_redis::redis::Script::new(s)
            .get_hash()
            .to_owned()
    });
    cmds.iter()
        .filter(|c| c.len() == 5 && is_script_call(c) && c[2] == "1" && c[3] == key)
        .filter(|c| shas.contains(&c[1]) || scripts.contains(&c[1].as_str()))
        .map(|c| c[4].clone())
        .collect()
}

fn is_token(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())
}
