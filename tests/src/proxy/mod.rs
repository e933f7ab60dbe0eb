//! A fault-injecting TCP proxy, placed in front of one Redis node.
//!
//! The Redlock client connects to the proxy; the proxy forwards each connection
//! to the node, and its faults can be switched at runtime:
//!
//! * latency and jitter, per direction. Delaying the **request** makes the
//!   command run late; delaying the **reply** means the command ran but the
//!   client cannot know it did;
//! * hold, then flush, per direction: bytes are kept until [`FaultProxy::flush`]
//!   and then delivered in order (a paused network path, a command that runs
//!   after its client gave up);
//! * blackhole: accept, never answer. Like a real black hole, a connection that
//!   lost a byte never delivers another one (TCP never skips a segment), and it is
//!   reset when the fault heals, as a retransmission timeout would;
//! * reset: every open connection is closed with an RST;
//! * refuse: the listening socket is closed, so new connections are refused
//!   (`ECONNREFUSED`), and reopened on the same port when the fault ends.
//!
//! It also reports every lock token it sees in a request (a 32-hex-digit bulk
//! string), with the time it read it, so the validity checker knows when a token
//! was on the wire ([`crate::history::Event::Sighting`]).
//!
//! Why not a crate: the maintained option, Toxiproxy, is a Go server (not on the
//! machine), and its Rust port `noxious` (last release 2021) has neither hold and
//! flush nor the all-or-nothing blackhole; neither can report tokens on the wire.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle};

use crate::history::{Event, HistoryLog, now_ns};

mod tokens;
use tokens::scan_tokens;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to node: commands.
    Request,
    /// Node to client: replies.
    Reply,
}

/// What happens to the bytes of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flow {
    /// Delivered (after the latency).
    #[default]
    Pass,
    /// Kept until the flow is set back to `Pass`, then delivered in order.
    Hold,
    /// Dropped; the connection never delivers anything again.
    Blackhole,
}

/// The fault of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirFault {
    /// Added to every chunk.
    pub latency: Duration,
    /// A uniform random extra in `0..jitter` (order is kept).
    pub jitter: Duration,
    /// Pass, hold or blackhole.
    pub flow: Flow,
}

impl DirFault {
    fn is_clear(&self) -> bool {
        *self == DirFault::default()
    }
}

#[derive(Debug, Clone, Default)]
struct Config {
    request: DirFault,
    reply: DirFault,
    refuse: bool,
    shutdown: bool,
    /// Requests of the connections numbered below this are held (set by
    /// [`FaultProxy::hold_open_requests`]); later connections pass.
    hold_requests_below: Option<u64>,
}

impl Config {
    fn dir(&self, d: Direction) -> DirFault {
        match d {
            Direction::Request => self.request,
            Direction::Reply => self.reply,
        }
    }

    fn dir_mut(&mut self, d: Direction) -> &mut DirFault {
        match d {
            Direction::Request => &mut self.request,
            Direction::Reply => &mut self.reply,
        }
    }
}

/// Counters of one proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections that could not reach the node (closed at once).
    pub upstream_failures: u64,
    /// Connections reset by [`FaultProxy::reset`] or by healing a blackhole.
    pub resets: u64,
    /// Chunks dropped by a blackhole.
    pub dropped_chunks: u64,
    /// Tokens seen in requests.
    pub sightings: u64,
}

struct ConnEntry {
    abort: AbortHandle,
    poisoned: Arc<AtomicBool>,
}

struct Shared {
    id: usize,
    addr: SocketAddr,
    /// The node's port on 127.0.0.1 ([`FaultProxy::retarget`] moves it).
    upstream: AtomicU16,
    cfg: watch::Sender<Config>,
    conns: Mutex<HashMap<u64, ConnEntry>>,
    next_conn: AtomicU64,
    log: Option<HistoryLog>,
    accepted: AtomicU64,
    upstream_failures: AtomicU64,
    resets: AtomicU64,
    dropped: AtomicU64,
    sightings: AtomicU64,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ConnEntry>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A TCP proxy on 127.0.0.1 in front of one node, with switchable faults.
///
/// Its tasks run on the Tokio runtime that started it; dropping the proxy stops
/// them and closes every connection.
pub struct FaultProxy {
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("id", &self.shared.id)
            .field("port", &self.port())
            .field("upstream", &self.upstream_port())
            .field("config", &*self.shared.cfg.borrow())
            .finish()
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = TcpSocket::new_v4()?;
    // Accepted sockets inherit SO_REUSEADDR, so the port can be bound again after
    // a refusal while old connections on it are still open.
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `127.0.0.1:upstream_port`.
    /// Token sightings go to `log`, tagged with `id`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(
        id: usize,
        upstream_port: u16,
        log: Option<HistoryLog>,
    ) -> std::io::Result<Self> {
        let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let (cfg, _) = watch::channel(Config::default());
        let shared = Arc::new(Shared {
            id,
            addr,
            upstream: AtomicU16::new(upstream_port),
            cfg,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            log,
            accepted: AtomicU64::new(0),
            upstream_failures: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            sightings: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(Arc::clone(&shared), listener));
        Ok(Self { shared, accept })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.shared.addr.port()
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// The node's port.
    pub fn upstream_port(&self) -> u16 {
        self.shared.upstream.load(Ordering::SeqCst)
    }

    /// Points the proxy at the node on `upstream_port` (a failover endpoint
    /// moving to the promoted replica): new connections go there, and every
    /// open one is reset, as the old node's would be. Returns how many.
    pub fn retarget(&self, upstream_port: u16) -> usize {
        self.shared.upstream.store(upstream_port, Ordering::SeqCst);
        self.reset()
    }

    /// Sets the fault of one direction.
    pub fn set(&self, dir: Direction, fault: DirFault) {
        self.shared.cfg.send_modify(|c| *c.dir_mut(dir) = fault);
    }

    /// Adds `latency` plus up to `jitter` to one direction.
    pub fn delay(&self, dir: Direction, latency: Duration, jitter: Duration) {
        self.shared.cfg.send_modify(|c| {
            let d = c.dir_mut(dir);
            d.latency = latency;
            d.jitter = jitter;
        });
    }

    /// Holds one direction's bytes until [`FaultProxy::flush`].
    pub fn hold(&self, dir: Direction) {
        self.shared
            .cfg
            .send_modify(|c| c.dir_mut(dir).flow = Flow::Hold);
    }

    /// Holds the requests of the connections open now, until
    /// [`FaultProxy::flush`]; connections opened later pass. A command sent on
    /// an old connection then runs after one sent later on a new connection
    /// (a reconnect, or another runtime's connection to the same node).
    pub fn hold_open_requests(&self) {
        let below = self.shared.next_conn.load(Ordering::Relaxed);
        self.shared
            .cfg
            .send_modify(|c| c.hold_requests_below = Some(below));
    }

    /// Delivers every held byte, in order, and stops holding.
    pub fn flush(&self) {
        self.shared.cfg.send_modify(|c| {
            c.hold_requests_below = None;
            for d in [Direction::Request, Direction::Reply] {
                if c.dir(d).flow == Flow::Hold {
                    c.dir_mut(d).flow = Flow::Pass;
                }
            }
        });
    }

    /// Blackholes both directions: connections are accepted, nothing is answered.
    pub fn blackhole(&self) {
        self.shared.cfg.send_modify(|c| {
            c.request.flow = Flow::Blackhole;
            c.reply.flow = Flow::Blackhole;
        });
    }

    /// Refuses new connections (`on`), or accepts them again.
    pub fn refuse(&self, on: bool) {
        self.shared.cfg.send_modify(|c| c.refuse = on);
    }

    /// Resets every open connection (RST to the client). Returns how many.
    pub fn reset(&self) -> usize {
        self.reset_where(|_| true)
    }

    fn reset_where(&self, f: impl Fn(&ConnEntry) -> bool) -> usize {
        let mut conns = self.shared.conns();
        let ids: Vec<u64> = conns
            .iter()
            .filter(|(_, e)| !e.abort.is_finished() && f(e))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(e) = conns.remove(id) {
                e.abort.abort();
            }
        }
        self.shared
            .resets
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        ids.len()
    }

    /// Clears every fault: held bytes are delivered, latency goes, the port
    /// accepts again, and blackholed connections are reset.
    pub fn heal(&self) {
        self.shared.cfg.send_modify(|c| {
            c.request = DirFault::default();
            c.reply = DirFault::default();
            c.refuse = false;
            c.hold_requests_below = None;
        });
        self.reset_where(|e| e.poisoned.load(Ordering::Acquire));
    }

    /// Whether any fault is set.
    pub fn is_faulty(&self) -> bool {
        let c = self.shared.cfg.borrow();
        c.refuse || !c.request.is_clear() || !c.reply.is_clear() || c.hold_requests_below.is_some()
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.shared
            .conns()
            .values()
            .filter(|e| !e.abort.is_finished())
            .count()
    }

    /// The counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            upstream_failures: s.upstream_failures.load(Ordering::Relaxed),
            resets: s.resets.load(Ordering::Relaxed),
            dropped_chunks: s.dropped.load(Ordering::Relaxed),
            sightings: s.sightings.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.cfg.send_modify(|c| c.shutdown = true);
        self.accept.abort();
        for (_, e) in self.shared.conns().drain() {
            e.abort.abort();
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, first: TcpListener) {
    let mut rx = shared.cfg.subscribe();
    let mut listener = Some(first);
    loop {
        let (refuse, shutdown) = {
            let c = rx.borrow_and_update();
            (c.refuse, c.shutdown)
        };
        if shutdown {
            return;
        }
        if refuse {
            // Closing the listening socket refuses new connections (and resets
            // those still in its backlog).
            listener = None;
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match listen(shared.addr) {
                Ok(l) => l,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            r = l.accept() => {
                if let Ok((s, _)) = r {
                    spawn_conn(&shared, s);
                }
            }
            c = rx.changed() => {
                if c.is_err() {
                    return;
                }
            }
        }
        listener = Some(l);
    }
}

fn spawn_conn(shared: &Arc<Shared>, client: TcpStream) {
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    // Closing an aborted connection sends an RST. Linger 0 never blocks.
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let poisoned = Arc::new(AtomicBool::new(false));
    let mut conns = shared.conns();
    let task = tokio::spawn(run_conn(
        Arc::clone(shared),
        client,
        Arc::clone(&poisoned),
        id,
    ));
    conns.insert(
        id,
        ConnEntry {
            abort: task.abort_handle(),
            poisoned,
        },
    );
}

async fn run_conn(shared: Arc<Shared>, client: TcpStream, poisoned: Arc<AtomicBool>, id: u64) {
    let upstream = match tokio::time::timeout(
        Duration::from_secs(1),
        TcpStream::connect(SocketAddr::from((
            [127, 0, 0, 1],
            shared.upstream.load(Ordering::SeqCst),
        ))),
    )
    .await
    {
        Ok(Ok(s)) => s,
        _ => {
            // The node is down: the client's connection is reset.
            shared.upstream_failures.fetch_add(1, Ordering::Relaxed);
            drop(client);
            shared.conns().remove(&id);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    tokio::join!(
        pump(&shared, (Direction::Request, id), cr, uw, &poisoned),
        pump(&shared, (Direction::Reply, id), ur, cw, &poisoned),
    );
    shared.conns().remove(&id);
}

enum Chunk {
    Data(Vec<u8>, Instant),
    Close(Instant),
}

async fn pump(
    shared: &Shared,
    (dir, conn): (Direction, u64),
    mut reader: OwnedReadHalf,
    mut writer: OwnedWriteHalf,
    poisoned: &AtomicBool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut carry = Vec::new();
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Chunk::Close(Instant::now()));
                    return;
                }
                Ok(n) => {
                    let at = now_ns();
                    let read_at = Instant::now();
                    if dir == Direction::Request {
                        for token in scan_tokens(&mut carry, &buf[..n]) {
                            shared.sightings.fetch_add(1, Ordering::Relaxed);
                            if let Some(log) = &shared.log {
                                log.push(Event::Sighting {
                                    proxy: shared.id,
                                    token,
                                    at,
                                });
                            }
                        }
                    }
                    if tx.send(Chunk::Data(buf[..n].to_vec(), read_at)).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let write = async move {
        let mut cfg = shared.cfg.subscribe();
        let mut last_due = Instant::now();
        while let Some(chunk) = rx.recv().await {
            let read_at = match &chunk {
                Chunk::Data(_, t) | Chunk::Close(t) => *t,
            };
            let sample: f64 = rand::rng().random();
            loop {
                if poisoned.load(Ordering::Acquire) {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                let f = {
                    let c = cfg.borrow_and_update();
                    let mut f = c.dir(dir);
                    if dir == Direction::Request && c.hold_requests_below.is_some_and(|b| conn < b)
                    {
                        f.flow = Flow::Hold;
                    }
                    f
                };
                match f.flow {
                    Flow::Blackhole => {
                        poisoned.store(true, Ordering::Release);
                        shared.dropped.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Flow::Hold => {
                        if cfg.changed().await.is_err() {
                            return;
                        }
                    }
                    Flow::Pass => {
                        let due = (read_at + f.latency + f.jitter.mul_f64(sample)).max(last_due);
                        if due > Instant::now() {
                            tokio::select! {
                                () = tokio::time::sleep_until(due.into()) => {}
                                c = cfg.changed() => {
                                    if c.is_err() {
                                        return;
                                    }
                                    continue;
                                }
                            }
                        }
                        last_due = due;
                        match &chunk {
                            Chunk::Data(bytes, _) => {
                                if writer.write_all(bytes).await.is_err() {
                                    return;
                                }
                            }
                            Chunk::Close(_) => {
                                let _ = writer.shutdown().await;
                                return;
                            }
                        }
                        break;
                    }
                }
            }
        }
    };
    tokio::join!(read, write);
}
