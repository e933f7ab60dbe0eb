//! Scenario `cluster-scale`: what a node that is a Redis Cluster buys over a
//! node that is one server (issue 40, "Scale, shown"), all in one run.
//!
//! - **Room.** Every shard, and every single server, gets the same low
//!   `maxmemory` with `noeviction`. Idempotency records whose response
//!   bodies total **three times one shard's `maxmemory`** are recorded
//!   through [`Idempotency`] (as a user's handler would), then replayed:
//!   through 3 cluster nodes of 4 shards each every record is stored and
//!   replayed; through 3 single servers the overflow is refused (fail
//!   closed: 503, the server's OOM) and nothing is replayed wrong. Four
//!   shards, not three: with three, 3× one shard is the whole capacity, and
//!   each shard's own overhead (about 1.5 MiB when empty) would not fit.
//! - **Cost.** Lock+unlock pairs on the 3 cluster nodes and on 3 single
//!   servers (fresh, before the records fill them), in alternating blocks:
//!   the p50, and the server CPU per pair of one node (`INFO cpu`,
//!   `used_cpu_sys` + `used_cpu_user` of every server process of the node,
//!   cluster bus included, summed over the 3 nodes and divided by 3 and by
//!   the pairs).
//!
//! ```sh
//! cargo build --release -p redlock-examples --bin bench
//! target/release/bench cluster-scale           # 32 MiB per shard, 4 x 1,000 pairs
//! target/release/bench cluster-scale --quick   # 16 MiB per shard, 4 x 250 pairs
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use redlock_core::Redlock;
use redlock_core::idempotency::{Begin, Idempotency, IdempotencyKey, RequestParts};
use redlock_tests::{Cluster, RedisClusters, RedisNode};

use crate::{BoxError, Setup, Stats, us};

/// Clusters and single servers: one Redlock node each.
const NODES: usize = 3;
/// Masters (shards) of each cluster.
const SHARDS: usize = 4;
/// One recorded response body: 31 KiB, so that with the record's few header
/// bytes one record is one 32 KiB allocation on the server.
const BODY: usize = 31 << 10;
/// Requests recorded at once.
const IN_FLIGHT: usize = 8;
/// Every handle's node timeout: a 31 KiB write on a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// Runs the scenario.
pub(crate) async fn cluster_scale(setup: &Setup) -> Result<(), BoxError> {
    let (maxmemory_mib, blocks, per_block) = if setup.quick {
        (16u64, 2, 250)
    } else {
        (32u64, 4, 1000)
    };
    let maxmemory = maxmemory_mib << 20;
    let requests = (3 * maxmemory).div_ceil(BODY as u64) as usize;
    let started = Instant::now();
    let (clusters, singles) = tokio::task::block_in_place(|| {
        let clusters = RedisClusters::start(NODES, SHARDS, 0);
        let singles = Cluster::start(NODES);
        (clusters, singles)
    });
    let on_cluster = clusters
        .clusters()
        .iter()
        .fold(Redlock::builder(), |b, c| b.cluster(c.seeds()))
        .node_timeout(NODE_TIMEOUT)
        .build()?;
    let on_single = Redlock::builder()
        .urls(singles.urls())
        .node_timeout(NODE_TIMEOUT)
        .build()?;
    let cluster_nodes: Vec<Vec<Arc<RedisNode>>> = clusters
        .clusters()
        .iter()
        .map(|c| c.masters().to_vec())
        .collect();
    let single_nodes: Vec<Vec<Arc<RedisNode>>> = singles
        .nodes()
        .iter()
        .map(|n| vec![Arc::clone(n)])
        .collect();
    println!(
        "\n### cluster-scale: {NODES} cluster nodes ({SHARDS} masters each, no replicas) against \
         {NODES} single servers (started in {:.1} s)\n",
        started.elapsed().as_secs_f64()
    );

    // Cost first, while every server is empty.
    let cost_c = Pairs::new(&on_cluster, &cluster_nodes).await?;
    let cost_s = Pairs::new(&on_single, &single_nodes).await?;
    let (mut cost_c, mut cost_s) = (cost_c, cost_s);
    for _ in 0..blocks {
        cost_c.block(per_block).await?;
        cost_s.block(per_block).await?;
    }

    // Room: every shard and every single server gets the same maxmemory.
    tokio::task::block_in_place(|| {
        for n in cluster_nodes.iter().chain(&single_nodes).flatten() {
            n.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
            n.cmd(&["CONFIG", "SET", "maxmemory", &maxmemory.to_string()]);
        }
    });
    let room_c = fill(&on_cluster, requests).await;
    let room_s = fill(&on_single, requests).await;

    println!(
        "maxmemory {maxmemory_mib} MiB per shard and per single server (noeviction); \
         {requests} records of {} KiB bodies = {:.1} MiB = {:.2}x one shard's maxmemory; \
         {IN_FLIGHT} requests in flight; node timeout {NODE_TIMEOUT:?}\n",
        BODY >> 10,
        (requests * BODY) as f64 / f64::from(1 << 20),
        (requests * BODY) as f64 / maxmemory as f64
    );
    println!(
        "| {:<44} | {:>14} | {:>14} | {:<6} | {:>6} |",
        "metric", "cluster nodes", "single servers", "unit", "ratio"
    );
    println!(
        "|{:-<46}|{:->16}|{:->16}|{:-<8}|{:->8}|",
        "", "", "", "", ""
    );
    let row = |name: &str, c: f64, s: f64, unit: &str| {
        let ratio = if s > 0.0 {
            format!("{:.3}", c / s)
        } else {
            "-".into()
        };
        println!("| {name:<44} | {c:>14.1} | {s:>14.1} | {unit:<6} | {ratio:>6} |");
    };
    row(
        "records stored",
        room_c.stored as f64,
        room_s.stored as f64,
        "",
    );
    row(
        "records replayed (the body recorded)",
        room_c.replayed as f64,
        room_s.replayed as f64,
        "",
    );
    row(
        "requests refused, recording",
        room_c.failed_first.values().sum::<usize>() as f64,
        room_s.failed_first.values().sum::<usize>() as f64,
        "",
    );
    row(
        "requests refused, replaying",
        room_c.failed_replay.values().sum::<usize>() as f64,
        room_s.failed_replay.values().sum::<usize>() as f64,
        "",
    );
    row(
        "records stored when asked again",
        room_c.stored_late as f64,
        room_s.stored_late as f64,
        "",
    );
    row(
        "wrong replays (another body or status)",
        room_c.wrong as f64,
        room_s.wrong as f64,
        "",
    );
    let (pc, ps) = (
        Stats::new(cost_c.took.clone()),
        Stats::new(cost_s.took.clone()),
    );
    row("lock+unlock p50", us(pc.pct(0.5)), us(ps.pct(0.5)), "µs");
    row("lock+unlock p99", us(pc.pct(0.99)), us(ps.pct(0.99)), "µs");
    row(
        "server CPU per pair, one node",
        cost_c.cpu_per_pair_per_node() * 1e6,
        cost_s.cpu_per_pair_per_node() * 1e6,
        "µs",
    );
    println!(
        "\nrefusals by status: cluster nodes {:?} then {:?}; single servers {:?} then {:?} \
         (recording, then replaying)",
        room_c.failed_first, room_c.failed_replay, room_s.failed_first, room_s.failed_replay
    );
    println!(
        "lock+unlock: {} pairs each, in {blocks} alternating blocks, after 200 to warm up\n",
        cost_c.took.len()
    );
    println!("| used_memory (MiB) | {} |", header_cells());
    println!("|---|{}", "---|".repeat(SHARDS));
    tokio::task::block_in_place(|| {
        for (i, shards) in cluster_nodes.iter().enumerate() {
            println!(
                "| cluster node {} | {} |",
                i + 1,
                memory_cells(shards, maxmemory)
            );
        }
        for (i, one) in single_nodes.iter().enumerate() {
            println!(
                "| single server {} | {} |",
                i + 1,
                memory_cells(one, maxmemory)
            );
        }
    });
    Ok(())
}

fn header_cells() -> String {
    (1..=SHARDS)
        .map(|s| format!("shard {s}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Each server's `used_memory` in MiB (and its share of `maxmemory`), as
/// table cells, padded to [`SHARDS`] cells.
fn memory_cells(servers: &[Arc<RedisNode>], maxmemory: u64) -> String {
    (0..SHARDS)
        .map(|i| match servers.get(i) {
            Some(n) => {
                let used = info_field(n, "memory", "used_memory").unwrap_or(0.0);
                format!(
                    "{:.1} ({:.0}%)",
                    used / f64::from(1 << 20),
                    100.0 * used / maxmemory as f64
                )
            }
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A numeric field of `INFO section` on `node`.
fn info_field(node: &RedisNode, section: &str, name: &str) -> Option<f64> {
    let info: String = node.raw(&["INFO", section]).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `used_cpu_sys` + `used_cpu_user` of every server of every node, summed.
fn server_cpu(nodes: &[Vec<Arc<RedisNode>>]) -> f64 {
    tokio::task::block_in_place(|| {
        nodes
            .iter()
            .flatten()
            .map(|n| {
                info_field(n, "cpu", "used_cpu_sys").unwrap_or(0.0)
                    + info_field(n, "cpu", "used_cpu_user").unwrap_or(0.0)
            })
            .sum()
    })
}

/// Lock+unlock pairs on one handle, block by block.
struct Pairs<'a> {
    redlock: &'a Redlock,
    nodes: &'a [Vec<Arc<RedisNode>>],
    took: Vec<Duration>,
    cpu: f64,
}

impl<'a> Pairs<'a> {
    /// Warms the handle up with 200 pairs.
    async fn new(redlock: &'a Redlock, nodes: &'a [Vec<Arc<RedisNode>>]) -> Result<Self, BoxError> {
        let mut me = Self {
            redlock,
            nodes,
            took: Vec::new(),
            cpu: 0.0,
        };
        me.pairs("warm", 200).await?;
        me.took.clear();
        Ok(me)
    }

    async fn pairs(&mut self, prefix: &str, n: usize) -> Result<(), BoxError> {
        let first = self.took.len();
        for i in 0..n {
            let key = format!("bench:cluster-scale:{prefix}:{}", first + i);
            let start = Instant::now();
            let lock = self
                .redlock
                .mutex(&key)
                .try_acquire(Duration::from_secs(5))
                .await?;
            self.redlock.unlock(lock).await?;
            self.took.push(start.elapsed());
        }
        Ok(())
    }

    /// `n` more pairs, with the servers' CPU around them.
    async fn block(&mut self, n: usize) -> Result<(), BoxError> {
        let cpu0 = server_cpu(self.nodes);
        self.pairs("pair", n).await?;
        self.cpu += server_cpu(self.nodes) - cpu0;
        Ok(())
    }

    fn cpu_per_pair_per_node(&self) -> f64 {
        self.cpu / self.nodes.len().max(1) as f64 / self.took.len().max(1) as f64
    }
}

/// What the records did on one handle.
#[derive(Default)]
struct Room {
    stored: usize,
    /// Stored when asked again (refused the first time).
    stored_late: usize,
    replayed: usize,
    /// Replays of another body or status: must be 0.
    wrong: usize,
    /// Refusals while recording, by status.
    failed_first: BTreeMap<u16, usize>,
    /// Refusals while replaying (a record that was never stored runs, and
    /// is refused, again), by status.
    failed_replay: BTreeMap<u16, usize>,
}

/// The body recorded for request `i`: its number, then filler.
fn body(i: usize) -> Bytes {
    let mut b = format!("response {i} ").into_bytes();
    b.resize(BODY, b'x');
    Bytes::from(b)
}

/// What one request through the flow came to.
enum Answer {
    Stored,
    Replayed { right: bool },
    Refused(u16),
}

/// Request `i` through the idempotency flow: a handler that answers 201
/// with [`body`]`(i)`.
async fn request(idem: &Idempotency, i: usize) -> Answer {
    let headers = http::HeaderMap::new();
    let parts = RequestParts {
        method: "POST",
        path: "/pay",
        query: None,
        headers: &headers,
        body: b"pay",
    };
    let key = IdempotencyKey::parse(format!("cluster-scale-{i}").as_bytes());
    match idem.begin(Some(key), None, &parts).await {
        Ok(Begin::Replay(r)) => Answer::Replayed {
            right: r.status == 201 && r.body == body(i),
        },
        Ok(Begin::Run(running)) => {
            match running.finish(201, std::iter::empty(), Some(body(i))).await {
                Ok(()) => Answer::Stored,
                Err(e) => Answer::Refused(e.status().as_u16()),
            }
        }
        Ok(Begin::PassThrough) => Answer::Refused(0),
        Err(e) => Answer::Refused(e.status().as_u16()),
    }
}

/// Records `requests` responses through `redlock`, then replays them all.
async fn fill(redlock: &Redlock, requests: usize) -> Room {
    let idem = Idempotency::new(redlock.clone());
    let mut room = Room::default();
    for replaying in [false, true] {
        let answers: Vec<Answer> = futures_util::stream::iter(0..requests)
            .map(|i| request(&idem, i))
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for a in answers {
            match (a, replaying) {
                (Answer::Stored, false) => room.stored += 1,
                // A request whose record was refused runs again, and its
                // record may fit now (lock keys of the first pass expired).
                (Answer::Stored, true) => room.stored_late += 1,
                (Answer::Replayed { right: true }, _) => room.replayed += 1,
                (Answer::Replayed { right: false }, _) => room.wrong += 1,
                (Answer::Refused(s), false) => *room.failed_first.entry(s).or_default() += 1,
                (Answer::Refused(s), true) => *room.failed_replay.entry(s).or_default() += 1,
            }
        }
    }
    room
}
