//! Keys from a gRPC request: its method, and its metadata.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use http::HeaderName;
use http::request::Parts;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_encode};
use redlock_core::request::{KeyFamily, normalize_path};

use crate::key::{ByHeader, KeyExtractor};

/// The gRPC method called, `/<package>.<Service>/<Method>`
/// (`/jobs.v1.Jobs/Run`): one lock per method, whatever the message.
///
/// The key is the request path in the canonical form [`ByPath`](crate::ByPath)
/// gives it ([`normalize_path`]), so a method spelled with percent-escapes
/// takes the method's lock. A path that is not two non-empty segments (not a
/// gRPC method) gives no key, and the missing-key policy applies.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByGrpcMethod;

impl KeyExtractor for ByGrpcMethod {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        let path = normalize_path(req.uri.path());
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        if service.is_empty() || method.is_empty() || method.contains('/') {
            return None;
        }
        Some(path.into_owned())
    }
}

/// The value of one metadata entry (e.g. `x-tenant`), keyed
/// `<name>=<value>` (`x-tenant=acme`), the value percent-encoded as
/// [`ByHeader`]'s is (see the [key format](KeyExtractor#the-key-format)).
///
/// ASCII metadata is a header: the key is the one
/// [`by_header`](crate::RedlockLayer::by_header) gives. Binary metadata
/// (a name ending in `-bin`) is base64 on the wire, padded or not as the
/// client likes (the gRPC spec lets it choose): the key is made from the
/// decoded bytes, so both spellings of one value take one lock. A value that
/// is not base64 gives no key.
///
/// The client chooses this value, as it chooses a header: use it for keys
/// where a client can only hurt itself by choosing another one (its own
/// tenant), and check it against authentication where that matters.
#[derive(Debug, Clone)]
pub struct ByMetadata {
    header: HeaderName,
    ascii: ByHeader,
    family: KeyFamily,
}

/// The bytes a key keeps as they are (`escape_value`'s set, for bytes).
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl ByMetadata {
    /// The metadata entry `name`, keyed `<name>=<value>`.
    pub fn new(name: HeaderName) -> Self {
        Self {
            ascii: ByHeader::new(name.clone()),
            family: KeyFamily::named(name.as_str()),
            header: name,
        }
    }

    fn is_binary(&self) -> bool {
        self.header.as_str().ends_with("-bin")
    }
}

impl KeyExtractor for ByMetadata {
    fn extract(&self, req: &mut Parts) -> Option<String> {
        if !self.is_binary() {
            return self.ascii.extract(req);
        }
        let encoded = req.headers.get(&self.header)?.as_bytes();
        let bytes = if encoded.len() % 4 == 0 {
            STANDARD.decode(encoded)
        } else {
            STANDARD_NO_PAD.decode(encoded)
        }
        .ok()
        .filter(|b| !b.is_empty())?;
        Some(format!(
            "{}={}",
            self.family.as_str(),
            percent_encode(&bytes, VALUE)
        ))
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Request};

    use super::*;

    fn parts(path: &str, metadata: &[(&'static str, &'static str)]) -> Parts {
        let mut request = Request::builder().uri(path);
        for (name, value) in metadata {
            request = request.header(*name, HeaderValue::from_static(value));
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_method_is_the_canonical_path_of_two_segments() {
        let key = |path| ByGrpcMethod.extract(&mut parts(path, &[]));
        assert_eq!(
            key("/jobs.v1.Jobs/Run").as_deref(),
            Some("/jobs.v1.Jobs/Run")
        );
        assert_eq!(
            key("/jobs.v1.Jobs/R%75n").as_deref(),
            Some("/jobs.v1.Jobs/Run")
        );
        assert_eq!(key("/jobs.v1.Jobs/"), None);
        assert_eq!(key("/jobs.v1.Jobs"), None);
        assert_eq!(key("/a/b/c"), None);
        assert_eq!(key("//Run"), None);
    }

    #[test]
    fn ascii_metadata_is_a_header_and_binary_metadata_its_bytes() {
        let tenant = ByMetadata::new(HeaderName::from_static("x-tenant"));
        let key = tenant.extract(&mut parts("/s/m", &[("x-tenant", "acme=1")]));
        assert_eq!(key.as_deref(), Some("x-tenant=acme%3D1"));

        let binary = ByMetadata::new(HeaderName::from_static("x-id-bin"));
        // "ab" is YWI= padded, YWI unpadded: one key.
        let padded = binary.extract(&mut parts("/s/m", &[("x-id-bin", "YWI=")]));
        let unpadded = binary.extract(&mut parts("/s/m", &[("x-id-bin", "YWI")]));
        assert_eq!(padded.as_deref(), Some("x-id-bin=ab"));
        assert_eq!(padded, unpadded);
        // Bytes that are not UTF-8 are escaped as bytes.
        let raw = binary.extract(&mut parts("/s/m", &[("x-id-bin", "/w==")]));
        assert_eq!(raw.as_deref(), Some("x-id-bin=%FF"));
        assert_eq!(
            binary.extract(&mut parts("/s/m", &[("x-id-bin", "not base64!")])),
            None
        );
        assert_eq!(binary.extract(&mut parts("/s/m", &[])), None);
    }
}
