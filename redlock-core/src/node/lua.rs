//! A Lua script as a node runs it (node layer): its text and its SHA1,
//! computed once per process, and the `EVALSHA` / `EVAL` pair that runs it.

use redis::Cmd;

/// A Lua script with its SHA1 computed once per process.
pub(crate) struct LuaScript {
    pub(super) body: &'static str,
    pub(super) sha: String,
}

impl LuaScript {
    pub(crate) fn new(body: &'static str) -> Self {
        let sha = redis::Script::new(body).get_hash().to_owned();
        Self { body, sha }
    }
}

/// `EVALSHA sha <keys> keys.. args..` and `EVAL body <keys> keys.. args..`.
pub(crate) fn keys_cmds<K, A>(script: &LuaScript, keys: &[K], args: &[A]) -> (Cmd, Cmd)
where
    K: redis::ToRedisArgs,
    A: redis::ToRedisArgs,
{
    let build = |name: &str, first: &str| {
        let mut cmd = redis::cmd(name);
        cmd.arg(first).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    (build("EVALSHA", &script.sha), build("EVAL", script.body))
}
