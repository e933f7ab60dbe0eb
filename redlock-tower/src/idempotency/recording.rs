//! The body of a response over the record's cap, streamed under its
//! idempotency lock and recorded "completed, not replayable" at its end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use redlock_core::idempotency::{IdempotencyRejection, Running};
use redlock_core::request::LossWatch;

use super::IdempotencyBody;
use crate::rejection::BoxError;

type FinishFuture = Pin<Box<dyn Future<Output = Result<(), IdempotencyRejection>> + Send>>;

/// A response body over the record's cap, streamed under its idempotency
/// lock: the lock is held, and watched, until the body ends; then the request
/// is recorded "completed, not replayable" before the end goes out. A body
/// that fails, is cut off by the lock's loss, or is dropped before its end
/// (the client gone) records nothing, and the next copy of the request runs
/// the work again.
pub(super) struct RecordingBody {
    /// The part read while buffering, sent first.
    prefix: Option<Bytes>,
    rest: IdempotencyBody,
    /// `None` once the body has ended, failed or been cut off.
    running: Option<(Running, u16)>,
    /// Set under `LostPolicy::Abort`.
    watch: Option<LossWatch>,
    /// The record's write at the end of the body.
    finishing: Option<FinishFuture>,
    /// The last frame, given out once the record is written.
    held: Option<Frame<Bytes>>,
    done: bool,
}

impl RecordingBody {
    pub(super) fn new(prefix: Bytes, rest: IdempotencyBody, running: Running, status: u16) -> Self {
        let watch = LossWatch::for_body(Some(running.lock()), running.lock_policy().lost_policy());
        Self {
            prefix: Some(prefix),
            rest,
            running: Some((running, status)),
            watch,
            finishing: None,
            held: None,
            done: false,
        }
    }

    /// Ends the body with `error`: nothing is recorded, and the lock is
    /// released in the background.
    fn fail(&mut self, error: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.running = None;
        self.watch = None;
        self.held = None;
        self.done = true;
        self.rest = Full::new(Bytes::new())
            .map_err(|e| match e {})
            .boxed_unsync();
        Poll::Ready(Some(Err(error)))
    }

    /// The body has ended well: the record's write starts (polled next).
    fn start_finishing(&mut self) {
        self.watch = None;
        match self.running.take() {
            Some((running, status)) => {
                self.finishing = Some(Box::pin(running.finish(status, std::iter::empty(), None)));
            }
            None => self.done = true,
        }
    }

    fn lost_now(&self) -> Option<redlock_core::Error> {
        self.watch.as_ref().and_then(LossWatch::lost_now)
    }
}

impl Body for RecordingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(finishing) = &mut this.finishing {
                let finished = ready!(finishing.as_mut().poll(cx));
                this.finishing = None;
                this.done = true;
                let last = this.held.take();
                return match finished {
                    Ok(()) => Poll::Ready(last.map(Ok)),
                    // Not recorded: the response must not look complete.
                    Err(r) => Poll::Ready(Some(Err(format!(
                        "idempotency record not written: {}",
                        r.title()
                    )
                    .into()))),
                };
            }
            if let Some(watch) = &mut this.watch
                && let Poll::Ready(error) = watch.poll_lost(cx)
            {
                return this.fail(error.into());
            }
            let polled = match this.prefix.take() {
                Some(prefix) => Some(Ok(Frame::data(prefix))),
                None => {
                    let polled = ready!(Pin::new(&mut this.rest).poll_frame(cx));
                    // A frame or the end made in the poll in which the lock
                    // was lost was made without it.
                    if let Some(error) = this.lost_now() {
                        return this.fail(error.into());
                    }
                    polled
                }
            };
            match polled {
                Some(Ok(frame)) if !this.rest.is_end_stream() => {
                    return Poll::Ready(Some(Ok(frame)));
                }
                // The last frame (with an exact length the server polls no
                // more): held back until the record is written.
                Some(Ok(frame)) => {
                    this.held = Some(frame);
                    this.start_finishing();
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "response body failed; nothing recorded");
                    return this.fail(error);
                }
                None => this.start_finishing(),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        let held = self
            .held
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let prefix = self
            .prefix
            .as_ref()
            .map_or(0, |p| p.len() as u64)
            .saturating_add(held);
        if prefix > 0 {
            let lower = hint.lower().saturating_add(prefix);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(prefix));
            }
            hint.set_lower(lower);
        }
        hint
    }
}
