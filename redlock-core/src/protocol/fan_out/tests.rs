//! Unit tests of `fan_out`.

use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::{Fan, ready_now};
use crate::error::NodeError;

/// A call of node `index` that answers when its sender says so.
fn answers_when_told(
    index: usize,
) -> (
    oneshot::Sender<()>,
    std::pin::Pin<Box<impl Future<Output = super::Settled<()>> + use<>>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let call = Box::pin(async move {
        let result = rx.await.map_err(|_| NodeError::Io("gone".into()));
        super::Settled {
            index,
            latency: Duration::ZERO,
            result,
        }
    });
    (tx, call)
}

#[tokio::test]
async fn answers_come_out_in_the_order_they_arrive_then_none() {
    let (mut gates, calls): (Vec<_>, Vec<_>) = (0..3).map(answers_when_told).unzip();
    let mut fan: Fan<_> = calls.into_iter().collect();
    assert!(ready_now(&mut fan).is_empty());
    for index in [2, 0, 1] {
        let gate = std::mem::replace(&mut gates[index], oneshot::channel().0);
        gate.send(()).unwrap();
        let s = tokio::time::timeout(Duration::from_secs(10), fan.next())
            .await
            .expect("an answer in time")
            .expect("a call left");
        assert_eq!(s.index, index);
        assert!(s.result.is_ok());
    }
    assert!(fan.is_empty());
    assert!(fan.next().await.is_none());
}

/// Calls that set no timer of their own and give up only when polled at
/// or after the deadline (as `Node::run_until` does): the set's one timer
/// must wake the task then, or this would wait forever.
#[tokio::test]
async fn calls_without_timers_give_up_when_the_sets_timer_wakes_the_task() {
    let timeout = Duration::from_millis(50);
    // Each call's clock starts at its first poll, in `ready_now` below;
    // this is earlier.
    let deadline = Instant::now() + timeout;
    let calls = (0..3).map(|index| {
        Box::pin(std::future::poll_fn(move |_| {
            if Instant::now() >= deadline {
                Poll::Ready(super::Settled {
                    index,
                    latency: timeout,
                    result: Err::<(), _>(NodeError::Timeout(timeout)),
                })
            } else {
                Poll::Pending
            }
        }))
    });
    let mut fan = Fan::with_timeout(calls, Some(timeout));
    assert!(ready_now(&mut fan).is_empty());
    let mut seen = Vec::new();
    // `timeout` polls the set before its own timer, so it would end a
    // set that nothing else woke at 10 s: the bound is 5.
    while let Some(s) = tokio::time::timeout(Duration::from_secs(10), fan.next())
        .await
        .expect("woken by the set's timer")
    {
        let now = Instant::now();
        assert!(now >= deadline);
        assert!(
            now < deadline + Duration::from_secs(5),
            "woken {:?} after the deadline: not by the set's timer",
            now - deadline
        );
        assert!(matches!(s.result, Err(NodeError::Timeout(_))));
        seen.push(s.index);
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2]);
}

/// `ready_now` polls with a waker that does nothing; the task that takes
/// the rest over must still be woken by their answers.
#[tokio::test]
async fn calls_left_by_ready_now_wake_the_task_that_takes_them_over() {
    let (gates, calls): (Vec<_>, Vec<_>) = (0..2).map(answers_when_told).unzip();
    let mut fan: Fan<_> = calls.into_iter().collect();
    assert!(ready_now(&mut fan).is_empty());
    let driver = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(s) = fan.next().await {
            seen.push(s.index);
        }
        seen
    });
    tokio::task::yield_now().await;
    for gate in gates {
        gate.send(()).unwrap();
    }
    let mut seen = tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("both answers seen in time")
        .unwrap();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1]);
}
