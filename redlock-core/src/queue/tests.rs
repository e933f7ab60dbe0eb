//! The local queue's tests: plain unit tests, and the model-checked
//! cancellation paths under `--cfg redlock_loom`.

#[cfg(not(redlock_loom))]
mod unit {
    use super::super::*;
    use std::task::Waker;

    fn poll_turn(q: &Queues, key: &str, id: u64) -> bool {
        q.poll_turn(key, id, &mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn first_come_first_served() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let ids: Vec<u64> = (0..4).map(|_| q.join(&key)).collect();
        let token: Arc<str> = "t0".into();
        for (i, id) in ids.iter().enumerate() {
            for later in &ids[i + 1..] {
                assert!(!poll_turn(&q, &key, *later));
            }
            assert!(poll_turn(&q, &key, *id));
            let far = Instant::now() + std::time::Duration::from_secs(60);
            assert!(q.hold(&key, *id, &token, far));
            assert_eq!(q.holder(&key).map(|h| h.0), Some(Arc::clone(&token)));
            q.release(&key, &token);
        }
        assert!(q.is_empty());
    }

    #[test]
    fn a_hand_over_is_allowed_once_in_a_row_then_a_release_resets_the_streak() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let ids: Vec<u64> = (0..4).map(|_| q.join(&key)).collect();
        let tokens: Vec<Arc<str>> = (0..4).map(|i| format!("t{i}").into()).collect();
        // Nobody queued behind: nothing to hand over.
        let lone: Arc<str> = "lone".into();
        let other: Arc<str> = "other".into();
        let l = q.join(&other);
        assert!(q.hold(&other, l, &lone, far));
        assert!(!q.hand_over(&other, &lone));
        q.release(&other, &lone);
        // A holds; its release hands the turn to B as it is sent.
        assert!(q.hold(&key, ids[0], &tokens[0], far));
        assert!(!q.hand_over(&key, "not-the-holder"));
        assert!(q.hand_over(&key, &tokens[0]));
        assert!(poll_turn(&q, &key, ids[1]));
        // A's release, once decided, only kicks B (who is contending).
        q.release(&key, &tokens[0]);
        assert!(poll_turn(&q, &key, ids[1]));
        // B holds; the streak is used up: B's release waits for its decision.
        assert!(q.hold(&key, ids[1], &tokens[1], far));
        assert!(!q.hand_over(&key, &tokens[1]));
        assert!(!poll_turn(&q, &key, ids[2]));
        q.release(&key, &tokens[1]);
        assert!(poll_turn(&q, &key, ids[2]));
        // ... which reset the streak.
        assert!(q.hold(&key, ids[2], &tokens[2], far));
        assert!(q.hand_over(&key, &tokens[2]));
        assert!(poll_turn(&q, &key, ids[3]));
        q.release(&key, &tokens[2]);
        q.leave(&key, ids[3]);
        assert!(q.is_empty());
    }

    #[test]
    fn leaving_waiters_do_not_take_the_turn_along() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let (a, b, c) = (q.join(&key), q.join(&key), q.join(&key));
        q.leave(&key, b);
        q.leave(&key, a);
        assert!(poll_turn(&q, &key, c));
        q.leave(&key, c);
        assert!(q.is_empty());
    }

    #[test]
    fn expired_holder_passes_the_turn_and_stale_releases_kick() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let (a, b) = (q.join(&key), q.join(&key));
        let ta: Arc<str> = "ta".into();
        assert!(q.hold(&key, a, &ta, Instant::now()));
        q.expire(&key, "other");
        assert!(!poll_turn(&q, &key, b));
        q.expire(&key, &ta);
        assert!(poll_turn(&q, &key, b));
        // A's late release is not B's turn to lose: it only tells B to retry.
        let cx = &mut Context::from_waker(Waker::noop());
        assert!(q.poll_kick(&key, b, cx).is_pending());
        q.release(&key, &ta);
        assert!(q.poll_kick(&key, b, cx).is_ready());
        assert!(q.poll_kick(&key, b, cx).is_pending());
        assert!(poll_turn(&q, &key, b));
    }

    #[test]
    fn the_release_that_handed_the_turn_over_does_not_kick_the_new_head() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let cx = &mut Context::from_waker(Waker::noop());
        let (a, b, c) = (q.join(&key), q.join(&key), q.join(&key));
        let (ta, tb, tc): (Arc<str>, Arc<str>, Arc<str>) = ("ta".into(), "tb".into(), "tc".into());
        assert!(q.hold(&key, a, &ta, far));
        assert!(q.hand_over(&key, &ta));
        assert!(poll_turn(&q, &key, b));
        // B attempts right behind A's release; A's decided release must not
        // send it to attempt again.
        q.release(&key, &ta);
        assert!(q.poll_kick(&key, b, cx).is_pending());
        // Nor the head after B, should B give up before the release decides.
        assert!(q.hold(&key, b, &tb, far));
        q.release(&key, &tb);
        assert!(q.hold(&key, c, &tc, far));
        let d = q.join(&key);
        let e = q.join(&key);
        assert!(q.hand_over(&key, &tc));
        q.leave(&key, d);
        assert!(poll_turn(&q, &key, e));
        q.release(&key, &tc);
        assert!(q.poll_kick(&key, e, cx).is_pending());
        // Another holder's release (a `try_acquire`) still kicks.
        q.release(&key, &ta);
        assert!(q.poll_kick(&key, e, cx).is_ready());
        q.leave(&key, e);
        assert!(q.is_empty());
    }

    #[test]
    fn a_renewed_holder_keeps_its_turn_until_the_renewed_validity() {
        let q = Queues::default();
        let key: Arc<str> = "k".into();
        let (a, b) = (q.join(&key), q.join(&key));
        let ta: Arc<str> = "ta".into();
        assert!(q.hold(&key, a, &ta, Instant::now()));
        let later = Instant::now() + std::time::Duration::from_secs(60);
        q.renew(&key, "other", later);
        q.renew(&key, &ta, later);
        assert_eq!(q.holder(&key).map(|h| h.1), Some(later));
        // A waiter that read the first validity finds the turn still held.
        q.expire(&key, &ta);
        assert!(!poll_turn(&q, &key, b));
        q.release(&key, &ta);
        assert!(poll_turn(&q, &key, b));
        q.leave(&key, b);
        assert!(q.is_empty());
    }
}

/// Model-checked cancellation paths: run with
/// `RUSTFLAGS="--cfg redlock_loom" cargo test -p redlock-core --release --lib queue`.
#[cfg(redlock_loom)]
mod loom_tests {
    use super::super::*;
    use loom::future::block_on;
    use loom::thread;

    fn turn(q: &Queues, key: &str, id: u64) {
        block_on(std::future::poll_fn(|cx| q.poll_turn(key, id, cx)));
    }

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    /// The head is cancelled while the next waiter waits: the turn is not lost.
    #[test]
    fn cancelled_head_passes_the_turn() {
        loom::model(|| {
            let q = Arc::new(Queues::default());
            let key: Arc<str> = "k".into();
            let a = q.join(&key);
            let b = q.join(&key);
            let t = {
                let (q, key) = (Arc::clone(&q), Arc::clone(&key));
                thread::spawn(move || q.leave(&key, a))
            };
            turn(&q, &key, b);
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
            q.leave(&key, b);
            assert!(q.is_empty());
        });
    }

    /// A holder's release (`release`) races the first waiter being dropped:
    /// the second waiter gets the turn whichever happens first, and nothing is
    /// left behind.
    fn release_racing_a_dropped_waiter(release: fn(&Queues, &str, &str)) {
        loom::model(move || {
            let q = Arc::new(Queues::default());
            let key: Arc<str> = "k".into();
            let token: Arc<str> = "t".into();
            let h = q.join(&key);
            assert!(q.hold(&key, h, &token, far()));
            let a = q.join(&key);
            let b = q.join(&key);
            let releaser = {
                let (q, key, token) = (Arc::clone(&q), Arc::clone(&key), Arc::clone(&token));
                thread::spawn(move || release(&q, &key, &token))
            };
            let dropper = {
                let (q, key) = (Arc::clone(&q), Arc::clone(&key));
                thread::spawn(move || q.leave(&key, a))
            };
            turn(&q, &key, b);
            for t in [releaser, dropper] {
                if let Err(e) = t.join() {
                    std::panic::resume_unwind(e);
                }
            }
            q.leave(&key, b);
            assert!(q.is_empty());
        });
    }

    #[test]
    fn release_racing_a_dropped_waiter_wakes_the_next() {
        release_racing_a_dropped_waiter(|q, key, token| q.release(key, token));
    }

    /// The turn handed over as the release is sent, then the release decided.
    #[test]
    fn hand_over_racing_a_dropped_waiter_wakes_the_next() {
        release_racing_a_dropped_waiter(|q, key, token| {
            q.hand_over(key, token);
            q.release(key, token);
        });
    }

    /// A waiter cancelled right as the turn reaches it (it was woken but never
    /// looked) hands the turn on instead of swallowing it.
    #[test]
    fn waiter_cancelled_as_it_is_woken_hands_the_turn_on() {
        loom::model(|| {
            let q = Arc::new(Queues::default());
            let key: Arc<str> = "k".into();
            let a = q.join(&key);
            let b = q.join(&key);
            let c = q.join(&key);
            let head = {
                let (q, key) = (Arc::clone(&q), Arc::clone(&key));
                thread::spawn(move || q.leave(&key, a))
            };
            let cancelled = {
                let (q, key) = (Arc::clone(&q), Arc::clone(&key));
                thread::spawn(move || q.leave(&key, b))
            };
            turn(&q, &key, c);
            for t in [head, cancelled] {
                if let Err(e) = t.join() {
                    std::panic::resume_unwind(e);
                }
            }
            q.leave(&key, c);
            assert!(q.is_empty());
        });
    }

    /// A `try_lock` holder's release races a waiter joining the key's queue,
    /// and the release reads [`Queues::idle`] without the lock. `conn`
    /// stands for one node's connection: the order in which the release's
    /// compare-and-delete and the waiter's `SET` are queued on it. Whenever
    /// the `SET` went first (it finds the key still held), the release must
    /// have seen the queue and kicked the waiter, so that it attempts again
    /// at once instead of sleeping until its next retry.
    #[test]
    fn a_release_that_sees_no_queue_runs_before_every_new_waiters_set() {
        loom::model(|| {
            use loom::sync::atomic::{AtomicUsize, Ordering};
            let q = Arc::new(Queues::default());
            let key: Arc<str> = "k".into();
            let conn = Arc::new(AtomicUsize::new(0));
            let releaser = {
                let (q, key, conn) = (Arc::clone(&q), Arc::clone(&key), Arc::clone(&conn));
                thread::spawn(move || {
                    let del = conn.fetch_add(1, Ordering::Relaxed);
                    q.hand_over(&key, "holder");
                    q.release(&key, "holder");
                    del
                })
            };
            let id = q.join(&key);
            let set = conn.fetch_add(1, Ordering::Relaxed);
            let del = match releaser.join() {
                Ok(del) => del,
                Err(e) => std::panic::resume_unwind(e),
            };
            if set < del {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                assert!(
                    q.poll_kick(&key, id, &mut cx).is_ready(),
                    "the waiter's SET ran before the release, and nothing kicked it"
                );
            }
            q.leave(&key, id);
            assert!(q.is_empty());
        });
    }

    /// A release by a holder without the turn, racing the head's wait for it:
    /// the head is woken (the kick is never lost).
    #[test]
    fn kick_is_not_lost() {
        loom::model(|| {
            let q = Arc::new(Queues::default());
            let key: Arc<str> = "k".into();
            let a = q.join(&key);
            let t = {
                let (q, key) = (Arc::clone(&q), Arc::clone(&key));
                thread::spawn(move || q.release(&key, "someone-else"))
            };
            block_on(std::future::poll_fn(|cx| q.poll_kick(&key, a, cx)));
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
            q.leave(&key, a);
            assert!(q.is_empty());
        });
    }
}
