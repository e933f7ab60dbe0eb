//! Signals to node processes, and the ghost-key watcher.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::history::{Event, duration_ns, now_ns};

#[allow(unused_imports)]
use super::*;

pub(super) fn signal_pid(pid: u32, sig: Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Polls `key` on node `node` every 10 ms from now until `set_after + ttl + 300 ms`
/// and returns the [`Event::Ghost`] that says how long it lived. Values equal to
/// `ignore` (a foreign holder's) are not the ghost.
pub async fn watch_ghost(
    rig: &Rig,
    node: usize,
    key: &str,
    ttl: Duration,
    set_after: u64,
    ignore: &str,
) -> Event {
    let end = set_after + duration_ns(ttl) + 300_000_000;
    let mut max_pttl_ms = -2;
    let mut last_present = None;
    while now_ns() < end {
        let n = Arc::clone(rig.node(node));
        let k = key.to_owned();
        let r: redis::RedisResult<(Option<String>, i64)> =
            tokio::task::spawn_blocking(move || n.raw(&["EVAL", READ_PTTL, "1", &k]))
                .await
                .expect("poll a key");
        let at = now_ns();
        if let Ok((Some(v), pttl)) = r
            && v != ignore
        {
            max_pttl_ms = max_pttl_ms.max(pttl);
            last_present = Some(at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Event::Ghost {
        node,
        key: key.to_owned(),
        ttl_ns: duration_ns(ttl),
        set_after,
        max_pttl_ms,
        last_present,
    }
}
