//! The response body: the inner body holding the lock until its end, or the small
//! body of a rejection.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use redlock_core::request::RequestLock;

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            lock: Option<RequestLock>,
        },
        Rejection {
            bytes: Option<Bytes>,
        },
    }
}

pin_project! {
    /// The body of a response that went through [`RedlockLayer`](crate::RedlockLayer).
    ///
    /// For a locked request it is the handler's body, and it holds the lock until
    /// the end of the stream: `poll_frame` returned `None`, or `is_end_stream()`
    /// turned true after a frame (with an exact `Content-Length`, nothing polls
    /// again), or an error, or the body was dropped (client gone). For a rejected
    /// request it is the small problem document.
    pub struct RedlockBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> RedlockBody<B> {
    pub(crate) fn inner(body: B, lock: Option<RequestLock>) -> Self {
        Self {
            kind: Kind::Inner { body, lock },
        }
    }

    pub(crate) fn rejection(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    /// Whether this body still holds a lock.
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { lock: Some(_), .. })
    }
}

impl<B> std::fmt::Debug for RedlockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBody")
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}

impl<B> Body for RedlockBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { mut body, lock } => {
                let polled = body.as_mut().poll_frame(cx);
                let finished = match &polled {
                    Poll::Ready(None | Some(Err(_))) => true,
                    Poll::Ready(Some(Ok(_))) => lock.is_some() && body.is_end_stream(),
                    Poll::Pending => false,
                };
                if finished {
                    // Drop releases the lock (spawned) and closes the request span.
                    drop(lock.take());
                }
                polled
            }
            KindProj::Rejection { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Rejection { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
