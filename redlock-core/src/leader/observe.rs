//! Following an election from outside: [`Observer`], a stream of who leads.
//!
//! An observer reads every node in one script per round: the lock key's
//! holder (fingerprinted here, never passed on), the leader info, and on the
//! way it sets the key's waiters flag, so that the leader's release is
//! announced on the channel the waiters use (`wake/`), which the observer
//! listens to. A leader that dies announces nothing: the observer also reads
//! at a bounded interval, and soon again while there is no leader or the
//! nodes disagree (a new leader takes over a round trip after a release).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::Value;
use tokio::sync::mpsc;

use super::info::{Record, info_key};
use crate::error::Error;
use crate::fencing::FencingToken;
use crate::inspect::token_fingerprint;
use crate::keys::waiters_flag;
use crate::redlock::Redlock;
use crate::wake::{Found, Subscription};

/// One node's round: set the waiters flag (`KEYS[2]`, `ARGV[1]` ms, kept if
/// it lives longer), read the lock key (`KEYS[1]`; a foreign type reads as no
/// holder) and the leader info (`KEYS[3]`).
const READ_LUA: &str = r"
redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1], 'GT')
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then v = false end
local i = redis.pcall('GET', KEYS[3])
if type(i) ~= 'string' then i = false end
return {v, i}
";

/// The first re-read after a change, doubled up to the interval while the
/// state stays unclear or leaderless.
const QUICK: Duration = Duration::from_millis(5);

/// The interval between reads of [`Redlock::observe`].
pub(crate) const DEFAULT_EVERY: Duration = Duration::from_secs(1);

/// Who leads an election, as an observer saw it on a quorum of nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The [`token_fingerprint`] of the leader's lock token
    /// ([`Leadership::fingerprint`](super::Leadership::fingerprint)).
    pub fingerprint: String,
    /// The leader's term: its fencing token.
    pub term: FencingToken,
    /// The id the leader campaigned with
    /// ([`CampaignOptions::id`](super::CampaignOptions::id)).
    pub id: String,
}

/// A stream of who leads an election ([`Redlock::observe`]): `Some(leader)`
/// or `None` (nobody leads), first when the observer knows, then at every
/// change. Intermediate states a slow reader missed are skipped.
///
/// A resignation reaches it about a round trip after the release (its release
/// message wakes the observer), the next leader soon after; a leader that
/// died without releasing, once its key expired and at the next read.
/// Dropping the stream stops its task.
///
/// ```no_run
/// use futures_util::StreamExt;
/// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
/// let mut leaders = redlock.observe("scheduler")?;
/// while let Some(leader) = leaders.next().await {
///     match leader {
///         Some(l) => println!("{} leads in term {}", l.id, l.term),
///         None => println!("no leader"),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Observer {
    rx: mpsc::Receiver<Option<Leader>>,
}

impl Observer {
    pub(super) fn start(redlock: Redlock, key: String, every: Duration) -> Result<Self, Error> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::NoRuntime("an election observer's task"))?;
        let (tx, rx) = mpsc::channel(1);
        rt.spawn(follow(redlock, key, every, tx));
        Ok(Self { rx })
    }
}

impl futures_util::Stream for Observer {
    type Item = Option<Leader>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Observer {
    /// [`Redlock::observe_every`] (and [`Redlock::observe`], every
    /// `DEFAULT_EVERY`).
    pub(crate) fn new(redlock: &Redlock, name: &str, every: Duration) -> Result<Self, Error> {
        redlock.core.check_resource(name)?;
        Self::start(redlock.clone(), redlock.key_for(name), every)
    }
}

/// What one round found.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Leader(Leader),
    Nobody,
    /// Too few answers, a holder below a quorum, or a leader whose info is
    /// not written yet.
    Unclear,
}

/// The observer's task: reads, says what changed, sleeps until a release
/// message, the next read, or the stream's drop.
async fn follow(redlock: Redlock, key: String, every: Duration, tx: mpsc::Sender<Option<Leader>>) {
    let every = every.max(QUICK);
    let mut subscription = redlock.core.inner.waiting.subscribe(&key);
    // The flag lives past the next read, so no release in between is silent.
    let flag_ms = every
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1))
        .as_millis()
        .to_string();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(READ_LUA)
        .arg(3)
        .arg(&key)
        .arg(waiters_flag(&key))
        .arg(info_key(&key))
        .arg(flag_ms);
    let mut last: Option<Option<Leader>> = None;
    let mut quick = QUICK;
    loop {
        if let Some(s) = subscription.as_mut() {
            s.mark_seen();
        }
        let seen = read(&redlock, &cmd).await;
        let wait = match seen {
            Seen::Leader(l) => {
                quick = QUICK;
                if last.as_ref() != Some(&Some(l.clone())) {
                    if tx.send(Some(l.clone())).await.is_err() {
                        return;
                    }
                    last = Some(Some(l));
                }
                every
            }
            Seen::Nobody | Seen::Unclear => {
                if seen == Seen::Nobody && last != Some(None) {
                    if tx.send(None).await.is_err() {
                        return;
                    }
                    last = Some(None);
                }
                let wait = quick;
                quick = quick.saturating_mul(2).min(every);
                wait
            }
        };
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(wait) => {}
            () = woken(&mut subscription) => quick = QUICK,
        }
    }
}

async fn woken(subscription: &mut Option<Subscription<'_>>) {
    match subscription {
        Some(s) => s.woken(&Found::default()).await,
        None => std::future::pending().await,
    }
}

/// One round on every node at once, judged.
async fn read(redlock: &Redlock, cmd: &redis::Cmd) -> Seen {
    let timeout = redlock.node_timeout();
    let answers: Vec<Option<(Option<String>, Option<Record>)>> = futures_util::future::join_all(
        redlock
            .core
            .inner
            .nodes
            .iter()
            .map(|node| async move { node.query(cmd, timeout).await.ok().and_then(parse) }),
    )
    .await;
    judge(&answers, redlock.quorum())
}

/// `{holder token|false, info|false}` into the holder's fingerprint and the
/// info record.
fn parse(v: Value) -> Option<(Option<String>, Option<Record>)> {
    let Value::Array(items) = v else {
        return None;
    };
    let [holder, info] = items.as_slice() else {
        return None;
    };
    let holder = match holder {
        Value::BulkString(b) => Some(token_fingerprint(&String::from_utf8_lossy(b))),
        _ => None,
    };
    Some((holder, Record::decode(info)))
}

/// The state the nodes' answers (`None`: no answer) show, for a handle whose
/// quorum is `quorum`: a leader when one holder is on a quorum and a node
/// has its info, nobody when too few nodes hold anything for a quorum.
fn judge(answers: &[Option<(Option<String>, Option<Record>)>], quorum: usize) -> Seen {
    let n = answers.len();
    let holders: Vec<&str> = answers
        .iter()
        .flatten()
        .filter_map(|(h, _)| h.as_deref())
        .collect();
    let free = answers
        .iter()
        .flatten()
        .filter(|(h, _)| h.is_none())
        .count();
    if let Some(leader) = holders
        .iter()
        .find(|h| holders.iter().filter(|o| o == h).count() >= quorum)
    {
        return answers
            .iter()
            .flatten()
            .filter_map(|(_, r)| r.as_ref())
            .find(|r| r.fingerprint == *leader)
            .map_or(Seen::Unclear, |r| {
                Seen::Leader(Leader {
                    fingerprint: r.fingerprint.clone(),
                    term: r.term,
                    id: r.id.clone(),
                })
            });
    }
    if free > n.saturating_sub(quorum) {
        return Seen::Nobody;
    }
    Seen::Unclear
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fp: &str, term: u64) -> Record {
        Record {
            term: FencingToken::new(term),
            fingerprint: fp.into(),
            id: format!("id-{term}"),
        }
    }

    fn node(
        holder: Option<&str>,
        info: Option<Record>,
    ) -> Option<(Option<String>, Option<Record>)> {
        Some((holder.map(str::to_owned), info))
    }

    #[test]
    fn a_leader_needs_a_quorum_and_its_own_info() {
        let a = || Some(record("a", 7));
        // The holder on a quorum, its info on one node.
        let seen = judge(&[node(Some("a"), a()), node(Some("a"), None), None], 2);
        assert_eq!(
            seen,
            Seen::Leader(Leader {
                fingerprint: "a".into(),
                term: FencingToken::new(7),
                id: "id-7".into()
            })
        );
        // A stale info of an earlier leader is not the leader's.
        let seen = judge(
            &[node(Some("b"), a()), node(Some("b"), a()), node(None, None)],
            2,
        );
        assert_eq!(seen, Seen::Unclear);
        // Below a quorum: not a leader, not nobody either.
        assert_eq!(
            judge(&[node(Some("a"), a()), node(None, None), None], 2),
            Seen::Unclear
        );
        assert_eq!(
            judge(&[node(None, a()), node(None, None), None], 2),
            Seen::Nobody
        );
        assert_eq!(judge(&[node(None, None), None, None], 2), Seen::Unclear);
    }
}
