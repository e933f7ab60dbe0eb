//! Waiting by wake-up, the remote half: the release script `PUBLISH`es on the
//! key's channel after its compare-and-delete (see `node::RELEASE_LUA`), and a
//! waiter listens on every node for that message instead of polling.
//!
//! One pub/sub connection per node per [`Redlock`](crate::Redlock) handle,
//! outside the deadpool pool (a subscribed connection cannot run commands),
//! shared by all keys, and subscribed to a key's channel only while a local
//! waiter of that key listens (reference-counted). Each node's connection is
//! owned by a task that subscribes, unsubscribes and reconnects; after a
//! reconnect it subscribes again to every channel still wanted.
//!
//! Pub/sub is at-most-once: a message sent while a connection was down, or
//! never sent (a key that expired), is not delivered. So a waiter is also woken
//! when a node's subscription drops or comes back, and keeps the fallback
//! timers of `wait.rs`.

use std::collections::HashMap;
use std::ops::DerefMut;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::node::Node;
use crate::queue::Queues;
use crate::settings::Settings;

mod node_task;
use node_task::node_task;

/// What the release script's channel names start with; the key follows. Keys
/// are unique, so channels of different keys never collide, and the prefix
/// keeps them apart from the application's own channels.
pub(crate) const CHANNEL_PREFIX: &str = "redlock:released:";

/// The channel a release of `key` is published on.
pub(crate) fn channel(key: &str) -> String {
    format!("{CHANNEL_PREFIX}{key}")
}

/// The shortest and longest wait before a failed pub/sub connection is tried
/// again: soon after a blip, rarely while a node stays down.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One node's part in a channel's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeSub {
    /// Asked for, not confirmed yet.
    Pending,
    Subscribed,
    /// No subscription on this node (no connection, or no way to make one):
    /// its releases are found by the fallback timers only.
    Down,
}

/// What a waiter watches: a counter bumped at every wake-up (a message, a
/// node's subscription lost or regained), and each node's subscription.
#[derive(Debug, Clone)]
struct Chan {
    wakes: u64,
    nodes: Vec<NodeSub>,
}

struct Entry {
    refs: usize,
    state: watch::Sender<Chan>,
}

/// A node's pub/sub connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Connecting,
    Up,
    Down,
}

/// What the node tasks and the waiters share.
struct Shared {
    channels: Mutex<HashMap<String, Entry>>,
    links: Mutex<Vec<Link>>,
}

impl Shared {
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

    fn wanted(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    fn desired(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }

    /// `node` confirmed these subscriptions. It also wakes their waiters: a
    /// release published before the confirmation may have been missed.
    fn confirm(&self, node: usize, channels: &[String]) {
        let map = self.channels();
        for c in channels {
            if let Some(e) = map.get(c) {
                e.state.send_modify(|s| {
                    if let Some(n) = s.nodes.get_mut(node) {
                        *n = NodeSub::Subscribed;
                    }
                    s.wakes = s.wakes.wrapping_add(1);
                });
            }
        }
    }

    /// `node`'s connection is gone: its waiters are woken (whatever it would
    /// have told them is lost) and fall back to their timers for it.
    fn node_down(&self, node: usize) {
        self.set_link(node, Link::Down);
        for e in self.channels().values() {
            e.state.send_if_modified(|s| match s.nodes.get_mut(node) {
                Some(n) if *n != NodeSub::Down => {
                    *n = NodeSub::Down;
                    s.wakes = s.wakes.wrapping_add(1);
                    true
                }
                _ => false,
            });
        }
    }

    /// A release was published on `channel`.
    fn wake(&self, channel: &str) {
        if let Some(e) = self.channels().get(channel) {
            e.state.send_modify(|s| s.wakes = s.wakes.wrapping_add(1));
        }
    }
}

/// How one node is reached for pub/sub.
struct NodeLink {
    /// `None`: the node was given as a pool, whose connection details cannot
    /// be read back; waiters poll that node.
    client: Option<redis::Client>,
    /// The node task's inbox: the channels whose subscription to reconcile.
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
                    .and_then(|info| redis::Client::open(info.clone()).ok()),
                task: Mutex::new(None),
            })
            .collect();
        let state = links
            .iter()
            .map(|l| match l.client {
                Some(_) => Link::Connecting,
                None => Link::Down,
            })
            .collect();
        Self {
            queues: Queues::default(),
            enabled,
            shared: Arc::new(Shared {
                channels: Mutex::new(HashMap::new()),
                links: Mutex::new(state),
            }),
            links,
            limit: settings
                .node_timeout
                .saturating_mul(10)
                .clamp(Duration::from_secs(1), Duration::from_secs(30)),
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
        let channel = channel(key);
        let (rx, fresh) = {
            let mut channels = self.shared.channels();
            match channels.get_mut(&channel) {
                Some(e) => {
                    e.refs = e.refs.saturating_add(1);
                    (e.state.subscribe(), false)
                }
                None => {
                    let nodes = self
                        .shared
                        .links()
                        .iter()
                        .map(|l| match l {
                            Link::Down => NodeSub::Down,
                            Link::Connecting | Link::Up => NodeSub::Pending,
                        })
                        .collect();
                    let (tx, rx) = watch::channel(Chan { wakes: 0, nodes });
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
        Some(Subscription {
            waiting: self,
            channel,
            rx,
        })
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
    channel: String,
    rx: watch::Receiver<Chan>,
}

impl Subscription<'_> {
    /// Waits (up to `limit`) until every node that can has confirmed the
    /// subscription, and starts listening from there. A node that confirms
    /// later wakes the waiter then.
    pub(crate) async fn ready(&mut self, limit: Duration) {
        let confirmed = self.rx.wait_for(|c| !c.nodes.contains(&NodeSub::Pending));
        let _ = tokio::time::timeout(limit, confirmed).await;
        self.rx.borrow_and_update();
    }

    /// Forgets the wake-ups so far: an attempt is about to start, and sees
    /// whatever they announced.
    pub(crate) fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Completes at the next wake-up.
    pub(crate) async fn woken(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
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
mod tests {
    use super::*;

    #[test]
    fn release_script_publishes_on_the_channel() {
        assert!(crate::node::RELEASE_LUA.contains(&format!("'{CHANNEL_PREFIX}' ..")));
        assert_eq!(channel("invoice:42"), "redlock:released:invoice:42");
    }
}
