//! Nodes that are Redis Clusters on the command line, and what `redlock
//! check` finds in one.
//!
//! A cluster node is written `redis+cluster://[user:password@]h1:7000,h2:7000`
//! (or `valkey+cluster://`): its seeds, which share the credentials and what
//! follows the hosts (`/db`, `?query`). A comma after the scheme's hosts
//! therefore never starts a new node (`nodes.rs` splits only where a scheme
//! starts).
//!
//! `check` reads the cluster from the first seed that answers: `CLUSTER
//! INFO` (its state, the slots assigned) and `CLUSTER NODES` (the masters,
//! their slots and their replicas), then checks each master as it checks a
//! single node. A cluster node is fit when its state is `ok`, all 16384
//! slots are assigned, every master is fit, and its replicas are waited
//! for: with `?replica_acks=n` on the node (each write then waits for `n`
//! replicas on its slot's master), every master must have `n` replicas;
//! without it, no master may have any, since a failover can promote a
//! replica that never got a lock key and hand the lock out again, the same
//! reason a primary with replicas and no replica acks is unfit.

use std::time::Duration;

use redlock_core::deadpool_redis::redis;
use redlock_core::{RedlockBuilder, ReplicaAcks, redact_url};

/// The schemes of a cluster node, and the scheme its seeds are given.
const SCHEMES: [(&str, &str); 2] = [
    ("redis+cluster://", "redis://"),
    ("valkey+cluster://", "valkey://"),
];

/// Every slot of a Redis Cluster.
const SLOTS: u32 = 16384;

/// A cluster node's seeds, written as one URL each; `None` when `node` is
/// not a cluster node.
pub(crate) struct Seeds {
    /// `redis://user:password@`: the seeds' scheme and credentials.
    head: String,
    hosts: Vec<String>,
    /// What follows the hosts: `/db`, `?query`.
    tail: String,
}

impl Seeds {
    pub(crate) fn parse(node: &str) -> Option<Seeds> {
        let (rest, scheme) = SCHEMES.iter().find_map(|(cluster, scheme)| {
            let head = node.get(..cluster.len())?;
            head.eq_ignore_ascii_case(cluster)
                .then(|| (&node[cluster.len()..], *scheme))
        })?;
        let (userinfo, after) = match rest.rfind('@') {
            Some(at) => (&rest[..=at], &rest[at + 1..]),
            None => ("", rest),
        };
        let end = after.find(['/', '?']).unwrap_or(after.len());
        Some(Seeds {
            head: format!("{scheme}{userinfo}"),
            hosts: after[..end]
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_owned)
                .collect(),
            tail: after[end..].to_owned(),
        })
    }

    /// The URL of member `host` (`host:port`), with the seeds' credentials.
    pub(crate) fn url(&self, host: &str) -> String {
        format!("{}{host}{}", self.head, self.tail)
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.hosts.iter().map(|h| self.url(h)).collect()
    }

    /// The node as shown: its scheme, credentials redacted, and hosts.
    pub(crate) fn shown(&self) -> String {
        const HOLE: &str = "hosts.invalid:1";
        let one = redact_url(&self.url(HOLE));
        let (scheme, rest) = one.split_once("://").unwrap_or(("redis", &one));
        format!(
            "{scheme}+cluster://{}",
            rest.replacen(HOLE, &self.hosts.join(","), 1)
        )
    }
}

/// Adds `node`, a cluster node or a URL, to `builder`.
pub(crate) fn add(builder: RedlockBuilder, node: &str) -> RedlockBuilder {
    match Seeds::parse(node) {
        Some(seeds) => builder.cluster(seeds.urls()),
        None => builder.url(node),
    }
}

/// One master as `CLUSTER NODES` lists it.
pub(crate) struct Master {
    pub(crate) address: String,
    pub(crate) slots: u32,
    pub(crate) replicas: u32,
}

/// What the members say of their cluster.
pub(crate) struct View {
    pub(crate) state: String,
    pub(crate) slots_assigned: u32,
    pub(crate) masters: Vec<Master>,
}

/// The cluster's view from the first seed that answers within
/// `node_timeout` (each), or why none did (no password in it).
pub(crate) async fn view(seeds: &Seeds, node_timeout: Duration) -> Result<View, String> {
    let mut last = "no seeds".to_owned();
    for url in seeds.urls() {
        match tokio::time::timeout(node_timeout.max(Duration::from_secs(1)), read_view(&url)).await
        {
            Ok(Ok(view)) => return Ok(view),
            Ok(Err(e)) => last = format!("{}: {e}", redact_url(&url)),
            Err(_) => last = format!("{}: timed out", redact_url(&url)),
        }
    }
    Err(last)
}

async fn read_view(url: &str) -> Result<View, String> {
    let client = redis::Client::open(url).map_err(|e| format!("{:?}", e.kind()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("{:?}", e.kind()))?;
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };
    Ok(View {
        state: field("cluster_state"),
        slots_assigned: field("cluster_slots_assigned").parse().unwrap_or(0),
        masters: masters(&nodes),
    })
}

/// The masters in `CLUSTER NODES` output: `<id> <ip:port@bus> <flags>
/// <master> <ping> <pong> <epoch> <link> <slot>...`.
fn masters(nodes: &str) -> Vec<Master> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    let flags = |f: &Vec<&str>, flag: &str| f[2].split(',').any(|x| x == flag);
    let mut masters: Vec<Master> = lines
        .iter()
        .filter(|f| flags(f, "master") && !flags(f, "fail"))
        .map(|f| Master {
            address: f[1].split('@').next().unwrap_or(f[1]).to_owned(),
            slots: f[8..].iter().map(|r| slot_count(r)).sum(),
            replicas: u32::try_from(
                lines
                    .iter()
                    .filter(|r| flags(r, "slave") && !flags(r, "fail") && r[3] == f[0])
                    .count(),
            )
            .unwrap_or(u32::MAX),
        })
        .collect();
    masters.sort_by(|a, b| a.address.cmp(&b.address));
    masters
}

/// How many slots a `CLUSTER NODES` slot field holds: `5`, `0-5460`; a
/// migration note (`[5->-id]`) holds none.
fn slot_count(field: &str) -> u32 {
    if field.starts_with('[') {
        return 0;
    }
    match field.split_once('-') {
        Some((a, b)) => match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(a), Ok(b)) if b >= a => b - a + 1,
            _ => 0,
        },
        None => u32::from(field.parse::<u32>().is_ok()),
    }
}

/// Why master `m`'s replicas make the cluster unfit, given the replica acks
/// its writes wait for: replicas not waited for, or fewer than waited for.
fn replica_problem(m: &Master, acks: Option<ReplicaAcks>) -> Option<String> {
    let waited = acks.map_or(0, |a| a.replicas());
    match acks {
        _ if waited == 0 && m.replicas > 0 => Some(format!(
            "has {} replica(s) and writes do not wait for them: a failover can promote \
             a replica that never got a lock key and hand the lock out again (add \
             ?replica_acks={} to the node's URL)",
            m.replicas, m.replicas
        )),
        Some(acks) if m.replicas < acks.replicas() => Some(format!(
            "has {} replica(s) but writes wait for {}: no acquire of a key in its \
             slots can count this node",
            m.replicas,
            acks.replicas()
        )),
        _ => None,
    }
}

/// How a master's row judges its replicas when nothing else is wrong.
pub(crate) fn replicas_note(m: &Master, acks: Option<ReplicaAcks>) -> String {
    match acks {
        _ if replica_problem(m, acks).is_some() => "unfit: replicas".to_owned(),
        Some(acks) if m.replicas > 0 => format!(
            "ok: writes wait for {} of {} replica(s)",
            acks.replicas(),
            m.replicas
        ),
        _ => "ok".to_owned(),
    }
}

/// Why the cluster as a whole is unfit, from its view and the replica acks
/// its writes wait for.
pub(crate) fn problems(view: &View, acks: Option<ReplicaAcks>) -> Vec<String> {
    let mut problems = Vec::new();
    if view.state != "ok" {
        problems.push(format!("cluster_state:{}", view.state));
    }
    if view.slots_assigned != SLOTS {
        problems.push(format!("{} of {SLOTS} slots assigned", view.slots_assigned));
    }
    problems.extend(
        view.masters
            .iter()
            .filter_map(|m| replica_problem(m, acks).map(|p| format!("master {} {p}", m.address))),
    );
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_share_credentials_and_tail_and_are_shown_redacted() {
        let s = Seeds::parse("redis+cluster://app:s3,cr@t@h1:7000, h2:7001/0?protocol=2").unwrap();
        assert_eq!(
            s.urls(),
            [
                "redis://app:s3,cr@t@h1:7000/0?protocol=2",
                "redis://app:s3,cr@t@h2:7001/0?protocol=2"
            ]
        );
        let shown = s.shown();
        assert!(!shown.contains("s3,cr"), "{shown}");
        assert_eq!(
            shown,
            "redis+cluster://app:***@h1:7000,h2:7001/0?protocol=2"
        );
        assert_eq!(
            Seeds::parse("VALKEY+CLUSTER://h:1").unwrap().shown(),
            "valkey+cluster://h:1"
        );
        assert!(Seeds::parse("redis://h:1").is_none());
    }

    #[test]
    fn a_masters_replicas_are_judged_by_the_acks_its_writes_wait_for() {
        let master = |replicas| Master {
            address: "h:1".into(),
            slots: 1,
            replicas,
        };
        let acks = |n| Some(ReplicaAcks::new(n, Duration::from_millis(5)));
        let local_aof = Some(ReplicaAcks::aof(true, 0, Duration::from_millis(5)));
        assert_eq!(replica_problem(&master(0), None), None);
        assert!(replica_problem(&master(1), None).is_some_and(|p| p.contains("do not wait")));
        assert!(replica_problem(&master(1), local_aof).is_some_and(|p| p.contains("do not wait")));
        assert_eq!(replica_problem(&master(1), acks(1)), None);
        assert!(replica_problem(&master(1), acks(2)).is_some_and(|p| p.contains("wait for 2")));
        assert_eq!(replicas_note(&master(0), None), "ok");
        assert_eq!(replicas_note(&master(1), None), "unfit: replicas");
        assert_eq!(
            replicas_note(&master(2), acks(1)),
            "ok: writes wait for 1 of 2 replica(s)"
        );
        let view = View {
            state: "ok".into(),
            slots_assigned: SLOTS,
            masters: vec![master(1)],
        };
        assert!(problems(&view, acks(1)).is_empty());
        assert_eq!(problems(&view, None).len(), 1);
    }

    #[test]
    fn masters_slots_and_replicas_from_cluster_nodes() {
        let nodes = "\
a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5->-b]
b 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
c 127.0.0.1:7002@17002 master,fail - 0 0 3 disconnected
d 127.0.0.1:7003@17003 slave a 0 0 1 connected
e 127.0.0.1:7004@17004 slave,fail b 0 0 2 disconnected
";
        let m = masters(nodes);
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].address.as_str(), m[0].slots, m[0].replicas),
            ("127.0.0.1:7000", 5461, 1)
        );
        assert_eq!((m[1].slots, m[1].replicas), (5462, 0));
        assert_eq!(slot_count("7"), 1);
    }
}
