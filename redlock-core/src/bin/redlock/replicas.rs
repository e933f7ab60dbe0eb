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

/// What a fit node's row says instead of a bare `ok` when its writes wait
/// for replicas.
pub(crate) fn fit_note(info: &NodeInfo) -> Option<String> {
    let acks = info.replica_acks?;
    Some(format!(
        "ok: writes wait for {} of {} replica(s)",
        acks.replicas(),
        info.connected_replicas.unwrap_or(0)
    ))
}
