//! Key extractors: which requests share a lock.

#[cfg(feature = "axum")]
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use redlock_core::request::{KeyFamily, RequestKey, normalize_path};

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
///
/// # The key format
///
/// Every key made from what a client sent stays in its family and bounded
/// in bytes, whatever the client sent (the shared rules are
/// `redlock_core::request`'s [`KeyFamily`] and [`bound_key`](redlock_core::request::bound_key)):
///
/// | extractor | key of the lock |
/// |---|---|
/// | [`ByPath`] | the canonical path, `/orders/42` |
/// | [`ByHeader`] (`by_header(x-tenant-id)`) | `x-tenant-id=<value>` |
/// | [`ByHeader`] [named](ByHeader::named) `tenant` (`by_header_as`) | `tenant=<value>` |
/// | `ByPathParam` (`by_path_param("tenant")`) | `tenant=<value>` |
/// | `ByPathParams` (`by_path_params(["from", "to"])`) | `from,to=<value>`, one key per parameter |
/// | `ByPathParams` named `account` | `account=<value>`, one key per parameter |
/// | `ByMatchedPath` | the route template, `/tenants/{tenant}/jobs` |
/// | a closure (`by_fn`) | what it returns |
///
/// A `<value>` is percent-encoded ([`escape_value`](redlock_core::request::escape_value)):
/// every byte but ASCII letters, digits, `-`, `.`, `_` and `~` is written
/// `%XX`, so `tenant=acme` in a path parameter is the key `from,to=tenant%3Dacme`,
/// not tenant acme's `tenant=acme`, and `a` + `b=c` (`a=b%3Dc`) is not
/// `a=b` + `c` (`a%3Db=c`). The policy's namespace goes before every key
/// (`redlock:` by default), and a key longer than
/// [`MAX_KEY_BYTES`](redlock_core::request::MAX_KEY_BYTES) (256) reaches the
/// nodes as its start and a SHA-256 digest (`/o/aaaa…#sha256-<hex>`). A
/// closure's key is bounded too, but its parts are its own: escape the
/// client's values in it with `escape_value`.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key of this request. It gets `&mut` so extractors can reuse axum's
    /// synchronous extractors, which take `&mut Parts`.
    fn extract(&self, req: &mut Parts) -> Option<String>;

    /// The keys of this request, locked together as one lock (see
    /// [`redlock_core::Redlock::mutex_many`](redlock_core::Redlock::mutex_many)). What the
    /// layer calls; by default the one key of [`extract`](Self::extract).
    /// Extractors that find several keys (e.g. `ByPathParams`) override it.
    fn extract_keys(&self, req: &mut Parts) -> Option<RequestKey> {
        self.extract(req).map(RequestKey::One)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &mut Parts) -> Option<String> {
        self(req)
    }
}

/// The request path, e.g. `/orders/42` (no query string), in its canonical
/// form. Every request has one.
///
/// The key names what the router serves, not how the client spelled it: the
/// path goes through [`normalize_path`], so `/orders/%34%32` and `/orders/42`
/// (one handler, one `Path(42)` in axum) take one lock, and so do `%4a`, `%4A`
/// and `J`. Keyed on the raw path, a client could walk around the lock by
/// spelling a path another way. `%2F` stays another path than a real `/`, as
/// it is for the router's matching; under a wildcard route (`/files/{*rest}`),
/// which hands both to the handler as `a/b`, key on the parameter with
/// `by_path_param` instead.
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
            return Some(normalize_path(original.path()).into_owned());
        }
        Some(normalize_path(req.uri.path()).into_owned())
    }
}

/// The value of one request header, e.g. `X-Tenant-Id`: keyed
/// `<header name>=<value>` (`x-tenant-id=acme`), or `name=<value>` once
/// [named](Self::named), the value percent-encoded (see the [key
/// format](KeyExtractor#the-key-format)). Absent, empty or non-UTF-8 values give no key.
///
/// The client chooses this value: use it for keys where a client can only hurt
/// itself by choosing another one (its own tenant, its own delivery id), and
/// check it against authentication where that matters.
#[derive(Debug, Clone)]
pub struct ByHeader {
    header: HeaderName,
    family: KeyFamily,
}

impl ByHeader {
    /// The value of `header`, keyed `<header name>=<value>`.
    pub fn new(header: HeaderName) -> Self {
        let family = KeyFamily::named(header.as_str());
        Self { header, family }
    }

    /// Keys `name=<value>`, as `ByPathParam` (axum) does for a route parameter of
    /// that name, so both find the same lock for the same value.
    pub fn named(mut self, name: &str) -> Self {
        self.family = KeyFamily::named(name);
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
        Some(self.family.key(value))
    }
}

/// Several named parameters of the axum route that matched, locked together
/// as one lock: `from` and `to` in `/transfers/{from}/{to}`. Each key is the
/// parameter's decoded value (as [`ByPathParam`] reads it), percent-encoded,
/// in one family for all of them: the parameters' names joined by `,`
/// (`from,to=7`), or `<name>=<value>` once [named](Self::named) with one
/// name for all of them. So `/transfers/7/9` and `/transfers/9/7` lock the
/// same two accounts, in one step that cannot deadlock. A request missing
/// any of the parameters has no key. Needs `Router::layer` or
/// `route_layer`, as [`ByPathParam`].
#[cfg(feature = "axum")]
#[derive(Debug, Clone)]
pub struct ByPathParams {
    pub(crate) params: Arc<[Arc<str>]>,
    pub(crate) family: KeyFamily,
}

#[cfg(feature = "axum")]
impl ByPathParams {
    /// The parameters `params`, each key `<names>=<value>`, `<names>` the
    /// parameters' names joined by `,` (`from,to=7`).
    pub fn new<I, S>(params: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let params: Arc<[Arc<str>]> = params.into_iter().map(|p| Arc::from(p.as_ref())).collect();
        let family = KeyFamily::params(params.iter());
        Self { params, family }
    }

    /// Keys each value as `name=<value>` (e.g. `account=7`), the key
    /// `by_path_param(name)` and `by_header_as(.., name)` give the same value.
    pub fn named(mut self, name: &str) -> Self {
        self.family = KeyFamily::named(name);
        self
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for ByPathParams {
    /// The keys joined by `+`, as the layer names the lock in logs.
    fn extract(&self, req: &mut Parts) -> Option<String> {
        self.extract_keys(req).map(|k| k.to_string())
    }

    fn extract_keys(&self, req: &mut Parts) -> Option<RequestKey> {
        use axum::extract::{FromRequestParts, RawPathParams};
        use futures_util::FutureExt;
        let params = RawPathParams::from_request_parts(req, &())
            .now_or_never()?
            .ok()?;
        let keys = self
            .params
            .iter()
            .map(|want| {
                let value = params.iter().find(|(name, _)| *name == &**want)?.1;
                Some(self.family.key(value))
            })
            .collect::<Option<Vec<String>>>()?;
        Some(RequestKey::Many(keys))
    }
}

/// One named parameter of the axum route that matched, e.g. `tenant` in
/// `/tenants/{tenant}/jobs`, keyed `tenant=<value>`. Needs the layer to be
/// applied with `Router::layer` or `route_layer` (the router fills the
/// parameters in before the layer runs).
///
/// The value is the parameter percent-decoded, as the router gives it to `Path`
/// (`%34%32` is `42`; a parameter that does not decode to UTF-8 gives no key,
/// and axum answers 400 to such a request anyway), then percent-encoded into
/// the key (see the [key format](KeyExtractor#the-key-format)). It is text, not the type the
/// handler parses it into: `042` and `42` are two keys even when both parse to
/// the same number. Where such spellings name one resource, compute the key
/// from the parsed value with `by_fn`.
#[cfg(feature = "axum")]
#[derive(Debug, Clone)]
pub struct ByPathParam {
    name: Arc<str>,
    family: KeyFamily,
}

#[cfg(feature = "axum")]
impl ByPathParam {
    /// The parameter `name`, keyed `name=<value>`.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            family: KeyFamily::named(name),
        }
    }
}

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
            .find(|(name, _)| *name == &*self.name)
            .map(|(_, value)| self.family.key(value))
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
