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
//!
//! That holds while the master that ran the marker is the one that ran the
//! write. A failover between the write's answer and the marker sends the
//! marker to the promoted replica, whose replicas' acks say nothing of a
//! write it may never have had (issue 47, item 10;
//! `tests/models/tests/model_cluster_failover.rs`). So the pipeline also
//! asks `INFO replication` for the master's replication ID, which a
//! promoted replica (or a master restarted empty) takes fresh, and a slot's
//! acks count only if that ID is the one seen for the slot's master
//! *before* the write was sent: then no promotion came between the two. The
//! node keeps the ID last seen per slot ([`Replids`]); a slot it has none
//! for costs one round trip of its own before the write (`EXISTS marker`,
//! `INFO replication`), once, not per call. A changed ID fails the call on
//! this node ([`NodeError::MasterChanged`]) and is kept, so the next call
//! counts again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use futures_util::future::join_all;
use redis::Value;

use super::cluster::Conn;
use super::scripts::Call;
use super::{Node, ReplicaAcks};
use crate::error::NodeError;

/// The slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// A master's replication ID (`master_replid` in `INFO replication`, 40
/// characters): a replica promoted to master takes a fresh one, and so does
/// a master restarted without its data, so one master's ID seen at two
/// moments means no promotion of that slot's master came between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Replid([u8; 40]);

/// The replication ID last seen for each slot's master, on one cluster
/// node: at most one entry per slot, so at most 16384. The lock is never
/// held across an await.
#[derive(Debug, Default)]
pub(super) struct Replids(Mutex<HashMap<u16, Replid>>);

impl Replids {
    /// The ID last seen for `slot`'s master, if any.
    fn get(&self, slot: u16) -> Option<Replid> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&slot)
            .copied()
    }

    /// `replid` seen for `slot`'s master (only a cluster slot is kept).
    fn set(&self, slot: u16, replid: Replid) {
        if slot < SLOTS {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(slot, replid);
        }
    }
}

/// One slot an acked write writes, as known before the write is sent: a key
/// of it, its marker key, and the replication ID of its master then.
pub(super) struct Written {
    key: Vec<u8>,
    slot: u16,
    marker: Vec<u8>,
    before: Replid,
}

/// `master_replid` of an `INFO replication` reply.
fn master_replid(reply: &Value) -> Option<Replid> {
    let text = <String as redis::FromRedisValue>::from_redis_value_ref(reply).ok()?;
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("master_replid:"))?
        .trim();
    <[u8; 40]>::try_from(id.as_bytes()).ok().map(Replid)
}

/// Where a test may hold a write between its answer and its marker (the
/// `test-hooks` feature, `hooks.rs`); nothing without the feature.
async fn before_marker(_key: &[u8]) {
    #[cfg(feature = "test-hooks")]
    crate::hooks::before_marker(_key).await;
}

/// The error for an `INFO replication` reply without a replication ID.
fn no_replid(slot: u16, reply: &Value) -> NodeError {
    NodeError::Protocol(format!(
        "INFO replication of slot {slot}'s master named no master_replid: {reply:?}"
    ))
}

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
    /// Before an acked write on a cluster node: every slot `call` writes,
    /// with its marker key and its master's replication ID as last seen
    /// ([`Replids`]). A slot without one is asked for it first (`EXISTS
    /// marker`, `INFO replication`, pipelined to the slot's master), all
    /// such slots at once: one round trip, once per slot.
    pub(super) async fn slots_before(
        &self,
        call: &Call,
        generation: u64,
        conn: &Conn,
    ) -> Result<Vec<Written>, NodeError> {
        let slots = written_keys(call).into_iter().map(|key| {
            let slot = slot_of(&key);
            let marker = marker(&key)
                .ok_or_else(|| NodeError::Protocol(format!("no marker key for slot {slot}")))?;
            Ok((key, slot, marker, self.replids.get(slot)))
        });
        let slots: Vec<_> = slots.collect::<Result<_, NodeError>>()?;
        let fetches = slots.into_iter().map(|(key, slot, marker, known)| {
            let mut conn = conn.clone();
            async move {
                let before = match known {
                    Some(replid) => replid,
                    None => {
                        self.fetch_replid(slot, &marker, generation, &mut conn)
                            .await?
                    }
                };
                Ok(Written {
                    key,
                    slot,
                    marker,
                    before,
                })
            }
        });
        join_all(fetches).await.into_iter().collect()
    }

    /// The replication ID of `slot`'s master, asked for and kept: `INFO
    /// replication` pipelined behind `EXISTS` of the slot's `marker`, which
    /// routes it to the slot's master (a member that does not serve the
    /// slot refuses the `EXISTS`, and redis follows its redirect).
    async fn fetch_replid(
        &self,
        slot: u16,
        marker: &[u8],
        generation: u64,
        conn: &mut Conn,
    ) -> Result<Replid, NodeError> {
        let mut p = redis::pipe();
        p.cmd("EXISTS").arg(marker);
        p.cmd("INFO").arg("replication");
        let replies = conn
            .send_packed_commands(&p, 0, 2)
            .await
            .map_err(|e| NodeError::from_redis(&e))?;
        self.answered(generation);
        let mut replies = replies
            .into_iter()
            .map(|r| r.extract_error().map_err(|e| NodeError::from_redis(&e)));
        let mut next = || replies.next().unwrap_or(Ok(Value::Nil));
        let (_exists, info) = (next()?, next()?);
        let replid = master_replid(&info).ok_or_else(|| no_replid(slot, &info))?;
        self.replids.set(slot, replid);
        Ok(replid)
    }

    /// The `WAIT` (or `WAITAOF`, [`ReplicaAcks::command`]) of an acked write on a cluster
    /// node, on the master of every slot it wrote (`slots`, from
    /// [`Node::slots_before`]), all at once; the first slot whose master
    /// changed since before the write, or short of acks, fails the call,
    /// naming its master and slot.
    pub(super) async fn wait_slots(
        &self,
        slots: Vec<Written>,
        acks: ReplicaAcks,
        wait_ms: u64,
        generation: u64,
        conn: &Conn,
    ) -> Result<(), NodeError> {
        let waits = slots.into_iter().map(|written| {
            let mut conn = conn.clone();
            async move {
                let Written {
                    key,
                    slot,
                    marker,
                    before,
                } = written;
                before_marker(&key).await;
                let mut p = redis::pipe();
                p.cmd("SET").arg(&marker).arg("").arg("PX").arg(1);
                p.cmd("INFO").arg("replication");
                p.add_command(acks.command(wait_ms));
                p.cmd("CLIENT").arg("INFO");
                let replies = conn
                    .send_packed_commands(&p, 0, 4)
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
                let (_set, info, wait, client) = (next()?, next()?, next()?, next());
                let master = client.ok().as_ref().and_then(laddr);
                let now = master_replid(&info).ok_or_else(|| no_replid(slot, &info))?;
                // Kept whatever the verdict: the next call compares with it.
                self.replids.set(slot, now);
                if now != before {
                    return Err(NodeError::MasterChanged { slot, master });
                }
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
        let fence = Call::waiting_acquire("k2", "t", 100, Some(b"\xfffence:{k2}"), 50, None);
        let keys = written_keys(&fence);
        assert_eq!(keys.len(), 1);
        assert_eq!(slot_of(&keys[0]), slot_of(b"k2"));
        let batch = Call::keys_per_slot(
            &crate::node::BATCH,
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
    fn the_replid_is_read_from_info_replication_and_kept_per_slot() {
        let id = "8c05b41e0a73fb1e1a4c6a1f0e0b4c8a1d9b6c2e";
        let info = format!(
            "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
             master_failover_state:no-failover\r\nmaster_replid:{id}\r\n\
             master_replid2:0000000000000000000000000000000000000000\r\n"
        );
        let replid = master_replid(&Value::BulkString(info.into_bytes()));
        assert_eq!(replid.map(|r| r.0.to_vec()), Some(id.as_bytes().to_vec()));
        assert_eq!(master_replid(&Value::Nil), None);
        let short = Value::BulkString(b"master_replid:abc\r\n".to_vec());
        assert_eq!(master_replid(&short), None);
        let replids = Replids::default();
        let (a, b) = (Replid([b'a'; 40]), Replid([b'b'; 40]));
        assert_eq!(replids.get(866), None);
        replids.set(866, a);
        replids.set(866, b);
        replids.set(SLOTS, a);
        assert_eq!(replids.get(866), Some(b));
        assert_eq!(replids.get(SLOTS), None);
    }

    #[test]
    fn the_master_is_read_from_client_info() {
        let info = Value::BulkString(b"id=3 addr=127.0.0.1:5 laddr=127.0.0.1:7000 fd=8".to_vec());
        assert_eq!(laddr(&info).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(laddr(&Value::Nil), None);
    }
}
