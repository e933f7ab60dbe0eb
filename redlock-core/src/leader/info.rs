//! The leader info key: who leads, in which term, written by the leader beside
//! its lock key, and how it is read back.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio_util::sync::CancellationToken;

use crate::fencing::FencingToken;
use crate::guard::LockHandle;
use crate::redlock::Redlock;

/// Writes the info (`KEYS[2]` := `ARGV[2]` for `ARGV[3]` ms) only while the
/// lock key (`KEYS[1]`) holds the leader's token `ARGV[1]`: a leader whose key
/// expired here, and perhaps went to the next leader, writes nothing.
const WRITE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
";

/// The info key of lock key `key`: the byte `0xFF`, `leader:`, then the
/// key's tag (never valid UTF-8, so never a lock key; in the lock key's
/// slot; see `fencing::fence_key` and `slots`).
pub(super) fn info_key(key: &str) -> Vec<u8> {
    const PREFIX: &[u8] = b"\xffleader:";
    let key = crate::slots::tagged(key);
    let mut k = Vec::with_capacity(PREFIX.len() + key.len());
    k.extend_from_slice(PREFIX);
    k.extend_from_slice(key.as_bytes());
    k
}

/// What the info key holds: `term fingerprint id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) term: FencingToken,
    pub(super) fingerprint: String,
    pub(super) id: String,
}

impl Record {
    fn encode(&self) -> String {
        format!("{} {} {}", self.term, self.fingerprint, self.id)
    }

    /// The record a node answered, if it is one.
    pub(super) fn decode(v: &Value) -> Option<Self> {
        let Value::BulkString(b) = v else {
            return None;
        };
        let text = std::str::from_utf8(b).ok()?;
        let mut parts = text.splitn(3, ' ');
        let term = FencingToken::new(parts.next()?.parse().ok()?);
        let fingerprint = parts.next()?.to_owned();
        let id = parts.next().unwrap_or_default().to_owned();
        Some(Self {
            term,
            fingerprint,
            id,
        })
    }
}

/// How long a record lives on the nodes, for a lock of `ttl`: ten TTLs
/// (at least a second); it is written again every half of that.
fn record_ttl(ttl: Duration) -> Duration {
    ttl.saturating_mul(10).max(Duration::from_secs(1))
}

/// Keeps the leader's record written until `stop` or the leadership's loss:
/// at once (again soon while fewer than a quorum of nodes took it), then
/// every half of its TTL.
pub(super) async fn keep_written(
    redlock: Redlock,
    key: Arc<str>,
    token: Arc<str>,
    record: Record,
    ttl: Duration,
    handle: LockHandle,
    stop: CancellationToken,
) {
    let life = record_ttl(ttl);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(WRITE_LUA)
        .arg(2)
        .arg(key.as_bytes())
        .arg(info_key(&key))
        .arg(&*token)
        .arg(record.encode())
        .arg(u64::try_from(life.as_millis()).unwrap_or(u64::MAX));
    let timeout = redlock.node_timeout();
    let retry = (ttl / 10).max(Duration::from_millis(10));
    loop {
        let written = futures_util::future::join_all(
            redlock
                .core
                .inner
                .nodes
                .iter()
                .map(|node| node.query(&cmd, timeout)),
        )
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Value::Int(1))))
        .count();
        let next = if written >= redlock.quorum() {
            life / 2
        } else {
            tracing::debug!(key = %key, written, "leader info: fewer than a quorum wrote it");
            retry
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = handle.lost() => return,
            () = tokio::time::sleep(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_keys_are_never_utf8() {
        let r = Record {
            term: FencingToken::new(42),
            fingerprint: "0011223344556677".into(),
            id: "web 3:4711".into(),
        };
        let v = Value::BulkString(r.encode().into_bytes());
        assert_eq!(Record::decode(&v), Some(r));
        assert_eq!(Record::decode(&Value::Nil), None);
        assert_eq!(Record::decode(&Value::BulkString(b"x y z".to_vec())), None);
        assert!(std::str::from_utf8(&info_key("a")).is_err());
        assert_eq!(
            record_ttl(Duration::from_millis(10)),
            Duration::from_secs(1)
        );
    }
}
