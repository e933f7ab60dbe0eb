//! The store side of fencing: apply a write only if its fencing token is not
//! older than the last one the store accepted for the resource, and record it.
//!
//! A lock alone cannot stop a holder that checked it still holds the lock, was
//! then paused (a GC pause, `SIGSTOP`, swap, a slow network) past its validity,
//! and only then wrote: by then another client may hold the lock and have
//! written. With [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing) on,
//! every lock carries a [`FencingToken`] larger than every earlier holder's. The
//! store remembers the largest token it accepted per resource and refuses
//! writes that come with a smaller one.
//!
//! The rule here is `token >= last`: the same holder may write many times with
//! its token; a holder whose token is older than one the store already
//! accepted is refused. The check and the write must be one atomic step in the
//! store, as they are below.
//!
//! **Fence the read of a read-modify-write too.** A holder stalled just before
//! the next holder wrote is still not older than the last token the store
//! saw, so its late write is accepted, and the next holder then overwrites it
//! from a value it read earlier. Claim the record with the token before
//! reading (a `set_if_fresh` of a marker, or `UPDATE … SET fence = $t WHERE
//! fence <= $t` in the same transaction as the read): the claim raises the
//! store's last token first, and the stalled write is refused.
//! `tests/tests/faults/fenced.rs` checks exactly this under stalls and restarts.
//!
//! # Redis as the store
//!
//! [`set_if_fresh`] runs one Lua script: compare with the record, then set the
//! record and the value. The record key keeps the last accepted token for the
//! resource; use one record per protected resource (not per value written
//! under it). On a Redis Cluster, give the record and the value keys one hash
//! tag (`{order:42}:fence`, `{order:42}:state`) so that the script may touch
//! both.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::{Redlock, fence};
//!
//! # async fn run(redlock: Redlock, store: deadpool_redis::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let lock = redlock.mutex("order:42").try_acquire(Duration::from_secs(5)).await?;
//! let token = lock.fencing_token().ok_or("the handle was built without fencing")?;
//! let mut conn = store.get().await?;
//! match fence::set_if_fresh(&mut conn, "{order:42}:fence", token, "{order:42}:state", "paid").await? {
//!     fence::Outcome::Applied => {}
//!     fence::Outcome::Stale { last } => eprintln!("a newer holder ({last}) wrote first"),
//! }
//! # Ok(()) }
//! ```
//!
//! # SQL as the store
//!
//! Keep the last accepted token in a column of the protected row, and make it
//! part of the write's condition:
//!
//! ```sql
//! UPDATE orders
//!    SET state = $2, fence = $3
//!  WHERE id = $1 AND fence <= $3;
//! -- 1 row: applied. 0 rows: stale (a newer holder wrote), or no such row.
//! ```
//!
//! (`fence BIGINT NOT NULL DEFAULT 0`; a token above `i64::MAX` does not fit a
//! signed column: store it as `NUMERIC(20)` then.) An `INSERT` takes the same
//! guard with `ON CONFLICT (id) DO UPDATE SET … WHERE orders.fence <= EXCLUDED.fence`.
//! Under the default isolation of PostgreSQL and MySQL an `UPDATE … WHERE`
//! re-checks its condition on the row it locked, so two writers cannot both
//! pass.
//!
//! # What a token promises
//!
//! Tokens grow from holder to holder of one resource, under the assumptions of
//! the handle's [`FencingMode`](crate::FencingMode) (durable counters, or a
//! restarted node down longer than the clock skew and no backward clock
//! steps). A store that checks them refuses every write of a holder once a
//! later holder's write was accepted. It cannot refuse a late write that
//! arrives before any later holder wrote: that write is then ordered before
//! the later holder's, which is what the resource sees either way.

use std::sync::LazyLock;

use redis::{ToRedisArgs, Value};

use crate::fencing::FencingToken;

/// `KEYS[1]` the record, `KEYS[2]` the value; `ARGV[1]` the token, `ARGV[2]`
/// the value. Tokens are decimal strings compared by length, then digits (Lua
/// numbers are doubles, which lose `u64` precision).
const SET_IF_FRESH_LUA: &str = r#"
local last = redis.call('GET', KEYS[1])
if last and (#last > #ARGV[1] or (#last == #ARGV[1] and last > ARGV[1])) then
  return {0, last}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return {1, ARGV[1]}
"#;

static SET_IF_FRESH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(SET_IF_FRESH_LUA));

/// What the store did with a fenced write: one or the other, nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The token was not older than the last accepted: the write was applied,
    /// and the token recorded.
    Applied,
    /// A newer holder's write was accepted before: nothing was written.
    Stale {
        /// The token the store accepted last.
        last: FencingToken,
    },
}

/// Why a fenced write could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store failed or refused the script (connection, `WRONGTYPE` at one
    /// of the keys, `NOSCRIPT` that `EVAL` could not fix, …).
    #[error("fenced write to the store failed: {0}")]
    Redis(#[from] redis::RedisError),
    /// The record holds something that is not a token this module wrote.
    #[error("the fence record {record:?} holds {found:?}, not a fencing token")]
    BadRecord {
        /// The record key.
        record: String,
        /// What it holds.
        found: String,
    },
    /// The value does not encode to exactly one Redis argument (an empty
    /// `Vec`, `()`, a tuple or a list of several), so `SET` could not store
    /// it. Refused before the script runs: nothing was written, the record
    /// included.
    #[error("the value for {key:?} encodes to {args} Redis arguments, not one")]
    BadValue {
        /// The value key.
        key: String,
        /// How many arguments the value encoded to.
        args: usize,
    },
}

/// Sets `key` to `value` only if `token` is at least the last token recorded
/// at `record`, and records `token`; one atomic script on the store.
///
/// # Errors
/// [`StoreError::Redis`] when the script fails, [`StoreError::BadRecord`] when
/// `record` holds something else than a token, [`StoreError::BadValue`] when
/// `value` is not one Redis argument (then nothing is sent).
pub async fn set_if_fresh<C, V>(
    conn: &mut C,
    record: &str,
    token: FencingToken,
    key: &str,
    value: V,
) -> Result<Outcome, StoreError>
where
    C: redis::aio::ConnectionLike + Send,
    V: ToRedisArgs,
{
    // The script raises the record before it writes the value: a value that
    // is not exactly one argument would make the second `SET` fail after the
    // first, leaving a record that claims a write that never happened.
    let mut args = value.to_redis_args();
    let value = match (args.pop(), args.is_empty()) {
        (Some(one), true) => one,
        (last, _) => {
            return Err(StoreError::BadValue {
                key: key.to_owned(),
                args: args.len() + usize::from(last.is_some()),
            });
        }
    };
    let reply: Value = SET_IF_FRESH
        .key(record)
        .key(key)
        .arg(token.get())
        .arg(value)
        .invoke_async(conn)
        .await?;
    let bad = |found: String| StoreError::BadRecord {
        record: record.to_owned(),
        found,
    };
    let Value::Array(items) = reply else {
        return Err(bad(format!("{reply:?}")));
    };
    match items.as_slice() {
        [Value::Int(1), _] => Ok(Outcome::Applied),
        [Value::Int(0), Value::BulkString(last)] => {
            let text = String::from_utf8_lossy(last);
            text.parse()
                .map(|last| Outcome::Stale {
                    last: FencingToken::new(last),
                })
                .map_err(|_| bad(text.into_owned()))
        }
        other => Err(bad(format!("{other:?}"))),
    }
}
