//! Leader election over Redlock, after etcd's `campaign` / `observe` /
//! `resign` / `leader`.
//!
//! A leadership is an auto-extended lock ([`LockGuard`]) on the election's
//! name, taken by waiting (woken by the release messages, `wait.rs`), whose
//! fencing token is the term. Beside the lock key, the leader writes a small
//! *leader info* key: the term, the [`token_fingerprint`] of its lock token and
//! the id the caller chose (`hostname:pid`, say; never a secret), so that
//! observers can tell who leads and in which term ([`Redlock::observe`]).
//!
//! The info key is `0xFF`, `leader:`, then the lock key's tag (like the fence
//! counter's, no UTF-8 lock key can be it). It is written only where the lock
//! key still holds the leader's token, with a TTL of ten lock TTLs, and
//! written again every five, while the leadership lasts. It is not deleted
//! at the end: an observer trusts it only while the lock key on a quorum
//! holds the token whose fingerprint it names, so a stale one is never
//! reported.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::Error;
use crate::fencing::FencingToken;
use crate::guard::{LockGuard, LockHandle, LostFuture};
use crate::inspect::token_fingerprint;
use crate::protocol::release::Released;
use crate::redlock::Redlock;
use crate::settings::{LockOptions, RetryPolicy};

mod info;
mod observe;

pub(crate) use observe::DEFAULT_EVERY;
pub use observe::{Leader, Observer};

/// How long one round of waiting lasts before the campaign starts another
/// (a round ends early only on errors a later attempt may not have).
const ROUND: Duration = Duration::from_secs(60);

/// Options of a campaign ([`Election::campaign_with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct CampaignOptions {
    ttl: Duration,
    id: String,
}

impl CampaignOptions {
    /// Leads with a lock of this TTL, renewed while the leadership lasts: a
    /// follower takes over within about this long after the leader dies.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            id: String::new(),
        }
    }

    /// The id observers are told while this process leads ([`Leader::id`]):
    /// `hostname:pid`, a pod name. Public to every client of the nodes:
    /// never a secret. Empty by default.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
}

/// This process leads an election ([`crate::Election::campaign`]).
///
/// Renewed in the background like a [`LockGuard`] (it is one), it signals its
/// loss the same way ([`Leadership::lost`], [`Leadership::is_lost`]): a leader
/// must stop acting as one then, and may campaign again. Dropping it resigns
/// in the background (never blocks); [`Leadership::resign`] resigns and says
/// how it went. Either way the release wakes the followers, one of which
/// leads a round trip later.
#[must_use = "dropping a Leadership resigns it"]
pub struct Leadership {
    guard: LockGuard,
    term: FencingToken,
    fingerprint: String,
    id: String,
    /// Stops the task that keeps the leader info written.
    _info: DropGuard,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.guard.resource())
            .field("term", &self.term)
            .field("fingerprint", &self.fingerprint)
            .field("id", &self.id)
            .field("lost", &self.guard.is_lost())
            .finish()
    }
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.resource()
    }

    /// The term: this leadership's fencing token, larger than every earlier
    /// leader's. Hand it to whatever the leader writes to, so that a deposed
    /// leader's late writes can be refused ([`crate::fence`]).
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The [`token_fingerprint`] of the leadership's lock token, which
    /// observers see ([`Leader::fingerprint`]).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The id observers are told ([`CampaignOptions::id`]).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long the leadership is still sure to last, as far as this process
    /// knows (see [`LockHandle::remaining`]): zero once it is lost.
    pub fn remaining(&self) -> Duration {
        self.guard.remaining()
    }

    /// Whether the leadership was lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the leadership is lost (see [`LockHandle::lost`]).
    pub fn lost(&self) -> LostFuture {
        self.guard.lost()
    }

    /// A clonable view of the lock under the leadership.
    pub fn handle(&self) -> LockHandle {
        self.guard.handle()
    }

    /// Resigns: stops renewing and releases the lock (decided at quorum). The
    /// release wakes the followers.
    ///
    /// # Errors
    /// See [`LockGuard::release`].
    pub async fn resign(self) -> Result<Released, Error> {
        self.guard.release().await
    }
}

/// An election of a fencing [`Redlock`] handle ([`Redlock::election`]): the
/// processes that campaign for its name take turns to lead, one at a time.
#[derive(Debug, Clone)]
pub struct Election {
    redlock: Redlock,
    name: Arc<str>,
}

impl Election {
    /// [`Redlock::election`].
    pub(crate) fn new(redlock: &Redlock, name: &str) -> Result<Election, Error> {
        if redlock.core.inner.settings.fencing.is_none() {
            return Err(Error::InvalidConfig(
                "an election needs fencing (RedlockBuilder::fencing): the term is the fencing token"
                    .into(),
            ));
        }
        redlock.core.check_resource(name)?;
        Ok(Election {
            redlock: redlock.clone(),
            name: name.into(),
        })
    }
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until this process leads, with a lock of `ttl` (see
    /// [`Election::campaign_with`]).
    ///
    /// # Errors
    /// See [`Election::campaign_with`].
    pub async fn campaign(&self, ttl: Duration) -> Result<Leadership, Error> {
        self.campaign_with(&CampaignOptions::new(ttl)).await
    }

    /// Waits until this process leads, then returns the [`Leadership`],
    /// renewed in the background.
    ///
    /// A follower waits for the leader's release message (then it leads
    /// about a round trip after the resignation) and for the leader's key to
    /// expire (about one TTL after the leader died), and polls now and then
    /// for what no message announces. It waits for as long as it takes:
    /// cancel it by dropping the future.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_core::{CampaignOptions, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), redlock_core::Error> {
    /// let scheduler = redlock.election("scheduler")?; // refused without fencing
    /// let me = CampaignOptions::new(Duration::from_secs(5)).id("web-3:4711");
    /// let leadership = scheduler.campaign_with(&me).await?;
    /// println!("leading in term {}", leadership.term());
    /// tokio::select! {
    ///     _ = leadership.lost() => eprintln!("no longer the leader"),
    ///     _ = tokio::time::sleep(Duration::from_secs(60)) => {} // lead a while
    /// }
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the loss margin is not shorter than the
    /// TTL; an acquire error a later attempt cannot fix (see
    /// [`Primitive::guard`](crate::Primitive::guard)).
    pub async fn campaign_with(&self, options: &CampaignOptions) -> Result<Leadership, Error> {
        campaign(&self.redlock, &self.name, options).await
    }

    /// Follows the election: see [`Redlock::observe`].
    ///
    /// # Errors
    /// See [`Redlock::observe`].
    pub fn observe(&self) -> Result<Observer, Error> {
        self.redlock.observe(&self.name)
    }
}

/// [`Election::campaign_with`] of the election `name` on `redlock`.
async fn campaign(
    redlock: &Redlock,
    name: &str,
    options: &CampaignOptions,
) -> Result<Leadership, Error> {
    if redlock.core.inner.settings.fencing.is_none() {
        return Err(Error::InvalidConfig(
            "a campaign needs fencing (RedlockBuilder::fencing): the term is the fencing token"
                .into(),
        ));
    }
    let ttl = options.ttl;
    // The release message and the holder's expiry wake a follower; this
    // poll is the safety net for a message lost on the way.
    let poll = (ttl / 2).max(Duration::from_millis(10));
    let lock = LockOptions::new(ttl).retry(
        RetryPolicy::deadline(ROUND)
            .with_delay(poll)
            .with_jitter(poll / 2),
    );
    let guard = loop {
        match redlock.mutex(name).guard(&lock).await {
            Ok(guard) => break guard,
            Err(e) if e.is_retryable() => {
                tracing::debug!(name, error = %e, "campaign: another round");
            }
            Err(e) => return Err(e),
        }
    };
    let handle = guard.handle();
    let Some(term) = handle.fencing_token() else {
        // Not reached: a fenced handle's locks all carry a token.
        return Err(Error::InvalidConfig("a campaign's lock has no term".into()));
    };
    let fingerprint = token_fingerprint(handle.token());
    let stop = CancellationToken::new();
    let record = info::Record {
        term,
        fingerprint: fingerprint.clone(),
        id: options.id.clone(),
    };
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::NoRuntime("a leadership's info task"))?;
    rt.spawn(info::keep_written(
        redlock.clone(),
        Arc::from(handle.key()),
        Arc::from(handle.token()),
        record,
        ttl,
        handle.clone(),
        stop.clone(),
    ));
    Ok(Leadership {
        guard,
        term,
        fingerprint,
        id: options.id.clone(),
        _info: stop.drop_guard(),
    })
}
