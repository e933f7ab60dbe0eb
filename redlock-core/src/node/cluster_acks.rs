//! Replica acks on a cluster node: after a write, a `WAIT` on the master
//! of every slot the call wrote (`replicas.rs` has the rest, shared with a
//! single server: when to wait, for how long, and what a short count means).
//!
//! `WAIT` counts the replicas that acknowledged the calling connection's
//! last write. A single server's multiplexed connection fails rather than
//! reconnect, so a `WAIT` on it follows this call's write. redis' cluster
//! connection does reconnect on its own, and retries a command whose
//! connection broke on the new one, where a `WAIT` would wait for nothing
//! (a fresh connection has written nothing, and every replica has acked
//! that). So each slot's `WAIT` is pipelined behind a write of its own,
//! `SET {tag}:redlock-acked "" PX 1` in the lock key's slot: the master ran
//! that write after the lock's, so the replicas that acknowledged it have
//! the lock's write too, whichever connection to the master the pipeline
//! went on. The marker key lives a millisecond; `CLIENT INFO` in the same
//! pipeline names the master (its `laddr`) if the count falls short.

use futures_util::future::join_all;
use redis::Value;

use super::cluster::Conn;
use super::scripts::Call;
use super::{Node, ReplicaAcks};
use crate::error::NodeError;

/// The Redis Cluster slot of `key`: the CRC16 (XMODEM) of its hash tag,
/// else of the whole key, modulo 16384.
fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).unwrap_or(key)) % 16384
}

/// The text between the first `{` of `key` and the first `}` after it,
/// when not empty (what a cluster hashes a key by).
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    Some(&key[open + 1..open + 1 + len]).filter(|t| !t.is_empty())
}

/// The marker key written before each slot's `WAIT`: `{tag}:redlock-acked`,
/// in `key`'s slot. `None` for a key without a hash tag that holds a brace
/// (its slot has no marker of this shape); the library's keys are never
/// such (`slots.rs` escapes braces into a tag).
fn marker(key: &[u8]) -> Option<Vec<u8>> {
    let tag = match hash_tag(key) {
        Some(tag) => tag,
        None if key.iter().any(|&b| b == b'{' || b == b'}') => return None,
        None => key,
    };
    let mut out = Vec::with_capacity(tag.len() + 16);
    out.push(b'{');
    out.extend_from_slice(tag);
    out.extend_from_slice(b"}:redlock-acked");
    Some(out)
}

/// The key a command names: `EVAL`/`EVALSHA`'s first key, else its first
/// argument.
fn key_of(cmd: &redis::Cmd) -> Option<Vec<u8>> {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        })
        .collect();
    let name = args.first()?;
    let at = if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        3
    } else {
        1
    };
    args.get(at).map(|k| k.to_vec())
}

/// One key of every slot `call` writes.
fn written_keys(call: &Call) -> Vec<Vec<u8>> {
    match call {
        Call::Set { key, .. } | Call::Script { key, .. } => vec![key.as_bytes().to_vec()],
        Call::Acquire { pipeline, .. } => {
            pipeline.cmd_iter().find_map(key_of).into_iter().collect()
        }
        Call::Keys {
            per_slot: Some(per_slot),
            ..
        } => per_slot
            .groups()
            .iter()
            .filter_map(|g| g.first().map(|&i| per_slot.keys[i].clone()))
            .collect(),
        Call::Keys { evalsha, .. } => key_of(evalsha).into_iter().collect(),
        // Releases do not wait (`replicas::waits`).
        Call::Release { .. } | Call::ReleaseMany { .. } => Vec::new(),
    }
}

/// `laddr=host:port` of a `CLIENT INFO` reply: the master's address as
/// this client reached it.
fn laddr(reply: &Value) -> Option<String> {
    let text = <String as redis::FromRedisValue>::from_redis_value_ref(reply).ok()?;
    text.split_whitespace()
        .find_map(|f| f.strip_prefix("laddr="))
        .map(str::to_owned)
}

impl Node {
    /// The `WAIT` (or `WAITAOF`, [`ReplicaAcks::command`]) of an acked write on a cluster
    /// node, on the master of every slot `call` wrote, all at once; the
    /// first slot short of acks fails the call, naming its master and slot.
    pub(super) async fn wait_slots(
        &self,
        call: &Call,
        acks: ReplicaAcks,
        wait_ms: u64,
        generation: u64,
        conn: &Conn,
    ) -> Result<(), NodeError> {
        let waits = written_keys(call).into_iter().map(|key| {
            let mut conn = conn.clone();
            async move {
                let slot = slot_of(&key);
                let marker = marker(&key)
                    .ok_or_else(|| NodeError::Protocol(format!("no marker key for slot {slot}")))?;
                #[cfg(feature = "test-hooks")]
                crate::hooks::before_marker(&key).await;
                let mut p = redis::pipe();
                p.cmd("SET").arg(&marker).arg("").arg("PX").arg(1);
                p.add_command(acks.command(wait_ms));
                p.cmd("CLIENT").arg("INFO");
                let replies = conn
                    .send_packed_commands(&p, 0, 3)
                    .await
                    .map_err(|e| super::replicas::wait_failed(&e))?;
                self.answered(generation);
                let mut replies = replies.into_iter().map(Value::extract_error);
                let mut next = || {
                    replies
                        .next()
                        .unwrap_or(Ok(Value::Nil))
                        .map_err(|e| super::replicas::wait_failed(&e))
                };
                let (_set, wait, info) = (next()?, next()?, next());
                let master = info.ok().as_ref().and_then(laddr);
                let shown = format!("{}, slot {slot}", master.as_deref().unwrap_or("?"));
                super::replicas::counted(acks, &wait, wait_ms, Some(shown))
            }
        });
        join_all(waits).await.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_markers_follow_the_cluster_hash_rule() {
        // `CLUSTER KEYSLOT` of these on Redis 7.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        for key in [
            &b"orders:42"[..],
            b"{orders%7B42%7D}",
            b"{orders:42}:redlock-waiters",
            b"\xfffence:{orders:42}",
        ] {
            let m = marker(key).unwrap();
            assert_eq!(
                slot_of(&m),
                slot_of(key),
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
        assert_eq!(marker(b"a}b"), None);
    }

    #[test]
    fn a_call_waits_on_each_slot_it_wrote() {
        let set = Call::acquire(&"k".into(), "t", 100);
        assert_eq!(written_keys(&set), vec![b"k".to_vec()]);
        let fence = Call::waiting_acquire("k2", "t", 100, Some(b"\xfffence:{k2}"), 50);
        let keys = written_keys(&fence);
        assert_eq!(keys.len(), 1);
        assert_eq!(slot_of(&keys[0]), slot_of(b"k2"));
        let batch = Call::keys_per_slot(
            &crate::node::EXTEND_BATCH,
            &[b"a", b"b", b"{a}:x"],
            &[b"t", b"1", b"t", b"1", b"t", b"1"],
            crate::node::Shape::ExtendBatch,
        );
        let mut slots: Vec<u16> = written_keys(&batch).iter().map(|k| slot_of(k)).collect();
        slots.sort_unstable();
        let mut want = vec![slot_of(b"a"), slot_of(b"b")];
        want.sort_unstable();
        assert_eq!(slots, want);
        assert!(written_keys(&Call::release("k".into(), "t".into())).is_empty());
    }

    #[test]
    fn the_master_is_read_from_client_info() {
        let info = Value::BulkString(b"id=3 addr=127.0.0.1:5 laddr=127.0.0.1:7000 fd=8".to_vec());
        assert_eq!(laddr(&info).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(laddr(&Value::Nil), None);
    }
}
