//! Where the middleware finds the lock key of a request, in the format
//! [`RedlockMiddleware`](crate::RedlockMiddleware#the-key-format) documents.

use std::fmt;
use std::sync::Arc;

use actix_web::dev::ServiceRequest;
use actix_web::http::header::HeaderName;
use redlock_core::request::{KeyFamily, RequestKey, decode_param, normalize_path};

/// A user key function of [`RedlockMiddleware::by_fn`](crate::RedlockMiddleware::by_fn).
pub(crate) type KeyFn = Arc<dyn Fn(&ServiceRequest) -> Option<String> + Send + Sync>;

/// The key source a middleware was built with.
#[derive(Clone)]
pub(crate) enum KeySource {
    /// `req.path()`, in canonical form.
    Path,
    /// One header's value, as `name=value` when named, else as
    /// `<header name>=value`.
    Header {
        header: HeaderName,
        name: Option<Arc<str>>,
        family: KeyFamily,
    },
    /// `req.match_pattern()`.
    MatchPattern,
    /// One parameter of `req.match_info()`, decoded, as `name=value`.
    PathParam { name: Arc<str>, family: KeyFamily },
    /// Several parameters of `req.match_info()`, decoded, locked together:
    /// each `<names>=value` (the parameters' names joined by `,`), or
    /// `name=value` with the one name given.
    PathParams {
        params: Arc<[Arc<str>]>,
        name: Option<Arc<str>>,
        family: KeyFamily,
    },
    /// A user function.
    Custom(KeyFn),
}

impl KeySource {
    /// [`KeySource::Header`] for `header`, named `name` if given.
    pub(crate) fn header(header: HeaderName, name: Option<&str>) -> Self {
        let family = KeyFamily::named(name.unwrap_or(header.as_str()));
        KeySource::Header {
            header,
            name: name.map(Arc::from),
            family,
        }
    }

    /// [`KeySource::PathParam`] for the parameter `name`.
    pub(crate) fn path_param(name: &str) -> Self {
        KeySource::PathParam {
            name: name.into(),
            family: KeyFamily::named(name),
        }
    }

    /// [`KeySource::PathParams`] for `params`, named `name` if given.
    pub(crate) fn path_params(params: Arc<[Arc<str>]>, name: Option<&str>) -> Self {
        let family = match name {
            Some(name) => KeyFamily::named(name),
            None => KeyFamily::params(params.iter()),
        };
        KeySource::PathParams {
            params,
            name: name.map(Arc::from),
            family,
        }
    }

    /// The key of `req`; `None` when the request has none (the missing-key
    /// policy then decides).
    pub(crate) fn key_of(&self, req: &ServiceRequest) -> Option<String> {
        match self {
            // From the raw path: its canonical form merges every spelling the
            // router's requoting (`match_info().as_str()`) merges, and also
            // those that only `web::Path` merges (`%2B` and `+`, `%2f` and `%2F`).
            KeySource::Path => Some(normalize_path(req.path()).into_owned()),
            KeySource::Header { header, family, .. } => {
                let value = req.headers().get(header)?.to_str().ok()?;
                if value.is_empty() {
                    return None;
                }
                Some(family.key(value))
            }
            KeySource::MatchPattern => req.match_pattern(),
            KeySource::PathParam { name, family } => {
                // `match_info()` keeps `%2F`, `%25` and `%2B` encoded;
                // `web::Path` decodes them, and the key follows the handler.
                let value = decode_param(req.match_info().get(name)?);
                Some(family.key(&value))
            }
            KeySource::PathParams { .. } => self.keys_of(req).map(|k| k.to_string()),
            KeySource::Custom(f) => f(req),
        }
    }

    /// The keys of `req`, locked together as one lock: several for
    /// [`KeySource::PathParams`] (none if any parameter is missing), else
    /// the one key of [`KeySource::key_of`].
    pub(crate) fn keys_of(&self, req: &ServiceRequest) -> Option<RequestKey> {
        let KeySource::PathParams { params, family, .. } = self else {
            return self.key_of(req).map(RequestKey::One);
        };
        let keys = params
            .iter()
            .map(|p| {
                let value = decode_param(req.match_info().get(p)?);
                Some(family.key(&value))
            })
            .collect::<Option<Vec<String>>>()?;
        Some(RequestKey::Many(keys))
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Path => f.write_str("by_path"),
            KeySource::Header {
                header, name: None, ..
            } => write!(f, "by_header({header})"),
            KeySource::Header {
                header,
                name: Some(name),
                ..
            } => write!(f, "by_header_as({header}, {name})"),
            KeySource::MatchPattern => f.write_str("by_match_pattern"),
            KeySource::PathParam { name, .. } => write!(f, "by_path_param({name})"),
            KeySource::PathParams { params, name, .. } => {
                let params: Vec<&str> = params.iter().map(|p| &**p).collect();
                match name {
                    None => write!(f, "by_path_params({params:?})"),
                    Some(name) => write!(f, "by_path_params_as({params:?}, {name})"),
                }
            }
            KeySource::Custom(_) => f.write_str("by_fn(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;

    #[test]
    fn each_source_reads_its_part_of_the_request() {
        let req = TestRequest::get()
            .uri("/tenants/acme/jobs?x=1")
            .insert_header(("x-tenant", "acme"))
            .insert_header(("x-empty", ""))
            .param("tenant", "acme")
            .to_srv_request();
        assert_eq!(
            KeySource::Path.key_of(&req).as_deref(),
            Some("/tenants/acme/jobs")
        );
        let header = |name| KeySource::header(HeaderName::from_static(name), None).key_of(&req);
        assert_eq!(header("x-tenant").as_deref(), Some("x-tenant=acme"));
        let named = KeySource::header(HeaderName::from_static("x-tenant"), Some("tenant"));
        assert_eq!(
            named.key_of(&req).as_deref(),
            Some("tenant=acme"),
            "as by_path_param"
        );
        assert_eq!(header("x-empty"), None);
        assert_eq!(header("x-absent"), None);
        let param = |name: &str| KeySource::path_param(name).key_of(&req);
        assert_eq!(param("tenant").as_deref(), Some("tenant=acme"));
        assert_eq!(param("job"), None);
        let encoded = TestRequest::get()
            .uri("/tenants/a%2Bb/jobs/%34%32")
            .param("tenant", "a%2Bb")
            .to_srv_request();
        assert_eq!(
            KeySource::Path.key_of(&encoded).as_deref(),
            Some("/tenants/a+b/jobs/42")
        );
        assert_eq!(
            KeySource::path_param("tenant").key_of(&encoded).as_deref(),
            Some("tenant=a%2Bb"),
            "decoded as web::Path<String> gives it, then escaped"
        );
        let custom = KeySource::Custom(Arc::new(|req: &ServiceRequest| {
            Some(format!("{} {}", req.method(), req.query_string()))
        }));
        assert_eq!(custom.key_of(&req).as_deref(), Some("GET x=1"));
        assert_eq!(format!("{custom:?}"), "by_fn(..)");
    }
}
