//! The scripts over the keys of several locks (batched renewal, and a
//! multi-resource lock's acquire, extend and release) on a cluster node: one
//! script per slot, all sent at once on the cluster connection (which
//! pipelines them to each master), their answers merged into the answer the
//! one script gives on a single server. A script never touches keys of two
//! slots (each resource's keys share one, `slots.rs`).
//!
//! A multi-resource lock counts on a cluster node only when every slot's
//! script set (or extended) its keys: a busy slot makes the node busy, a
//! failed one fails the node's call. The keys that other slots' scripts set
//! meanwhile hold the attempt's token and are released with the attempt's
//! other keys (the acquire releases every node of an attempt that failed),
//! or expire.

use std::collections::HashMap;

use futures_util::future::join_all;
use redis::Value;
use redis::cluster_routing::Slot;

use super::Node;
use super::cluster::Conn;
use super::many::SHARD_RELEASE_MANY;
use super::scripts::{Call, LuaScript, PerSlot, Shape, keys_cmds};
use crate::error::NodeError;
use crate::keys::Many;

impl Call {
    /// [`Call::keys`] over the keys of several locks, which a cluster node
    /// cuts by slot as `shape` says.
    pub(crate) fn keys_per_slot(
        script: &'static LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        shape: Shape,
    ) -> Self {
        let (evalsha, eval) = keys_cmds(script, keys, args);
        Call::Keys {
            evalsha,
            eval,
            per_slot: Some(Box::new(PerSlot {
                script,
                shape,
                keys: keys.iter().map(|k| k.to_vec()).collect(),
                args: args.iter().map(|a| a.to_vec()).collect(),
            })),
        }
    }
}

/// A multi-resource release as a cluster node runs it: one script per slot.
pub(super) fn release_many_per_slot(many: &Many, token: &str, db: i64) -> PerSlot {
    let keys = many.keys.iter().map(|k| k.as_bytes().to_vec()).collect();
    release_keys_per_slot(keys, token.as_bytes().to_vec(), db)
}

/// The multi-resource release of `keys` held with `token`, cut by slot.
pub(super) fn release_keys_per_slot(keys: Vec<Vec<u8>>, token: Vec<u8>, db: i64) -> PerSlot {
    PerSlot {
        script: &SHARD_RELEASE_MANY,
        shape: Shape::AnyOf,
        keys,
        args: vec![token, db.to_string().into_bytes()],
    }
}

impl PerSlot {
    /// The lock keys' indices grouped by slot, in key order within a group.
    pub(super) fn groups(&self) -> Vec<Vec<usize>> {
        let locks = match self.shape {
            Shape::AcquireMany { fenced: true } => self.keys.len() / 2,
            _ => self.keys.len(),
        };
        let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
        for (i, key) in self.keys.iter().take(locks).enumerate() {
            by_slot.entry(Slot::for_key(key)).or_default().push(i);
        }
        let mut groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        groups.sort_unstable();
        groups
    }

    /// The keys and arguments of the script over `group`'s keys.
    fn part(&self, group: &[usize]) -> (Vec<&[u8]>, Vec<Vec<u8>>) {
        let mut keys: Vec<&[u8]> = group.iter().map(|&i| self.keys[i].as_slice()).collect();
        let args = match self.shape {
            Shape::ExtendBatch => group
                .iter()
                .flat_map(|&i| {
                    let at = |j: usize| self.args.get(j).cloned().unwrap_or_default();
                    [at(2 * i), at(2 * i + 1)]
                })
                .collect(),
            Shape::AcquireMany { fenced } => {
                if fenced {
                    let n = self.keys.len() / 2;
                    keys.extend(group.iter().map(|&i| self.keys[n + i].as_slice()));
                }
                let mut args: Vec<Vec<u8>> = self.args.iter().take(2).cloned().collect();
                args.push(group.len().to_string().into_bytes());
                args
            }
            Shape::AllOf | Shape::AnyOf => self.args.clone(),
        };
        (keys, args)
    }
}

impl Node {
    /// `call` on a cluster node: one script per slot, the answers merged.
    pub(super) async fn run_per_slot(
        &self,
        generation: u64,
        conn: Conn,
        call: &PerSlot,
    ) -> Result<Value, NodeError> {
        let groups = call.groups();
        let replies = join_all(groups.iter().map(|group| {
            let (keys, args) = call.part(group);
            let (evalsha, eval) = keys_cmds(call.script, &keys, &args);
            let conn = conn.clone();
            async move { self.run_keys(generation, conn, &evalsha, &eval).await }
        }))
        .await;
        if let Shape::AcquireMany { .. } = call.shape {
            self.take_back(generation, &conn, call, &groups, &replies)
                .await;
        }
        merge(call.shape, call.keys.len(), &groups, replies)
    }

    /// A multi-resource acquire that found a slot busy: the slots whose
    /// script set their keys are released again, since the attempt's
    /// release skips a node that answered busy (it never stored the token,
    /// which on a cluster holds for the busy slot only). A release that
    /// fails leaves those keys to expire, as any lost release does.
    async fn take_back(
        &self,
        generation: u64,
        conn: &Conn,
        call: &PerSlot,
        groups: &[Vec<usize>],
        replies: &[Result<Value, NodeError>],
    ) {
        let first = |r: &Result<Value, NodeError>| match r {
            Ok(Value::Array(items)) => items.first().cloned(),
            _ => None,
        };
        if !replies.iter().any(|r| first(r) == Some(Value::Int(0))) {
            return;
        }
        let keys: Vec<Vec<u8>> = groups
            .iter()
            .zip(replies)
            .filter(|(_, r)| first(r) == Some(Value::Int(1)))
            .flat_map(|(g, _)| g.iter().map(|&i| call.keys[i].clone()))
            .collect();
        if keys.is_empty() {
            return;
        }
        let token = call.args.first().cloned().unwrap_or_default();
        let release = release_keys_per_slot(keys, token, self.db);
        let _ = Box::pin(self.run_per_slot(generation, conn.clone(), &release)).await;
    }
}

/// The one script's answer from the slots' answers.
fn merge(
    shape: Shape,
    keys: usize,
    groups: &[Vec<usize>],
    replies: Vec<Result<Value, NodeError>>,
) -> Result<Value, NodeError> {
    match shape {
        Shape::ExtendBatch => {
            let mut flags = vec![Value::Int(0); keys];
            let mut first_error = None;
            let mut any = false;
            for (group, reply) in groups.iter().zip(replies) {
                match reply {
                    Ok(Value::Array(items)) if items.len() == group.len() => {
                        any = true;
                        for (&i, v) in group.iter().zip(items) {
                            flags[i] = v;
                        }
                    }
                    Ok(other) => {
                        return Err(NodeError::Protocol(format!("batch reply {other:?}")));
                    }
                    Err(e) => first_error = first_error.or(Some(e)),
                }
            }
            match first_error {
                Some(e) if !any => Err(e),
                _ => Ok(Value::Array(flags)),
            }
        }
        Shape::AllOf | Shape::AnyOf => {
            let mut ones = 0;
            for reply in replies.iter() {
                match reply {
                    Ok(Value::Int(1)) => ones += 1,
                    Ok(Value::Int(_)) => {}
                    Ok(other) => return Err(NodeError::Protocol(format!("reply {other:?}"))),
                    Err(e) if matches!(shape, Shape::AllOf) => return Err(e.clone()),
                    Err(_) => {}
                }
            }
            let all = ones == replies.len();
            match shape {
                Shape::AllOf => Ok(Value::Int(i64::from(all))),
                _ if ones > 0 => Ok(Value::Int(1)),
                _ => replies
                    .into_iter()
                    .find_map(Result::err)
                    .map_or(Ok(Value::Int(0)), Err),
            }
        }
        Shape::AcquireMany { fenced } => merge_acquire(fenced, keys, groups, replies),
    }
}

/// `ACQUIRE_MANY_LUA`'s answer from the slots': the first busy key (by the
/// lock's key order) if any slot was busy, else `{1}`, or fenced
/// `{1, time, counters..}` with the latest `TIME` of the masters.
fn merge_acquire(
    fenced: bool,
    keys: usize,
    groups: &[Vec<usize>],
    replies: Vec<Result<Value, NodeError>>,
) -> Result<Value, NodeError> {
    let locks = if fenced { keys / 2 } else { keys };
    let mut busy: Option<(usize, Vec<Value>)> = None;
    let mut time: Option<((i64, i64), Value)> = None;
    let mut counters = vec![Value::Nil; locks];
    for (group, reply) in groups.iter().zip(replies) {
        let Value::Array(items) = reply? else {
            return Err(NodeError::Protocol("acquire reply not an array".into()));
        };
        match items.first() {
            Some(Value::Int(0)) => {
                let at = match items.get(1) {
                    Some(Value::Int(i)) => usize::try_from(*i).unwrap_or(0),
                    _ => 0,
                };
                let Some(&original) = at.checked_sub(1).and_then(|j| group.get(j)) else {
                    return Err(NodeError::Protocol(format!("acquire reply {items:?}")));
                };
                if busy.as_ref().is_none_or(|(b, _)| original < *b) {
                    let mut items = items;
                    items[1] = Value::Int(i64::try_from(original + 1).unwrap_or(i64::MAX));
                    busy = Some((original, items));
                }
            }
            Some(Value::Int(1)) if fenced => {
                let mut rest = items.into_iter().skip(1);
                let t = rest.next().unwrap_or(Value::Nil);
                let when = time_of(&t);
                if time.as_ref().is_none_or(|(w, _)| when > *w) {
                    time = Some((when, t));
                }
                for (&i, c) in group.iter().zip(rest) {
                    counters[i] = c;
                }
            }
            Some(Value::Int(1)) => {}
            _ => return Err(NodeError::Protocol(format!("acquire reply {items:?}"))),
        }
    }
    if let Some((_, items)) = busy {
        return Ok(Value::Array(items));
    }
    let mut out = vec![Value::Int(1)];
    if fenced {
        out.push(time.map_or(Value::Nil, |(_, t)| t));
        out.extend(counters);
    }
    Ok(Value::Array(out))
}

/// A `TIME` reply as (seconds, microseconds), for picking the latest.
fn time_of(v: &Value) -> (i64, i64) {
    let int = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        Some(Value::Int(i)) => *i,
        _ => 0,
    };
    match v {
        Value::Array(parts) => (int(parts.first()), int(parts.get(1))),
        _ => (0, 0),
    }
}
