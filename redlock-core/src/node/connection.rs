//! A node's one cached multiplexed connection per Tokio runtime, and the
//! single background connection attempt shared by all its callers on that
//! runtime (`per_runtime.rs` says why per runtime).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Node;
use super::cluster::Conn;
use super::coalesce::{Home, NodeCoalescer, new_coalescer};
use super::native::{NativeCommands, NativeSupport, detect};
use crate::error::NodeError;
use crate::per_runtime::PerRuntime;

/// The shortest and the longest a background connection attempt may take (it
/// gets ten node timeouts within these bounds): long enough for a handshake over
/// a slow link that no single call could wait for, short enough that a node
/// which accepts connections but never answers is tried again soon.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a background connection attempt started by a call with `timeout`
/// may take.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(10)
        .min(MAX_CONNECT_TIMEOUT.max(timeout))
        .max(MIN_CONNECT_TIMEOUT)
}

/// How stale the time of a node's last answer may get before an answer
/// writes it again (see `Shared::stamp_answer`).
const STAMP_STEP: Duration = Duration::from_millis(1);
const STAMP_STEP_NS: u64 = STAMP_STEP.as_nanos() as u64;

/// A connection attempt's outcome, as its waiters see it: the connection and its
/// generation, or why it could not be made. `None` while it runs.
type Attempt = Option<Result<(u64, Conn), NodeError>>;

/// The connection calls use.
struct Cached {
    generation: u64,
    conn: Conn,
    /// The native commands found on this connection, asked right after it
    /// was opened (`None`: not known yet, or not looked for with
    /// [`NativeCommands::Off`]).
    native: Option<NativeSupport>,
}

/// The node's connection state, shared with the background connection attempt.
#[derive(Default)]
struct Slot {
    cached: Option<Cached>,
    /// The attempt under way, if any: its number, and where its outcome appears.
    connecting: Option<(u64, watch::Receiver<Attempt>)>,
    /// The number of the next attempt.
    next_attempt: u64,
    /// When a cluster connection was last set to be replaced in the
    /// background (see [`Node::forget_connection`]).
    replaced_at: Option<Instant>,
}

impl Slot {
    /// The cached connection and its generation, also put in `used`.
    fn cached(&self, used: &mut Option<u64>) -> Option<(u64, Conn)> {
        let c = self.cached.as_ref()?;
        *used = Some(c.generation);
        Some((c.generation, c.conn.clone()))
    }
}

/// A node's connections: one [`Shared`] per runtime.
#[derive(Default)]
pub(super) struct Connections {
    per_runtime: PerRuntime<Arc<Shared>>,
    /// The last generation given out, on any runtime: generations are unique
    /// across the node's connections.
    generations: Arc<AtomicU64>,
}

impl Connections {
    /// The current runtime's connection state (`None` outside a runtime).
    fn here(&self) -> Option<Arc<Shared>> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        Some(
            self.per_runtime
                .with(&rt, || Arc::new_cyclic(Shared::new), |s| Arc::clone(s)),
        )
    }
}

/// What a node's callers on one runtime and their background connection
/// attempt share.
pub(super) struct Shared {
    slot: Mutex<Slot>,
    /// Set each time a new connection replaces the cached one. Two calls with
    /// the same generation went over the same socket, so the node ran them in the
    /// order they were sent.
    generation: AtomicU64,
    /// When the node last answered anything on the newest connection (the
    /// handshake counts), in nanoseconds since `epoch`. A call that timed out
    /// with nothing answered since it started says the connection is dead;
    /// one that timed out while answers kept arriving says only that this
    /// call was slow (waiting for the reconnect or an `EVAL` fallback used up
    /// its time), and dropping the connection then would make the next call
    /// pay the handshake again. An atomic, not a field under `slot`: every
    /// answer writes it, from both worker threads.
    answered: AtomicU64,
    epoch: Instant,
    /// The node's coalescer on this runtime (`coalesce.rs`), made by the
    /// first call that takes part: kept here, so that a node call finds
    /// its connection and its coalescer by one lookup of its runtime.
    coalescer: OnceLock<Arc<NodeCoalescer>>,
    /// This value, for its coalescer's batches to note the node's answers.
    this: Weak<Shared>,
}

impl Home for Shared {
    fn coalescer(&self) -> &Arc<NodeCoalescer> {
        self.coalescer.get_or_init(|| {
            let home: Weak<dyn Home> = Weak::clone(&self.this) as Weak<Shared>;
            new_coalescer(home)
        })
    }

    fn answered_on(&self, generation: u64) {
        Shared::answered_on(self, generation);
    }
}

impl Shared {
    fn new(this: &Weak<Shared>) -> Self {
        Self {
            slot: Mutex::new(Slot::default()),
            generation: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            epoch: Instant::now(),
            coalescer: OnceLock::new(),
            this: Weak::clone(this),
        }
    }

    /// The node answered on connection `generation`: noted if that is the
    /// newest connection (see [`Node::answered`]).
    pub(super) fn answered_on(&self, generation: u64) {
        if self.generation.load(Ordering::SeqCst) == generation {
            self.stamp_answer();
        }
    }

    /// `at` in nanoseconds since `epoch`.
    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The node answered on the newest connection now. Every answer comes
    /// here, from every worker thread: the stamp is written only when it is
    /// [`STAMP_STEP`] old, so that under load its cache line is read by both
    /// threads instead of moving between them on every answer.
    fn stamp_answer(&self) {
        let now = self.since_epoch(Instant::now());
        if now.saturating_sub(self.answered.load(Ordering::Relaxed)) >= STAMP_STEP_NS {
            self.answered.store(now, Ordering::Relaxed);
        }
    }

    /// Whether the node answered nothing on the newest connection since
    /// `started`. The stamp may lag an answer by [`STAMP_STEP`], so an answer
    /// that late before `started` counts as after it: a dead connection is
    /// then dropped by the next call's timeout instead of this one's, and a
    /// live one is never dropped for the lag.
    fn silent_since(&self, started: Instant) -> bool {
        self.answered
            .load(Ordering::Relaxed)
            .saturating_add(STAMP_STEP_NS)
            < self.since_epoch(started)
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Node {
    /// The cached connection, if there is one, without waiting (see
    /// [`Node::connection`]), with this runtime's connection state.
    pub(super) fn cached_here(&self, used: &mut Option<u64>) -> Option<(Arc<Shared>, u64, Conn)> {
        let shared = self.shared.here()?;
        let (generation, conn) = shared.slot().cached(used)?;
        Some((shared, generation, conn))
    }

    /// This runtime's connection state (`None` outside a runtime).
    pub(super) fn shared_here(&self) -> Option<Arc<Shared>> {
        self.shared.here()
    }

    /// The cached connection, else the outcome of the connection attempt under
    /// way (starting one if there is none), with its generation, which is also
    /// put in `used` so that it is known after a timeout.
    pub(super) async fn connection(
        &self,
        timeout: Duration,
        used: &mut Option<u64>,
    ) -> Result<(u64, Conn), NodeError> {
        let shared = self.shared.here().ok_or_else(|| {
            NodeError::Connect("no Tokio runtime to run the connection attempt on".into())
        })?;
        let mut rx = {
            let mut slot = shared.slot();
            if let Some(cached) = slot.cached(used) {
                return Ok(cached);
            }
            match &slot.connecting {
                // A closed channel is an attempt whose task ended without an
                // outcome (a panic, or its runtime shut down): start another.
                Some((_, rx)) if rx.has_changed().is_ok() => rx.clone(),
                _ => self.start_connect(&shared, &mut slot, timeout)?,
            }
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone(),
            Err(_) => None,
        };
        match outcome {
            Some(Ok((generation, conn))) => {
                *used = Some(generation);
                Ok((generation, conn))
            }
            Some(Err(e)) => Err(e),
            None => Err(NodeError::Connect(
                "the connection attempt ended without an outcome (its task panicked, or its \
                 Tokio runtime shut down)"
                    .into(),
            )),
        }
    }

    /// Spawns a connection attempt on the current Tokio runtime and records it in
    /// `slot`. It caches its connection when done, whether or not anyone still
    /// waits for it.
    fn start_connect(
        &self,
        shared: &Arc<Shared>,
        slot: &mut Slot,
        timeout: Duration,
    ) -> Result<watch::Receiver<Attempt>, NodeError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            NodeError::Connect("no Tokio runtime to run the connection attempt on".into())
        })?;
        let id = slot.next_attempt;
        slot.next_attempt = slot.next_attempt.wrapping_add(1);
        let (tx, rx) = watch::channel(None);
        slot.connecting = Some((id, rx.clone()));
        let pool = self.pool.clone();
        let shared = Arc::clone(shared);
        let generations = Arc::clone(&self.shared.generations);
        let limit = connect_timeout(timeout);
        let look = self.native != NativeCommands::Off;
        runtime.spawn(async move {
            let result = match tokio::time::timeout(limit, pool.connect()).await {
                Ok(r) => r,
                Err(_) => Err(NodeError::Connect(format!(
                    "no connection within {limit:?}"
                ))),
            };
            let outcome = {
                let mut slot = shared.slot();
                if slot.connecting.as_ref().is_some_and(|(i, _)| *i == id) {
                    slot.connecting = None;
                }
                result.map(|conn| {
                    let generation = generations.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
                    shared.generation.store(generation, Ordering::SeqCst);
                    shared.stamp_answer();
                    slot.cached = Some(Cached {
                        generation,
                        conn: conn.clone(),
                        native: None,
                    });
                    (generation, conn)
                })
            };
            let asked = match (&outcome, look) {
                (Ok((generation, conn)), true) => Some((*generation, conn.clone())),
                _ => None,
            };
            // Nobody may be waiting any more; the connection is cached anyway.
            let _ = tx.send(Some(outcome));
            // Asked after the connection is handed out, so that no call waits
            // for it: until the answer, calls run the scripts.
            if let Some((generation, mut conn)) = asked {
                let found = tokio::time::timeout(limit, detect(&mut conn))
                    .await
                    .unwrap_or_default();
                let mut slot = shared.slot();
                if let Some(c) = slot.cached.as_mut()
                    && c.generation == generation
                    && c.native.is_none()
                {
                    c.native = Some(found);
                }
            }
        });
        Ok(rx)
    }

    /// The native commands found on connection `generation`, while it is the
    /// cached one (`None` when not looked for, or replaced meanwhile).
    pub(super) fn native_support(&self, generation: u64) -> Option<NativeSupport> {
        let shared = self.shared.here()?;
        let slot = shared.slot();
        slot.cached
            .as_ref()
            .filter(|c| c.generation == generation)
            .and_then(|c| c.native)
    }

    /// The native commands found on the current connection, if any is open
    /// and they were looked for.
    pub(crate) fn current_native_support(&self) -> Option<NativeSupport> {
        self.shared
            .here()?
            .slot()
            .cached
            .as_ref()
            .and_then(|c| c.native)
    }

    /// Connection `generation` refused a native command: the scripts run on it
    /// from now on.
    pub(super) fn forget_native(&self, generation: u64) {
        let Some(shared) = self.shared.here() else {
            return;
        };
        let mut slot = shared.slot();
        if let Some(c) = slot.cached.as_mut()
            && c.generation == generation
        {
            c.native = Some(NativeSupport::none());
        }
    }

    /// The node answered on connection `generation`: noted if that is the
    /// newest connection (the cached one, when there is one).
    pub(super) fn answered(&self, generation: u64) {
        if let Some(shared) = self.shared.here() {
            shared.answered_on(generation);
        }
    }

    /// After a call that started at `started` (with `timeout`) failed with
    /// `error` on connection `generation`: drops that connection if the error
    /// says it is broken, and only that one, never a newer connection that
    /// replaced it meanwhile. A timeout says it is broken only if the node has
    /// answered nothing on it since the call started.
    ///
    /// A cluster's connection is one connection per master, and one silent
    /// master says nothing of the others: it is not dropped. A new one is
    /// made in the background, at most once per background attempt's time
    /// limit (ten node timeouts, 1 s to 30 s), and replaces it when ready;
    /// meanwhile calls go on over the old one, whose other masters answer.
    /// That new connection reads the slot map afresh, so a master that went
    /// silent for good and was failed over is left behind even when no call
    /// is ever redirected away from it. (A new cluster connection waits for
    /// every master's handshake, and a stopped master's never comes: calls
    /// that waited for it failed on every slot.)
    pub(super) fn forget_connection(
        &self,
        error: &NodeError,
        generation: Option<u64>,
        started: Instant,
        timeout: Duration,
    ) {
        let (Some(generation), Some(shared)) = (generation, self.shared.here()) else {
            return;
        };
        let mut slot = shared.slot();
        let Some(c) = &slot.cached else {
            return;
        };
        if c.generation != generation {
            return;
        }
        let broken = match error {
            NodeError::Timeout(_) => shared.silent_since(started),
            other => other.breaks_connection(),
        };
        if !broken {
            return;
        }
        if matches!(c.conn, Conn::Cluster(_)) {
            let due = slot
                .replaced_at
                .is_none_or(|at| at.elapsed() >= connect_timeout(timeout));
            if slot.connecting.is_none() && due {
                slot.replaced_at = Some(Instant::now());
                // No runtime to spawn on: nothing is replaced, the old
                // connection stays.
                let _ = self.start_connect(&shared, &mut slot, timeout);
            }
            return;
        }
        slot.cached = None;
    }
}

/// Gives rustls a process-level crypto provider before the first TLS handshake:
/// redis builds its TLS configuration with `ClientConfig::builder()`, which
/// panics when no provider was installed and the crate features do not name
/// exactly one. An application that installed its own keeps it.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first; any installed provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
