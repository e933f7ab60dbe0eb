//! Reading the nodes' replies: the acquire pipeline's (busy, acquired, with
//! what a fenced acquire read) and the scripts' flags.

use redis::Value;

use crate::error::NodeError;
use crate::fencing::{FenceRead, bad_read};

/// The acquire script's answer on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// `fence`: what a fenced acquire read (fencing step 1); `None` unfenced.
    Acquired {
        fence: Option<FenceRead>,
    },
    /// A multi-resource lock set every key; `fences`: what a fenced acquire
    /// read, one per key in key order.
    AcquiredMany {
        fences: Option<std::sync::Arc<[FenceRead]>>,
    },
    Busy {
        pttl_ms: i64,
    },
}

impl AcquireReply {
    /// Whether the node stored the token (every key of a multi-resource lock).
    pub(crate) fn acquired(&self) -> bool {
        !matches!(self, AcquireReply::Busy { .. })
    }

    /// What a fenced acquire read for the lock's key number `i` (0 for a
    /// single-resource lock).
    pub(crate) fn fence_read(&self, i: usize) -> Option<FenceRead> {
        match self {
            AcquireReply::Acquired { fence } if i == 0 => *fence,
            AcquireReply::AcquiredMany { fences: Some(f) } => f.get(i).copied(),
            _ => None,
        }
    }
}

/// Reads `ACQUIRE_MANY_LUA`'s answer: `{1}`, `{1, time, counters..}` (fenced),
/// or `{0, i, pttl, type}` for a key found. A key of a foreign type is the
/// node's `WrongType`, as for one key. A fenced answer must carry one
/// readable counter per key (`keys`) when the keys were set, or the node
/// counts as failed (and is released).
pub(crate) fn parse_acquire_many(v: Value) -> Result<AcquireReply, NodeError> {
    let Value::Array(mut items) = v else {
        return Err(NodeError::Protocol(format!("acquire reply {v:?}")));
    };
    let rest = items.split_off(items.len().min(1));
    match items.pop() {
        Some(Value::Int(1)) => {
            let mut rest = rest.into_iter();
            let Some(time) = rest.next() else {
                return Ok(AcquireReply::AcquiredMany { fences: None });
            };
            let time_us = parse_time_us(time)?;
            let fences = rest
                .map(|c| {
                    Ok(FenceRead {
                        counter: parse_counter(c)?,
                        time_us,
                    })
                })
                .collect::<Result<Vec<_>, NodeError>>()?;
            if fences.is_empty() {
                return Err(NodeError::Protocol(
                    "fenced acquire without counters".into(),
                ));
            }
            Ok(AcquireReply::AcquiredMany {
                fences: Some(fences.into()),
            })
        }
        Some(Value::Int(0)) => {
            let (pttl_ms, ty) = match rest.as_slice() {
                [_, Value::Int(p), Value::BulkString(t)] => (*p, String::from_utf8_lossy(t)),
                [_, Value::Int(p), Value::SimpleString(t)] => (*p, t.as_str().into()),
                other => return Err(NodeError::Protocol(format!("acquire refusal {other:?}"))),
            };
            if let Some(theirs) = ty.strip_prefix("redlock-permits:") {
                return Err(NodeError::PermitsMismatch {
                    found: theirs.to_owned(),
                });
            }
            match &*ty {
                "string" => Ok(AcquireReply::Busy { pttl_ms }),
                other => Err(NodeError::WrongType {
                    found: other.to_owned(),
                    pttl_ms,
                }),
            }
        }
        other => Err(NodeError::Protocol(format!("acquire reply {other:?}"))),
    }
}

/// Judges the acquire by its `SET` reply (an unfenced acquire's `SET` comes
/// alone when it said OK, with the probe's `PTTL` and `TYPE` when it refused): `OK` is acquired whatever
/// `PTTL` and `TYPE` said (the key is set; a user not allowed those commands
/// must still be able to lock), an error is the node's error, and nil is busy.
/// Only then do `PTTL` and `TYPE` describe the holder; a refused one leaves that
/// part unknown. A fenced acquire's two more replies (counter and `TIME`) must
/// be readable when `SET` said OK: a token picked without them could be too
/// small, so the node then counts as failed (and is released).
pub(crate) fn parse_acquire(v: Value) -> Result<AcquireReply, NodeError> {
    let mut items = match v {
        // An unfenced acquire's `SET` alone, and a refusal whose probe failed.
        Value::Okay => return Ok(AcquireReply::Acquired { fence: None }),
        Value::SimpleString(s) if s == "OK" => return Ok(AcquireReply::Acquired { fence: None }),
        Value::Array(items) if items.len() == 1 && items[0] == Value::Nil => {
            return Ok(AcquireReply::Busy { pttl_ms: -2 });
        }
        Value::Array(items) => items,
        v => return Err(NodeError::Protocol(format!("acquire reply {v:?}"))),
    };
    let fenced = match items.len() {
        5 => items.split_off(3),
        _ => Vec::new(),
    };
    let [set, pttl, ty] = <[Value; 3]>::try_from(items)
        .map_err(|items| NodeError::Protocol(format!("acquire reply of {} items", items.len())))?;
    let acquired = || -> Result<AcquireReply, NodeError> {
        let fence = match <[Value; 2]>::try_from(fenced) {
            Ok([counter, time]) => Some(FenceRead {
                counter: parse_counter(counter)?,
                time_us: parse_time_us(time)?,
            }),
            Err(_) => None,
        };
        Ok(AcquireReply::Acquired { fence })
    };
    match set {
        Value::Okay => return acquired(),
        Value::SimpleString(s) if s == "OK" => return acquired(),
        Value::Nil => {}
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.into())),
        other => return Err(NodeError::Protocol(format!("SET reply {other:?}"))),
    }
    let pttl_ms = match pttl {
        Value::Int(p) => Some(p),
        Value::ServerError(_) => None,
        other => return Err(NodeError::Protocol(format!("PTTL reply {other:?}"))),
    };
    let ty = match &ty {
        Value::SimpleString(s) => Some(s.as_str()),
        Value::Okay => Some("ok"),
        Value::ServerError(_) => None,
        other => return Err(NodeError::Protocol(format!("TYPE reply {other:?}"))),
    };
    // -2 is what `PTTL` says of a missing key; it maps to "no known PTTL".
    let pttl_ms = pttl_ms.unwrap_or(-2);
    match ty {
        // An unknown type is most likely our kind of holder: SET NX refused
        // because the key exists.
        Some("string") | None => Ok(AcquireReply::Busy { pttl_ms }),
        // The holder's key expired between `SET` and `TYPE`: free now.
        Some("none") => Ok(AcquireReply::Busy { pttl_ms: 0 }),
        Some(other) => Err(NodeError::WrongType {
            found: other.to_owned(),
            pttl_ms,
        }),
    }
}

/// A fence counter as `GET` returns it: none yet is 0. `u64::MAX` is refused,
/// so that `max + 1` can never overflow.
fn parse_counter(v: Value) -> Result<u64, NodeError> {
    let n = match &v {
        Value::Nil => return Ok(0),
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.clone().into())),
        _ => None,
    };
    n.filter(|&n| n < u64::MAX)
        .ok_or_else(|| bad_read("fence counter", &v))
}

/// The node's `TIME` (seconds, microseconds) in microseconds since the epoch.
fn parse_time_us(v: Value) -> Result<u64, NodeError> {
    let part = |p: &Value| -> Option<u64> {
        match p {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::SimpleString(s) => s.parse().ok(),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    };
    let us = match &v {
        Value::Array(parts) => match parts.as_slice() {
            [secs, micros] => part(secs)
                .zip(part(micros))
                .and_then(|(s, m)| s.checked_mul(1_000_000)?.checked_add(m)),
            _ => None,
        },
        Value::ServerError(e) => return Err(NodeError::from_redis(&e.clone().into())),
        _ => None,
    };
    us.filter(|&us| us < u64::MAX)
        .ok_or_else(|| bad_read("TIME", &v))
}

/// One node's answer to a release (`RELEASE_LUA` and its forms, the
/// quiet and multi-key releases, a native compare-and-delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// The key did not hold the token (expired, or never set there).
    NotHeld,
    /// The key was deleted; `heard`: how many subscribers of the resource's
    /// channel the announcement reached on this node (0 when nothing was
    /// announced: no waiters flag, a script that does not count, or a
    /// `PUBLISH` refused).
    Deleted { heard: u64 },
}

impl ReleaseReply {
    /// Whether the node deleted the key.
    pub(crate) fn deleted(self) -> bool {
        matches!(self, Self::Deleted { .. })
    }
}

/// A release's answer: 0 (token not there), else 1 plus the number of
/// subscribers its announcement reached (`RELEASE_LUA`); the scripts that do
/// not count answer 1.
pub(crate) fn parse_release(v: Value) -> Result<ReleaseReply, NodeError> {
    match v {
        Value::Int(0) => Ok(ReleaseReply::NotHeld),
        Value::Int(n) if n >= 1 => Ok(ReleaseReply::Deleted {
            heard: n.abs_diff(1),
        }),
        other => Err(NodeError::Protocol(format!("release reply {other:?}"))),
    }
}

/// The extend scripts (and the fence's) answer 1 (done) or 0 (token not
/// there).
pub(crate) fn parse_flag(v: Value) -> Result<bool, NodeError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(NodeError::Protocol(format!("script reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_answer_counts_who_heard_it() {
        assert_eq!(parse_release(Value::Int(0)), Ok(ReleaseReply::NotHeld));
        assert_eq!(
            parse_release(Value::Int(1)),
            Ok(ReleaseReply::Deleted { heard: 0 })
        );
        assert_eq!(
            parse_release(Value::Int(4)),
            Ok(ReleaseReply::Deleted { heard: 3 })
        );
        assert_eq!(
            parse_release(Value::Int(i64::MAX)),
            Ok(ReleaseReply::Deleted {
                heard: i64::MAX.unsigned_abs() - 1
            })
        );
        for bad in [
            Value::Int(-1),
            Value::Int(i64::MIN),
            Value::Okay,
            Value::Nil,
        ] {
            assert!(parse_release(bad).is_err());
        }
        // Extend still answers 1 or 0 only.
        assert!(parse_flag(Value::Int(2)).is_err());
    }

    #[test]
    fn parses_busy_and_foreign_types() {
        let reply = |set: Value, pttl: i64, ty: &str| {
            Value::Array(vec![set, Value::Int(pttl), Value::SimpleString(ty.into())])
        };
        assert_eq!(
            parse_acquire(reply(Value::Nil, 1500, "string")),
            Ok(AcquireReply::Busy { pttl_ms: 1500 })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil, -1, "hash")),
            Err(NodeError::WrongType {
                found: "hash".into(),
                pttl_ms: -1
            })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil, -2, "none")),
            Ok(AcquireReply::Busy { pttl_ms: 0 })
        );
        assert_eq!(
            parse_acquire(reply(Value::Okay, 1000, "string")),
            Ok(AcquireReply::Acquired { fence: None })
        );
        assert!(parse_acquire(Value::Nil).is_err());
    }

    #[test]
    fn parses_fenced_acquire_reads() {
        let time = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        let reply = |set: Value, counter: Value| {
            Value::Array(vec![
                set,
                Value::Int(900),
                Value::SimpleString("string".into()),
                counter,
                time.clone(),
            ])
        };
        let read = |counter| {
            Ok(AcquireReply::Acquired {
                fence: Some(FenceRead {
                    counter,
                    time_us: 1_700_000_000_123_456,
                }),
            })
        };
        assert_eq!(parse_acquire(reply(Value::Okay, Value::Nil)), read(0));
        assert_eq!(
            parse_acquire(reply(Value::Okay, Value::BulkString(b"41".to_vec()))),
            read(41)
        );
        let max = u64::MAX.to_string().into_bytes();
        for bad in [b"x".to_vec(), max] {
            assert!(matches!(
                parse_acquire(reply(Value::Okay, Value::BulkString(bad))),
                Err(NodeError::Protocol(_))
            ));
        }
        // Busy: the reads do not matter.
        assert_eq!(
            parse_acquire(reply(Value::Nil, Value::BulkString(b"x".to_vec()))),
            Ok(AcquireReply::Busy { pttl_ms: 900 })
        );
    }

    #[test]
    fn judges_by_set_when_pttl_or_type_is_refused() {
        let refused = || {
            redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n")
                .expect("an error reply parses")
        };
        assert!(matches!(refused(), Value::ServerError(_)));
        let reply = |set: Value| Value::Array(vec![set, refused(), refused()]);
        assert_eq!(
            parse_acquire(reply(Value::Okay)),
            Ok(AcquireReply::Acquired { fence: None })
        );
        assert_eq!(
            parse_acquire(reply(Value::Nil)),
            Ok(AcquireReply::Busy { pttl_ms: -2 })
        );
        assert_eq!(
            parse_acquire(Value::Array(vec![Value::Nil, Value::Int(700), refused()])),
            Ok(AcquireReply::Busy { pttl_ms: 700 })
        );
        assert!(matches!(
            parse_acquire(reply(refused())),
            Err(NodeError::Auth(_))
        ));
    }
}
