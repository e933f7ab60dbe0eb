//! The Redlock algorithm: acquire, extend and release on N independent masters.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deadpool_redis::Pool;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use rand::Rng;
use redis::Value;
use tracing::Instrument;

use crate::config::{RedlockBuilder, RetryPolicy, Settings};
use crate::error::{Error, NodeError, NodeOutcome, NodeStatus, Report};
use crate::node::{AcquireReply, Call, EXTEND, Node, RELEASE, parse_acquire, parse_flag};

pub(crate) struct Inner {
    pub(crate) nodes: Vec<Node>,
    pub(crate) quorum: usize,
    pub(crate) settings: Settings,
}

impl Inner {
    pub(crate) fn new(nodes: Vec<Node>, settings: Settings) -> Self {
        Self {
            quorum: quorum(nodes.len()),
            nodes,
            settings,
        }
    }
}

/// A handle to N independent Redis masters that hands out Redlock locks.
///
/// Cheap to clone (one `Arc`), `Send + Sync`: build it once at start-up and share
/// it. Every call talks to all nodes at once and returns as soon as the outcome is
/// decided.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::Redlock;
///
/// # async fn run() -> Result<(), redlock_core::Error> {
/// let redlock = Redlock::from_urls(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = redlock.lock("invoice:42", Duration::from_secs(5)).await?;
/// // ... at most one holder at a time runs here, for lock.remaining() ...
/// redlock.unlock(lock).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<&str> = self.inner.nodes.iter().map(|n| &*n.label).collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("quorum", &self.inner.quorum)
            .field("settings", &self.inner.settings)
            .finish()
    }
}

/// What [`Redlock::check_nodes`] learned about one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node's label.
    pub node: Arc<str>,
    /// The server's `run_id`, unique per server process.
    pub run_id: Option<String>,
    /// The server's `redis_version`.
    pub version: Option<String>,
    /// The error, if the node did not answer.
    pub error: Option<NodeError>,
}

/// One node's settled answer within a fan-out.
pub(crate) struct Settled<T> {
    index: usize,
    latency: Duration,
    /// The node's connection generation when the call was sent.
    generation: u64,
    result: Result<T, NodeError>,
}

/// Acquire answers still on their way when the outcome was decided.
pub(crate) type Stragglers = FuturesUnordered<NodeFuture<AcquireReply>>;

/// What the task that drives [`Stragglers`] needs to know about the lock.
#[derive(Default)]
pub(crate) struct Late {
    /// Set when the lock is released (or the attempt failed): a late `OK` must not
    /// outlive it.
    abandoned: AtomicBool,
    /// Set when the release was sent to every node, pending ones included. A late
    /// `OK` is then already covered if it used the connection the release used.
    released_everywhere: AtomicBool,
}

/// One node's call, boxed.
pub(crate) type NodeFuture<T> = Pin<Box<dyn Future<Output = Settled<T>> + Send>>;

/// The quorum of `n` nodes: a strict majority, `n / 2 + 1`.
pub(crate) fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Spec step 3: the validity left to the holder, `ttl - elapsed - drift` with
/// `drift = ttl * drift_factor + fixed_drift`. `None` when nothing is left, which
/// fails the attempt.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, s: &Settings) -> Option<Duration> {
    // The keys live for whole milliseconds (`PX`/`PEXPIRE` take an integer): the
    // sub-millisecond rest of `ttl` is not on the nodes.
    let ttl = whole_millis(ttl);
    let drift = ttl.mul_f64(s.drift_factor).saturating_add(s.fixed_drift);
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// `start + d`, for a `d` that may be as large as `Duration::MAX` (a TTL bound
/// the user lifted): past what an `Instant` can hold it is a century, which is
/// "never" for a lock.
pub(crate) fn instant_after(start: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    start
        .checked_add(d)
        .or_else(|| start.checked_add(CENTURY))
        .unwrap_or(start)
}

/// `d` rounded down to whole milliseconds: what a key set with `PX`/`PEXPIRE`
/// of `d.as_millis()` actually lives.
pub(crate) fn whole_millis(d: Duration) -> Duration {
    Duration::new(d.as_secs(), d.subsec_millis() * 1_000_000)
}

/// Spec step 1: a fresh token of 128 bits from the OS CSPRNG, hex-encoded. A new
/// one for every attempt, so a late reply to an old attempt can never be taken for
/// the current one.
pub(crate) fn new_token() -> Result<Arc<str>, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::InvalidConfig(format!("OS random source failed: {e}")))?;
    let mut hex = String::with_capacity(32);
    for b in bytes {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        hex.push(DIGITS[usize::from(b >> 4)] as char);
        hex.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    Ok(hex.into())
}

/// Spec step 5 ("retry after a random delay"): `delay + uniform(0..=jitter)`.
pub(crate) fn retry_delay(policy: &RetryPolicy) -> Duration {
    let jitter_us = u64::try_from(policy.jitter.as_micros()).unwrap_or(u64::MAX);
    let extra = if jitter_us == 0 {
        0
    } else {
        rand::rng().random_range(0..=jitter_us)
    };
    policy.delay.saturating_add(Duration::from_micros(extra))
}

/// When a quorum could be free: the nodes not held by others are free at once, so
/// `busy - (n - quorum)` holders' keys (at least one) must expire first; the wait
/// is that many-th smallest PTTL. `None` when keys without expiry are in the way.
fn busy_retry_after(
    pttls: &mut [Duration],
    busy: usize,
    n: usize,
    quorum: usize,
) -> Option<Duration> {
    let needed = busy.saturating_sub(n - quorum).max(1);
    pttls.sort_unstable();
    pttls.get(needed - 1).copied()
}

impl Redlock {
    /// A handle over these pools, one per independent Redis master, with the
    /// default settings. Use [`Redlock::builder`] for the rest.
    ///
    /// # Errors
    /// [`Error::NoNodes`] for an empty list.
    pub fn new(pools: impl IntoIterator<Item = Pool>) -> Result<Self, Error> {
        pools
            .into_iter()
            .fold(RedlockBuilder::new(), RedlockBuilder::pool)
            .build()
    }

    /// A handle over these node URLs with the default settings.
    ///
    /// # Errors
    /// See [`RedlockBuilder::build`].
    pub fn from_urls<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder::new().urls(urls).build()
    }

    /// A builder for the nodes and the settings.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::new()
    }

    pub(crate) fn from_inner(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// How many nodes this handle talks to.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.inner.settings.node_timeout
    }

    /// The default loss margin of a [`LockGuard`](crate::LockGuard): how long
    /// before the end of its validity the holder is told the lock is lost.
    pub fn loss_margin(&self) -> Duration {
        self.inner
            .settings
            .loss_margin
            .unwrap_or(self.inner.settings.node_timeout)
    }

    /// The smallest TTL this handle accepts.
    pub(crate) fn min_ttl(&self) -> Duration {
        self.inner.settings.min_ttl
    }

    /// The default retry policy of [`Redlock::lock`].
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.settings.retry
    }

    /// The Redis key used for `resource`: the key prefix, then the resource.
    pub fn key_for(&self, resource: &str) -> String {
        format!("{}{}", self.inner.settings.key_prefix, resource)
    }

    /// Connects to every node, reads `INFO server`, and refuses the same server
    /// listed twice (same `run_id`). Nodes that do not answer are reported, not
    /// refused: Redlock is built to run with a minority down.
    ///
    /// # Errors
    /// [`Error::DuplicateNode`] with `by: "run_id"`.
    pub async fn check_nodes(&self) -> Result<Vec<NodeInfo>, Error> {
        let cmd = {
            let mut c = redis::cmd("INFO");
            c.arg("server");
            c
        };
        let timeout = self
            .inner
            .settings
            .node_timeout
            .max(Duration::from_millis(500));
        let infos: Vec<NodeInfo> =
            futures_util::future::join_all(self.inner.nodes.iter().map(|node| {
                let cmd = &cmd;
                async move {
                    let mut info = NodeInfo {
                        node: node.label.clone(),
                        run_id: None,
                        version: None,
                        error: None,
                    };
                    match node.query(cmd, timeout).await {
                        Ok(v) => {
                            let text = match v {
                                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                                Value::VerbatimString { text, .. } => text,
                                other => format!("{other:?}"),
                            };
                            let field = |name: &str| {
                                text.lines()
                                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                                    .map(|v| v.trim().to_owned())
                            };
                            info.run_id = field("run_id");
                            info.version = field("redis_version");
                        }
                        Err(e) => info.error = Some(e),
                    }
                    info
                }
            }))
            .await;
        for (i, a) in infos.iter().enumerate() {
            if let Some(b) = infos[..i]
                .iter()
                .find(|b| b.run_id.is_some() && b.run_id == a.run_id)
            {
                return Err(Error::DuplicateNode {
                    first: b.node.clone(),
                    second: a.node.clone(),
                    by: "run_id",
                });
            }
        }
        Ok(infos)
    }

    fn check_resource(resource: &str) -> Result<(), Error> {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        Ok(())
    }

    /// Spec input checks: the TTL is in bounds and longer than the node timeout.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), Error> {
        let s = &self.inner.settings;
        // Under 1 ms the keys would get `PX 0` / `PEXPIRE 0`, which deletes them.
        if whole_millis(ttl).is_zero() || ttl < s.min_ttl || ttl > s.max_ttl {
            return Err(Error::InvalidTtl {
                ttl,
                min: s.min_ttl,
                max: s.max_ttl,
            });
        }
        if s.node_timeout >= ttl {
            return Err(Error::NodeTimeoutTooLong {
                node_timeout: s.node_timeout,
                ttl,
            });
        }
        Ok(())
    }

    /// One attempt to take the lock (no retry).
    ///
    /// # Errors
    /// [`Error::Busy`] when another holder has it, [`Error::NoQuorum`] when too
    /// many nodes failed, [`Error::NoValidity`] when the quorum came too late, or
    /// an input error.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        self.lock_with(resource, ttl, &RetryPolicy::no_retry())
            .await
    }

    /// Takes the lock, retrying failed attempts per the handle's retry policy.
    ///
    /// # Errors
    /// The last attempt's error once the policy gives up; see [`Redlock::try_lock`].
    pub async fn lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        self.lock_with(resource, ttl, &self.inner.settings.retry)
            .await
    }

    /// Takes the lock, retrying failed attempts per `retry`.
    ///
    /// # Errors
    /// See [`Redlock::lock`].
    pub async fn lock_with(
        &self,
        resource: &str,
        ttl: Duration,
        retry: &RetryPolicy,
    ) -> Result<Lock, Error> {
        Self::check_resource(resource)?;
        self.check_ttl(ttl)?;
        let resource: Arc<str> = resource.into();
        let key: Arc<str> = self.key_for(&resource).into();
        let begin = Instant::now();
        // The last attempt must be able to finish inside the deadline: its acquire
        // round and, if it fails, the release round of the failed attempt. A
        // deadline past the end of time is no deadline.
        let latest_start = retry
            .deadline
            .and_then(|d| begin.checked_add(d))
            .map(|end| {
                end.checked_sub(self.inner.settings.node_timeout.saturating_mul(2))
                    .unwrap_or(begin)
            });
        let mut attempt = 1;
        loop {
            let err = match self.attempt(&resource, &key, ttl, attempt).await {
                Ok(lock) => return Ok(lock),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => e,
            };
            if attempt >= retry.max_attempts {
                return Err(err);
            }
            let now = Instant::now();
            if latest_start.is_some_and(|latest| now >= latest) {
                return Err(err);
            }
            let wake = now.checked_add(retry_delay(retry));
            let wake = match (wake, latest_start) {
                (Some(w), Some(l)) => Some(w.min(l)),
                (w, l) => w.or(l),
            };
            match wake {
                Some(wake) => tokio::time::sleep_until(wake.into()).await,
                // A delay past the end of time: no attempt will ever follow.
                None => return Err(err),
            }
            attempt += 1;
        }
    }

    /// Spec step 2: sends `call` to the given nodes at once, each under the node
    /// timeout. Each node's future is boxed once, so the set only moves pointers.
    fn fan_out<T>(
        &self,
        call: &Arc<Call>,
        parse: fn(Value) -> Result<T, NodeError>,
        nodes: impl Iterator<Item = usize>,
    ) -> FuturesUnordered<NodeFuture<T>>
    where
        T: Send + 'static,
    {
        let timeout = self.inner.settings.node_timeout;
        nodes
            .map(|index| {
                let inner = Arc::clone(&self.inner);
                let call = Arc::clone(call);
                Box::pin(async move {
                    let node = &inner.nodes[index];
                    let generation = node.generation();
                    let (result, latency) = node.run(&call, timeout).await;
                    Settled {
                        index,
                        latency,
                        generation,
                        result: result.and_then(parse),
                    }
                }) as NodeFuture<T>
            })
            .collect()
    }

    /// Collects answers until `decided` says the outcome is known. Nodes that have
    /// not answered by then stay in `pending`.
    async fn settle<T, F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        mut decided: impl FnMut(&Settled<T>) -> bool,
    ) -> Vec<Option<Settled<T>>>
    where
        F: Future<Output = Settled<T>>,
    {
        let mut out: Vec<Option<Settled<T>>> = (0..self.inner.nodes.len()).map(|_| None).collect();
        while let Some(s) = pending.next().await {
            let done = decided(&s);
            let index = s.index;
            if let Some(slot) = out.get_mut(index) {
                *slot = Some(s);
            }
            if done {
                break;
            }
        }
        out
    }

    fn report<T>(
        &self,
        settled: &[Option<Settled<T>>],
        status: impl Fn(&T) -> NodeStatus,
    ) -> Report {
        Report {
            nodes: settled
                .iter()
                .enumerate()
                .map(|(index, s)| NodeOutcome {
                    index,
                    node: self.inner.nodes[index].label.clone(),
                    latency: s.as_ref().map_or(Duration::ZERO, |s| s.latency),
                    status: match s {
                        None => NodeStatus::Pending,
                        Some(Settled { result: Ok(v), .. }) => status(v),
                        Some(Settled { result: Err(e), .. }) => NodeStatus::Failed(e.clone()),
                    },
                })
                .collect(),
        }
    }

    /// One acquire attempt: spec steps 1 to 4.
    async fn attempt(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: Duration,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let span = tracing::debug_span!(
            "redlock.acquire",
            resource = %resource,
            attempt,
            ttl_ms = ttl.as_millis() as u64,
            elapsed_us = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
            ok = tracing::field::Empty,
        );
        async {
            let token = new_token()?;
            let call = Arc::new(Call::acquire(key, &token, ttl.as_millis()));
            let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
            let start = Instant::now();
            let mut pending = self.fan_out(&call, parse_acquire, 0..n);
            let mut cleanup = ReleaseOnDrop {
                redlock: self,
                key: Arc::clone(key),
                token: Arc::clone(&token),
                armed: true,
            };
            let (mut ok, mut not_ok) = (0, 0);
            let settled = self
                .settle(&mut pending, |s| {
                    if matches!(s.result, Ok(AcquireReply::Acquired)) {
                        ok += 1;
                    } else {
                        not_ok += 1;
                    }
                    ok >= q || n - not_ok < q
                })
                .await;
            let elapsed = start.elapsed();
            let validity = validity(ttl, elapsed, &self.inner.settings);
            let late = (!pending.is_empty()).then(|| Arc::new(Late::default()));
            let span = tracing::Span::current();
            span.record("elapsed_us", elapsed.as_micros() as u64);
            span.record("ok", ok);

            if let (true, Some(validity)) = (ok >= q, validity) {
                span.record("validity_ms", validity.as_millis() as u64);
                tracing::debug!(report = %self.report(&settled, acquire_status), "acquired");
                // From here the `Lock` (and its `Drop`) owns the release.
                cleanup.armed = false;
                let late = self.drive_stragglers(pending, late, key, &token);
                return Ok(Lock {
                    redlock: self.clone(),
                    resource: Arc::clone(resource),
                    key: Arc::clone(key),
                    token,
                    started: start,
                    valid_until: instant_after(start, elapsed.saturating_add(validity)),
                    ttl,
                    extensions: 0,
                    late,
                    released: false,
                });
            }

            // Spec step 4: a failed attempt is released wherever it may have landed:
            // now on the nodes that answered, and on the others as their answers come.
            if let Some(late) = &late {
                late.abandoned.store(true, Ordering::SeqCst);
            }
            self.drive_stragglers(pending, late, key, &token);
            let report = self.report(&settled, acquire_status);
            self.unlock_all(key, &token, Some(&report)).await;
            cleanup.armed = false;
            tracing::debug!(report = %report, "attempt failed");
            Err(self.acquire_error(resource, ok, elapsed, ttl, report))
        }
        .instrument(span)
        .await
    }

    fn acquire_error(
        &self,
        resource: &Arc<str>,
        ok: usize,
        elapsed: Duration,
        ttl: Duration,
        report: Report,
    ) -> Error {
        let q = self.inner.quorum;
        if ok >= q {
            return Error::NoValidity {
                resource: Arc::clone(resource),
                elapsed,
                ttl,
            };
        }
        let mut busy: Vec<Duration> = Vec::new();
        let mut busy_count = 0;
        for n in &report.nodes {
            if let NodeStatus::Busy { pttl } = n.status {
                busy_count += 1;
                busy.extend(pttl);
            }
        }
        // Busy when the other holders alone make a quorum impossible, or when the
        // nodes that answered (ours and theirs) make one: the backend is up.
        if ok + busy_count >= q || self.inner.nodes.len() - busy_count < q {
            Error::Busy {
                resource: Arc::clone(resource),
                retry_after: busy_retry_after(&mut busy, busy_count, self.inner.nodes.len(), q),
                report,
            }
        } else {
            Error::NoQuorum {
                resource: Arc::clone(resource),
                ok,
                quorum: q,
                report,
            }
        }
    }

    /// Drives the acquire answers that came after the outcome was decided, in a
    /// background task. A late `OK` joins the lock and is released with it; once
    /// the lock is released (or the attempt failed), a late `OK` is released again
    /// unless the release already followed it on the same connection. A late error
    /// is released too, in case the `SET` ran.
    fn drive_stragglers(
        &self,
        mut pending: Stragglers,
        late: Option<Arc<Late>>,
        key: &Arc<str>,
        token: &Arc<str>,
    ) -> Option<Arc<Late>> {
        let late = late?;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Some(late);
        };
        let (this, state, key, token) = (
            self.clone(),
            Arc::clone(&late),
            Arc::clone(key),
            Arc::clone(token),
        );
        rt.spawn(async move {
            while let Some(s) = pending.next().await {
                if matches!(
                    s.result,
                    Ok(AcquireReply::Busy { .. }) | Err(NodeError::WrongType { .. })
                ) || !state.abandoned.load(Ordering::SeqCst)
                {
                    continue;
                }
                let covered = state.released_everywhere.load(Ordering::SeqCst)
                    && this.inner.nodes[s.index].generation() == s.generation;
                if !covered {
                    this.release_on(s.index, &key, &token).await;
                }
            }
        });
        Some(late)
    }

    /// A background release of one node's late key. Nobody waits on it, so it
    /// gets a longer timeout than a call on the hot path, and one retry: a key it
    /// fails to delete blocks the resource for a whole TTL.
    async fn release_on(&self, index: usize, key: &Arc<str>, token: &Arc<str>) {
        let call = Call::script(&RELEASE, Arc::clone(key), vec![token.to_string()]);
        let timeout = self.inner.settings.node_timeout.saturating_mul(4);
        for attempt in 1..=2 {
            let (result, _) = self.inner.nodes[index].run(&call, timeout).await;
            tracing::debug!(node = %self.inner.nodes[index].label, attempt, ?result, "late release");
            if result.is_ok() {
                break;
            }
        }
    }

    /// Spec step 5 ("release the lock"): compare-and-delete on every node at once.
    /// With a `report` from a failed acquire, nodes that answered "busy" are
    /// skipped (they refused the `SET`, so they never stored this token), and so
    /// are nodes that have not answered yet (their answer is released when it
    /// comes, see [`Redlock::drive_stragglers`]), so a failure returns at once.
    /// Returns the keys deleted and every node's outcome.
    pub(crate) async fn unlock_all(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        acquired: Option<&Report>,
    ) -> (usize, Report) {
        let skip = |i: usize| {
            acquired.is_some_and(|r| {
                matches!(
                    r.nodes[i].status,
                    NodeStatus::Busy { .. }
                        | NodeStatus::Pending
                        | NodeStatus::Failed(NodeError::WrongType { .. })
                )
            })
        };
        if (0..self.inner.nodes.len()).all(skip) {
            return (0, Report::default());
        }
        let call = Arc::new(Call::script(
            &RELEASE,
            Arc::clone(key),
            vec![token.to_string()],
        ));
        let mut pending = self.fan_out(
            &call,
            parse_flag,
            (0..self.inner.nodes.len()).filter(|&i| !skip(i)),
        );
        let mut settled = self.settle(&mut pending, |_| false).await;
        for s in settled.iter_mut().flatten() {
            // A foreign non-string value at the key is not ours to delete.
            if matches!(s.result, Err(NodeError::WrongType { .. })) {
                s.result = Ok(false);
            }
        }
        let deleted = settled
            .iter()
            .flatten()
            .filter(|s| matches!(s.result, Ok(true)))
            .count();
        (
            deleted,
            self.report(&settled, |&d| {
                if d {
                    NodeStatus::Ok
                } else {
                    NodeStatus::NotHeld
                }
            }),
        )
    }

    /// Releases `lock` on every node (spec step 5). Returns how many keys were
    /// deleted: fewer than the quorum means some had already expired.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when a node failed; its key expires with the TTL.
    pub async fn unlock(&self, lock: Lock) -> Result<usize, Error> {
        lock.unlock().await
    }

    /// Extends `lock` to a fresh `ttl` on every node (compare-and-pexpire).
    ///
    /// # Errors
    /// See [`Lock::extend`].
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        lock.extend(ttl).await
    }
}

/// Releases an attempt's keys on every node if the attempt's future is dropped
/// before it returns: a caller that goes away mid-acquire (a client gone while
/// its request waits, a timeout around `lock`) must not leave a lock that nobody
/// holds for a whole TTL. The release goes over the same per-node connections as
/// the `SET`s, after them.
struct ReleaseOnDrop<'a> {
    redlock: &'a Redlock,
    key: Arc<str>,
    token: Arc<str>,
    armed: bool,
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (redlock, key, token) = (
                self.redlock.clone(),
                Arc::clone(&self.key),
                Arc::clone(&self.token),
            );
            rt.spawn(async move {
                redlock.unlock_all(&key, &token, None).await;
            });
        }
    }
}

fn acquire_status(r: &AcquireReply) -> NodeStatus {
    match r {
        AcquireReply::Acquired => NodeStatus::Ok,
        AcquireReply::Busy { pttl_ms } => NodeStatus::Busy {
            pttl: u64::try_from(*pttl_ms).ok().map(Duration::from_millis),
        },
    }
}

/// A held Redlock lock: the resource, this holder's token, and how long it is valid.
///
/// Dropping a `Lock` without [`Lock::unlock`] spawns the release in the background
/// (when inside a Tokio runtime; otherwise the keys expire with their TTL).
pub struct Lock {
    redlock: Redlock,
    resource: Arc<str>,
    key: Arc<str>,
    token: Arc<str>,
    started: Instant,
    valid_until: Instant,
    ttl: Duration,
    extensions: u32,
    late: Option<Arc<Late>>,
    released: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource)
            .field("key", &self.key)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .field("ttl", &self.ttl)
            .field("extensions", &self.extensions)
            .finish()
    }
}

impl Lock {
    /// The resource name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The Redis key: the key prefix, then the resource.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// This holder's random token, the value stored at the key.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// When the winning attempt (or the last extension) was sent.
    pub fn started_at(&self) -> Instant {
        self.started
    }

    /// When the validity ends: after this instant, another client may hold the lock.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The validity left, zero once it has run out.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Whether the validity has not run out yet.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// The TTL of the keys as last set.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many times the lock has been extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    /// Marks the lock released for the straggler task, before the release is sent.
    fn abandon(&self) {
        if let Some(late) = &self.late {
            late.released_everywhere.store(true, Ordering::SeqCst);
            late.abandoned.store(true, Ordering::SeqCst);
        }
    }

    pub(crate) fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    pub(crate) fn shared_key(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn shared_token(&self) -> &Arc<str> {
        &self.token
    }

    pub(crate) fn shared_resource(&self) -> &Arc<str> {
        &self.resource
    }

    /// Spec step "extend": compare-and-pexpire to `ttl` on every node at once. It
    /// counts only if a quorum agrees before the current validity ends; the new
    /// validity is then `ttl - elapsed - drift` from the call's start.
    ///
    /// # Errors
    /// [`Error::Expired`] if the validity already ran out, [`Error::NotHeld`] when
    /// the key is gone from too many nodes, [`Error::NoQuorum`] when nodes failed,
    /// [`Error::ExtensionLimit`], or a TTL error (a zero TTL is refused before
    /// sending: `PEXPIRE 0` would delete the key).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let redlock = self.redlock.clone();
        redlock.check_ttl(ttl)?;
        if let Some(limit) = redlock.inner.settings.max_extensions
            && self.extensions >= limit
        {
            return Err(Error::ExtensionLimit {
                resource: Arc::clone(&self.resource),
                limit,
            });
        }
        let start = Instant::now();
        if start >= self.valid_until {
            return Err(Error::Expired {
                resource: Arc::clone(&self.resource),
            });
        }
        // A TTL shorter than what is left shortens the keys on every node that
        // applies it, whatever the outcome here (a late answer, a minority): the
        // validity is lowered to what the new TTL allows before anything is sent,
        // and stays lowered if the extend fails.
        let capped = validity(ttl, Duration::ZERO, &redlock.inner.settings)
            .map_or(start, |v| instant_after(start, v));
        self.valid_until = self.valid_until.min(capped);
        let span = tracing::debug_span!(
            "redlock.extend",
            resource = %self.resource,
            extension = self.extensions.saturating_add(1),
            ttl_ms = ttl.as_millis() as u64,
        );
        let _enter = span.enter();
        let call = Arc::new(Call::script(
            &EXTEND,
            Arc::clone(&self.key),
            vec![self.token.to_string(), ttl.as_millis().to_string()],
        ));
        let (n, q) = (redlock.inner.nodes.len(), redlock.inner.quorum);
        let (mut ok, mut not_ok, mut not_held) = (0, 0, 0);
        drop(_enter);
        let mut pending = redlock.fan_out(&call, parse_flag, 0..n);
        let settled = redlock
            .settle(&mut pending, |s| {
                match s.result {
                    Ok(true) => ok += 1,
                    Ok(false) | Err(NodeError::WrongType { .. }) => {
                        not_ok += 1;
                        not_held += 1;
                    }
                    Err(_) => not_ok += 1,
                }
                ok >= q || n - not_ok < q
            })
            .instrument(span.clone())
            .await;
        let now = Instant::now();
        let elapsed = now - start;
        // The nodes that have not answered still get their `PEXPIRE`: dropping
        // their calls now could cancel them before they are written (the redis
        // connection skips a request nobody waits for), leaving those keys to
        // expire early and the lock on a bare quorum.
        if !pending.is_empty()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { while pending.next().await.is_some() {} });
        }
        let report = redlock.report(&settled, |&b| {
            if b {
                NodeStatus::Ok
            } else {
                NodeStatus::NotHeld
            }
        });
        let validity = validity(ttl, elapsed, &redlock.inner.settings);
        span.in_scope(|| tracing::debug!(ok, elapsed_us = elapsed.as_micros() as u64, validity_ms = validity.map(|v| v.as_millis() as u64), report = %report, "extend"));
        match validity {
            Some(v) if ok >= q && now < self.valid_until => {
                self.started = start;
                self.valid_until = instant_after(now, v);
                self.ttl = ttl;
                self.extensions = self.extensions.saturating_add(1);
                Ok(())
            }
            _ if ok >= q => Err(Error::Expired {
                resource: Arc::clone(&self.resource),
            }),
            _ if n - not_held < q => Err(Error::NotHeld {
                resource: Arc::clone(&self.resource),
                report,
            }),
            _ => Err(Error::NoQuorum {
                resource: Arc::clone(&self.resource),
                ok,
                quorum: q,
                report,
            }),
        }
    }

    /// Releases the lock on every node (compare-and-delete). Returns how many keys
    /// were deleted.
    ///
    /// # Errors
    /// [`Error::ReleaseIncomplete`] when a node failed; its key expires with the TTL.
    ///
    /// Cancel-safe: if this future is dropped before it completes (a timeout
    /// around it, a client gone), the `Lock` it owns is dropped with it, and its
    /// `Drop` sends the release again in the background.
    pub async fn unlock(mut self) -> Result<usize, Error> {
        self.abandon();
        let span = tracing::debug_span!("redlock.release", resource = %self.resource);
        let (deleted, report) = self
            .redlock
            .unlock_all(&self.key, &self.token, None)
            .instrument(span.clone())
            .await;
        span.in_scope(|| tracing::debug!(deleted, report = %report, "released"));
        // Only now: a future dropped mid-release leaves `Drop` to release.
        self.released = true;
        if report.failed_count() > 0 {
            return Err(Error::ReleaseIncomplete {
                resource: Arc::clone(&self.resource),
                deleted,
                report,
            });
        }
        Ok(deleted)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.abandon();
        // Never block in drop: spawn the release, or leave the keys to their TTL
        // when there is no runtime to spawn on.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (redlock, key, token) = (
                self.redlock.clone(),
                Arc::clone(&self.key),
                Arc::clone(&self.token),
            );
            rt.spawn(async move {
                redlock.unlock_all(&key, &token, None).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let s = Settings::default();
        let ttl = Duration::from_millis(1000);
        // 1000 - 100 - (10 + 2) = 888
        assert_eq!(
            validity(ttl, Duration::from_millis(100), &s),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(ttl, Duration::from_millis(988), &s), None);
        assert_eq!(validity(ttl, Duration::from_millis(2000), &s), None);
        assert_eq!(
            validity(ttl, Duration::from_millis(987), &s),
            Some(Duration::from_millis(1))
        );
    }

    #[test]
    fn tokens_are_128_bit_and_fresh() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn retry_delay_stays_in_bounds_and_varies() {
        let p = RetryPolicy::attempts(3)
            .with_delay(Duration::from_millis(50))
            .with_jitter(Duration::from_millis(50));
        let delays: Vec<Duration> = (0..200).map(|_| retry_delay(&p)).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(50) && *d <= Duration::from_millis(100))
        );
        assert!(
            delays.iter().any(|d| *d != delays[0]),
            "jitter must vary the delay"
        );
    }

    #[test]
    fn busy_retry_after_waits_for_enough_holders() {
        let ms = Duration::from_millis;
        // 5 nodes all held by others: 3 keys must expire.
        assert_eq!(
            busy_retry_after(&mut [ms(500), ms(100), ms(300), ms(400), ms(200)], 5, 5, 3),
            Some(ms(300))
        );
        // 3 of 5 held, 2 free: one expiry is enough.
        assert_eq!(
            busy_retry_after(&mut [ms(500), ms(100), ms(300)], 3, 5, 3),
            Some(ms(100))
        );
        // 3 nodes (2 s, 8 s, free): the 2 s key frees a quorum.
        assert_eq!(
            busy_retry_after(&mut [ms(8000), ms(2000)], 2, 3, 2),
            Some(ms(2000))
        );
        assert_eq!(busy_retry_after(&mut [], 3, 5, 3), None);
    }
}
