//! *Layer 1, values (see `lib.rs`).*
//!
//! Whether a node keeps the keys the algorithm relies on when it runs out of
//! memory: the promise "a lock key lives until its TTL or its release" (and
//! a fencing counter until it expires, or for ever), judged by
//! [`Redlock::check_nodes`](crate::Redlock::check_nodes) from the node's
//! `maxmemory` and `maxmemory-policy`.

use crate::fencing::FencingMode;

/// Whether a node's eviction policy can remove lock keys or fencing counters
/// before their time, as [`Redlock::check_nodes`](crate::Redlock::check_nodes)
/// judged it from `maxmemory_policy` and `maxmemory` (`INFO memory`, or
/// `CONFIG GET` when `INFO` does not say).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// `noeviction`: no key is ever evicted. Over `maxmemory`, writes fail
    /// instead (`OOM`, [`NodeError::OutOfMemory`](crate::NodeError::OutOfMemory)):
    /// no lock can be taken on the node, which fails closed.
    Sound {
        /// What to watch for (the memory limit), for the log.
        note: String,
    },
    /// A policy that can evict lock keys (every `volatile-*` and `allkeys-*`
    /// policy: lock keys carry a TTL), or fencing counters (`allkeys-*`, and
    /// `volatile-*` for the expiring [`FencingMode::Hybrid`] counters). An
    /// evicted lock key lets a second client take a held lock; an evicted
    /// counter lets tokens repeat.
    Unsound {
        /// The policy, what it can evict, and what that breaks.
        reason: String,
    },
    /// The policy could not be read (`INFO` and `CONFIG` refused, or the
    /// node is down).
    Unknown {
        /// Why it could not be read.
        reason: String,
    },
}

impl EvictionCheck {
    /// Whether no key the algorithm relies on can be evicted on the node.
    pub fn is_sound(&self) -> bool {
        matches!(self, Self::Sound { .. })
    }
}

/// Judges a node's `maxmemory-policy` (and `maxmemory`, in bytes, `0` for no
/// limit) for locks, and for fencing counters in `fencing` mode.
pub(crate) fn check_eviction(
    policy: Option<&str>,
    maxmemory: Option<u64>,
    fencing: Option<FencingMode>,
) -> EvictionCheck {
    let Some(policy) = policy else {
        return EvictionCheck::Unknown {
            reason: "neither INFO memory nor CONFIG GET maxmemory-policy said the policy".into(),
        };
    };
    let limit = match maxmemory {
        Some(0) => " (maxmemory is 0 now: nothing is evicted until a limit is set)".to_owned(),
        Some(bytes) => format!(" once maxmemory ({bytes} bytes) is reached"),
        None => String::new(),
    };
    let policy = policy.to_ascii_lowercase();
    if policy == "noeviction" {
        let note = match maxmemory {
            Some(0) => "noeviction, no maxmemory: keys are never evicted".to_owned(),
            Some(bytes) => format!(
                "noeviction: keys are never evicted, but once maxmemory ({bytes} bytes) is \
                 reached writes fail with OOM and no lock can be taken on this node"
            ),
            None => "noeviction: keys are never evicted, but writes fail with OOM once \
                     maxmemory is reached"
                .to_owned(),
        };
        return EvictionCheck::Sound { note };
    }
    let counters = match fencing {
        Some(FencingMode::Durable) if policy.starts_with("allkeys-") => {
            ", and the fencing counters (tokens can repeat)"
        }
        // Hybrid counters expire, so a volatile policy can pick them too.
        Some(FencingMode::Hybrid) => ", and the fencing counters (tokens can repeat)",
        _ => "",
    };
    if policy.starts_with("volatile-") || policy.starts_with("allkeys-") {
        return EvictionCheck::Unsound {
            reason: format!(
                "maxmemory-policy {policy} can evict lock keys (they carry a TTL){counters}{limit}: \
                 an evicted key lets another client take a held lock; use noeviction"
            ),
        };
    }
    EvictionCheck::Unknown {
        reason: format!("unknown maxmemory-policy {policy}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_sound() {
        assert!(check_eviction(Some("noeviction"), Some(0), None).is_sound());
        let EvictionCheck::Sound { note } = check_eviction(Some("noeviction"), Some(1 << 20), None)
        else {
            panic!()
        };
        assert!(note.contains("OOM"), "{note}");
        for p in [
            "volatile-lru",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-random",
        ] {
            let EvictionCheck::Unsound { reason } = check_eviction(Some(p), Some(100), None) else {
                panic!("{p}")
            };
            assert!(
                reason.contains(p) && reason.contains("lock keys"),
                "{reason}"
            );
            assert!(!reason.contains("fencing"), "{reason}");
        }
        assert!(matches!(
            check_eviction(None, None, None),
            EvictionCheck::Unknown { .. }
        ));
    }

    #[test]
    fn counters_are_named_where_the_policy_can_pick_them() {
        let reason = |p, m| match check_eviction(Some(p), Some(1), Some(m)) {
            EvictionCheck::Unsound { reason } => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason("allkeys-lfu", FencingMode::Durable).contains("fencing counters"));
        assert!(!reason("volatile-lru", FencingMode::Durable).contains("fencing counters"));
        assert!(reason("volatile-lru", FencingMode::Hybrid).contains("fencing counters"));
    }
}
