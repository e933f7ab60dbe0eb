//! [`RedlockService`]: the middleware itself.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use redlock_core::Redlock;
use redlock_core::request::{self, MissingKeyPolicy};
use tower_service::Service;

use crate::body::LockedBody;
use crate::config::Config;
use crate::future::ResponseFuture;
use crate::key::KeyExtractor;

/// The service [`RedlockLayer`](crate::RedlockLayer) wraps around the inner one.
/// Its clones share one configuration.
#[derive(Clone, Debug)]
pub struct RedlockService<S, K> {
    pub(crate) inner: S,
    pub(crate) key: K,
    pub(crate) config: Arc<Config>,
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RedlockService<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<LockedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let key = self.key.extract_keys(&mut parts);
        let req = Request::from_parts(parts, body);
        let config = Arc::clone(&self.config);

        // No key and pass-through: no lock, no box.
        if key.is_none() && config.policy.missing_key_policy() == MissingKeyPolicy::PassThrough {
            request::count_pass_through();
            return ResponseFuture::unlocked(self.inner.call(req), config);
        }
        let redlock = config
            .redlock
            .clone()
            .or_else(|| req.extensions().get::<Redlock>().cloned());
        // The ready service was this one: take it, leave a clone for next time.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let acquire_config = Arc::clone(&config);
        let reads = request::is_read_method(req.method().as_str());
        let acquire = Box::pin(async move {
            request::acquire_keys_for(redlock.as_ref(), key, &acquire_config.policy, reads).await
        });
        ResponseFuture::acquiring(acquire, inner, req, config)
    }
}
