//! The release (spec step 5, compare-and-delete) as a node runs it: the
//! script in its three announcing forms (database 0, another database, a
//! cluster's shard channel), the form without the waiters flag for a user
//! whose ACL refuses it, and their `EVALSHA` / `EVAL` commands.

use std::sync::LazyLock;

use redis::Cmd;

use super::lua::{LuaScript, keys_cmds};

/// Release: compare-and-delete (spec "Releasing the lock"). Never a bare `DEL`.
/// The key's waiters flag (the key's tag `{tag}`, see `slots`, and
/// `keys::WAITERS_SUFFIX`) goes in the
/// same `DEL`: only when it was there, i.e. some waiter set it before its
/// attempt on this node, is the delete announced on the key's channel
/// (`keys::channel`) to wake the waiters. A release nobody waits for thus
/// runs two commands on the node, not three: each `redis.call` costs the
/// node about 3,900 instructions, 12% of the call (BENCHMARKS.md at 9debf85, "Announce
/// a release only to waiters"). The `PUBLISH` is a `pcall`, so that a user
/// not allowed to publish still releases. This one is for database 0, what
/// nearly every node uses: its channel is written in, since every argument
/// costs the node about 1,800 instructions; [`RELEASE_IN_DB_LUA`] takes the
/// database as `ARGV[2]`.
///
/// The flag's name is built here from `KEYS[1]` rather than passed as
/// `KEYS[2]`: one argument less cuts the node's work per release by about
/// 1,300 instructions of 34,000 (BENCHMARKS.md at 9debf85, "The release script names
/// the waiters flag"). Redis asks scripts to declare their keys for Redis
/// Cluster's sake; a cluster runs an undeclared key of the declared key's
/// slot, which the flag is by its tag. A user whose ACL refuses the flag's key gets an
/// `ERR` from this script before anything is deleted, and the release runs
/// again without the flag (`release_unflagged_lua`).
///
/// A read share's key (`{tag}:redlock-reader:<token>`, `rwlock/`) is also
/// taken off its resource's readers index, held or not: the index lists it
/// for the writers to check, and a listed reader whose key is gone would
/// otherwise keep the index on the node until it expires (as long as the
/// longest reader it listed could). The test is on
/// the key's text, so a lock's release runs no more commands than before.
///
/// The announcement carries the flag's value: the name of the last mutex
/// waiter that set it (`keys::waiter_name`), which tries first
/// (`wait/`, issue 48 item 7), or `1`, which names nobody (a holder's
/// attempt takes its own name off the flag: `NAME_FLAG_LUA`). Reading the
/// flag costs the release one `GET` more, only when the key held the token.
///
/// It answers 0 when the key did not hold the token, else 1 plus what the
/// `PUBLISH` answered, the number of connections subscribed to the channel
/// (0 when nothing was announced or the `pcall` failed): the releaser learns
/// whether its release woke waiters other than its own handle's, and then
/// leaves them the next turn (`wait/handoff.rs`, issue 48).
pub(crate) const RELEASE_LUA: &str = release_lua!("PUBLISH", "'redlock:released:0:'");

/// The release script's text: `$publish` announces the delete on the
/// channel `$prefix .. '{tag}'` (`$prefix` is Lua text).
macro_rules! release_lua {
    ($publish:literal, $prefix:literal) => {
        concat!(
            r#"
local t = KEYS[1]
if string.byte(t) ~= 123 then t = '{' .. t .. '}' else t = string.match(t, '^{[^}]*}') or t end
if string.sub(KEYS[1], #t + 1, #t + "#,
            reader_infix_len!(),
            r#") == '"#,
            reader_infix!(),
            r#"' then
  redis.call('SREM', t .. '"#,
            readers_suffix!(),
            r#"', KEYS[1])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local f = t .. '"#,
            waiters_suffix!(),
            r#"'
  local w = redis.pcall('GET', f)
  if type(w) ~= 'string' then w = '1' end
  if redis.call('DEL', KEYS[1], f) > 1 then
    local n = redis.pcall('"#,
            $publish,
            "', ",
            $prefix,
            r#" .. t, w)
    if type(n) == 'number' then return 1 + n end
  end
  return 1
end
return 0
"#
        )
    };
}
use release_lua;

/// [`RELEASE_LUA`] for a node of another database than 0, named by `ARGV[2]`
/// (`PUBLISH` reaches every database of a server, and a script cannot read
/// which database it runs in).
const RELEASE_IN_DB_LUA: &str = release_lua!("PUBLISH", "'redlock:released:' .. ARGV[2] .. ':'");

/// [`RELEASE_LUA`] on a cluster node: the delete is announced by `SPUBLISH`
/// on the key's shard channel, which hashes to the key's slot by its tag
/// (`slots`), so only the shard that holds the key hears it, and a script
/// may send it (a script touches only its keys' slot). A cluster node is
/// always database 0 (Redis Cluster has no other), so no database argument.
const SHARD_RELEASE_LUA: &str = release_lua!("SPUBLISH", "'redlock:released:0:'");

/// The release for a user whose ACL refuses the waiters flag's key
/// (`ERR` from [`RELEASE_LUA`]): the key alone, every delete announced on
/// the channel `ARGV[2]`, as before waiters set flags; `$publish` and the
/// answer as in [`release_lua`].
macro_rules! release_unflagged_lua {
    ($publish:literal) => {
        concat!(
            r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local n = redis.pcall('"#,
            $publish,
            r#"', ARGV[2], '1')
  if type(n) == 'number' then return 1 + n end
  return 1
end
return 0
"#
        )
    };
}

/// The release of a permit slot's failed attempt, which took fewer nodes
/// than a quorum (`Attempt::release_failed`): compare-and-delete (a read
/// share also leaves its index), announcing nothing and leaving the waiters
/// flag. Such a key never held the slot: a waiter it refused waits for the
/// holder that refused the attempt, or for its own poll. Announced, it woke
/// the resource's waiters to try again at once, the attempt's own waiter
/// too (issue 48, item 3: a permit waiter's clean-up of one slot woke it as
/// a release on another slot's busy node, and it spun); and a `DEL` of the
/// flag took other waiters' flags away.
pub(crate) const RELEASE_QUIET_LUA: &str = concat!(
    reader_index_lua!(),
    r#"
local idx = index_of(KEYS[1])
if idx then redis.call('SREM', idx, KEYS[1]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#
);

pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_LUA));
pub(crate) static RELEASE_QUIET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(RELEASE_QUIET_LUA));
static RELEASE_IN_DB: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(RELEASE_IN_DB_LUA));
pub(crate) static RELEASE_UNFLAGGED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(release_unflagged_lua!("PUBLISH")));
static SHARD_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(SHARD_RELEASE_LUA));
static SHARD_RELEASE_UNFLAGGED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(release_unflagged_lua!("SPUBLISH")));

/// How a node announces a release: by `PUBLISH` in database `db` of a
/// single server, or by `SPUBLISH` on a cluster node (database 0).
#[derive(Debug, Clone, Copy)]
pub(super) enum Announce {
    Publish { db: i64 },
    Shard,
}

/// The release's `EVALSHA` as a node announcing by `how` runs it: the key
/// and its waiters flag, the token, and for a database other than 0 the
/// database (for the channel).
pub(super) fn release_evalsha(key: &str, token: &str, how: Announce) -> Cmd {
    release_cmd("EVALSHA", key, token, how)
}

/// The release's `EVAL`, after `NOSCRIPT`.
pub(super) fn release_eval(key: &str, token: &str, how: Announce) -> Cmd {
    release_cmd("EVAL", key, token, how)
}

fn release_cmd(name: &str, key: &str, token: &str, how: Announce) -> Cmd {
    let (script, db) = match how {
        Announce::Shard => (&*SHARD_RELEASE, 0),
        Announce::Publish { db: 0 } => (&*RELEASE, 0),
        Announce::Publish { db } => (&*RELEASE_IN_DB, db),
    };
    let body = if name == "EVAL" {
        script.body
    } else {
        script.sha.as_str()
    };
    // Sized up front (see `scripts::set_nx`).
    let mut cmd = Cmd::with_capacity(
        6,
        body.len()
            .saturating_add(key.len())
            .saturating_add(token.len())
            .saturating_add(32),
    );
    cmd.arg(name).arg(body).arg(1).arg(key).arg(token);
    if db != 0 {
        cmd.arg(db);
    }
    cmd
}

/// The release without the waiters flag (`release_unflagged_lua`), by
/// `EVALSHA` and `EVAL`, for a user whose ACL refuses the flag's key.
pub(super) fn release_unflagged(key: &str, token: &str, how: Announce) -> (Cmd, Cmd) {
    let (script, db) = match how {
        Announce::Publish { db } => (&*RELEASE_UNFLAGGED, db),
        Announce::Shard => (&*SHARD_RELEASE_UNFLAGGED, 0),
    };
    keys_cmds(
        script,
        &[key],
        &[token.to_owned(), crate::keys::channel(db, key)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_hash_once_and_match_redis() {
        assert_eq!(RELEASE.sha, redis::Script::new(RELEASE_LUA).get_hash());
        assert_eq!(RELEASE.sha.len(), 40);
        assert_ne!(RELEASE_UNFLAGGED.sha, RELEASE.sha);
        assert_ne!(RELEASE_IN_DB.sha, RELEASE.sha);
        assert_ne!(SHARD_RELEASE.sha, RELEASE.sha);
        assert!(SHARD_RELEASE_LUA.contains("redis.pcall('SPUBLISH', 'redlock:released:0:' .. t"));
        assert!(RELEASE_IN_DB_LUA.contains("'redlock:released:' .. ARGV[2] .. ':' .. t"));
        assert_ne!(SHARD_RELEASE_UNFLAGGED.sha, RELEASE_UNFLAGGED.sha);
    }

    #[test]
    fn the_release_scripts_name_the_readers_index_as_the_rwlock_does() {
        use crate::keys::{READER_INFIX, READERS_SUFFIX};
        for lua in [RELEASE_LUA, RELEASE_IN_DB_LUA, SHARD_RELEASE_LUA] {
            assert!(lua.contains(&format!("'{READER_INFIX}'")), "{lua}");
            assert!(lua.contains(&format!("'{READERS_SUFFIX}'")), "{lua}");
        }
    }
}
