//! [`ResponseFuture`]: acquire, then run the handler under the lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use pin_project_lite::pin_project;
use redlock_core::request::{
    self, Guarded, LockPolicy, Rejection, ReleaseFuture, ReleasePolicy, RequestLock,
};
use tower_service::Service;

use crate::body::RedlockBody;
use crate::layer::RejectionHandler;

type Acquire = Pin<Box<dyn Future<Output = Result<Option<RequestLock>, Rejection>> + Send>>;

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
        ResBody: Body,
    {
        Acquiring {
            acquire: Acquire,
            service: Option<S>,
            request: Option<Request<ReqBody>>,
        },
        Running {
            #[pin]
            future: Guarded<S::Future>,
            lock: Option<RequestLock>,
        },
        // The handler has answered. The head is held back until the release
        // has completed (`ReleasePolicy::ResponseHead`), or until the body has
        // been polled once, and released if that ended it (`BodyEnd`).
        Settling {
            release: Option<ReleaseFuture>,
            response: Option<Response<RedlockBody<ResBody>>>,
        },
        Rejected {
            rejection: Option<Rejection>,
        },
    }
}

pin_project! {
    /// The response future of [`RedlockService`](crate::RedlockService).
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
        ResBody: Body,
    {
        #[pin]
        state: State<S, ReqBody, ResBody>,
        policy: Arc<LockPolicy>,
        on_rejection: Option<RejectionHandler>,
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
    ResBody: Body,
{
    pub(crate) fn acquiring(
        acquire: Acquire,
        service: S,
        request: Request<ReqBody>,
        policy: Arc<LockPolicy>,
        on_rejection: Option<RejectionHandler>,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                service: Some(service),
                request: Some(request),
            },
            policy,
            on_rejection,
        }
    }

    pub(crate) fn unlocked(
        future: S::Future,
        policy: Arc<LockPolicy>,
        on_rejection: Option<RejectionHandler>,
    ) -> Self {
        Self {
            state: State::Running {
                future: request::guard(future, None, &policy),
                lock: None,
            },
            policy,
            on_rejection,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
{
    type Output = Result<Response<RedlockBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    service,
                    request,
                } => {
                    let acquired = ready!(acquire.as_mut().poll(cx));
                    let (Some(mut service), Some(mut request)) = (service.take(), request.take())
                    else {
                        // Only reachable if polled after a panic inside `call`.
                        return Poll::Ready(Ok(reject(
                            Rejection::MissingHandle,
                            this.on_rejection.as_ref(),
                        )));
                    };
                    match acquired {
                        Ok(lock) => {
                            if let Some(lock) = &lock {
                                request.extensions_mut().insert(lock.handle());
                            }
                            let future =
                                request::guard(service.call(request), lock.as_ref(), this.policy);
                            this.state.set(State::Running { future, lock });
                        }
                        Err(rejection) => this.state.set(State::Rejected {
                            rejection: Some(rejection),
                        }),
                    }
                }
                StateProj::Running { future, lock } => match ready!(future.poll(cx)) {
                    Ok(Ok(response)) => {
                        let held = lock.take();
                        let (release, held) = match (this.policy.release_policy(), held) {
                            (ReleasePolicy::ResponseHead, Some(held)) => {
                                (Some(held.release()), None)
                            }
                            (_, held) => (None, held),
                        };
                        this.state.set(State::Settling {
                            release,
                            response: Some(response.map(|body| {
                                RedlockBody::inner(body, held, this.policy.lost_policy())
                            })),
                        });
                    }
                    Ok(Err(error)) => {
                        drop(lock.take());
                        return Poll::Ready(Err(error));
                    }
                    Err(rejection) => {
                        // Lost: drop the handler's future first, then answer.
                        this.state.set(State::Rejected { rejection: None });
                        return Poll::Ready(Ok(reject(rejection, this.on_rejection.as_ref())));
                    }
                },
                StateProj::Settling { release, response } => {
                    if let Some(pending) = release {
                        ready!(pending.as_mut().poll(cx));
                        *release = None;
                    }
                    let Some(mut ready) = response.take() else {
                        return Poll::Ready(Ok(reject(
                            Rejection::MissingHandle,
                            this.on_rejection.as_ref(),
                        )));
                    };
                    if ready.body_mut().poll_settle(cx).is_pending() {
                        *response = Some(ready);
                        return Poll::Pending;
                    }
                    return Poll::Ready(Ok(ready));
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection.take().unwrap_or(Rejection::MissingHandle);
                    return Poll::Ready(Ok(reject(rejection, this.on_rejection.as_ref())));
                }
            }
        }
    }
}

/// The response for a rejection: the custom handler's, or a problem+json document
/// with `Retry-After` where it applies.
pub(crate) fn reject<B: Body>(
    rejection: Rejection,
    handler: Option<&RejectionHandler>,
) -> Response<RedlockBody<B>> {
    if let Some(handler) = handler {
        return handler(&rejection).map(RedlockBody::rejection);
    }
    let mut response = Response::new(RedlockBody::rejection(Bytes::from(
        rejection.problem_json(),
    )));
    *response.status_mut() =
        StatusCode::from_u16(rejection.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Rejection::CONTENT_TYPE),
    );
    if let Some(secs) = rejection.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}
