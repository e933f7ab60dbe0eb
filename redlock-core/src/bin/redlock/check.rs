//! `redlock check`: each node's version, run_id, role, persistence and
//! latency, and what would make the set unfit for Redlock: two URLs that reach
//! one server (same `run_id`), a node down, a replica, a master with
//! replicas whose writes do not wait for them (`replicas.rs`), an eviction policy that can evict lock keys, and with
//! `--fencing`, nodes where the mode is unsound. A cluster node
//! (`cluster.rs`) is checked master by master, and as a whole.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redlock_core::{EvictionCheck, FencingMode, NodeInfo, Redlock, ReplicaAcks};
use serde_json::json;

use crate::run::Fencing;
use crate::{code, fail};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Also judge each node's persistence for this fencing mode.
    #[arg(long, value_enum)]
    fencing: Option<Fencing>,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One node's findings.
struct Row {
    url: String,
    info: Option<NodeInfo>,
    latency: Option<Duration>,
    problems: Vec<String>,
    /// A cluster node's state, slots assigned, and its masters' findings.
    cluster: Option<(String, u32, Vec<Member>)>,
}

/// One master of a cluster node.
struct Member {
    master: crate::cluster::Master,
    problems: Vec<String>,
    /// The row's verdict on its replicas when it has no other problem.
    replicas_note: String,
}

/// The median of three inspections of a key nobody uses: one round trip each.
async fn latency(redlock: &Redlock) -> Option<Duration> {
    let mut times = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let seen = redlock.inspect("redlock-check:latency").await.ok()?;
        if seen.nodes.iter().any(|n| n.state.is_err()) {
            return None;
        }
        times.push(start.elapsed());
    }
    times.sort();
    times.get(1).copied()
}

/// Checks the node at `url`; a cluster's master (`member`) is not judged
/// by its replicas here ([`check_cluster`] judges them).
async fn check_one(
    url: &str,
    node_timeout: Duration,
    fencing: Option<FencingMode>,
    member: bool,
) -> Row {
    let mut row = Row {
        url: redlock_core::redact_url(url),
        info: None,
        latency: None,
        problems: Vec::new(),
        cluster: None,
    };
    let mut builder = Redlock::builder().url(url).node_timeout(node_timeout);
    if let Some(mode) = fencing {
        builder = builder.fencing(mode);
    }
    let redlock = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            row.problems.push(e.to_string());
            return row;
        }
    };
    match redlock.check_nodes().await {
        Ok(mut infos) => row.info = infos.pop(),
        Err(e) => row.problems.push(e.to_string()),
    }
    if let Some(info) = &row.info {
        if let Some(e) = &info.error {
            row.problems.push(format!("unreachable: {e}"));
        } else {
            row.latency = latency(&redlock).await;
        }
        if let Some(check) = info.fencing.as_ref().filter(|c| !c.is_sound()) {
            row.problems.push(format!("fencing unsound: {check:?}"));
        }
        match info.role.as_deref() {
            Some("master") | None => {}
            Some(role) => row
                .problems
                .push(format!("role {role}: Redlock needs independent masters")),
        }
        if let Some(problem) = crate::replicas::problem(info).filter(|_| !member) {
            row.problems.push(problem);
        }
        if let Some(problem) = crate::replicas::aof_problem(info) {
            row.problems.push(problem);
        }
        if let Some(EvictionCheck::Unsound { reason }) = &info.eviction {
            row.problems.push(format!("eviction: {reason}"));
        }
    }
    row
}

/// Checks a cluster node: its state and slots, each master as a node, and
/// their replicas (`cluster::problems`). The row shows the first master's
/// version, run_id, role and persistence, and the cluster's latency.
async fn check_cluster(
    seeds: &crate::cluster::Seeds,
    node_timeout: Duration,
    fencing: Option<FencingMode>,
) -> Row {
    let mut row = Row {
        url: seeds.shown(),
        info: None,
        latency: None,
        problems: Vec::new(),
        cluster: None,
    };
    let view = match crate::cluster::view(seeds, node_timeout).await {
        Ok(view) => view,
        Err(e) => {
            row.problems.push(format!("unreachable: {e}"));
            return row;
        }
    };
    // The seeds share their query, `?replica_acks=n` included.
    let acks = seeds
        .urls()
        .first()
        .and_then(|u| ReplicaAcks::from_url(u).ok().flatten());
    row.problems.extend(crate::cluster::problems(&view, acks));
    let rows = futures_util::future::join_all(
        view.masters
            .iter()
            .map(|m| seeds.url(&m.address))
            .collect::<Vec<_>>()
            .iter()
            .map(|url| check_one(url, node_timeout, fencing, true)),
    )
    .await;
    let mut members = Vec::new();
    for (master, mut r) in view.masters.into_iter().zip(rows) {
        row.problems.extend(
            r.problems
                .iter()
                .map(|p| format!("master {}: {p}", master.address)),
        );
        if row.info.is_none() {
            row.info = r.info.take();
        }
        members.push(Member {
            replicas_note: crate::cluster::replicas_note(&master, acks),
            master,
            problems: r.problems,
        });
    }
    let handle = Redlock::builder()
        .cluster(seeds.urls())
        .node_timeout(node_timeout)
        .build();
    match handle {
        Ok(redlock) => row.latency = latency(&redlock).await,
        Err(e) => row.problems.push(e.to_string()),
    }
    row.cluster = Some((view.state, view.slots_assigned, members));
    row
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
    if nodes.is_empty() {
        return fail(
            code::USAGE,
            "no nodes: give --nodes or set REDLOCK_NODES (redis:// URLs, comma-separated)",
        );
    }
    let fencing = args.fencing.map(|f| match f {
        Fencing::Durable => FencingMode::Durable,
        Fencing::Hybrid => FencingMode::Hybrid,
    });
    let mut rows = futures_util::future::join_all(nodes.iter().map(|u| async move {
        match crate::cluster::Seeds::parse(u) {
            Some(seeds) => check_cluster(&seeds, node_timeout, fencing).await,
            None => check_one(u, node_timeout, fencing, false).await,
        }
    }))
    .await;
    // Two URLs, one server: a single failure takes both, so they are one vote.
    for i in 0..rows.len() {
        let run_id = rows[i].info.as_ref().and_then(|n| n.run_id.clone());
        if let Some(run_id) = run_id
            && let Some(j) = (0..i).find(|&j| {
                rows[j].info.as_ref().and_then(|n| n.run_id.as_deref()) == Some(run_id.as_str())
            })
        {
            let first = rows[j].url.clone();
            rows[i]
                .problems
                .push(format!("same server as {first} (run_id {run_id})"));
        }
    }
    let healthy = rows.iter().filter(|r| r.problems.is_empty()).count();
    let quorum = nodes.len() / 2 + 1;
    if args.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                let info = r.info.as_ref();
                json!({
                    "node": r.url,
                    "version": info.and_then(|i| i.version.clone()),
                    "run_id": info.and_then(|i| i.run_id.clone()),
                    "role": info.and_then(|i| i.role.clone()),
                    "connected_replicas": info.and_then(|i| i.connected_replicas),
                    "replica_acks": info.and_then(|i| i.replica_acks).map(|a| a.replicas()),
                    "maxmemory_policy": info.and_then(|i| i.maxmemory_policy.clone()),
                    "aof_enabled": info.and_then(|i| i.aof_enabled),
                    "appendfsync": info.and_then(|i| i.appendfsync.clone()),
                    "latency_us": r.latency.map(|l| u64::try_from(l.as_micros()).unwrap_or(u64::MAX)),
                    "problems": r.problems,
                    "cluster": r.cluster.as_ref().map(|(state, slots, members)| json!({
                        "state": state,
                        "slots_assigned": slots,
                        "masters": members.iter().map(|m| json!({
                            "address": m.master.address,
                            "slots": m.master.slots,
                            "replicas": m.master.replicas,
                            "problems": m.problems,
                        })).collect::<Vec<_>>(),
                    })),
                })
            })
            .collect();
        println!(
            "{}",
            json!({"nodes": list, "quorum": quorum, "healthy": healthy, "ok": healthy == rows.len()})
        );
    } else {
        let width = rows.iter().map(|r| r.url.len()).max().unwrap_or(4).max(4);
        println!(
            "{:<width$}  {:<8}  {:<12}  {:<6}  {:<10}  {:>10}  PROBLEMS",
            "NODE", "VERSION", "RUN_ID", "ROLE", "AOF/FSYNC", "LATENCY"
        );
        for r in &rows {
            let info = r.info.as_ref();
            let run_id: String = info
                .and_then(|i| i.run_id.as_deref())
                .map_or_else(|| "-".into(), |id| id.chars().take(12).collect());
            let aof = match info.and_then(|i| i.aof_enabled) {
                Some(true) => format!(
                    "yes/{}",
                    info.and_then(|i| i.appendfsync.as_deref()).unwrap_or("?")
                ),
                Some(false) => "no".into(),
                None => "-".into(),
            };
            println!(
                "{:<width$}  {:<8}  {:<12}  {:<6}  {:<10}  {:>10}  {}",
                r.url,
                info.and_then(|i| i.version.as_deref()).unwrap_or("-"),
                run_id,
                info.and_then(|i| i.role.as_deref()).unwrap_or("-"),
                aof,
                r.latency
                    .map_or_else(|| "-".into(), |l| format!("{} us", l.as_micros())),
                if r.problems.is_empty() {
                    info.and_then(crate::replicas::fit_note)
                        .unwrap_or_else(|| "ok".to_owned())
                } else {
                    r.problems.join("; ")
                },
            );
            if let Some((state, slots, members)) = &r.cluster {
                println!("  cluster_state:{state}, {slots} of 16384 slots assigned");
                for m in members {
                    println!(
                        "  master {}  {} slot(s)  {} replica(s)  {}",
                        m.master.address,
                        m.master.slots,
                        m.master.replicas,
                        if m.problems.is_empty() {
                            m.replicas_note.clone()
                        } else {
                            m.problems.join("; ")
                        }
                    );
                }
            }
        }
        println!(
            "{healthy} of {} node(s) fit for Redlock (quorum {quorum})",
            rows.len()
        );
    }
    if healthy == rows.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(code::FAILURE)
    }
}
