//! The response body: the inner body holding the lock until its end (and cut
//! off if the lock is lost first), or the small body of a rejection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use redlock_core::request::{LossWatch, LostPolicy, Rejection, ReleaseFuture, RequestLock};

use crate::grpc::status::lost_trailers;
use crate::rejection::{BoxError, RejectionBody};

// `Inner` is the common case (every response of a locked request) and the
// small variants the rare ones: boxing it would add an allocation per response
// to save memory on rejections.
#[allow(clippy::large_enum_variant)]
enum Kind<B: Body> {
    Inner {
        // Boxed so the response future can poll it before handing it to the
        // server (see `poll_settle`) and still move it afterwards.
        body: Pin<Box<B>>,
        lock: Option<RequestLock>,
        // The release in progress at the end of the body.
        releasing: Option<ReleaseFuture>,
        // A frame taken from `body` and not yet given out: the first one, taken by
        // `poll_settle`, or the last one, held back until the release completes.
        held: Option<Result<Frame<Bytes>, B::Error>>,
        // `poll_settle` has run its one poll.
        settled: bool,
        // Set while `lock` is held under `LostPolicy::Abort`.
        watch: Option<LossWatch>,
    },
    // A rejected request's answer: the problem document, or the app's own.
    Rejection {
        body: RejectionBody,
    },
    // The lock was lost while the body streamed: the inner body is dropped, so
    // nothing more is produced without the lock, and the error (given out once)
    // makes the server abort the response instead of ending it cleanly; for a
    // gRPC response, the `UNAVAILABLE` trailers end it instead.
    Cut {
        error: Option<redlock_core::Error>,
        trailers: Option<HeaderMap>,
    },
}

/// The body of a response that went through [`RedlockLayer`](crate::RedlockLayer).
///
/// For a locked request it is the handler's body, and it holds the lock until
/// the end of the stream: `poll_frame` returned `None`, or `is_end_stream()`
/// turned true after a frame (with an exact `Content-Length`, nothing polls
/// again), or an error, or the body was dropped (client gone). The end is
/// reported only once the release has completed, so a client that saw the whole
/// response can take the lock at once. For a rejected request it is the problem
/// document, or the answer of the layer's `on_rejection`.
///
/// If the lock is lost while the body streams, under the default
/// [`LostPolicy::Abort`], the body is cut off: the handler's body is dropped
/// (not polled again), the loss is logged, and the next `poll_frame` yields the
/// error [`redlock_core::Error::Lost`], on which the server aborts the response,
/// so the client sees a truncated response rather than a clean end. The loss is
/// watched at every `poll_frame`, and a body waiting on its producer is woken by
/// it; it is checked again after each poll of the producer, so a frame made in
/// the poll in which the lock was lost (a producer that blocked its thread past
/// the deadline) is dropped, not sent, and the body is cut off there. A loss
/// seen before the head goes out (in the one poll the layer gives the body
/// first) drops the body, and the answer is the loss's 503. A gRPC response
/// (see [`grpc`](crate::grpc)) is not aborted: it ends with the trailers
/// `grpc-status: 14` (`UNAVAILABLE`) and a message, and a loss before the head
/// is answered `UNAVAILABLE`. Under [`LostPolicy::Signal`] the body keeps streaming: the handler chose
/// to watch [`LockHandle::lost`](redlock_core::LockHandle::lost) itself. The error type boxes the handler
/// body's own errors and this one.
pub struct LockedBody<B: Body> {
    kind: Kind<B>,
    // A gRPC response: a loss ends it with trailers.
    grpc: bool,
}

// No field is ever pinned in place: the inner body sits in its own box.
impl<B: Body> Unpin for LockedBody<B> {}

impl<B: Body> LockedBody<B> {
    pub(crate) fn inner(body: B, lock: Option<RequestLock>, on_lost: LostPolicy) -> Self {
        let watch = LossWatch::for_body(lock.as_ref(), on_lost);
        Self {
            kind: Kind::Inner {
                body: Box::pin(body),
                lock,
                releasing: None,
                held: None,
                settled: false,
                watch,
            },
            grpc: false,
        }
    }

    /// Marks a gRPC response: a loss ends it with `UNAVAILABLE` trailers.
    pub(crate) fn grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    pub(crate) fn rejection(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rejection { body },
            grpc: false,
        }
    }

    /// Whether this body still holds a lock.
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { lock: Some(_), .. })
    }

    /// Cuts the body off if the lock it holds is lost, and returns the answer to
    /// give instead if the head has not gone out yet; otherwise `cx` is woken
    /// when it is.
    fn watch_loss(&mut self, cx: &mut Context<'_>) -> Option<Rejection> {
        let Kind::Inner {
            lock: Some(_),
            watch: Some(watch),
            ..
        } = &mut self.kind
        else {
            return None;
        };
        let Poll::Ready(error) = watch.poll_lost(cx) else {
            return None;
        };
        self.cut(error)
    }

    /// Cuts the body off with `error` (already logged): drops the inner body,
    /// and the lock (released in the background). Returns the rejection to
    /// answer with instead, if the head is still to be sent.
    fn cut(&mut self, error: redlock_core::Error) -> Option<Rejection> {
        let key = match &self.kind {
            Kind::Inner {
                lock: Some(lock), ..
            } => Some(Arc::from(lock.handle().resource())),
            _ => None,
        };
        let trailers = key.as_deref().filter(|_| self.grpc).map(lost_trailers);
        self.kind = Kind::Cut {
            error: trailers.is_none().then_some(error),
            trailers,
        };
        key.map(|key| Rejection::Lost { key })
    }
}

impl<B: Body<Data = Bytes>> LockedBody<B> {
    /// Called by the response future before it gives the head to the server: one
    /// poll of the inner body. If that completes the body (the usual in-memory
    /// response), the lock is released now and the response goes out whole, the
    /// head and the body in one write. Releasing only once the server has
    /// flushed the head would split them in two writes, and the second one can
    /// wait for the client's delayed ACK (tens of ms) when Nagle's algorithm is
    /// on. A body that is not done after one poll streams as usual.
    ///
    /// `Ready(Some(rejection))` when the lock was lost before the head went
    /// out, or in that one poll (so what it made was made without the lock):
    /// the body is cut off, and the response future answers `rejection`
    /// instead, as it does for a handler that finished after the loss.
    pub(crate) fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<Option<Rejection>> {
        if let Some(rejection) = self.watch_loss(cx) {
            return Poll::Ready(Some(rejection));
        }
        let Kind::Inner {
            body,
            lock,
            releasing,
            held,
            settled,
            watch,
        } = &mut self.kind
        else {
            return Poll::Ready(None);
        };
        if !*settled {
            if lock.is_none() {
                *settled = true;
                return Poll::Ready(None);
            }
            let Poll::Ready(polled) = body.as_mut().poll_frame(cx) else {
                *settled = true;
                return Poll::Ready(None);
            };
            *settled = true;
            if let Some(error) = lost_in(watch, &polled) {
                return Poll::Ready(self.cut(error));
            }
            let ended = match &polled {
                None => true,
                Some(Ok(_)) => body.is_end_stream(),
                Some(Err(_)) => {
                    // The response is over: release in the background.
                    drop(lock.take());
                    false
                }
            };
            *held = polled;
            if !ended {
                return Poll::Ready(None);
            }
            if let Some(lock) = lock.take() {
                *releasing = Some(lock.release());
            }
        }
        if let Some(release) = releasing {
            ready!(release.as_mut().poll(cx));
            *releasing = None;
        }
        Poll::Ready(None)
    }
}

impl<B: Body> std::fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedBody")
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}

/// The error that cuts the body off if the lock was lost by the end of the
/// poll that produced `polled` (under [`LostPolicy::Abort`]): whatever the
/// producer made in that poll, a frame or the end, it made past the holder's
/// deadline, and must not reach the client as if made under the lock. A
/// failed body ends the response anyway.
fn lost_in<T, E>(
    watch: &Option<LossWatch>,
    polled: &Option<Result<T, E>>,
) -> Option<redlock_core::Error> {
    if matches!(polled, Some(Err(_))) {
        return None;
    }
    watch.as_ref()?.lost_now()
}

fn boxed<E: Into<BoxError>>(
    polled: Option<Result<Frame<Bytes>, E>>,
) -> Option<Result<Frame<Bytes>, BoxError>> {
    polled.map(|frame| frame.map_err(Into::into))
}

impl<B> Body for LockedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        // The head is out: a loss can only cut the body off.
        let _ = this.watch_loss(cx);
        let lost = match &mut this.kind {
            Kind::Inner {
                body,
                lock,
                releasing,
                held,
                settled,
                watch,
            } => loop {
                *settled = true;
                if let Some(release) = releasing {
                    ready!(release.as_mut().poll(cx));
                    *releasing = None;
                    // The keys are gone: now the client may see the end.
                    return Poll::Ready(boxed(held.take()));
                }
                let polled = match held.take() {
                    Some(frame) => Some(frame),
                    None => ready!(body.as_mut().poll_frame(cx)),
                };
                let Some(lock_held) = lock.take() else {
                    return Poll::Ready(boxed(polled));
                };
                if let Some(error) = lost_in(watch, &polled) {
                    let resource = lock_held.handle().resource().to_owned();
                    drop(lock_held);
                    break (error, resource);
                }
                match polled {
                    // The end: release, then report the end.
                    None => *releasing = Some(lock_held.release()),
                    // The last frame (exact length): hold it back until released.
                    Some(Ok(frame)) if body.is_end_stream() => {
                        *held = Some(Ok(frame));
                        *releasing = Some(lock_held.release());
                    }
                    Some(Ok(frame)) => {
                        *lock = Some(lock_held);
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // A failed body: the response is over; release in the background.
                    Some(Err(e)) => {
                        drop(lock_held);
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
            },
            Kind::Rejection { body } => return Pin::new(body).poll_frame(cx),
            Kind::Cut { error, trailers } => {
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                return Poll::Ready(error.take().map(|e| Err(e.into())));
            }
        };
        let (error, resource) = lost;
        // Drops the inner body and the frame it made after the loss.
        this.kind = Kind::Cut {
            error: None,
            trailers: None,
        };
        if this.grpc {
            return Poll::Ready(Some(Ok(Frame::trailers(lost_trailers(&resource)))));
        }
        Poll::Ready(Some(Err(error.into())))
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While a lock is held, the end is reported only after the release.
            Kind::Inner {
                body,
                lock,
                releasing,
                held,
                ..
            } => lock.is_none() && releasing.is_none() && held.is_none() && body.is_end_stream(),
            Kind::Rejection { body } => body.is_end_stream(),
            Kind::Cut { error, trailers } => error.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, held, .. } => {
                let mut hint = body.size_hint();
                // A frame taken out of the body still has to be sent.
                let taken = match held {
                    Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.remaining() as u64),
                    _ => 0,
                };
                if taken > 0 {
                    let lower = hint.lower().saturating_add(taken);
                    match hint.upper() {
                        Some(upper) => {
                            hint.set_upper(upper.saturating_add(taken));
                            hint.set_lower(lower);
                        }
                        None => hint.set_lower(lower),
                    }
                }
                hint
            }
            Kind::Rejection { body } => body.size_hint(),
            Kind::Cut { .. } => SizeHint::default(),
        }
    }
}
