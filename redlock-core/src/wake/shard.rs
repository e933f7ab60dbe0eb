//! A cluster node's release subscription: the release scripts announce by
//! `SPUBLISH` on the key's shard channel (`node/scripts.rs`), which only the
//! shard serving the key's slot hears, so a waiter subscribes by `SSUBSCRIBE`
//! there. redis' cluster connection (RESP3, its pushes sent to this task)
//! routes each `SSUBSCRIBE` to the master of the channel's slot, one channel
//! per command (channels of several slots in one would be refused).
//!
//! The session ends, and the node task makes a new connection from the
//! seeds, with a fresh slot map, when a member's connection drops (a master
//! killed or failing over: a `Disconnection` push), when a master
//! unsubscribes a channel still wanted (its slot moved away: Redis sends
//! `sunsubscribe` then), or when a silent connection does not answer a
//! `PING`. Until a new session confirms the subscriptions, waiters are woken
//! and fall back to their timers for this node, as on a single server.

use std::collections::HashSet;

use futures_util::future::join_all;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::HEALTH_CHECK_AFTER;
use super::Link;
use super::node_task::{Conn, Served, closed};

impl Conn<'_> {
    /// One session on a cluster given by `seeds`: connects, subscribes to
    /// every wanted key's shard channel, then serves as [`Conn::serve`] does.
    pub(super) async fn serve_shards(
        &self,
        seeds: &[redis::ConnectionInfo],
        inbox: &mut mpsc::UnboundedReceiver<String>,
    ) -> Served {
        let (tx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
        let client = ClusterClientBuilder::new(seeds.to_vec())
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(tx)
            .retries(2)
            .connection_timeout(self.limit)
            .response_timeout(self.limit)
            .build();
        let Ok(client) = client else {
            return Served::Broken { confirmed: false };
        };
        let connected = tokio::select! {
            r = tokio::time::timeout(self.limit, client.get_async_connection()) => r.ok().and_then(Result::ok),
            () = closed(inbox) => return Served::Closed,
        };
        let Some(mut conn) = connected else {
            return Served::Broken { confirmed: false };
        };
        let (node, shared, limit) = (self.node, self.shared, self.limit);
        let desired = shared.desired();
        let mut subscribed: HashSet<String> = HashSet::new();
        shared.listen(node, &desired);
        if !self.subscribe(&conn, &desired).await {
            return Served::Broken { confirmed: false };
        }
        shared.set_link(node, Link::Up);
        shared.confirm(node, &desired);
        subscribed.extend(desired);
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
                        self.subscribe(&conn, std::slice::from_ref(&key)).await
                    } else if !want && has {
                        matches!(
                            tokio::time::timeout(limit, conn.sunsubscribe(self.channel(&key))).await,
                            Ok(Ok(()))
                        )
                    } else {
                        if want {
                            shared.confirm(node, std::slice::from_ref(&key));
                        }
                        continue;
                    };
                    if !sent {
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
                push = pushes.recv() => {
                    let Some(push) = push else {
                        return Served::Broken { confirmed: true };
                    };
                    heard = Instant::now();
                    let key = channel_of(&push).and_then(|c| c.strip_prefix(self.prefix).map(str::to_owned));
                    match (&push.kind, key) {
                        (PushKind::SMessage, Some(key)) => shared.wake(&key, node, payload_of(&push)),
                        (PushKind::Disconnection, _) => {
                            tracing::debug!(node, "cluster member's connection dropped; subscribing anew");
                            return Served::Broken { confirmed: true };
                        }
                        // A master gave up a channel nobody unsubscribed:
                        // its slot moved away.
                        (PushKind::SUnsubscribe, Some(key))
                            if subscribed.contains(&key) && shared.wanted(&key) =>
                        {
                            tracing::debug!(node, "shard channel dropped by its master (slot moved); subscribing anew");
                            return Served::Broken { confirmed: true };
                        }
                        _ => {}
                    }
                }
                () = tokio::time::sleep_until(check_at), if !subscribed.is_empty() => {
                    let ping = redis::cmd("PING");
                    let answer = tokio::time::timeout(
                        limit,
                        redis::aio::ConnectionLike::req_packed_command(&mut conn, &ping),
                    )
                    .await;
                    match answer {
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

    /// Subscribes to the shard channels of `keys`, one command each (each
    /// goes to its slot's master), all at once. True if every one was
    /// confirmed within the limit.
    async fn subscribe(&self, conn: &ClusterConnection, keys: &[String]) -> bool {
        let limit = self.limit;
        let confirmed = join_all(keys.iter().map(|key| {
            let mut conn = conn.clone();
            let channel = self.channel(key);
            async move {
                matches!(
                    tokio::time::timeout(limit, conn.ssubscribe(channel)).await,
                    Ok(Ok(()))
                )
            }
        }))
        .await;
        confirmed.into_iter().all(|ok| ok)
    }
}

/// The channel a push names (its first item).
/// A shard message's payload (its second item), or nothing.
fn payload_of(push: &PushInfo) -> &[u8] {
    match push.data.get(1) {
        Some(Value::BulkString(b)) => b,
        Some(Value::SimpleString(s)) => s.as_bytes(),
        _ => &[],
    }
}

fn channel_of(push: &PushInfo) -> Option<&str> {
    match push.data.first() {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok(),
        Some(Value::SimpleString(s)) => Some(s),
        _ => None,
    }
}
