//! The handler's future raced against the loss of its request's lock
//! (framework-free HTTP layer): [`guard`] and [`Guarded`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::{LockPolicy, LostFuture, LostPolicy, Rejection, RequestLock};

pin_project! {
    /// The handler's future, raced against the loss of the lock (see [`guard`]).
    pub struct Guarded<F> {
        #[pin]
        inner: F,
        #[pin]
        lost: Option<LostFuture>,
        key: Option<Arc<str>>,
    }
}

impl<F: Future> Future for Guarded<F> {
    type Output = Result<F::Output, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Checked before the handler runs again, and again when it finishes: a
        // handler that blocked its thread past the deadline in its last poll did
        // not run under the lock, and must not answer as if it had.
        let Poll::Ready(out) = ({
            if let Some(lost) = this.lost.as_mut().as_pin_mut()
                && lost.poll(cx).is_ready()
            {
                return Poll::Ready(Err(lost_rejection(this.key)));
            }
            this.inner.poll(cx)
        }) else {
            return Poll::Pending;
        };
        if let Some(lost) = this.lost.as_pin_mut()
            && lost.poll(cx).is_ready()
        {
            return Poll::Ready(Err(lost_rejection(this.key)));
        }
        Poll::Ready(Ok(out))
    }
}

fn lost_rejection(key: &mut Option<Arc<str>>) -> Rejection {
    let rejection = Rejection::Lost {
        key: key.take().unwrap_or_else(|| "".into()),
    };
    rejection.log();
    rejection
}

/// Runs the handler future `inner` under `lock`: with [`LostPolicy::Abort`] it
/// resolves to [`Rejection::Lost`] as soon as the lock is lost (checked against
/// the clock before every poll of `inner`, and once more when `inner` finishes),
/// and the caller
/// drops `inner`. With no lock or [`LostPolicy::Signal`], it is `inner` as is.
pub fn guard<F: Future>(inner: F, lock: Option<&RequestLock>, policy: &LockPolicy) -> Guarded<F> {
    let watch = lock.filter(|_| policy.lost == LostPolicy::Abort);
    Guarded {
        inner,
        lost: watch.map(RequestLock::lost),
        // The resource, as busy and unavailable name it: the handle's key
        // prefix is the operator's, not the client's business.
        key: watch.map(|l| Arc::from(l.handle.resource())),
    }
}
