//! The read/write lock's acquire scripts (`rwlock/`), one atomic step per
//! node each. The keys of one resource: the writer key (the resource's own
//! lock key, so a writer is a mutex holder to every other step), the writers'
//! intent, the readers' index, and one key per reader. A reader's key holds
//! its token with its own expiry (`PX`, the node's clock), so the mutex's
//! compare-and-delete and compare-and-pexpire release and extend it; the
//! index lists the reader keys for the write acquire to check.
//!
//! Both answer as `ACQUIRE_MANY_LUA` does (`parse_acquire_many`): `{1}` (a
//! fenced writer: `{1, time, counter}`), or `{0, i, pttl, type}` for what was
//! in the way.

use std::sync::LazyLock;

use super::scripts::{Call, LuaScript};

/// Read acquire: `KEYS` = writer key, intent, index, this reader's key;
/// `ARGV` = token, TTL in ms. Refused while a writer holds or waits (its
/// intent: writer preference); else the reader's key is set with its own
/// TTL and listed in the index. Up to three listed readers are checked at
/// random and dropped from the index if their keys are gone, so that
/// readers that died unreleased do not pile up between writers. The index
/// lives at least as long as the reader's key (`list_reader`): here, and in
/// every extend of a reader's key (`EXTEND_READER_LUA`, `EXTEND_BATCH_LUA`),
/// so a writer sees every live reader and no index outlives its readers by
/// more than their TTL. A reader's release takes it off the index
/// (`RELEASE_LUA`), and Redis deletes the set once it is empty.
const READ_ACQUIRE_LUA: &str = concat!(
    reader_index_lua!(),
    r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  return {0, 1, redis.call('PTTL', KEYS[1]), t}
end
local i = redis.call('PTTL', KEYS[2])
if i ~= -2 then
  return {0, 2, i, 'string'}
end
for _, r in ipairs(redis.call('SRANDMEMBER', KEYS[3], 3)) do
  if redis.call('EXISTS', r) == 0 then
    redis.call('SREM', KEYS[3], r)
  end
end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
list_reader(KEYS[3], KEYS[4], ARGV[2])
return {1}
"#
);

/// Write acquire: `KEYS` = writer key, intent, index, and for a fenced lock
/// the writer key's fence counter; `ARGV` = token, TTL in ms, the writer's
/// id (the same for all its attempts), the intent's TTL in ms. Refused while
/// another writer holds, or while any listed reader's key is still there
/// (listed keys that are gone are dropped); a refused writer leaves its
/// intent (or renews its own), which refuses new readers. The intent is not
/// deleted here: a failed attempt must not lift it; the writer deletes it
/// once it holds or gives up (`rwlock/`), or it expires.
const WRITE_ACQUIRE_LUA: &str = r#"
local function intend()
  if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) then
    if redis.call('GET', KEYS[2]) == ARGV[3] then
      redis.call('PEXPIRE', KEYS[2], ARGV[4])
    end
  end
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t == 'string' then intend() end
  return {0, 1, redis.call('PTTL', KEYS[1]), t}
end
local longest = -2
for _, r in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local p = redis.call('PTTL', r)
  if p == -2 then
    redis.call('SREM', KEYS[3], r)
  elseif p == -1 or p > longest then
    longest = p
  end
end
if longest ~= -2 then
  intend()
  return {0, 3, longest, 'string'}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if #KEYS == 3 then
  return {1}
end
return {1, redis.call('TIME'), redis.call('GET', KEYS[4]) or false}
"#;

static READ_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(READ_ACQUIRE_LUA));
static WRITE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(WRITE_ACQUIRE_LUA));

/// The keys of one resource's read/write lock on a node.
pub(crate) struct RwKeys<'a> {
    /// The writer key: the resource's lock key.
    pub(crate) writer: &'a str,
    pub(crate) intent: &'a str,
    pub(crate) index: &'a str,
}

impl Call {
    /// A reader's acquire of `reader` (its own key) with `token` for `ttl_ms`.
    pub(crate) fn read_acquire(keys: &RwKeys<'_>, reader: &str, token: &str, ttl_ms: u128) -> Self {
        let ttl = ttl_ms.to_string();
        Call::keys(
            &READ_ACQUIRE,
            &[
                keys.writer.as_bytes(),
                keys.intent.as_bytes(),
                keys.index.as_bytes(),
                reader.as_bytes(),
            ],
            &[token.as_bytes(), ttl.as_bytes()],
        )
    }

    /// A writer's acquire with `token` for `ttl_ms`, as writer `writer_id`
    /// whose intent lives `intent_ms`; with `fence_key`, it reads the
    /// counter and the node's `TIME` once the key is set (fencing step 1).
    pub(crate) fn write_acquire(
        keys: &RwKeys<'_>,
        token: &str,
        ttl_ms: u128,
        writer_id: &str,
        intent_ms: u128,
        fence_key: Option<&[u8]>,
    ) -> Self {
        let mut k: Vec<&[u8]> = vec![
            keys.writer.as_bytes(),
            keys.intent.as_bytes(),
            keys.index.as_bytes(),
        ];
        k.extend(fence_key);
        let (ttl, intent) = (ttl_ms.to_string(), intent_ms.max(1).to_string());
        Call::keys(
            &WRITE_ACQUIRE,
            &k,
            &[
                token.as_bytes(),
                ttl.as_bytes(),
                writer_id.as_bytes(),
                intent.as_bytes(),
            ],
        )
    }
}
