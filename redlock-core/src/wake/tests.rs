//! Unit tests of `wake`.

use super::*;
use crate::keys::channel;

#[test]
fn a_channel_names_the_database_and_the_key() {
    // By the key's tag (`slots`), so that a shard channel is in the key's slot.
    assert_eq!(channel(0, "invoice:42"), "redlock:released:0:{invoice:42}");
    assert_eq!(channel(3, "a:b"), "redlock:released:3:{a:b}");
    assert_eq!(channel(0, "{a%7Bb%7D}"), "redlock:released:0:{a%7Bb%7D}");
}

#[test]
fn only_a_new_confirmation_wakes_the_waiters() {
    let shared = Shared::new(vec![Link::Up; 2]);
    let (tx, rx) = watch::channel(Chan::new(vec![NodeSub::Pending; 2]));
    shared
        .channels()
        .insert("k".into(), Entry { refs: 1, state: tx });
    let keys = ["k".to_owned()];
    shared.confirm(0, &keys);
    assert_eq!(rx.borrow().changes, 1);
    assert_eq!(rx.borrow().nodes, [NodeSub::Subscribed, NodeSub::Pending]);
    // The same node confirming again (a key unsubscribed and wanted again
    // before its task caught up sends two requests) is no news.
    shared.confirm(0, &keys);
    assert_eq!(rx.borrow().changes, 1);
    // A subscription regained after it was lost is.
    shared.node_down(0);
    shared.confirm(0, &keys);
    assert_eq!(rx.borrow().changes, 3);
}
