//! `redlock check`'s judgement of a node's replicas: a master with replicas
//! is fit for Redlock only when its writes wait for them (`replica_acks` in
//! its URL), since a failover may promote a replica that never received a
//! lock key and so hand the lock out again.

use redlock_core::NodeInfo;

/// Why the node's replication makes it unfit, if it does.
pub(crate) fn problem(info: &NodeInfo) -> Option<String> {
    if info.role.as_deref().is_some_and(|r| r != "master") {
        // The role's own problem is told already.
        return None;
    }
    let attached = info.connected_replicas;
    match info.replica_acks {
        None => attached.filter(|n| *n > 0).map(|n| {
            format!(
                "{n} replica(s) attached and writes do not wait for them: a failover can \
                 promote a replica that never got a lock key and hand the lock out again \
                 (add ?replica_acks={n} to the node's URL)"
            )
        }),
        Some(acks) if acks.replicas() == 0 => attached.filter(|n| *n > 0).map(|n| {
            format!(
                "{n} replica(s) attached and writes wait only for this master's AOF: a \
                 failover can promote a replica that never got a lock key (add \
                 &replica_acks={n} to the node's URL)"
            )
        }),
        Some(acks) => {
            let wanted = u64::from(acks.replicas());
            match attached {
                Some(n) if n < wanted => Some(format!(
                    "writes wait for {wanted} replica(s) but {n} attached: no acquire can \
                     count this node"
                )),
                _ => None,
            }
        }
    }
}

/// Why the node's `WAITAOF` acks ([`ReplicaAcks::aof`]) cannot be met, if
/// they cannot: a server without `WAITAOF` (`redis_version` before 7.2;
/// Valkey 8 and later say 7.2.4), or the master's own AOF waited for with
/// `appendonly no`.
///
/// [`ReplicaAcks::aof`]: redlock_core::ReplicaAcks::aof
pub(crate) fn aof_problem(info: &NodeInfo) -> Option<String> {
    let local = info.replica_acks?.aof_local()?;
    let version = info.version.as_deref()?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (7, 2) {
        return Some(format!(
            "writes wait by WAITAOF (waitaof= in the URL) and this server (redis_version \
             {version}) lacks it: no acquire can count this node (Redis >= 7.2 or Valkey \
             >= 8 has it)"
        ));
    }
    (local && info.aof_enabled == Some(false)).then(|| {
        "writes wait for this master's AOF (waitaof=1) and appendonly is off: no \
         acquire can count this node"
            .to_owned()
    })
}

/// What a fit node's row says instead of a bare `ok` when its writes wait
/// for replicas.
pub(crate) fn fit_note(info: &NodeInfo) -> Option<String> {
    let acks = info.replica_acks?;
    let by = match acks.aof_local() {
        None => "",
        Some(true) => " and this master's AOF (WAITAOF)",
        Some(false) => " (WAITAOF)",
    };
    Some(format!(
        "ok: writes wait for {} of {} replica(s){by}",
        acks.replicas(),
        info.connected_replicas.unwrap_or(0)
    ))
}
