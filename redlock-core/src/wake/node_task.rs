//! One node's pub/sub connection, owned by one task: it connects, subscribes to
//! every channel still wanted, reconciles subscriptions as waiters come and go,
//! forwards release messages to the waiters, and reconnects with backoff.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::mpsc;

use super::{Link, MAX_BACKOFF, MIN_BACKOFF, Shared};

/// Owns one node's pub/sub connection: connects, subscribes to every wanted
/// channel, reconciles subscriptions as waiters come and go, forwards
/// messages, and reconnects with backoff. Ends when the handle is dropped.
pub(super) async fn node_task(
    node: usize,
    client: redis::Client,
    shared: Arc<Shared>,
    mut inbox: mpsc::UnboundedReceiver<String>,
    limit: Duration,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        shared.set_link(node, Link::Connecting);
        let connected = tokio::select! {
            r = tokio::time::timeout(limit, client.get_async_pubsub()) => r.ok().and_then(Result::ok),
            () = closed(&mut inbox) => return,
        };
        if let Some(pubsub) = connected {
            let (sink, stream) = pubsub.split();
            match serve(node, &shared, sink, stream, &mut inbox, limit).await {
                Served::Closed => return,
                Served::Broken { confirmed } => {
                    if confirmed {
                        backoff = MIN_BACKOFF;
                    }
                }
            }
        }
        shared.node_down(node);
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

enum Served {
    /// The handle is gone.
    Closed,
    /// The connection failed; `confirmed` if it worked for a while first.
    Broken { confirmed: bool },
}

/// Drains the inbox until the handle is gone: while there is no connection,
/// requests need no answer (the next connection subscribes to what is wanted).
async fn closed(inbox: &mut mpsc::UnboundedReceiver<String>) {
    while inbox.recv().await.is_some() {}
}

async fn serve(
    node: usize,
    shared: &Shared,
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    inbox: &mut mpsc::UnboundedReceiver<String>,
    limit: Duration,
) -> Served {
    let mut subscribed: HashSet<String> = HashSet::new();
    let desired = shared.desired();
    if !desired.is_empty() {
        match tokio::time::timeout(limit, sink.subscribe(&desired)).await {
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
    loop {
        tokio::select! {
            request = inbox.recv() => {
                let Some(channel) = request else {
                    return Served::Closed;
                };
                let want = shared.wanted(&channel);
                let has = subscribed.contains(&channel);
                let sent = if want && !has {
                    tokio::time::timeout(limit, sink.subscribe(&channel)).await
                } else if !want && has {
                    tokio::time::timeout(limit, sink.unsubscribe(&channel)).await
                } else {
                    if want {
                        // A new waiter's entry for a channel still subscribed.
                        shared.confirm(node, std::slice::from_ref(&channel));
                    }
                    continue;
                };
                if !matches!(sent, Ok(Ok(()))) {
                    return Served::Broken { confirmed: true };
                }
                if want {
                    shared.confirm(node, std::slice::from_ref(&channel));
                    subscribed.insert(channel);
                } else {
                    subscribed.remove(&channel);
                }
            }
            message = stream.next() => match message {
                Some(m) => shared.wake(m.get_channel_name(), node),
                None => return Served::Broken { confirmed: true },
            },
        }
    }
}
