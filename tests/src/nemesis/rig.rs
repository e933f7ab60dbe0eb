//! The rig of a fault run: lock nodes behind fault proxies, and the store.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{Event, FaultKind, HistoryLog, now_ns};
use crate::proxy::{Direction, FaultProxy};
use crate::{Cluster, RedisNode};

#[allow(unused_imports)]
use super::*;

/// Redis nodes, each behind its own [`FaultProxy`].
#[derive(Debug)]
pub struct Rig {
    cluster: Cluster,
    proxies: Vec<FaultProxy>,
    /// A second, slow proxy per node ([`Rig::start_slow_path`]).
    slow: Vec<FaultProxy>,
}

impl Rig {
    /// Starts `n` nodes and a proxy in front of each; proxies report token
    /// sightings to `log`.
    ///
    /// # Panics
    /// If a node or a proxy cannot start.
    pub async fn start(n: usize, log: &HistoryLog) -> Self {
        let cluster = tokio::task::spawn_blocking(move || Cluster::start(n))
            .await
            .expect("start the cluster");
        let mut proxies = Vec::with_capacity(n);
        for (i, node) in cluster.nodes().iter().enumerate() {
            proxies.push(
                FaultProxy::start(i, node.port(), Some(log.clone()))
                    .await
                    .expect("start a proxy"),
            );
        }
        Self {
            cluster,
            proxies,
            slow: Vec::new(),
        }
    }

    /// Starts a second proxy in front of every node with a constant latency of
    /// 20–40 ms each way (20–35 ms, seeded, plus up to 5 ms of jitter), logs each
    /// as a proxy fault, and returns their URLs. The nemesis never touches them;
    /// they last as long as the rig. The sightings they report carry proxy ids
    /// `len()..2·len()`.
    ///
    /// # Panics
    /// If a proxy cannot start.
    pub async fn start_slow_path(&mut self, seed: u64, log: &HistoryLog) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x736c_6f77_7061_7468);
        let n = self.len();
        for (i, node) in self.cluster.nodes().iter().enumerate() {
            let p = FaultProxy::start(n + i, node.port(), Some(log.clone()))
                .await
                .expect("start a slow proxy");
            let jitter = Duration::from_millis(5);
            let mut lat = [Duration::ZERO; 2];
            for (d, l) in [Direction::Request, Direction::Reply]
                .into_iter()
                .zip(&mut lat)
            {
                *l = Duration::from_millis(rng.random_range(20..=35));
                p.delay(d, *l, jitter);
            }
            log.push(Event::Fault {
                kind: FaultKind::Proxy,
                node: Some(i),
                at: now_ns(),
                detail: format!(
                    "slow path for max_hold guards (second proxy, whole run): request {} ms, reply {} ms, + up to {} ms each",
                    lat[0].as_millis(),
                    lat[1].as_millis(),
                    jitter.as_millis()
                ),
            });
            self.slow.push(p);
        }
        self.slow.iter().map(FaultProxy::url).collect()
    }

    /// The proxies' URLs: what the clients connect to.
    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }

    /// Node `i` (direct access, no proxy).
    pub fn node(&self, i: usize) -> &Arc<RedisNode> {
        self.cluster.node(i)
    }

    /// The proxy in front of node `i`.
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        &self.proxies[i]
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// The quorum.
    pub fn quorum(&self) -> usize {
        self.len() / 2 + 1
    }

    /// Every `(node, key)` of `keys` still present on a running node.
    pub async fn leftover_keys(&self, keys: &[String]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for i in 0..self.len() {
            let node = Arc::clone(self.node(i));
            if !node.is_running() {
                continue;
            }
            let keys = keys.to_vec();
            let found: Vec<String> = tokio::task::spawn_blocking(move || {
                keys.into_iter()
                    .filter(|k| node.raw::<i64>(&["EXISTS", k]).unwrap_or(0) == 1)
                    .collect()
            })
            .await
            .expect("EXISTS");
            out.extend(found.into_iter().map(|k| (i, k)));
        }
        out
    }
}
