//! Real Redis Clusters (`--cluster-enabled yes`): masters (and replicas when
//! asked) as [`RedisNode`]s on free loopback ports, each in its own temp dir
//! with its own `nodes.conf`, killed on drop (on panic too).
//!
//! The cluster is formed with `redis-cli --cluster create` (`--cluster-yes`,
//! `--cluster-replicas` when replicas are asked), then the harness waits,
//! bounded, until every member says `cluster_state:ok`, knows every other
//! member and sees all 16384 slots served. [`RedisCluster::move_slot`]
//! reshards one slot by hand (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`,
//! `MIGRATE`, `SETSLOT ... NODE`), as `redis-cli --cluster reshard` does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::util::poll_until;
use crate::{RedisNode, redis_server_binary};

/// How long a cluster may take to form before the test fails.
const FORM_WITHIN: Duration = Duration::from_secs(30);

/// The slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// One Redis Cluster of masters (and replicas).
#[derive(Debug)]
pub struct RedisCluster {
    masters: Vec<Arc<RedisNode>>,
    replicas: Vec<Arc<RedisNode>>,
}

/// The `redis-cli` next to `bin`, else the first on `PATH`.
fn redis_cli(bin: &Path) -> PathBuf {
    let near = bin.with_file_name("redis-cli");
    if near.is_file() {
        return near;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("redis-cli"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "redis-cli was not found (it creates the test clusters). Install it with \
                 `sudo apt-get install -y redis-tools` (Debian/Ubuntu) or `brew install redis`."
            )
        })
}

impl RedisCluster {
    /// A cluster of `masters` masters, each with `replicas` replicas, on
    /// [`redis_server_binary`].
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_binary(&redis_server_binary(), masters, replicas)
    }

    /// [`RedisCluster::start`] on server binary `bin` (e.g. a `valkey-server`).
    ///
    /// # Panics
    /// When the cluster does not form within 30 s, with the members' view.
    pub fn start_binary(bin: &Path, masters: usize, replicas: usize) -> Self {
        Self::start_binary_judging(bin, masters, replicas, Duration::from_secs(1))
    }

    /// [`RedisCluster::start`] with `cluster-node-timeout` `judge`: how long
    /// a member may be silent before the others judge it down (the others
    /// start with one second). A test that stops a master and needs the
    /// cluster to stay `ok` meanwhile gives one longer than the stop.
    pub fn start_judging(masters: usize, replicas: usize, judge: Duration) -> Self {
        Self::start_binary_judging(&redis_server_binary(), masters, replicas, judge)
    }

    fn start_binary_judging(bin: &Path, masters: usize, replicas: usize, judge: Duration) -> Self {
        assert!(masters >= 3, "redis-cli --cluster create needs 3 masters");
        let total = masters * (1 + replicas);
        let judge = judge.as_millis().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            judge.as_str(),
            // A replica may take over as soon as its master is judged down.
            "--cluster-replica-validity-factor",
            "0",
        ];
        let handles: Vec<_> = (0..total)
            .map(|_| {
                let bin = bin.to_path_buf();
                let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
                std::thread::spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    RedisNode::start_binary(&bin, &args, &[])
                })
            })
            .collect();
        let mut nodes: Vec<Arc<RedisNode>> = handles
            .into_iter()
            .map(|h| Arc::new(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(redis_cli(bin))
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let replicas = nodes.split_off(masters);
        let cluster = Self {
            masters: nodes,
            replicas,
        };
        cluster.wait_formed();
        cluster
    }

    /// Waits until every member says `cluster_state:ok`, knows all members
    /// and sees every slot served, and every replica's link is up.
    fn wait_formed(&self) {
        let total = self.masters.len() + self.replicas.len();
        let formed = poll_until(FORM_WITHIN, || {
            self.nodes().iter().all(|n| {
                let Ok(info) = n.raw::<String>(&["CLUSTER", "INFO"]) else {
                    return false;
                };
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .map(str::trim)
                        .unwrap_or_default()
                        .to_owned()
                };
                field("cluster_state") == "ok"
                    && field("cluster_known_nodes") == total.to_string()
                    && field("cluster_slots_assigned") == SLOTS.to_string()
            }) && self.replicas.iter().all(|r| {
                r.raw::<String>(&["INFO", "replication"])
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            })
        });
        assert!(formed, "cluster did not form: {}", self.describe());
    }

    /// Every member's `CLUSTER INFO` state and `CLUSTER NODES`, for failures.
    pub fn describe(&self) -> String {
        self.nodes()
            .iter()
            .map(|n| {
                format!(
                    "{}: {:?}\n",
                    n.port(),
                    n.raw::<String>(&["CLUSTER", "NODES"])
                )
            })
            .collect()
    }

    /// Masters then replicas.
    pub fn nodes(&self) -> Vec<Arc<RedisNode>> {
        self.masters.iter().chain(&self.replicas).cloned().collect()
    }

    /// The masters the cluster was created with (a failover may have made
    /// one of them a replica since).
    pub fn masters(&self) -> &[Arc<RedisNode>] {
        &self.masters
    }

    /// The replicas the cluster was created with.
    pub fn replicas(&self) -> &[Arc<RedisNode>] {
        &self.replicas
    }

    /// Every member's URL: the seeds a client is given.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes().iter().map(|n| n.url()).collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &[u8]) -> u16 {
        self.masters[0]
            .raw_bytes(&[b"CLUSTER", b"KEYSLOT", key])
            .expect("CLUSTER KEYSLOT")
    }

    /// The running member that serves `slot` by its own view.
    pub fn owner(&self, slot: u16) -> Option<Arc<RedisNode>> {
        self.nodes().into_iter().find(|n| {
            n.is_running()
                && n.raw::<String>(&["CLUSTER", "MYID"])
                    .is_ok_and(|id| view_owner(n, slot).as_deref() == Some(id.as_str()))
        })
    }

    /// The value of `key` on the master serving its slot (`None`: no such
    /// key, or no running master serves the slot).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let owner = self.owner(self.slot_of(key))?;
        owner.raw_bytes(&[b"GET", key]).ok().flatten()
    }

    /// The `PTTL` of `key` on the master serving its slot (-2: none).
    pub fn pttl(&self, key: &[u8]) -> i64 {
        self.owner(self.slot_of(key))
            .and_then(|o| o.raw_bytes(&[b"PTTL", key]).ok())
            .unwrap_or(-2)
    }

    /// Moves `slot` and its keys to master `to` (an index of
    /// [`RedisCluster::masters`]), by hand: the target imports, the source
    /// migrates, the keys go over by `MIGRATE` in batches of `batch`, with
    /// `between` called after every batch (a test takes and renews locks
    /// there, while the slot is half moved; once before the first batch
    /// too), then every master is told the new owner.
    ///
    /// # Panics
    /// When a step fails.
    pub fn move_slot(&self, slot: u16, to: usize, batch: usize, mut between: impl FnMut()) {
        let from = self.owner(slot).expect("an owner of the slot");
        let to = Arc::clone(&self.masters[to]);
        if from.port() == to.port() {
            return;
        }
        let id = |n: &RedisNode| n.raw::<String>(&["CLUSTER", "MYID"]).expect("CLUSTER MYID");
        let (from_id, to_id) = (id(&from), id(&to));
        let s = slot.to_string();
        let _: () = to
            .raw(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
            .expect("SETSLOT IMPORTING");
        let _: () = from
            .raw(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
            .expect("SETSLOT MIGRATING");
        // The slot is half moved from here on, its keys still on the source.
        between();
        let port = to.port().to_string();
        let batch_arg = batch.max(1).to_string();
        loop {
            let keys: Vec<Vec<u8>> = from
                .raw(&["CLUSTER", "GETKEYSINSLOT", &s, &batch_arg])
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<&[u8]> = vec![
                b"MIGRATE",
                b"127.0.0.1",
                port.as_bytes(),
                b"",
                b"0",
                b"5000",
                b"KEYS",
            ];
            args.extend(keys.iter().map(Vec::as_slice));
            let _: redis::Value = from.raw_bytes(&args).expect("MIGRATE");
            between();
        }
        for m in self.masters.iter().filter(|m| m.is_running()) {
            let _: () = m
                .raw(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id])
                .expect("SETSLOT NODE");
        }
        let moved = poll_until(FORM_WITHIN, || {
            self.nodes()
                .iter()
                .filter(|n| n.is_running())
                .all(|n| view_owner(n, slot).as_deref() == Some(to_id.as_str()))
        });
        assert!(moved, "slot {slot} did not move: {}", self.describe());
    }
}

/// Independent Redis Clusters, started side by side: the nodes of one
/// Redlock.
#[derive(Debug)]
pub struct RedisClusters {
    clusters: Vec<RedisCluster>,
}

impl RedisClusters {
    /// `n` clusters of `masters` masters with `replicas` replicas each, on
    /// [`redis_server_binary`].
    pub fn start(n: usize, masters: usize, replicas: usize) -> Self {
        let bin = redis_server_binary();
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let bin = bin.clone();
                std::thread::spawn(move || RedisCluster::start_binary(&bin, masters, replicas))
            })
            .collect();
        Self {
            clusters: handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect(),
        }
    }

    /// Cluster `i`.
    pub fn cluster(&self, i: usize) -> &RedisCluster {
        &self.clusters[i]
    }

    /// All clusters.
    pub fn clusters(&self) -> &[RedisCluster] {
        &self.clusters
    }

    /// How many clusters hold `key` with value `token`.
    pub fn count_holding(&self, key: &str, token: &str) -> usize {
        self.clusters
            .iter()
            .filter(|c| c.get(key.as_bytes()).as_deref() == Some(token.as_bytes()))
            .count()
    }

    /// Waits until `f` holds, up to `timeout`; returns whether it did.
    pub fn wait_until(&self, timeout: Duration, mut f: impl FnMut(&Self) -> bool) -> bool {
        poll_until(timeout, || f(self))
    }

    /// How many clusters have `key` at all.
    pub fn count_with_key(&self, key: &str) -> usize {
        self.clusters
            .iter()
            .filter(|c| c.get(key.as_bytes()).is_some())
            .count()
    }
}

/// The id of the master that serves `slot` in `n`'s `CLUSTER NODES`.
fn view_owner(n: &RedisNode, slot: u16) -> Option<String> {
    let nodes = n.raw::<String>(&["CLUSTER", "NODES"]).ok()?;
    nodes.lines().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let serves = fields.get(2)?.contains("master")
            && fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(|s| s.parse::<u16>().ok());
                match (ends.next().flatten(), ends.next()) {
                    (Some(a), None) => a == slot,
                    (Some(a), Some(Some(b))) => (a..=b).contains(&slot),
                    _ => false,
                }
            });
        serves.then(|| fields[0].to_owned())
    })
}
