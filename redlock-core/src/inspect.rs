//! *Layer 5, operations (see `lib.rs`).*
//!
//! An operator's look at one lock: who holds it on each node, and for how long
//! ([`Redlock::inspect`]), and the escape hatch for a holder that is gone
//! ([`Redlock::release_token`]).
//!
//! Inspection takes no lock and writes nothing. It never shows a token: a token
//! is a release capability (whoever knows it can delete the lock), so a holder
//! is named by a [`token_fingerprint`], the first 8 bytes of the token's
//! SHA-256, which the holder can compute too (`redlock run` gives it to its
//! child as `REDLOCK_TOKEN_FINGERPRINT`).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, NodeError};
use crate::fencing::fence_key;
use crate::protocol::redlock::Core;
use crate::protocol::release::Released;

/// One node's view of a lock key, read in one script so the parts agree.
const READ_LUA: &str = r"
local t = redis.call('TYPE', KEYS[1])
t = t['ok'] or t
local v = false
if t == 'string' then v = redis.call('GET', KEYS[1]) end
local c = false
local ct = redis.call('TYPE', KEYS[2])
if (ct['ok'] or ct) == 'string' then c = redis.call('GET', KEYS[2]) end
return {t, v, redis.call('PTTL', KEYS[1]), c}
";

/// The fingerprint of a token: the first 8 bytes of its SHA-256, in hex. It
/// names a holder without giving away the token (which can release the lock).
pub fn token_fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What one node holds at a lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// Whether the key exists.
    pub exists: bool,
    /// The holder's [`token_fingerprint`], when the key holds a string.
    pub holder: Option<String>,
    /// The Redis type of the value when it is not a string (another
    /// application's key: no Redlock client can take it).
    pub foreign_type: Option<String>,
    /// The key's time to live; `None` when the key is absent or has no expiry.
    pub pttl: Option<Duration>,
    /// The resource's fencing counter on this node, if it has one.
    pub fencing_counter: Option<u64>,
}

/// One node's answer to an inspection: of a lock key by default, of a
/// read/write lock's keys ([`RwState`](crate::RwState)) for
/// [`Redlock::inspect_rw`](crate::Redlock::inspect_rw).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeView<S = KeyState> {
    /// The node's label (its address, never its password).
    pub node: Arc<str>,
    /// What it holds, or why it did not say.
    pub state: Result<S, NodeError>,
}

/// The inspection's verdict on a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// No holder can have a quorum: enough nodes answered that the key is absent.
    Free,
    /// One holder's token is on a quorum of nodes and no other value is anywhere.
    Held {
        /// The holder's [`token_fingerprint`].
        holder: String,
        /// How many nodes hold its token.
        nodes: usize,
        /// The time to live left on a quorum of them (the quorum-th longest
        /// PTTL): an upper bound on the holder's validity, as the nodes see it.
        validity: Duration,
    },
    /// Different holders, a holder on fewer nodes than a quorum (a failed
    /// attempt's leftovers, a key expiring, or a release half done), or a
    /// foreign value.
    Inconsistent {
        /// Why, in words.
        reason: String,
    },
    /// Too few nodes answered to tell.
    Unknown {
        /// How many nodes answered.
        answered: usize,
    },
}

/// What [`Redlock::inspect`](crate::Redlock::inspect) found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Inspection {
    /// The resource.
    pub resource: String,
    /// Its Redis key.
    pub key: String,
    /// The quorum the handle uses.
    pub quorum: usize,
    /// Each node's answer, in the handle's node order.
    pub nodes: Vec<NodeView>,
    /// The verdict.
    pub verdict: Verdict,
}

impl Core {
    /// [`Redlock::inspect`].
    pub(crate) async fn inspect(&self, resource: &str) -> Result<Inspection, Error> {
        self.check_resource(resource)?;
        Ok(self.inspect_key(resource, self.key_for(resource)).await)
    }

    /// [`Redlock::inspect`] of `key`, a key held as a lock (the resource's
    /// lock key, or a permit slot's).
    pub(crate) async fn inspect_key(&self, resource: &str, key: String) -> Inspection {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ_LUA)
            .arg(2)
            .arg(key.as_bytes())
            .arg(fence_key(&key));
        let nodes = self.read_nodes(&cmd, parse_view).await;
        let verdict = judge(&nodes, self.inner.quorum);
        Inspection {
            resource: resource.to_owned(),
            key,
            quorum: self.inner.quorum,
            nodes,
            verdict,
        }
    }

    /// Sends the read-only `cmd` to every node at once (each bounded by the
    /// node timeout, at least 500 ms) and parses each answer with `parse`.
    pub(crate) async fn read_nodes<T>(
        &self,
        cmd: &redis::Cmd,
        parse: fn(Value) -> Option<T>,
    ) -> Vec<NodeView<T>> {
        let timeout = self.node_timeout().max(Duration::from_millis(500));
        futures_util::future::join_all(self.inner.nodes.iter().map(|node| async move {
            let state = node
                .query(cmd, timeout)
                .await
                .and_then(|v| parse(v).ok_or_else(unexpected));
            NodeView {
                node: Arc::clone(&node.label),
                state,
            }
        }))
        .await
    }

    /// [`Redlock::release_everywhere`].
    pub(crate) async fn release_everywhere(
        &self,
        handle: &crate::LockHandle,
    ) -> Result<Released, Error> {
        let key = crate::keys::Keys::One(handle.key().into());
        let token: Arc<str> = handle.token().into();
        self.release_everywhere_key(handle.resource(), &key, &token)
            .await
    }

    /// [`Redlock::release_token`].
    pub(crate) async fn release_token(
        &self,
        resource: &str,
        token: &str,
    ) -> Result<Released, Error> {
        self.check_resource(resource)?;
        let key = crate::keys::Keys::One(self.key_for(resource).into());
        let token: Arc<str> = token.into();
        self.release_everywhere_key(resource, &key, &token).await
    }

    /// Compare-and-delete of `key` with `token` on every node, each waited
    /// for (or its timeout).
    async fn release_everywhere_key(
        &self,
        resource: &str,
        key: &crate::keys::Keys,
        token: &Arc<str>,
    ) -> Result<Released, Error> {
        let settled = self.unlock_all(key, token, None, None).await;
        let failed = settled
            .iter()
            .flatten()
            .filter(|s| s.result.is_err())
            .count();
        let released = self.released(settled);
        if self.inner.nodes.len() - failed < self.inner.quorum {
            return Err(Error::ReleaseIncomplete {
                resource: resource.into(),
                deleted: released.deleted,
                report: released.report(),
            });
        }
        Ok(released)
    }
}

fn unexpected() -> NodeError {
    NodeError::Server {
        code: "UNEXPECTED".into(),
        message: "the inspection script answered in an unexpected shape".into(),
    }
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// `{type, value|nil, pttl, counter|nil}` into a [`KeyState`].
fn parse_view(v: Value) -> Option<KeyState> {
    let Value::Array(items) = v else {
        return None;
    };
    parse_key_state(&items)
}

/// The first four items of a node's answer, `{type, value|nil, pttl,
/// counter|nil}`, into a [`KeyState`].
pub(crate) fn parse_key_state(items: &[Value]) -> Option<KeyState> {
    let [kind, value, pttl, counter, ..] = items else {
        return None;
    };
    let kind = text(kind)?;
    let pttl = match pttl {
        Value::Int(ms) if *ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        Value::Int(_) => None,
        _ => return None,
    };
    let exists = kind != "none";
    let holder = text(value).map(|t| token_fingerprint(&t));
    let foreign_type = (exists && kind != "string").then_some(kind);
    let fencing_counter = text(counter).and_then(|c| c.parse().ok());
    Some(KeyState {
        exists,
        holder,
        foreign_type,
        pttl,
        fencing_counter,
    })
}

/// The verdict over every node's answer, for a handle whose quorum is `quorum`.
pub(crate) fn judge(nodes: &[NodeView], quorum: usize) -> Verdict {
    let n = nodes.len();
    let states: Vec<&KeyState> = nodes.iter().filter_map(|v| v.state.as_ref().ok()).collect();
    let answered = states.len();
    if let Some(foreign) = states.iter().find_map(|s| s.foreign_type.as_deref()) {
        return Verdict::Inconsistent {
            reason: format!("a node holds a foreign {foreign} value at the key"),
        };
    }
    let mut holders: Vec<(&str, Vec<Option<Duration>>)> = Vec::new();
    for s in &states {
        if let Some(h) = s.holder.as_deref() {
            match holders.iter_mut().find(|(k, _)| *k == h) {
                Some((_, pttls)) => pttls.push(s.pttl),
                None => holders.push((h, vec![s.pttl])),
            }
        }
    }
    let absent = states.iter().filter(|s| !s.exists).count();
    match holders.as_slice() {
        [] if absent > n.saturating_sub(quorum) => Verdict::Free,
        [] => Verdict::Unknown { answered },
        [(holder, pttls)] if pttls.len() >= quorum => {
            let mut left: Vec<Duration> =
                pttls.iter().map(|p| p.unwrap_or(Duration::MAX)).collect();
            left.sort_unstable_by(|a, b| b.cmp(a));
            Verdict::Held {
                holder: (*holder).to_owned(),
                nodes: pttls.len(),
                validity: left
                    .get(quorum.saturating_sub(1))
                    .copied()
                    .unwrap_or_default(),
            }
        }
        // The holder may have a quorum among the nodes that did not answer.
        [(_, pttls)] if pttls.len() + (n - answered) >= quorum => Verdict::Unknown { answered },
        [(holder, pttls)] => Verdict::Inconsistent {
            reason: format!(
                "holder {holder} is on {} node(s), fewer than the quorum of {quorum}",
                pttls.len()
            ),
        },
        many => Verdict::Inconsistent {
            reason: format!(
                "{} different holders: {}",
                many.len(),
                many.iter()
                    .map(|(h, p)| format!("{h} on {} node(s)", p.len()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(holder: Option<&str>, pttl_ms: u64) -> NodeView {
        NodeView {
            node: "n".into(),
            state: Ok(KeyState {
                exists: holder.is_some(),
                holder: holder.map(str::to_owned),
                foreign_type: None,
                pttl: holder.map(|_| Duration::from_millis(pttl_ms)),
                fencing_counter: None,
            }),
        }
    }

    fn down() -> NodeView {
        NodeView {
            node: "n".into(),
            state: Err(NodeError::Timeout(Duration::from_millis(50))),
        }
    }

    #[test]
    fn verdicts() {
        assert_eq!(
            judge(&[view(None, 0), view(None, 0), down()], 2),
            Verdict::Free
        );
        assert_eq!(
            judge(&[view(None, 0), down(), down()], 2),
            Verdict::Unknown { answered: 1 }
        );
        assert_eq!(
            judge(
                &[
                    view(Some("a"), 900),
                    view(Some("a"), 1000),
                    view(Some("a"), 800)
                ],
                2
            ),
            Verdict::Held {
                holder: "a".into(),
                nodes: 3,
                validity: Duration::from_millis(900)
            }
        );
        assert!(matches!(
            judge(&[view(Some("a"), 900), view(None, 0), view(None, 0)], 2),
            Verdict::Inconsistent { .. }
        ));
        assert!(matches!(
            judge(
                &[view(Some("a"), 900), view(Some("b"), 900), view(None, 0)],
                2
            ),
            Verdict::Inconsistent { .. }
        ));
        assert_eq!(
            judge(&[view(Some("a"), 900), down(), down()], 2),
            Verdict::Unknown { answered: 1 }
        );
    }

    #[test]
    fn fingerprints_are_stable_and_short() {
        let f = token_fingerprint("0123456789abcdef0123456789abcdef");
        assert_eq!(f.len(), 16);
        assert_eq!(f, token_fingerprint("0123456789abcdef0123456789abcdef"));
        assert_ne!(f, token_fingerprint("0123456789abcdef0123456789abcdee"));
    }
}
