//! *Layer 2, local wake-up plumbing (see `lib.rs`).*
//!
//! Waiting by wake-up, the remote half: the release script `PUBLISH`es on the
//! key's channel after its compare-and-delete (see `node::RELEASE_LUA`), and a
//! waiter listens on every node for that message instead of polling. The
//! release publishes only when it also deleted the key's waiters flag
//! ([`WAITERS_SUFFIX`](crate::keys::WAITERS_SUFFIX)), which every attempt of a subscribed waiter sets on
//! each node just before its `SET NX`: a release that runs on a node after a
//! waiter's refused `SET` there finds the flag (or a release between the two
//! found it and published), so no waiter sleeps through a release
//! (`tests/models/tests/model_wake_flag.rs` checks it, with the wrong orders as
//! negative controls), and a release nobody waits for publishes nothing.
//! The announcement carries the flag's value, which names a mutex waiter
//! ([`Named`](crate::keys::Named)): of the woken, the one named tries first
//! and the others defer to it (`wait/`).
//!
//! One pub/sub connection per node per [`Redlock`](crate::Redlock) handle,
//! outside the deadpool pool (a subscribed connection cannot run commands),
//! shared by all keys, and subscribed to a key's channel only while a local
//! waiter of that key listens (reference-counted). Each node's connection is
//! owned by a task that subscribes, unsubscribes and reconnects; after a
//! reconnect it subscribes again to every channel still wanted. While no
//! waiter listens, the task makes no connection at all (a node that is down
//! is not retried for nobody), and while one does, a subscribed connection
//! that stays silent is asked a `PING` and replaced if it does not answer.
//!
//! The channel names the node's database (`PUBLISH` reaches every database
//! of a server); the waiters' subscriptions are kept by key, and each node's
//! task names the channel in its own database.
//!
//! Pub/sub is at-most-once: a message sent while a connection was down, or
//! never sent (a key that expired), is not delivered. So a waiter is also woken
//! when a node's subscription drops or comes back, and keeps the fallback
//! timers of `wait/`.

use std::collections::{HashMap, HashSet};
use std::ops::DerefMut;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::node::{Node, PubSubAt};
use crate::queue::Queues;
use crate::settings::Settings;

pub(crate) mod handoff;
mod news;
mod node_task;
mod shard;
use news::{Chan, NodeSub};
pub(crate) use news::{Found, Naming};
use node_task::{Source, node_task};

use crate::keys::channel_prefix;
use handoff::HandOffs;

/// How long a subscribed connection may stay silent before it is asked a
/// `PING`; without an answer within the subscription limit it is replaced.
/// A connection that died without a word (a path that drops everything, a
/// peer gone) is thus found within this plus the limit.
const HEALTH_CHECK_AFTER: Duration = Duration::from_secs(1);

/// The shortest and longest wait before a failed pub/sub connection is tried
/// again: soon after a blip, rarely while a node stays down.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

struct Entry {
    refs: usize,
    state: watch::Sender<Chan>,
}

/// A node's pub/sub connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Not connected because no waiter listens: the next waiter's
    /// subscription makes the task connect.
    Idle,
    Connecting,
    Up,
    Down,
}

/// What the node tasks and the waiters share.
struct Shared {
    channels: Mutex<HashMap<String, Entry>>,
    links: Mutex<Vec<Link>>,
    /// Per node, the keys whose channel this handle's connection is
    /// subscribed to, or may be as far as the node can tell: from the
    /// `SUBSCRIBE`'s sending to the `UNSUBSCRIBE`'s answer, until the
    /// connection is lost. A release counts this handle's own subscription
    /// by it (`Waiting::release_sent`).
    listening: Mutex<Vec<HashSet<String>>>,
}

impl Shared {
    fn new(links: Vec<Link>) -> Self {
        let listening = Mutex::new(vec![HashSet::new(); links.len()]);
        Self {
            channels: Mutex::new(HashMap::new()),
            links: Mutex::new(links),
            listening,
        }
    }

    fn listening(&self) -> impl DerefMut<Target = Vec<HashSet<String>>> + '_ {
        self.listening
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `node`'s connection is about to subscribe to these keys' channels.
    fn listen(&self, node: usize, keys: &[String]) {
        if let Some(set) = self.listening().get_mut(node) {
            set.extend(keys.iter().cloned());
        }
    }

    /// `node`'s connection unsubscribed from `key`'s channel.
    fn unlisten(&self, node: usize, key: &str) {
        if let Some(set) = self.listening().get_mut(node) {
            set.remove(key);
        }
    }
    fn channels(&self) -> impl DerefMut<Target = HashMap<String, Entry>> + '_ {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn links(&self) -> impl DerefMut<Target = Vec<Link>> + '_ {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_link(&self, node: usize, link: Link) {
        if let Some(l) = self.links().get_mut(node) {
            *l = link;
        }
    }

    fn wanted(&self, key: &str) -> bool {
        self.channels().contains_key(key)
    }

    /// The keys some local waiter listens for.
    fn desired(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }

    /// `node` confirmed the subscriptions of these keys. A node that was not
    /// subscribed before also wakes their waiters: a release published before
    /// the confirmation may have been missed. A confirmation of what was
    /// confirmed already is no news, and wakes nobody.
    fn confirm(&self, node: usize, keys: &[String]) {
        let map = self.channels();
        for k in keys {
            if let Some(e) = map.get(k) {
                e.state.send_if_modified(|s| match s.nodes.get_mut(node) {
                    Some(n) if *n != NodeSub::Subscribed => {
                        *n = NodeSub::Subscribed;
                        s.changes = s.changes.wrapping_add(1);
                        true
                    }
                    _ => false,
                });
            }
        }
    }

    /// `node`'s connection is gone: its waiters are woken (whatever it would
    /// have told them is lost) and fall back to their timers for it.
    fn node_down(&self, node: usize) {
        self.set_link(node, Link::Down);
        if let Some(set) = self.listening().get_mut(node) {
            set.clear();
        }
        for e in self.channels().values() {
            e.state.send_if_modified(|s| match s.nodes.get_mut(node) {
                Some(n) if *n != NodeSub::Down => {
                    *n = NodeSub::Down;
                    s.changes = s.changes.wrapping_add(1);
                    true
                }
                _ => false,
            });
        }
    }

    /// `node` announced a release of `key`, with `payload` (the waiters
    /// flag's value: the waiter it names, if any).
    fn wake(&self, key: &str, node: usize, payload: &[u8]) {
        if let Some(e) = self.channels().get(key) {
            let name = crate::keys::Heard::parse(payload);
            e.state.send_modify(|s| s.heard(node, name));
        }
    }
}

/// How one node is reached for pub/sub.
struct NodeLink {
    /// `None`: the node was given as a pool, whose connection details cannot
    /// be read back; waiters poll that node.
    client: Option<Source>,
    /// The node's database, which its channels name.
    db: i64,
    /// The node task's inbox: the keys whose subscription to reconcile.
    task: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

/// A handle's waiting machinery: the local queues and the per-node
/// subscriptions.
pub(crate) struct Waiting {
    pub(crate) queues: Queues,
    enabled: bool,
    shared: Arc<Shared>,
    links: Vec<NodeLink>,
    /// How long one pub/sub connect or (un)subscribe may take.
    limit: Duration,
    /// How many nodes must announce a release before a waiter tries again.
    quorum: usize,
    /// The hand-off windows of this handle's releases that woke another
    /// handle's waiters (`wait/handoff.rs`).
    pub(crate) handoffs: HandOffs,
}

impl Waiting {
    pub(crate) fn new(nodes: &[Node], settings: &Settings) -> Self {
        let enabled = settings.wake_on_release;
        let links: Vec<NodeLink> = nodes
            .iter()
            .map(|n| NodeLink {
                client: n
                    .pubsub
                    .as_ref()
                    .filter(|_| enabled)
                    .and_then(|at| match at {
                        PubSubAt::Server(info) => redis::Client::open((**info).clone())
                            .ok()
                            .map(|c| Source::Server(Box::new(c))),
                        PubSubAt::Cluster(seeds) => Some(Source::Cluster(seeds.clone())),
                    }),
                db: n.db,
                task: Mutex::new(None),
            })
            .collect();
        let state = links
            .iter()
            .map(|l| match l.client {
                Some(_) => Link::Idle,
                None => Link::Down,
            })
            .collect();
        Self {
            queues: Queues::default(),
            enabled,
            shared: Arc::new(Shared::new(state)),
            links,
            limit: settings
                .node_timeout
                .saturating_mul(10)
                .clamp(Duration::from_secs(1), Duration::from_secs(30)),
            quorum: nodes.len() / 2 + 1,
            handoffs: HandOffs::default(),
        }
    }

    /// Whether waiters queue locally and wait for wake-ups (else they poll).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Subscribes to `key`'s releases on every node that can. `None` when no
    /// node can (all given as pools).
    pub(crate) fn subscribe(&self, key: &str) -> Option<Subscription<'_>> {
        if self.links.iter().all(|l| l.client.is_none()) {
            return None;
        }
        // Channels name the key by its tag (`slots`).
        let channel = crate::slots::tagged(key).into_owned();
        let (rx, fresh) = {
            let mut channels = self.shared.channels();
            match channels.get_mut(&channel) {
                Some(e) => {
                    e.refs = e.refs.saturating_add(1);
                    (e.state.subscribe(), false)
                }
                None => {
                    let nodes: Vec<NodeSub> = self
                        .shared
                        .links()
                        .iter()
                        .map(|l| match l {
                            Link::Down => NodeSub::Down,
                            Link::Idle | Link::Connecting | Link::Up => NodeSub::Pending,
                        })
                        .collect();
                    let (tx, rx) = watch::channel(Chan::new(nodes));
                    channels.insert(channel.clone(), Entry { refs: 1, state: tx });
                    (rx, true)
                }
            }
        };
        if fresh {
            for node in 0..self.links.len() {
                self.sync(node, &channel, true);
            }
        }
        let seen = rx.borrow().clone();
        Some(Subscription {
            waiting: self,
            channel,
            rx,
            seen,
        })
    }

    /// This handle's release of `key` is about to be sent to every node.
    /// Returns, per node, whether this handle's connection there is (or
    /// may be) subscribed to the key's channel: the node's announcement, if
    /// any, reaches it, and is this handle's own, not another's (so its
    /// waiters in a hand-off window take it for their own; see
    /// [`Chan::heard`]).
    pub(crate) fn release_sent(&self, key: &str) -> Vec<bool> {
        let own: Vec<bool> = {
            let listening = self.shared.listening();
            // Nothing subscribed (the common case): no channel name to make.
            if listening.iter().all(HashSet::is_empty) {
                return Vec::new();
            }
            let channel = crate::slots::tagged(key);
            (0..self.links.len())
                .map(|n| listening.get(n).is_some_and(|set| set.contains(&*channel)))
                .collect()
        };
        let channel = crate::slots::tagged(key);
        if own.contains(&true)
            && let Some(e) = self.shared.channels().get(&*channel)
        {
            e.state.send_if_modified(|s| {
                for (n, _) in own.iter().enumerate().filter(|(_, o)| **o) {
                    s.expect(n);
                }
                false
            });
        }
        own
    }

    /// This handle's release of `key`, which [`Waiting::release_sent`]
    /// expected to reach this handle's subscription on `node`, did not:
    /// the node answered that the key was not held, or that nobody heard.
    pub(crate) fn release_unheard(&self, key: &str, node: usize) {
        let channel = crate::slots::tagged(key);
        if let Some(e) = self.shared.channels().get(&*channel) {
            e.state.send_if_modified(|s| s.unexpect(node));
        }
    }

    /// Tells `node`'s task to reconcile `channel`, starting the task if there
    /// is none (and `start` allows: an unsubscribe never needs a new task).
    fn sync(&self, node: usize, channel: &str, start: bool) {
        let Some(link) = self.links.get(node) else {
            return;
        };
        let Some(client) = &link.client else {
            return;
        };
        let mut task = link.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = task.as_ref()
            && tx.send(channel.to_owned()).is_ok()
        {
            return;
        }
        if !start {
            return;
        }
        // No task, or its runtime is gone: a new one subscribes to every
        // wanted channel when it connects.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.shared.node_down(node);
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        *task = Some(tx);
        self.shared.set_link(node, Link::Connecting);
        rt.spawn(node_task(
            node,
            client.clone(),
            channel_prefix(link.db),
            Arc::clone(&self.shared),
            rx,
            self.limit,
        ));
    }
}

/// A waiter's subscription to one key's releases; dropping it unsubscribes
/// when it was the key's last.
pub(crate) struct Subscription<'a> {
    waiting: &'a Waiting,
    /// The key (each node names its channel in its own database).
    channel: String,
    rx: watch::Receiver<Chan>,
    /// The state at the waiter's last attempt.
    seen: Chan,
}

impl Subscription<'_> {
    /// Waits (up to `limit`) until every node that can has confirmed the
    /// subscription, and starts listening from there. A node that confirms
    /// later wakes the waiter then.
    pub(crate) async fn ready(&mut self, limit: Duration) {
        let confirmed = self.rx.wait_for(|c| !c.nodes.contains(&NodeSub::Pending));
        let _ = tokio::time::timeout(limit, confirmed).await;
        self.mark_seen();
    }

    /// The channel's state as the waiter last marked it, then as it is now
    /// (for debug logs).
    pub(crate) fn describe(&self) -> String {
        format!("seen {:?}, now {:?}", self.seen, *self.rx.borrow())
    }

    /// Whether every node that can has confirmed the subscription.
    pub(crate) fn confirmed(&self) -> bool {
        !self.rx.borrow().nodes.contains(&NodeSub::Pending)
    }

    /// Forgets the wake-ups so far: an attempt is about to start, and sees
    /// whatever they announced.
    pub(crate) fn mark_seen(&mut self) {
        self.seen = self.rx.borrow_and_update().clone();
    }

    /// Whom the releases announced since the waiter's last attempt name,
    /// for the waiter `me` (see `Chan::naming`).
    pub(crate) fn naming(&self, me: u64, partial: bool) -> Naming {
        self.rx.borrow().naming(&self.seen, me, partial)
    }

    /// The nodes that announced a release since the waiter last marked
    /// them seen (`None`: a subscription changed since, and what it would
    /// have told is lost).
    pub(crate) fn fresh_nodes(&self) -> Option<Vec<usize>> {
        let now = self.rx.borrow();
        if now.changes != self.seen.changes {
            return None;
        }
        Some(
            (0..now.released.len())
                .filter(|&i| now.released.get(i) != self.seen.released.get(i))
                .collect(),
        )
    }

    /// Marks `nodes`' announcements so far seen, the other nodes' not.
    pub(crate) fn mark_nodes_seen(&mut self, nodes: &[usize]) {
        let now = self.rx.borrow_and_update();
        for &i in nodes {
            if let (Some(seen), Some(now)) = (self.seen.released.get_mut(i), now.released.get(i)) {
                *seen = *now;
            }
        }
    }

    /// Whether the announcements since those marked seen, with what the
    /// last attempt `found`, may have freed a quorum (see `Chan::wakes`).
    pub(crate) fn wakes_now(&self, found: &Found) -> bool {
        self.rx
            .borrow()
            .wakes(&self.seen, found, self.waiting.quorum)
    }

    /// Completes at the next change of the channel's state (an
    /// announcement, a subscription lost or regained). Cancel-safe.
    pub(crate) async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Per node, how many releases by others than this handle were
    /// announced so far (for [`Subscription::others_released`]).
    pub(crate) fn others(&self) -> Vec<u64> {
        self.rx.borrow().others.clone()
    }

    /// Completes once releases by others than this handle were announced,
    /// since `since` (an earlier [`Subscription::others`]), on a quorum of
    /// the nodes (on every subscribed one, with fewer). Cancel-safe.
    pub(crate) async fn others_released(&mut self, since: &[u64]) {
        let quorum = self.waiting.quorum;
        loop {
            if self.rx.borrow_and_update().others_released(since, quorum) {
                return;
            }
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Completes when the nodes that announced a release since the last
    /// attempt, with what that attempt `found`, may make a quorum, or when a
    /// subscription changed (see `Chan::wakes`). Cancel-safe: it keeps
    /// nothing but the watch's own cursor.
    pub(crate) async fn woken(&mut self, found: &Found) {
        let quorum = self.waiting.quorum;
        loop {
            if self.rx.borrow_and_update().wakes(&self.seen, found, quorum) {
                return;
            }
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.waiting.shared.channels();
            match channels.get_mut(&self.channel) {
                Some(e) => {
                    e.refs = e.refs.saturating_sub(1);
                    e.refs == 0 && channels.remove(&self.channel).is_some()
                }
                None => false,
            }
        };
        if last {
            for node in 0..self.waiting.links.len() {
                self.waiting.sync(node, &self.channel, false);
            }
        }
    }
}

#[cfg(test)]
mod tests;
