//! The coalescer's tests: plain unit tests of its batches, and the
//! model-checked hand-off under `--cfg redlock_loom`.

#[cfg(not(redlock_loom))]
mod unit {
    use super::super::*;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Where a waiter's turn goes.
    type TurnSlot = Arc<StdMutex<Option<Turn<Op>>>>;

    struct Op {
        id: u32,
        bytes: usize,
        gone: Arc<AtomicBool>,
        /// A waiter for the turn, not an operation.
        waiter: Option<TurnSlot>,
    }

    impl Pending for Op {
        fn bytes(&self) -> usize {
            self.bytes
        }
        fn abandoned(&self) -> bool {
            self.gone.load(Ordering::SeqCst)
        }
        fn waits_for_turn(&self) -> bool {
            self.waiter.is_some()
        }
        fn take_turn(self, turn: Turn<Self>) {
            if let Some(slot) = self.waiter {
                *slot.lock().unwrap() = Some(turn);
            }
        }
    }

    fn waiter(id: u32, slot: &TurnSlot) -> Op {
        Op {
            id,
            bytes: 0,
            gone: Arc::default(),
            waiter: Some(Arc::clone(slot)),
        }
    }

    type Started = Arc<StdMutex<Vec<(Turn<Op>, Vec<Op>)>>>;

    /// A coalescer whose drivers are kept for the test to run by hand.
    fn coalescer(ops: usize, bytes: usize) -> (Arc<Coalescer<Op>>, Started) {
        let started: Started = Arc::default();
        let s = Arc::clone(&started);
        let c = Coalescer::new(
            Limits { ops, bytes },
            Box::new(move |turn, batch| {
                s.lock().unwrap().push((turn, batch));
            }),
        );
        (Arc::new(c), started)
    }

    fn op(id: u32, bytes: usize) -> Op {
        Op {
            id,
            bytes,
            gone: Arc::default(),
            waiter: None,
        }
    }

    fn ids(batch: &[Op]) -> Vec<u32> {
        batch.iter().map(|o| o.id).collect()
    }

    #[test]
    fn a_lone_operation_goes_at_once_and_leaves_the_coalescer_idle() {
        let (c, started) = coalescer(10, 1000);
        let turn = c.enter(|| unreachable!("an idle coalescer queues nothing"));
        assert!(turn.is_some());
        assert!(c.is_busy());
        drop(turn);
        assert!(!c.is_busy());
        assert!(started.lock().unwrap().is_empty(), "no driver for nothing");
    }

    #[test]
    fn what_queues_behind_a_call_goes_as_batches_within_the_limits_oldest_first() {
        let (c, started) = coalescer(3, 1000);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        for id in 1..=5 {
            assert!(c.enter(|| op(id, 1)).is_none());
        }
        assert_eq!(c.queued(), 5);
        // The lone call answers: its turn starts a driver with the first batch.
        drop(turn);
        let (mut turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [1, 2, 3]);
        assert!(c.is_busy());
        // What comes while the batch is in flight queues behind it.
        assert!(c.enter(|| op(6, 1)).is_none());
        assert_eq!(turn.next().as_deref().map(ids), Some(vec![4, 5, 6]));
        assert_eq!(turn.next().map(|b| ids(&b)), None);
        assert!(!c.is_busy());
        drop(turn);
        assert!(started.lock().unwrap().is_empty());
        // Idle again: the next one goes alone.
        assert!(c.enter(|| op(7, 1)).is_some());
    }

    #[test]
    fn a_batch_is_cut_by_bytes_and_a_large_operation_goes_alone() {
        let (c, started) = coalescer(100, 10);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        for (id, bytes) in [(1, 4), (2, 4), (3, 4), (4, 50), (5, 1)] {
            assert!(c.enter(|| op(id, bytes)).is_none());
        }
        drop(turn);
        let (mut turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [1, 2]);
        assert_eq!(turn.next().as_deref().map(ids), Some(vec![3]));
        assert_eq!(turn.next().as_deref().map(ids), Some(vec![4]));
        assert_eq!(turn.next().as_deref().map(ids), Some(vec![5]));
        assert!(turn.next().is_none());
    }

    #[test]
    fn an_abandoned_operation_is_not_sent() {
        let (c, started) = coalescer(10, 1000);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        let gone = Arc::new(AtomicBool::new(false));
        assert!(c.enter(|| op(1, 1)).is_none());
        assert!(
            c.enter(|| Op {
                id: 2,
                bytes: 1,
                gone: Arc::clone(&gone),
                waiter: None,
            })
            .is_none()
        );
        assert!(c.enter(|| op(3, 1)).is_none());
        gone.store(true, Ordering::SeqCst);
        drop(turn);
        let (_turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [1, 3]);
    }

    #[test]
    fn a_driver_dropped_mid_batch_passes_the_queue_on() {
        let (c, started) = coalescer(1, 1000);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        assert!(c.enter(|| op(1, 1)).is_none());
        assert!(c.enter(|| op(2, 1)).is_none());
        drop(turn);
        let (turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [1]);
        // Its task is cancelled: the batch is lost with it (its callers see
        // their channels closed), the rest goes to a new driver.
        drop(batch);
        drop(turn);
        let (mut turn, batch) = started.lock().unwrap().pop().expect("a new driver");
        assert_eq!(ids(&batch), [2]);
        assert!(turn.next().is_none());
        assert!(!c.is_busy());
    }

    #[test]
    fn a_call_not_batched_goes_at_once_when_everything_before_it_is_written() {
        let (c, started) = coalescer(10, 1000);
        // Idle.
        assert!(c.after_queue(|| unreachable!("nothing to wait for")));
        // A lone call in flight, not written yet: wait for it.
        let mut turn = c.enter(|| op(0, 1)).expect("idle");
        let slot = TurnSlot::default();
        assert!(!c.after_queue(|| waiter(1, &slot)));
        assert_eq!(c.queued(), 1);
        drop(c.state().queue.pop_back());
        // Written: what follows goes after it on the connection anyway.
        turn.written();
        assert!(c.after_queue(|| unreachable!("the call in flight is written")));
        drop(turn);
        assert!(!c.is_busy());
        assert!(started.lock().unwrap().is_empty());
    }

    #[test]
    fn a_call_not_batched_waits_for_what_queued_before_it_and_goes_before_what_came_after() {
        let (c, started) = coalescer(10, 1000);
        let mut turn = c.enter(|| op(0, 1)).expect("idle");
        turn.written();
        assert!(c.enter(|| op(1, 1)).is_none());
        let slot = TurnSlot::default();
        assert!(!c.after_queue(|| waiter(2, &slot)));
        assert!(c.enter(|| op(3, 1)).is_none());
        // The lone call answers: the batch ends before the waiter.
        drop(turn);
        let (mut turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [1]);
        assert!(
            slot.lock().unwrap().is_none(),
            "its turn before the batch is answered"
        );
        // Still not written: another call not batched waits too.
        let later = TurnSlot::default();
        assert!(!c.after_queue(|| waiter(4, &later)));
        drop(c.state().queue.pop_back());
        // The batch answers: the waiter has the turn, the driver is done.
        assert!(turn.next().is_none());
        drop(turn);
        let mut theirs = slot.lock().unwrap().take().expect("the waiter's turn");
        assert!(c.is_busy());
        assert!(started.lock().unwrap().is_empty());
        // Its call answers: what came after it goes.
        theirs.written();
        drop(theirs);
        let (_turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [3]);
    }

    #[test]
    fn a_waiter_gone_passes_the_turn_on() {
        let (c, started) = coalescer(10, 1000);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        let slot = TurnSlot::default();
        let gone = Arc::new(AtomicBool::new(false));
        assert!(!c.after_queue(|| Op {
            gone: Arc::clone(&gone),
            ..waiter(1, &slot)
        }));
        assert!(c.enter(|| op(2, 1)).is_none());
        gone.store(true, Ordering::SeqCst);
        drop(turn);
        let (mut turn, batch) = started.lock().unwrap().pop().expect("a driver");
        assert_eq!(ids(&batch), [2]);
        assert!(turn.next().is_none());
        assert!(!c.is_busy());
        assert!(slot.lock().unwrap().is_none());
    }

    #[test]
    fn give_up_drops_the_queue_and_leaves_the_coalescer_idle() {
        let (c, started) = coalescer(1, 1000);
        let turn = c.enter(|| op(0, 1)).expect("idle");
        assert!(c.enter(|| op(1, 1)).is_none());
        assert!(c.enter(|| op(2, 1)).is_none());
        drop(turn);
        let (turn, _batch) = started.lock().unwrap().pop().expect("a driver");
        turn.give_up();
        assert!(!c.is_busy());
        assert_eq!(c.queued(), 0);
        assert!(started.lock().unwrap().is_empty());
    }
}

/// The hand-off, model-checked: run with
/// `RUSTFLAGS="--cfg redlock_loom" cargo test -p redlock-core --release --lib coalesce`.
#[cfg(redlock_loom)]
mod loom_tests {
    use super::super::*;
    use loom::future::block_on;
    use loom::sync::Mutex as LoomMutex;
    use loom::thread;

    /// A one-shot answer channel loom can see into (the library uses
    /// tokio's `oneshot`, which is not loom-aware).
    mod chan {
        use loom::future::AtomicWaker;
        use loom::sync::Arc;
        use loom::sync::Mutex;
        use loom::sync::atomic::{AtomicBool, Ordering};
        use std::future::Future;
        use std::pin::Pin;
        use std::task::{Context, Poll};

        struct Shared<T> {
            value: Mutex<Option<T>>,
            sender_gone: AtomicBool,
            receiver_gone: AtomicBool,
            waker: AtomicWaker,
        }

        pub(super) struct Tx<T = u32>(Arc<Shared<T>>);
        pub(super) struct Rx<T = u32>(Arc<Shared<T>>);

        pub(super) fn channel<T>() -> (Tx<T>, Rx<T>) {
            let shared = Arc::new(Shared {
                value: Mutex::new(None),
                sender_gone: AtomicBool::new(false),
                receiver_gone: AtomicBool::new(false),
                waker: AtomicWaker::new(),
            });
            (Tx(Arc::clone(&shared)), Rx(shared))
        }

        impl<T> Tx<T> {
            /// Consumes the sender: an operation is answered at most once.
            pub(super) fn send(self, v: T) {
                *self.0.value.lock().unwrap() = Some(v);
            }
            pub(super) fn is_closed(&self) -> bool {
                self.0.receiver_gone.load(Ordering::SeqCst)
            }
        }

        impl<T> Drop for Tx<T> {
            fn drop(&mut self) {
                self.0.sender_gone.store(true, Ordering::SeqCst);
                self.0.waker.wake();
            }
        }

        impl<T> Drop for Rx<T> {
            fn drop(&mut self) {
                self.0.receiver_gone.store(true, Ordering::SeqCst);
            }
        }

        /// `Some(answer)`, or `None` when the sender was dropped unanswered.
        impl<T> Future for Rx<T> {
            type Output = Option<T>;
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
                let check = || {
                    // Read before the value: a sender sets the value, then
                    // is dropped.
                    let gone = self.0.sender_gone.load(Ordering::SeqCst);
                    if let Some(v) = self.0.value.lock().unwrap().take() {
                        return Some(Some(v));
                    }
                    gone.then_some(None)
                };
                if let Some(out) = check() {
                    return Poll::Ready(out);
                }
                self.0.waker.register_by_ref(cx.waker());
                match check() {
                    Some(out) => Poll::Ready(out),
                    None => Poll::Pending,
                }
            }
        }
    }

    /// An operation, or a caller waiting for the turn (`turn`).
    struct Op {
        id: u32,
        tx: chan::Tx,
        turn: Option<chan::Tx<Turn<Op>>>,
    }

    impl Pending for Op {
        fn bytes(&self) -> usize {
            1
        }
        fn abandoned(&self) -> bool {
            match &self.turn {
                Some(turn) => turn.is_closed(),
                None => self.tx.is_closed(),
            }
        }
        fn waits_for_turn(&self) -> bool {
            self.turn.is_some()
        }
        fn take_turn(self, turn: Turn<Self>) {
            if let Some(tx) = self.turn {
                tx.send(turn);
            }
        }
    }

    /// What the model records: every operation a sender answered (by id).
    #[derive(Default)]
    struct World {
        answered: LoomMutex<Vec<u32>>,
    }

    /// The answer an operation gets: its id, told apart from anything else.
    fn answer(id: u32) -> u32 {
        id * 10 + 7
    }

    /// A coalescer whose driver answers each batch, then the next, on the
    /// thread that ended the call before it (the library spawns a task
    /// there; a thread of its own would only multiply the interleavings of
    /// what it does alone). With `drop_first`, the first driver is
    /// cancelled before it sends anything (its task dropped), and the ones
    /// after it work.
    fn coalescer(world: &Arc<World>, ops: usize, drop_first: bool) -> Arc<Coalescer<Op>> {
        let w = Arc::clone(world);
        let first = loom::sync::atomic::AtomicBool::new(drop_first);
        let start = move |mut turn: Turn<Op>, mut batch: Vec<Op>| {
            if first.swap(false, loom::sync::atomic::Ordering::SeqCst) {
                // Cancelled before it sent: its operations' senders are
                // dropped, and its turn passes the rest on.
                drop(batch);
                drop(turn);
                return;
            }
            loop {
                // Written: the batch's operations, in order.
                for op in &batch {
                    w.answered.lock().unwrap().push(op.id);
                }
                turn.written();
                for op in batch {
                    op.tx.send(answer(op.id));
                }
                match turn.next() {
                    Some(b) => batch = b,
                    None => break,
                }
            }
        };
        Arc::new(Coalescer::new(Limits { ops, bytes: 1000 }, Box::new(start)))
    }

    /// A caller: its operation goes alone (answered by its own call) or
    /// waits in the queue. Returns its outcome: `Some(answer)`, or `None`
    /// when its batch was dropped unanswered.
    fn call(c: &Arc<Coalescer<Op>>, world: &World, id: u32) -> Option<u32> {
        let (tx, rx) = chan::channel();
        match c.enter(move || Op { id, tx, turn: None }) {
            Some(mut turn) => {
                world.answered.lock().unwrap().push(id);
                turn.written();
                drop(turn);
                Some(answer(id))
            }
            None => block_on(rx),
        }
    }

    /// A call that is not batched: it goes at once, or once it has the
    /// turn; either way it is recorded as written when it goes.
    fn direct_call(c: &Arc<Coalescer<Op>>, world: &World, id: u32) {
        let (turn_tx, turn_rx) = chan::channel();
        let (tx, _) = chan::channel();
        let now = c.after_queue(move || Op {
            id,
            tx,
            turn: Some(turn_tx),
        });
        if now {
            world.answered.lock().unwrap().push(id);
            return;
        }
        let turn = block_on(turn_rx);
        world.answered.lock().unwrap().push(id);
        drop(turn);
    }

    /// A caller that gives up at once: its future dropped while its
    /// operation is queued, or while its own lone call is in flight.
    fn cancelled_call(c: &Arc<Coalescer<Op>>, id: u32) {
        let (tx, rx) = chan::channel();
        let turn = c.enter(move || Op { id, tx, turn: None });
        drop(rx);
        drop(turn);
    }

    fn join_all(callers: Vec<thread::JoinHandle<()>>) {
        for t in callers {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
    }

    /// Every interleaving with up to three preemptions (loom's advice: most
    /// bugs need two); `LOOM_MAX_PREEMPTIONS` sets another bound.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(f);
    }

    /// Nothing is left behind, and no operation was answered twice.
    fn settled(c: &Coalescer<Op>, world: &World) -> Vec<u32> {
        assert!(!c.is_busy(), "the coalescer stayed busy");
        assert_eq!(c.queued(), 0, "operations left in the queue");
        let mut answered = world.answered.lock().unwrap().clone();
        answered.sort_unstable();
        let n = answered.len();
        answered.dedup();
        assert_eq!(answered.len(), n, "an operation answered twice");
        answered
    }

    /// Two callers and a third that is cancelled, racing one another for
    /// the turn: each of the two gets its own answer, exactly once, whoever
    /// went alone and whenever the third gave up.
    #[test]
    fn every_operation_is_answered_once_and_a_cancelled_one_moves_nobody() {
        model(|| {
            let world = Arc::new(World::default());
            let c = coalescer(&world, 2, false);
            let mut callers = Vec::new();
            for id in 0..2 {
                let (c, w) = (Arc::clone(&c), Arc::clone(&world));
                callers.push(thread::spawn(move || {
                    assert_eq!(call(&c, &w, id), Some(answer(id)));
                }));
            }
            cancelled_call(&c, 2);
            join_all(callers);
            let answered = settled(&c, &world);
            assert!(
                answered.contains(&0) && answered.contains(&1),
                "{answered:?}"
            );
        });
    }

    /// Batches of one: three callers, so that a batch is taken while
    /// another caller is still entering, and each batch's driver goes on
    /// with the next.
    #[test]
    fn a_driver_goes_on_until_the_queue_is_empty() {
        model(|| {
            let world = Arc::new(World::default());
            let c = coalescer(&world, 1, false);
            let mut callers = Vec::new();
            for id in 0..2 {
                let (c, w) = (Arc::clone(&c), Arc::clone(&world));
                callers.push(thread::spawn(move || {
                    assert_eq!(call(&c, &w, id), Some(answer(id)));
                }));
            }
            assert_eq!(call(&c, &world, 2), Some(answer(2)));
            join_all(callers);
            assert_eq!(settled(&c, &world), [0, 1, 2]);
        });
    }

    /// The first batch's driver is cancelled before it sends: the callers
    /// in that batch learn that their operation went unanswered (once), and
    /// the rest of the queue still goes out: nobody waits forever.
    #[test]
    fn a_cancelled_driver_fails_its_batch_and_passes_the_rest_on() {
        model(|| {
            let world = Arc::new(World::default());
            let c = coalescer(&world, 1, true);
            let mut callers = Vec::new();
            let outcomes = Arc::new(LoomMutex::new(Vec::new()));
            for id in 0..2 {
                let (c, w, o) = (Arc::clone(&c), Arc::clone(&world), Arc::clone(&outcomes));
                callers.push(thread::spawn(move || {
                    let got = call(&c, &w, id);
                    assert!(got.is_none() || got == Some(answer(id)), "{got:?}");
                    o.lock().unwrap().push((id, got));
                }));
            }
            let got = call(&c, &world, 2);
            assert!(got.is_none() || got == Some(answer(2)), "{got:?}");
            outcomes.lock().unwrap().push((2, got));
            join_all(callers);
            let answered = settled(&c, &world);
            let outcomes = outcomes.lock().unwrap().clone();
            assert_eq!(outcomes.len(), 3);
            // At most one batch (of one) was dropped, and an operation is
            // answered if and only if its caller got its answer.
            let unanswered = outcomes.iter().filter(|(_, got)| got.is_none()).count();
            assert!(unanswered <= 1, "{outcomes:?}");
            for (id, got) in &outcomes {
                assert_eq!(got.is_some(), answered.contains(id), "{outcomes:?}");
            }
        });
    }

    /// A caller's operation is entered (alone or queued), and before its
    /// answer comes the caller sends a call that is not batched (a fan-out
    /// that returned at quorum, then the next acquire): that call is never
    /// written before the operation, whoever else is queued or in flight.
    #[test]
    fn a_call_not_batched_never_overtakes_an_operation_entered_before_it() {
        model(|| {
            let world = Arc::new(World::default());
            let c = coalescer(&world, 2, false);
            let other = {
                let (c, w) = (Arc::clone(&c), Arc::clone(&world));
                thread::spawn(move || {
                    assert_eq!(call(&c, &w, 0), Some(answer(0)));
                })
            };
            let (tx, rx) = chan::channel();
            match c.enter(move || Op {
                id: 1,
                tx,
                turn: None,
            }) {
                Some(mut turn) => {
                    world.answered.lock().unwrap().push(1);
                    turn.written();
                    // Its answer comes while the direct call is sent.
                    let answering = thread::spawn(move || drop(turn));
                    direct_call(&c, &world, 2);
                    join_all(vec![answering]);
                }
                None => {
                    direct_call(&c, &world, 2);
                    assert_eq!(block_on(rx), Some(answer(1)));
                }
            }
            join_all(vec![other]);
            let order = world.answered.lock().unwrap().clone();
            let at = |id| order.iter().position(|&x| x == id);
            assert!(at(1) < at(2), "the direct call overtook: {order:?}");
            assert_eq!(settled(&c, &world), [0, 1, 2]);
        });
    }
}
