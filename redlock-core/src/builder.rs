//! *Layer 7, the top (see `lib.rs`).*
//!
//! Builds a [`Redlock`]: one node per independent master, from a deadpool-redis
//! pool or a URL, and the settings checked once.

use std::time::Duration;

use deadpool_redis::Pool;

use crate::error::Error;
use crate::fencing::FencingMode;
use crate::node_spec::NodeSpec;
use crate::protocol::redlock::{Core, Inner};
use crate::redlock::Redlock;
use crate::settings::{RetryPolicy, Settings};
use crate::sources::{NodeSource, open_nodes};

/// Builds a [`Redlock`]: the nodes, then the settings.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_core::{Redlock, RetryPolicy};
///
/// # fn main() -> Result<(), redlock_core::Error> {
/// let redlock = Redlock::builder()
///     .url("redis://10.0.0.1:6379")
///     .url("redis://10.0.0.2:6379")
///     .url("redis://:secret@10.0.0.3:6379/0")
///     .node_timeout(Duration::from_millis(20))
///     .retry(RetryPolicy::deadline(Duration::from_secs(2)))
///     .key_prefix("lock:")
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct RedlockBuilder {
    pub(crate) sources: Vec<NodeSource>,
    settings: Settings,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.sources.iter().map(NodeSource::shown).collect();
        f.debug_struct("RedlockBuilder")
            .field("nodes", &nodes)
            .field("settings", &self.settings)
            .finish()
    }
}

impl Default for RedlockBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedlockBuilder {
    /// A builder with no nodes and the default settings.
    pub fn new() -> Self {
        Self {
            sources: Vec::new(),
            settings: Settings::default(),
        }
    }

    /// Adds a node: a deadpool-redis pool to one independent Redis master.
    ///
    /// Every call is bounded by [`node_timeout`](Self::node_timeout). A pool built
    /// with `deadpool_redis::Config::create_pool` also carries redis' default
    /// response timeout (500 ms), which then caps longer node timeouts; build the
    /// pool with `Manager::new_with_config` to lift it.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.sources.push(NodeSource::Pool { label: None, pool });
        self
    }

    /// Adds a node with a label for logs and errors. Labels (or URLs) also let the
    /// builder refuse the same address listed twice.
    pub fn labeled_pool(mut self, label: impl Into<String>, pool: Pool) -> Self {
        self.sources.push(NodeSource::Pool {
            label: Some(label.into()),
            pool,
        });
        self
    }

    /// Adds a node by URL: `redis://[user:password@]host[:port][/db]`,
    /// `rediss://…` with the `tls` feature, or `unix:///path`.
    ///
    /// A `rediss://` node is checked against the system's root certificates
    /// (its server certificate must name the URL's host). For a server whose
    /// certificate a private CA signed, give the CA with `tls_url` (with the
    /// `tls` feature) instead, or trust it system-wide
    /// (`SSL_CERT_FILE=/path/ca.pem` is honoured). The `tls` feature uses
    /// rustls with its `ring` provider, installed as the process default at the
    /// first `rediss://` node unless the application installed one before.
    /// `rediss://host:port/#insecure` (no certificate check at all) is refused
    /// with [`Error::InvalidUrl`](crate::Error::InvalidUrl): trust the private
    /// CA instead, as above.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.sources.push(NodeSource::Url(url.into()));
        self
    }

    /// Adds a node with options of its own: a URL or a pool, and the
    /// replicas each of its writes must reach ([`NodeSpec::replica_acks`]).
    pub fn node(mut self, spec: NodeSpec) -> Self {
        self.sources.push(spec.into_source());
        self
    }

    /// Adds several nodes by URL.
    pub fn urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for u in urls {
            self = self.url(u);
        }
        self
    }

    /// The longest one node may take to answer one call (default 50 ms). Must be
    /// shorter than every TTL used. Small values keep a dead or paused node from
    /// slowing every acquire.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.settings.node_timeout = timeout;
        self
    }

    /// The clock drift allowed per unit of TTL (default 0.01).
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.settings.drift_factor = factor;
        self
    }

    /// The fixed drift added to `ttl * drift_factor` (default 2 ms).
    pub fn fixed_drift(mut self, drift: Duration) -> Self {
        self.settings.fixed_drift = drift;
        self
    }

    /// The retry policy of [`crate::Primitive::acquire`] (default [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.settings.retry = retry;
        self
    }

    /// A prefix put before every resource name to form the Redis key (default
    /// none, so keys match other Redlock clients that lock the same name).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.key_prefix = prefix.into();
        self
    }

    /// The smallest TTL accepted (default 10 ms).
    pub fn min_ttl(mut self, ttl: Duration) -> Self {
        self.settings.min_ttl = ttl;
        self
    }

    /// The largest TTL accepted (default 24 h).
    pub fn max_ttl(mut self, ttl: Duration) -> Self {
        self.settings.max_ttl = ttl;
        self
    }

    /// Caps how many times one lock may be extended (default: no cap; use
    /// [`LockOptions::max_hold`](crate::LockOptions::max_hold) to cap by time).
    pub fn max_extensions(mut self, n: u32) -> Self {
        self.settings.max_extensions = Some(n);
        self
    }

    /// How long before the end of a [`LockGuard`](crate::LockGuard)'s confirmed
    /// validity its holder is told the lock is lost (default: the node timeout).
    /// See [`LockOptions::loss_margin`](crate::LockOptions::loss_margin), which overrides it per lock.
    pub fn loss_margin(mut self, margin: Duration) -> Self {
        self.settings.loss_margin = Some(margin);
        self
    }

    /// Checks the settings and builds the handle. No connection is made yet; call
    /// [`Redlock::check_nodes`] to connect and to refuse duplicate servers by
    /// `run_id`.
    ///
    /// # Errors
    /// [`Error::NoNodes`], [`Error::InvalidUrl`], [`Error::DuplicateNode`] (by
    /// address) or [`Error::InvalidConfig`].
    pub fn build(self) -> Result<Redlock, Error> {
        if self.sources.is_empty() {
            return Err(Error::NoNodes);
        }
        self.settings.check()?;
        let nodes = open_nodes(self.sources)?;
        for node in &nodes {
            if let Some(acks) = &node.replica_acks {
                acks.check(&node.label, self.settings.node_timeout)?;
            }
        }
        if nodes.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = nodes.len(),
                quorum = nodes.len() / 2 + 1,
                "an even number of Redlock nodes tolerates no more failures than one node fewer"
            );
        }
        Ok(Redlock::from_core(Core::from_inner(Inner::new(
            nodes,
            self.settings,
        ))))
    }

    /// Adds a `rediss://` node that trusts the given certificates instead of the
    /// system's roots: a private CA's certificate (PEM) in `root_cert`, and for
    /// mutual TLS a client certificate and key in `client_tls`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::TlsCertificates;
    /// use redlock_core::Redlock;
    ///
    /// let ca = std::fs::read("/etc/redis/ca.pem")?;
    /// let certs = || TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) };
    /// let redlock = Redlock::builder()
    ///     .tls_url("rediss://:secret@10.0.0.1:6380", certs())?
    ///     .tls_url("rediss://:secret@10.0.0.2:6380", certs())?
    ///     .tls_url("rediss://:secret@10.0.0.3:6380", certs())?
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that is not `rediss://` or does not parse,
    /// or certificates that do not parse.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_url(
        mut self,
        url: impl Into<String>,
        certs: redis::TlsCertificates,
    ) -> Result<Self, Error> {
        let url = url.into();
        let client = redis::Client::build_with_tls(url.as_str(), certs)
            .map_err(|e| crate::node::invalid_url(&url, e.to_string()))?;
        let (label, _, pool) =
            crate::node::pool_from_info(&url, client.get_connection_info().clone())?;
        self.sources.push(NodeSource::Pool {
            label: Some(label),
            pool,
        });
        Ok(self)
    }

    /// Hands out a fencing token with every lock (default: off): a number
    /// larger than every earlier holder's token for the resource, read with
    /// [`Lock::fencing_token`](crate::Lock::fencing_token) or
    /// [`LockHandle::fencing_token`](crate::LockHandle::fencing_token), for the
    /// protected resource to refuse late writes (see [`crate::fence`]).
    ///
    /// It costs each acquire one more round trip (the fence phase, decided at
    /// quorum); extend and release are unchanged. The counters live on the
    /// nodes, one key per resource locked: the byte `0xFF`, `fence:`, then
    /// the lock key (no UTF-8 key can collide with that). A
    /// [`FencingMode::Durable`] counter never expires; a
    /// [`FencingMode::Hybrid`] one expires a day (see
    /// [`fence_counter_ttl`](Self::fence_counter_ttl)) after its last fence.
    /// Pick the mode for the nodes' persistence and check it with
    /// [`Redlock::check_nodes`]: [`FencingMode::Durable`] needs
    /// `appendonly yes` + `appendfsync always` on every node;
    /// [`FencingMode::Hybrid`] needs restarted nodes to stay down longer than
    /// the clock skew between nodes, and no backward clock steps.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{FencingMode, Redlock};
    ///
    /// # async fn run() -> Result<(), redlock_core::Error> {
    /// let redlock = Redlock::builder()
    ///     .urls(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .fencing(FencingMode::Durable)
    ///     .build()?;
    /// for node in redlock.check_nodes().await? {
    ///     assert!(node.fencing.as_ref().is_some_and(|c| c.is_sound()), "{node:?}");
    /// }
    /// let lock = redlock.mutex("invoice:42").try_acquire(Duration::from_secs(5)).await?;
    /// let token = lock.fencing_token().expect("fencing is on");
    /// // write to the store with `token`; it refuses tokens older than the last it took
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, mode: FencingMode) -> Self {
        self.settings.fencing = Some(mode);
        self
    }

    /// How long a [`FencingMode::Hybrid`] counter lives after the last fence
    /// that wrote it (default: one day; at least one hour, or
    /// [`build`](Self::build) refuses it with [`Error::InvalidConfig`]).
    /// Each fence also gives it at least its lock's TTL plus one hour, so a
    /// counter outlives every holder fenced with it.
    ///
    /// Why a counter may expire at all: a `Hybrid` token is at least the
    /// node's clock (`TIME`, µs), and a counter holds at most the clock of
    /// the node that wrote it plus the clock skew between nodes. Once it has
    /// been idle for longer than that skew, the node's own `TIME` is above
    /// every token it ever held, as after the empty restart the mode already
    /// allows; the hour's floor keeps a wide margin over any skew of
    /// NTP-synced servers. Without expiry, client-chosen keys (`by_path`)
    /// leave one counter per distinct key for ever. [`FencingMode::Durable`]
    /// counters do not expire: their order rests on them alone.
    pub fn fence_counter_ttl(mut self, ttl: Duration) -> Self {
        self.settings.fence_counter_ttl = ttl;
        self
    }

    /// Whether waiting ([`crate::Primitive::acquire`] and everything built on it) is woken
    /// by releases (default: on). On, the waiters of a key in this process
    /// queue first come, first served, only the first contends on the nodes,
    /// and it sleeps until releases published on the key's channel
    /// (`redlock:released:`, the node's database, `:` and the key) free a
    /// quorum, or a fallback timer fires: the holder's remaining TTL, the
    /// retry policy's delay (a safety-net poll), or a node's subscription
    /// lost or regained. It opens one pub/sub connection per node (outside
    /// the pool) when a waiter of this process first waits, subscribed only
    /// while one waits, and checked by `PING` when silent. Nodes given as pools rather
    /// than URLs cannot be subscribed to: their releases are found by the
    /// fallback timers.
    ///
    /// Off, waiters poll every `delay + jitter` of the retry policy, each on
    /// its own: for nodes that refuse `SUBSCRIBE` (an ACL, a proxy).
    pub fn wake_on_release(mut self, on: bool) -> Self {
        self.settings.wake_on_release = on;
        self
    }

    /// Coalesces the plain acquires, releases and extends that many tasks
    /// send to one single-server node while its connection is busy: they go
    /// out together in one write, each answered as its own call would be
    /// (default: off). A lone call goes out at once, as without it.
    ///
    /// Experimental (issue 50): measured at 1.01–1.15 times the raw loop's
    /// 64-task throughput on a 2-core machine at load 2–4, and 0.76–0.96
    /// times at load 5–8 (BENCHMARKS.md, "Coalescing"), so it is not yet
    /// worth turning on, except on nodes with replica acks
    /// ([`NodeSpec::replica_acks`](crate::NodeSpec::replica_acks)): there a
    /// batch waits for the replicas by one `WAIT` after all its writes, where
    /// each write alone waits for its own. Cluster nodes, native commands,
    /// fenced and waiting acquires keep their own calls either way; on a node whose
    /// queue is not empty, such a call waits for what queued before it, so
    /// that it never overtakes a queued release. The batched renewal of
    /// auto-extended locks sends the coalescer's batch script whether this is
    /// on or off: it knows its batch (up to 100 locks per node) up front, and
    /// on a coalescing node it takes its turn behind what is queued.
    pub fn coalesce(mut self, on: bool) -> Self {
        self.settings.coalesce = on;
        self
    }

    /// Which of the nodes' own compare-and-set and compare-and-delete commands
    /// replace the Lua scripts where a node has them (default:
    /// [`NativeCommands::Extend`](crate::NativeCommands::Extend)): extend by
    /// `SET key token IFEQ token PX ttl` (Valkey 8.1+, Redis 8.4), release by
    /// `DELIFEQ` (Valkey 9.0+) or `DELEX key IFEQ token` (Redis 8.4, Valkey
    /// 9.2). What a node has is asked (`COMMAND INFO`, `COMMAND DOCS`) on each
    /// new connection, never taken from its version; nodes without them, or
    /// that refuse one, run the scripts. See
    /// [`NodeInfo::native`](crate::NodeInfo::native) for what was found.
    pub fn native_commands(mut self, use_: crate::NativeCommands) -> Self {
        self.settings.native_commands = use_;
        self
    }

    /// Labels the per-lock metrics (see [`crate::metrics`]) with `key`, the
    /// name `label` gives the resource's Redis key. Off by default: a
    /// resource key can be anything a client sends, and each distinct label
    /// value is a new time series. `label` must map keys to a small, bounded
    /// set (a key's kind, a tenant tier), never return the key itself; it
    /// returns `&'static str` to make that hard to get wrong.
    ///
    /// ```
    /// let builder = redlock_core::Redlock::builder().metrics_key_label(|key| {
    ///     if key.starts_with("redlock:/webhooks") { "webhooks" } else { "other" }
    /// });
    /// # let _ = builder;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_key_label(
        mut self,
        label: impl Fn(&str) -> &'static str + Send + Sync + 'static,
    ) -> Self {
        self.settings.metrics_key = Some(crate::metrics::KeyLabel(std::sync::Arc::new(label)));
        self
    }
}

/// Construction.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_replica_acks_the_node_timeout_cannot_serve() {
        let ms = Duration::from_millis;
        let acked = |acks: u32, wait| {
            RedlockBuilder::new()
                .node(NodeSpec::cluster(["redis://127.0.0.1:7000"]).replica_acks(acks, wait))
                .url("redis://127.0.0.1:7100")
                .url("redis://127.0.0.1:7200")
        };
        // The README's cluster example before: 50 ms acks, 50 ms node timeout.
        match acked(1, ms(50)).build() {
            Err(Error::InvalidConfig(m)) => assert!(m.contains("set node_timeout"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(acked(1, ms(50)).node_timeout(ms(100)).build().is_ok());
        // `replica_acks(0, ..)` on a NodeSpec turns acks off.
        assert!(acked(0, ms(50)).build().is_ok());
        let url = RedlockBuilder::new()
            .url("redis://127.0.0.1:7000?replica_acks=1&replica_timeout_ms=500")
            .url("redis://127.0.0.1:7100")
            .url("redis://127.0.0.1:7200");
        assert!(matches!(url.build(), Err(Error::InvalidConfig(_))));
    }

    #[test]
    fn refuses_bad_settings_and_urls() {
        assert!(matches!(RedlockBuilder::new().build(), Err(Error::NoNodes)));
        let e = RedlockBuilder::new()
            .url("http://:pw123@x")
            .build()
            .unwrap_err();
        match e {
            Error::InvalidUrl { url, reason } => {
                assert!(
                    !url.contains("pw123") && !reason.contains("pw123"),
                    "{url} {reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let e = RedlockBuilder::new()
            .url("redis://127.0.0.1:7001")
            .url("redis://localhost:7001/2")
            .build()
            .unwrap_err();
        assert!(
            matches!(e, Error::DuplicateNode { by: "address", .. }),
            "{e:?}"
        );
        let e = RedlockBuilder::new()
            .url("redis://127.0.0.1:7001")
            .drift_factor(0.9)
            .build()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e:?}");
    }

    #[test]
    fn retry_policy_bounds() {
        assert_eq!(RetryPolicy::attempts(0).max_attempts(), 1);
        assert_eq!(RetryPolicy::no_retry().max_attempts(), 1);
        let p = RetryPolicy::deadline(Duration::from_secs(1));
        assert_eq!(p.overall_deadline(), Some(Duration::from_secs(1)));
    }
}
