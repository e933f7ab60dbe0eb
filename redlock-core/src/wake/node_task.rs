//! One node's pub/sub connection, owned by one task: it connects while some
//! local waiter listens, subscribes to every channel still wanted, reconciles
//! subscriptions as waiters come and go, forwards release messages to the
//! waiters, checks a silent connection with `PING`, and reconnects with
//! backoff. With no waiter it stays idle: no connection, no retries. A
//! cluster node's session is `shard.rs`'s.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{HEALTH_CHECK_AFTER, Link, MAX_BACKOFF, MIN_BACKOFF, Shared};

/// How a node's pub/sub connection is opened.
#[derive(Clone)]
pub(super) enum Source {
    /// A single server: one connection, `SUBSCRIBE`.
    Server(Box<redis::Client>),
    /// A cluster by its seeds: a cluster connection, `SSUBSCRIBE` (`shard.rs`).
    Cluster(Vec<redis::ConnectionInfo>),
}

/// Owns one node's pub/sub connection: connects when a waiter listens,
/// subscribes to every wanted key's channel (named `prefix` + key),
/// reconciles subscriptions as waiters come and go, forwards messages, and
/// reconnects with backoff while waiters remain. Ends when the handle is
/// dropped.
pub(super) async fn node_task(
    node: usize,
    source: Source,
    prefix: String,
    shared: Arc<Shared>,
    mut inbox: mpsc::UnboundedReceiver<String>,
    limit: Duration,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        if !until_wanted(node, &shared, &mut inbox).await {
            return;
        }
        shared.set_link(node, Link::Connecting);
        let link = Conn {
            node,
            shared: &shared,
            prefix: &prefix,
            limit,
        };
        let served = match &source {
            Source::Server(client) => {
                let connected = tokio::select! {
                    r = tokio::time::timeout(limit, client.get_async_pubsub()) => r.ok().and_then(Result::ok),
                    () = closed(&mut inbox) => return,
                };
                match connected {
                    Some(pubsub) => {
                        let (sink, stream) = pubsub.split();
                        Some(link.serve(sink, stream, &mut inbox).await)
                    }
                    None => None,
                }
            }
            Source::Cluster(seeds) => Some(link.serve_shards(seeds, &mut inbox).await),
        };
        match served {
            Some(Served::Closed) => return,
            Some(Served::Broken { confirmed: true }) => backoff = MIN_BACKOFF,
            _ => {}
        }
        shared.node_down(node);
        if shared.desired().is_empty() {
            // Nobody to reconnect for: idle until a waiter comes, which then
            // need not wait out a backoff built up for nobody.
            backoff = MIN_BACKOFF;
            continue;
        }
        tracing::debug!(
            node,
            retry_in_ms = backoff.as_millis() as u64,
            "release subscription down"
        );
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = closed(&mut inbox) => return,
        }
        backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
    }
}

/// Returns at once if a local waiter listens for some key; else marks the
/// link idle and waits, without any connection, until a waiter's request
/// comes. False when the handle is gone.
async fn until_wanted(
    node: usize,
    shared: &Shared,
    inbox: &mut mpsc::UnboundedReceiver<String>,
) -> bool {
    if !shared.desired().is_empty() {
        return true;
    }
    shared.set_link(node, Link::Idle);
    // A waiter that subscribes after the look above sends its key here.
    while let Some(key) = inbox.recv().await {
        if shared.wanted(&key) {
            return true;
        }
    }
    false
}

pub(super) enum Served {
    /// The handle is gone.
    Closed,
    /// The connection failed; `confirmed` if it worked for a while first.
    Broken { confirmed: bool },
}

/// Drains the inbox until the handle is gone: while there is no connection,
/// requests need no answer (the next connection subscribes to what is wanted).
pub(super) async fn closed(inbox: &mut mpsc::UnboundedReceiver<String>) {
    while inbox.recv().await.is_some() {}
}

/// One connection's session.
pub(super) struct Conn<'a> {
    pub(super) node: usize,
    pub(super) shared: &'a Shared,
    /// The node's channel names: this, then the key.
    pub(super) prefix: &'a str,
    /// How long a connect, (un)subscribe or `PING` may take.
    pub(super) limit: Duration,
}

impl Conn<'_> {
    pub(super) fn channel(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn serve(
        &self,
        mut sink: PubSubSink,
        mut stream: PubSubStream,
        inbox: &mut mpsc::UnboundedReceiver<String>,
    ) -> Served {
        let (node, shared, limit) = (self.node, self.shared, self.limit);
        let mut subscribed: HashSet<String> = HashSet::new();
        let desired = shared.desired();
        if !desired.is_empty() {
            let channels: Vec<String> = desired.iter().map(|k| self.channel(k)).collect();
            shared.listen(node, &desired);
            match tokio::time::timeout(limit, sink.subscribe(&channels)).await {
                Ok(Ok(())) => {
                    shared.set_link(node, Link::Up);
                    shared.confirm(node, &desired);
                    subscribed.extend(desired);
                }
                _ => return Served::Broken { confirmed: false },
            }
        } else {
            shared.set_link(node, Link::Up);
        }
        // When the node last said anything on this connection.
        let mut heard = Instant::now();
        loop {
            let check_at = heard.checked_add(HEALTH_CHECK_AFTER).unwrap_or(heard);
            tokio::select! {
                request = inbox.recv() => {
                    let Some(key) = request else {
                        return Served::Closed;
                    };
                    let want = shared.wanted(&key);
                    let has = subscribed.contains(&key);
                    let sent = if want && !has {
                        shared.listen(node, std::slice::from_ref(&key));
                        tokio::time::timeout(limit, sink.subscribe(self.channel(&key))).await
                    } else if !want && has {
                        tokio::time::timeout(limit, sink.unsubscribe(self.channel(&key))).await
                    } else {
                        if want {
                            // A new waiter's entry for a key still subscribed.
                            shared.confirm(node, std::slice::from_ref(&key));
                        }
                        continue;
                    };
                    if !matches!(sent, Ok(Ok(()))) {
                        return Served::Broken { confirmed: true };
                    }
                    heard = Instant::now();
                    if want {
                        shared.confirm(node, std::slice::from_ref(&key));
                        subscribed.insert(key);
                    } else {
                        shared.unlisten(node, &key);
                        subscribed.remove(&key);
                    }
                }
                message = stream.next() => match message {
                    Some(m) => {
                        heard = Instant::now();
                        if let Some(key) = m.get_channel_name().strip_prefix(self.prefix) {
                            shared.wake(key, node, m.get_payload_bytes());
                        }
                    }
                    None => return Served::Broken { confirmed: true },
                },
                // A subscribed connection that died without a word (a path
                // that drops everything, a node gone behind a middlebox) would
                // leave the waiters on their safety-net poll for good: a
                // silent one is asked, and replaced if it does not answer. The
                // new one's confirmation wakes the waiters to look again.
                () = tokio::time::sleep_until(check_at), if !subscribed.is_empty() => {
                    match tokio::time::timeout(limit, sink.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => heard = Instant::now(),
                        _ => {
                            tracing::debug!(node, "release subscription silent, replaced");
                            return Served::Broken { confirmed: true };
                        }
                    }
                }
            }
        }
    }
}
