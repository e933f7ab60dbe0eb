//! An operator's look at a read/write lock ([`Redlock::inspect_rw`]): on
//! each node, in one script so the parts agree, the writer key (as
//! [`Redlock::inspect`] reads a mutex's), how many readers hold a share and
//! the longest share's PTTL, a waiting writer's intent, and the turns
//! (issue 48): the readers owed or marked behind a writer, and an open read
//! phase. Reads only.

use std::time::Duration;

use redis::Value;

use super::Names;
use crate::error::Error;
use crate::fencing::fence_key;
use crate::inspect::{KeyState, NodeView, Verdict, judge, parse_key_state};
use crate::protocol::redlock::Core;

/// One node's view of a read/write lock: the writer key (`KEYS[1]`) and its
/// fence counter (`KEYS[2]`) as `inspect`'s script reads them, the intent's
/// PTTL (`KEYS[3]`), and the live readers listed in the index (`KEYS[4]`)
/// with the longest PTTL among them (-1: one has no expiry), then the turns:
/// how many readers the waiting hash (`KEYS[5]`) marks, and how many the
/// read phase (`KEYS[6]`) still admits with its PTTL. Reader keys are in the
/// writer key's slot (`slots`).
const READ_RW_LUA: &str = r"
local t = redis.call('TYPE', KEYS[1])
t = t['ok'] or t
local v = false
if t == 'string' then v = redis.call('GET', KEYS[1]) end
local c = false
local ct = redis.call('TYPE', KEYS[2])
if (ct['ok'] or ct) == 'string' then c = redis.call('GET', KEYS[2]) end
local readers, longest = 0, -2
local it = redis.call('TYPE', KEYS[4])
if (it['ok'] or it) == 'set' then
  for _, r in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    local p = redis.call('PTTL', r)
    if p == -1 then
      readers = readers + 1
      longest = -1
    elseif p >= 0 then
      readers = readers + 1
      if longest ~= -1 and p > longest then longest = p end
    end
  end
end
local function count(k)
  local kt = redis.call('TYPE', k)
  if (kt['ok'] or kt) == 'hash' then return redis.call('HLEN', k) end
  return 0
end
return {t, v, redis.call('PTTL', KEYS[1]), c, redis.call('PTTL', KEYS[3]), readers, longest,
  count(KEYS[5]), count(KEYS[6]), redis.call('PTTL', KEYS[6])}
";

/// What one node holds for a read/write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwState {
    /// The writer key: the writer's [`token_fingerprint`](crate::token_fingerprint)
    /// and PTTL, and the fencing counter.
    pub writer: KeyState,
    /// How many readers hold a share on this node (listed and not expired).
    pub readers: usize,
    /// The longest PTTL among them ([`Duration::MAX`] for a key without
    /// expiry); `None` without readers.
    pub readers_pttl: Option<Duration>,
    /// The PTTL of a refused writer's intent, which keeps new readers out
    /// ([`Duration::MAX`] without expiry); `None` when no writer waits here.
    pub intent_pttl: Option<Duration>,
    /// How many refused readers that will try again are marked here: owed
    /// the next read phase, or waiting behind the writer whose intent
    /// refused them.
    pub readers_waiting: usize,
    /// How many readers the open read phase still admits (those that have
    /// not held yet); 0 when no phase is open.
    pub phase_readers: usize,
    /// The open read phase's PTTL (no writer is admitted while it is open);
    /// `None` when no phase is open.
    pub phase_pttl: Option<Duration>,
}

/// The inspection's verdict on a read/write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RwVerdict {
    /// No writer and no reader can hold a quorum.
    Free,
    /// A writer holds the write lock on a quorum and no node lists a reader.
    Written {
        /// The writer's [`token_fingerprint`](crate::token_fingerprint).
        holder: String,
        /// How many nodes hold its token.
        nodes: usize,
        /// The time to live left on a quorum of them.
        validity: Duration,
    },
    /// Readers hold shares on a quorum of nodes and no writer is anywhere.
    Read {
        /// The readers on a quorum: each of a quorum of nodes lists at least
        /// this many.
        readers: usize,
        /// How many nodes list readers.
        nodes: usize,
    },
    /// A writer and readers both in sight, or a writer key that the mutex's
    /// verdict finds inconsistent.
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

/// What [`Redlock::inspect_rw`](crate::Redlock::inspect_rw) found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RwInspection {
    /// The resource.
    pub resource: String,
    /// Its lock key (the writer key).
    pub key: String,
    /// The quorum the handle uses.
    pub quorum: usize,
    /// Each node's answer, in the handle's node order.
    pub nodes: Vec<NodeView<RwState>>,
    /// How many nodes hold a waiting writer's intent (new readers are
    /// refused there).
    pub writer_waiting: usize,
    /// How many nodes have a read phase open (writers are refused there
    /// until the readers it admits have held, or it expires).
    pub read_phase_open: usize,
    /// The verdict.
    pub verdict: RwVerdict,
}

impl Core {
    /// [`Redlock::inspect_rw`](crate::Redlock::inspect_rw).
    pub(crate) async fn inspect_rw(&self, resource: &str) -> Result<RwInspection, Error> {
        self.check_resource(resource)?;
        let names = Names::new(self.key_for(resource));
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ_RW_LUA)
            .arg(6)
            .arg(names.writer.as_bytes())
            .arg(fence_key(&names.writer))
            .arg(names.intent.as_bytes())
            .arg(names.index.as_bytes())
            .arg(names.waiting.as_bytes())
            .arg(names.phase.as_bytes());
        let nodes = self.read_nodes(&cmd, parse_rw).await;
        let writer_waiting = nodes
            .iter()
            .filter(|v| v.state.as_ref().is_ok_and(|s| s.intent_pttl.is_some()))
            .count();
        let read_phase_open = nodes
            .iter()
            .filter(|v| v.state.as_ref().is_ok_and(|s| s.phase_pttl.is_some()))
            .count();
        let verdict = judge_rw(&nodes, self.inner.quorum);
        Ok(RwInspection {
            resource: resource.to_owned(),
            key: names.writer.to_string(),
            quorum: self.inner.quorum,
            nodes,
            writer_waiting,
            read_phase_open,
            verdict,
        })
    }
}

/// A PTTL answer: `None` for an absent key (-2), [`Duration::MAX`] for one
/// without expiry (-1).
fn pttl(v: &Value) -> Option<Option<Duration>> {
    match v {
        Value::Int(-1) => Some(Some(Duration::MAX)),
        Value::Int(ms) if *ms >= 0 => Some(Some(Duration::from_millis(ms.unsigned_abs()))),
        Value::Int(_) => Some(None),
        _ => None,
    }
}

fn parse_rw(v: Value) -> Option<RwState> {
    let Value::Array(items) = v else {
        return None;
    };
    let writer = parse_key_state(&items)?;
    let [
        _,
        _,
        _,
        _,
        intent,
        readers,
        longest,
        waiting,
        phase,
        phase_pttl,
    ] = items.as_slice()
    else {
        return None;
    };
    let count = |v: &Value| match v {
        Value::Int(n) => usize::try_from(*n).ok(),
        _ => None,
    };
    let readers = count(readers)?;
    Some(RwState {
        writer,
        readers,
        readers_pttl: pttl(longest)?.filter(|_| readers > 0),
        intent_pttl: pttl(intent)?,
        readers_waiting: count(waiting)?,
        phase_readers: count(phase)?,
        phase_pttl: pttl(phase_pttl)?,
    })
}

/// The verdict over every node's answer: the writer key's by the mutex's
/// rules, then the readers'.
fn judge_rw(nodes: &[NodeView<RwState>], quorum: usize) -> RwVerdict {
    let n = nodes.len();
    let writers: Vec<NodeView> = nodes
        .iter()
        .map(|v| NodeView {
            node: v.node.clone(),
            state: v
                .state
                .as_ref()
                .map(|s| s.writer.clone())
                .map_err(Clone::clone),
        })
        .collect();
    let states: Vec<&RwState> = nodes.iter().filter_map(|v| v.state.as_ref().ok()).collect();
    let answered = states.len();
    let reading = states.iter().filter(|s| s.readers > 0).count();
    match judge(&writers, quorum) {
        Verdict::Held {
            holder,
            nodes,
            validity,
        } if reading == 0 => RwVerdict::Written {
            holder,
            nodes,
            validity,
        },
        Verdict::Held { holder, .. } => RwVerdict::Inconsistent {
            reason: format!("writer {holder} holds a quorum, and {reading} node(s) list readers"),
        },
        Verdict::Free => {
            let empty = states
                .iter()
                .filter(|s| !s.writer.exists && s.readers == 0)
                .count();
            if empty > n.saturating_sub(quorum) {
                return RwVerdict::Free;
            }
            if reading >= quorum {
                let mut counts: Vec<usize> = states.iter().map(|s| s.readers).collect();
                counts.sort_unstable_by(|a, b| b.cmp(a));
                return RwVerdict::Read {
                    readers: counts.get(quorum.saturating_sub(1)).copied().unwrap_or(0),
                    nodes: reading,
                };
            }
            RwVerdict::Unknown { answered }
        }
        Verdict::Inconsistent { reason } => RwVerdict::Inconsistent { reason },
        _ => RwVerdict::Unknown { answered },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NodeError;

    fn node(writer: Option<&str>, readers: usize) -> NodeView<RwState> {
        NodeView {
            node: "n".into(),
            state: Ok(RwState {
                writer: KeyState {
                    exists: writer.is_some(),
                    holder: writer.map(str::to_owned),
                    foreign_type: None,
                    pttl: writer.map(|_| Duration::from_millis(900)),
                    fencing_counter: None,
                },
                readers,
                readers_pttl: (readers > 0).then_some(Duration::from_millis(900)),
                intent_pttl: None,
                readers_waiting: 0,
                phase_readers: 0,
                phase_pttl: None,
            }),
        }
    }

    fn down() -> NodeView<RwState> {
        NodeView {
            node: "n".into(),
            state: Err(NodeError::Timeout(Duration::from_millis(50))),
        }
    }

    /// The turns' fields: marked readers, an open phase's readers and PTTL,
    /// and no phase (-2).
    #[test]
    fn parses_the_turns() {
        let reply = |phase: i64, phase_pttl: i64| {
            Value::Array(vec![
                Value::SimpleString("none".into()),
                Value::Nil,
                Value::Int(-2),
                Value::Nil,
                Value::Int(700),
                Value::Int(0),
                Value::Int(-2),
                Value::Int(3),
                Value::Int(phase),
                Value::Int(phase_pttl),
            ])
        };
        let s = parse_rw(reply(2, 450)).unwrap();
        assert_eq!(s.readers_waiting, 3);
        assert_eq!(s.phase_readers, 2);
        assert_eq!(s.phase_pttl, Some(Duration::from_millis(450)));
        assert_eq!(s.intent_pttl, Some(Duration::from_millis(700)));
        let s = parse_rw(reply(0, -2)).unwrap();
        assert_eq!((s.phase_readers, s.phase_pttl), (0, None));
        // A reply of the old, shorter shape is refused, not misread.
        let Value::Array(mut short) = reply(0, -2) else {
            unreachable!()
        };
        short.truncate(7);
        assert_eq!(parse_rw(Value::Array(short)), None);
    }

    #[test]
    fn verdicts() {
        let free = [node(None, 0), node(None, 0), node(None, 1)];
        assert_eq!(judge_rw(&free, 2), RwVerdict::Free);
        let read = [node(None, 2), node(None, 3), node(None, 1)];
        assert_eq!(
            judge_rw(&read, 2),
            RwVerdict::Read {
                readers: 2,
                nodes: 3
            }
        );
        let written = [node(Some("w"), 0), node(Some("w"), 0), node(None, 0)];
        assert!(matches!(
            judge_rw(&written, 2),
            RwVerdict::Written { nodes: 2, .. }
        ));
        let both = [node(Some("w"), 0), node(Some("w"), 0), node(None, 1)];
        assert!(matches!(judge_rw(&both, 2), RwVerdict::Inconsistent { .. }));
        let unsure = [node(None, 1), down(), down()];
        assert_eq!(judge_rw(&unsure, 2), RwVerdict::Unknown { answered: 1 });
    }
}
