//! Key extractors: which requests share a lock.

use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

/// Computes the lock key of a request. `None` means "this request has no key"; the
/// layer then follows its missing-key policy (pass through by default).
///
/// Closures `Fn(&Parts) -> Option<String>` implement it, so any key can be built
/// from the method, URI, headers or extensions:
///
/// ```
/// use redlock_tower::RedlockLayer;
///
/// let layer = RedlockLayer::by_fn(|req: &http::request::Parts| {
///     Some(format!("{} {}", req.method, req.uri.path()))
/// });
/// # let _ = layer;
/// ```
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key of this request. It gets `&mut` so extractors can reuse axum's
    /// synchronous extractors, which take `&mut Parts`.
    fn extract(&self, req: &mut Parts) -> Option<String>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &mut Parts) -> Option<String> {
        self(req)
    }
}

/// The request path, e.g. `/orders/42` (no query string). Every request has one.
///
/// With the `axum` feature, inside a nested router this is the full path the
/// client sent (axum's `OriginalUri`), not the path with the nest prefix removed,
/// so `/tenants/a/jobs/1` and `/tenants/b/jobs/1` stay distinct keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByPath;

impl KeyExtractor for ByPath {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        #[cfg(feature = "axum")]
        if let Some(original) = req.extensions.get::<axum::extract::OriginalUri>() {
            return Some(original.path().to_owned());
        }
        Some(req.uri.path().to_owned())
    }
}

/// The value of one request header, e.g. `X-Tenant-Id`: the value itself, or
/// `name=<value>` once [named](Self::named). Absent, empty or non-UTF-8 values
/// give no key.
///
/// The client chooses this value: use it for keys where a client can only hurt
/// itself by choosing another one (its own tenant, its own delivery id), and
/// check it against authentication where that matters.
#[derive(Debug, Clone)]
pub struct ByHeader {
    header: HeaderName,
    name: Option<Arc<str>>,
}

impl ByHeader {
    /// The value of `header`, as the key.
    pub fn new(header: HeaderName) -> Self {
        Self { header, name: None }
    }

    /// Keys `name=<value>`, as `ByPathParam` (axum) does for a route parameter of
    /// that name, so both find the same lock for the same value.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }
}

impl KeyExtractor for ByHeader {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        let value = req
            .headers
            .get(&self.header)?
            .to_str()
            .ok()
            .filter(|v| !v.is_empty())?;
        Some(match &self.name {
            Some(name) => format!("{name}={value}"),
            None => value.to_owned(),
        })
    }
}

/// One named parameter of the axum route that matched, e.g. `tenant` in
/// `/tenants/{tenant}/jobs`. Needs the layer to be applied with `Router::layer`
/// or `route_layer` (the router fills the parameters in before the layer runs).
#[cfg(feature = "axum")]
#[derive(Debug, Clone)]
pub struct ByPathParam(pub(crate) Arc<str>);

#[cfg(feature = "axum")]
impl KeyExtractor for ByPathParam {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        use axum::extract::{FromRequestParts, RawPathParams};
        use futures_util::FutureExt;
        // The extractor only reads the request extensions: it is ready at once.
        let params = RawPathParams::from_request_parts(req, &())
            .now_or_never()?
            .ok()?;
        params
            .iter()
            .find(|(name, _)| *name == &*self.0)
            .map(|(_, value)| format!("{}={value}", self.0))
    }
}

/// The route template that matched, e.g. `/tenants/{tenant}/jobs`: one lock per
/// route, whatever its parameters.
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy, Default)]
pub struct ByMatchedPath;

#[cfg(feature = "axum")]
impl KeyExtractor for ByMatchedPath {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        req.extensions
            .get::<axum::extract::MatchedPath>()
            .map(|p| p.as_str().to_owned())
    }
}
