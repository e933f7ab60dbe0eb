//! Plain `redis-server` nodes on free loopback ports, each in its own temp dir,
//! killed on drop (on panic too), and clusters of them.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis::Value;

pub(crate) const INSTALL_HINT: &str = "redis-server (>= 6.2) was not found. Install it with \
`sudo apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis` (macOS), \
or set REDIS_SERVER=/path/to/redis-server.";

/// The `redis-server` binary: `$REDIS_SERVER`, else the first on `PATH`.
///
/// # Panics
/// With the install command when there is none.
pub fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_SERVER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "REDIS_SERVER={} is not a file. {INSTALL_HINT}",
            p.display()
        );
        return p;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("redis-server"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{INSTALL_HINT}"))
}

pub(crate) fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    l.local_addr().expect("local addr").port()
}

/// Whether `test`, which shifts a node's clock with libfaketime, can run here:
/// on Linux always (a missing library then fails the test with the install
/// command, see [`faketime_env`]); elsewhere it says on stderr, by name, that
/// it is skipped, because the preload libraries below are Linux's.
pub fn faketime_or_skip(test: &str) -> bool {
    if cfg!(target_os = "linux") {
        return true;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED {test}: clock skew is emulated with Linux's libfaketime and glibc's preloadable malloc"
    );
    false
}

/// Where Debian's `libfaketime` package puts the preload library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// glibc's malloc as a preloadable library (glibc >= 2.34).
///
/// libfaketime cannot start inside a `redis-server` linked to jemalloc (Debian's
/// is): jemalloc's first `malloc` reads the clock, libfaketime's lazy init then
/// calls `dlsym`, which allocates, which re-enters jemalloc's init, and the
/// process hangs with "Unexpected recursive calls to clock_gettime()"
/// (wolfcw/libfaketime#130). Preloaded first, this library answers `malloc`,
/// `free`, `realloc`, `calloc` and `malloc_usable_size` with glibc's allocator,
/// so jemalloc is never entered and libfaketime initializes normally. A Redis
/// built with its bundled (prefixed) jemalloc works with it too.
pub const LIBC_MALLOC: &str = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0";

/// The environment that makes a `redis-server` see its wall clock shifted by a
/// constant `offset_ms` (may be negative) through libfaketime: for
/// [`RedisNode::start_with_env`] and [`Cluster::start_each_with_env`], where it
/// is kept across restarts. Only the wall clock is shifted
/// (`DONT_FAKE_MONOTONIC=1`); `TIME`, key expiry and the logs follow it.
///
/// # Panics
/// With the install command when libfaketime (or glibc's preloadable malloc)
/// is missing: a clock-skew test never runs without its skew.
pub fn faketime_env(offset_ms: i64) -> Vec<(String, String)> {
    assert!(
        std::path::Path::new(LIBFAKETIME).is_file(),
        "{LIBFAKETIME} is missing: this test emulates clock skew between Redis nodes with \
         libfaketime. Install it with `sudo apt-get install -y faketime` (Debian/Ubuntu)."
    );
    assert!(
        std::path::Path::new(LIBC_MALLOC).is_file(),
        "{LIBC_MALLOC} is missing (glibc >= 2.34 ships it): libfaketime needs it preloaded \
         to start inside a jemalloc-linked redis-server. Install glibc >= 2.34 and \
         `sudo apt-get install -y faketime`."
    );
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    vec![
        (
            "LD_PRELOAD".to_owned(),
            format!("{LIBC_MALLOC}:{LIBFAKETIME}"),
        ),
        (
            "FAKETIME".to_owned(),
            format!("{sign}{}.{:03}", abs / 1000, abs % 1000),
        ),
        ("DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
    ]
}

/// One `redis-server` process on 127.0.0.1, in its own temp dir.
pub struct RedisNode {
    /// The server binary, used again by every restart (see
    /// [`RedisNode::restart_as`]).
    bin: Mutex<PathBuf>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    /// Set on the process at every spawn, restarts included.
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .finish()
    }
}

impl RedisNode {
    /// Starts a node with `--save "" --appendonly no`.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a node with extra `redis-server` arguments (each `--name value`).
    pub fn start_with(extra_args: &[&str]) -> Self {
        Self::start_with_env(extra_args, &[])
    }

    /// Starts a node with extra arguments and extra environment variables for
    /// its process (e.g. [`faketime_env`]). Both are used again by every
    /// [`RedisNode::restart`].
    pub fn start_with_env(extra_args: &[&str], env: &[(String, String)]) -> Self {
        Self::start_binary(&redis_server_binary(), extra_args, env)
    }

    /// Starts a node of server binary `bin` (a `valkey-server`, or a
    /// `redis-server` other than [`redis_server_binary`]), with extra arguments
    /// and environment, both used again by every restart.
    pub fn start_binary(
        bin: &std::path::Path,
        extra_args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let bin = bin.to_path_buf();
        let mut last_err = String::new();
        for _ in 0..10 {
            let node = Self {
                bin: Mutex::new(bin.clone()),
                port: free_port(),
                dir: tempfile::Builder::new()
                    .prefix("redlock-node-")
                    .tempdir()
                    .expect("create a temp dir for redis-server"),
                extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
                env: env.to_vec(),
                child: Mutex::new(None),
            };
            match node.spawn(&bin) {
                Ok(()) => return node,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    fn spawn(&self, bin: &PathBuf) -> Result<(), String> {
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}. {INSTALL_HINT}", bin.display()))?;
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                return Err(format!("redis-server exited with {status}: {log}"));
            }
            match self.info_pid() {
                Ok(Some(p)) if p == pid => break,
                Ok(Some(p)) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "port {} is served by pid {p}, not ours ({pid})",
                        self.port
                    ));
                }
                _ if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("redis-server on port {} did not answer", self.port));
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        *self.lock_child() = Some(child);
        Ok(())
    }

    fn info_pid(&self) -> redis::RedisResult<Option<u32>> {
        let info: String = self.raw(&["INFO", "server"])?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok()))
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The node's temp dir (its `dump.rdb` lives here).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// How far the node's clock (`TIME`) is from this process's wall clock, in
    /// microseconds (positive: the node is ahead), and the uncertainty of that
    /// reading (half the best round trip), from the best of five samples.
    ///
    /// # Panics
    /// If the node does not answer `TIME`.
    pub fn clock_offset_us(&self) -> (i64, i64) {
        fn wall_us() -> i64 {
            let d = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the wall clock is after 1970");
            i64::try_from(d.as_micros()).expect("microseconds fit i64")
        }
        let client = redis::Client::open(self.url()).expect("node url");
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect to port {}: {e}", self.port));
        let mut best: Option<(i64, i64)> = None;
        for _ in 0..5 {
            let before = wall_us();
            let (secs, micros): (i64, i64) = redis::cmd("TIME")
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("TIME on port {}: {e}", self.port));
            let after = wall_us();
            let half_rtt = (after - before) / 2;
            let offset = secs * 1_000_000 + micros - (before + half_rtt);
            if best.is_none_or(|(_, err)| half_rtt < err) {
                best = Some((offset, half_rtt));
            }
        }
        best.expect("five samples")
    }

    /// The running process id, if the node is up.
    pub fn pid(&self) -> Option<u32> {
        self.lock_child().as_ref().map(Child::id)
    }

    /// Whether the process is running (it may be paused).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// `kill -9` and reap. The node's data is gone (no persistence).
    pub fn kill(&self) {
        if let Some(mut child) = self.lock_child().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node again on the same port and dir (empty, unless the test
    /// saved an RDB there).
    pub fn restart(&self) {
        let bin = self
            .bin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.restart_as(&bin);
    }

    /// Starts the node again on the same port and dir with server binary
    /// `bin` (kept for later restarts): the same address, another server.
    pub fn restart_as(&self, bin: &std::path::Path) {
        *self.bin.lock().unwrap_or_else(PoisonError::into_inner) = bin.to_path_buf();
        self.kill();
        let bin = bin.to_path_buf();
        let mut last = String::new();
        for _ in 0..50 {
            match self.spawn(&bin) {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "could not restart redis-server on port {}: {last}",
            self.port
        );
    }

    /// Restarts the node after `delay`, from a background thread.
    pub fn restart_after(self: &Arc<Self>, delay: Duration) -> JoinHandle<()> {
        let node = Arc::clone(self);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            node.restart();
        })
    }

    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid() {
            let pid = i32::try_from(pid).expect("pid fits i32");
            kill(Pid::from_raw(pid), sig).expect("signal redis-server");
        }
    }

    /// `SIGSTOP`: the node keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// `SIGCONT` after [`RedisNode::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Runs one raw command on a fresh connection (2 s timeouts).
    pub fn raw<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.raw_bytes(&args)
    }

    /// [`RedisNode::raw`] for arguments that need not be UTF-8 (a binary
    /// value).
    pub fn raw_bytes<T: redis::FromRedisValue>(&self, args: &[&[u8]]) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.set_write_timeout(Some(Duration::from_secs(2)))?;
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        cmd.query(&mut conn)
    }

    /// Runs one raw command and panics on error.
    pub fn cmd(&self, args: &[&str]) -> Value {
        self.raw(args)
            .unwrap_or_else(|e| panic!("{:?} on port {}: {e}", args, self.port))
    }

    /// The string value at `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        self.raw(&["GET", key]).expect("GET")
    }

    /// `PTTL key` in milliseconds (-2: no key, -1: no expiry).
    pub fn pttl(&self, key: &str) -> i64 {
        self.raw(&["PTTL", key]).expect("PTTL")
    }

    /// All keys on the node.
    pub fn keys(&self) -> Vec<String> {
        self.raw(&["KEYS", "*"]).expect("KEYS")
    }

    /// Opens `MONITOR` on the node and records every command it sees until the
    /// returned recorder is stopped.
    pub fn monitor(&self) -> crate::monitor::Monitor {
        crate::monitor::Monitor::start(self.port)
    }

    /// Connects a plain TCP stream to the node (for raw protocol tests).
    pub fn tcp(&self) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.port)).expect("connect")
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// N independent nodes.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Arc<RedisNode>>,
}

impl Cluster {
    /// Starts `n` nodes.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &[])
    }

    /// Starts `n` nodes with the same extra arguments.
    pub fn start_with(n: usize, extra_args: &[&str]) -> Self {
        Self::start_each_with_env(extra_args, vec![Vec::new(); n])
    }

    /// Starts one node per entry of `envs`, all with the same extra arguments,
    /// node `i` with the extra environment `envs[i]` (kept across restarts), e.g.
    /// a distinct [`faketime_env`] clock offset per node.
    pub fn start_each_with_env(extra_args: &[&str], envs: Vec<Vec<(String, String)>>) -> Self {
        let handles: Vec<_> = envs
            .into_iter()
            .map(|env| {
                let args: Vec<String> = extra_args.iter().map(|s| (*s).to_owned()).collect();
                std::thread::spawn(move || {
                    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                    RedisNode::start_with_env(&refs, &env)
                })
            })
            .collect();
        let nodes = handles
            .into_iter()
            .map(|h| Arc::new(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))))
            .collect();
        Self { nodes }
    }

    /// A cluster of nodes started one by one (e.g. of different servers, with
    /// [`RedisNode::start_binary`]).
    pub fn of(nodes: Vec<RedisNode>) -> Self {
        Self {
            nodes: nodes.into_iter().map(Arc::new).collect(),
        }
    }

    /// The nodes' URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &Arc<RedisNode> {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[Arc<RedisNode>] {
        &self.nodes
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// How many running nodes hold `key` with value `token`.
    pub fn count_holding(&self, key: &str, token: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.get(key).as_deref() == Some(token))
            .count()
    }

    /// How many running nodes have `key` at all.
    pub fn count_with_key(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.raw::<i64>(&["EXISTS", key]).unwrap_or(0) == 1)
            .count()
    }

    /// A handle over these nodes for a test whose subject is not a slow node:
    /// [`PATIENT_NODE_TIMEOUT`](crate::timing::PATIENT_NODE_TIMEOUT), the
    /// builder's defaults otherwise. Its locks need TTLs above 2 s.
    pub fn patient_redlock(&self) -> redlock_core::Redlock {
        redlock_core::Redlock::builder()
            .urls(self.urls())
            .node_timeout(crate::timing::PATIENT_NODE_TIMEOUT)
            .build()
            .expect("a handle over the test nodes")
    }

    /// How many running nodes have `key`, once that is `want` or
    /// [`settled`](crate::timing::settled) has passed: a lock or an unlock
    /// returns at quorum, and the last node's answer may still be on its way.
    /// Assert on the result; it returns at once when the count is `want`.
    pub async fn settled_count(&self, key: &str, want: usize) -> usize {
        let end = Instant::now() + crate::timing::settled();
        loop {
            let n = self.count_with_key(key);
            if n == want || Instant::now() > end {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The blocking twin of [`settled_count`](Self::settled_count), for tests
    /// without a runtime.
    pub fn settled_count_blocking(&self, key: &str, want: usize) -> usize {
        let mut n = self.count_with_key(key);
        self.wait_until(crate::timing::settled(), |c| {
            n = c.count_with_key(key);
            n == want
        });
        n
    }

    /// Waits until `f` holds, up to `timeout`; returns whether it did.
    ///
    /// It blocks its thread. On a worker of a multi-thread Tokio runtime it
    /// does so in `block_in_place`, which hands the worker's queued tasks to
    /// another thread first: a task the test spawned just before sits in its
    /// worker's LIFO slot, which no other worker steals, and would not run
    /// until the wait ended (a waiter that "never flagged its keys" in a
    /// loaded run). On a current-thread runtime nothing else can run while it
    /// blocks: poll with `util::eventually` there instead.
    pub fn wait_until(&self, timeout: Duration, mut f: impl FnMut(&Self) -> bool) -> bool {
        let end = Instant::now() + timeout;
        let mut wait = || loop {
            if f(self) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }
}

/// Reads a RESP line from a raw stream (used by [`monitor`]).
pub(crate) fn read_line(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end().to_owned()),
    }
}

/// Writes a RESP command to a raw stream.
pub(crate) fn write_command(s: &mut TcpStream, args: &[&str]) -> std::io::Result<()> {
    let mut buf = format!("*{}\r\n", args.len());
    for a in args {
        buf.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    s.write_all(buf.as_bytes())
}
