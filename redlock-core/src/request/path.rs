//! Request keys from paths: one key per resource the router serves, however the
//! client spelled its path (the promise behind the adapters' `by_path()`).
//!
//! A key taken from the raw path lets a client walk around the lock: axum's
//! router matches `/orders/{id}` on the raw path and its `Path` extractor then
//! percent-decodes the parameter, so `/orders/42` and `/orders/%34%32` reach the
//! same handler with the same `id`; actix-web matches on a path it has already
//! percent-decoded (`actix_router::Url`, which keeps only `%2F`, `%25` and `%2B`
//! encoded) and `web::Path` decodes those too. Two spellings, one resource, and
//! two locks if the key is the raw path.

use std::borrow::Cow;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What stays raw in a canonical path segment: RFC 3986's `pchar` less
/// `pct-encoded` (unreserved, sub-delims, `:` and `@`). Everything else is
/// written `%XX`: `%` itself, so that decoding stays unambiguous (`%2541` is
/// not `%41`), `/` inside a segment (from `%2F`), which would otherwise change
/// the path's structure, the octets a path may not carry raw (controls, space,
/// `"`, `#`, `<`, `>`, `?`, `[`, `\`, `]`, `^`, `` ` ``, `{`, `|`, `}`), and
/// every octet of a non-ASCII character.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b';')
    .remove(b'=')
    .remove(b':')
    .remove(b'@');

/// [`SEGMENT`] with `/` raw: for the whole path, when it has no `%` at all.
const PATH: &AsciiSet = &SEGMENT.remove(b'/');

/// The canonical form of a request path, so that two paths the router serves
/// as one resource give one lock key. `by_path()` in `redlock-tower` and
/// `redlock-actix` key on it.
///
/// Each `/`-separated segment is percent-decoded whole, then re-encoded with
/// upper-case hex for `%`, `/`, non-ASCII octets and the octets a path may not
/// carry raw; every other character is written raw. So:
///
/// - `%34%32` is `42`, and `%4a`, `%4A` and `J` are one key (RFC 3986 §6.2.2.1
///   and §6.2.2.2 for unreserved characters; beyond them, every octet the
///   routers decode, e.g. `%21` is `!` and `%2B` is `+`, as axum's `Path` and
///   actix-web's `web::Path` both see them);
/// - `%2F` (or `%2f`) stays `%2F`, distinct from a real `/`: it does not split
///   the path into segments, so the router does not match it as one;
/// - `%25` stays `%25`: `%2541` is not `%41`;
/// - a `%` that starts no valid escape (`%`, `%G1`) is a literal `%`, as both
///   routers read it, and is written `%25`;
/// - octets that do not decode to UTF-8 (`%C3` alone, `%FF`) become U+FFFD, as
///   actix-web's router reads them (axum refuses such a parameter with 400, so
///   merging them costs no exclusion);
/// - dot segments, empty segments and letter case are kept: neither router
///   merges `/a/../b` with `/b`, `/a//b` with `/a/b`, or `/A` with `/a`.
///
/// It never fails and never panics; the result is ASCII, and normalising it
/// again gives it back unchanged. A path that is already canonical (the usual
/// case) is borrowed, not copied.
///
/// ```
/// use redlock_core::request::normalize_path;
///
/// assert_eq!(normalize_path("/orders/%34%32"), "/orders/42");
/// assert_eq!(normalize_path("/users/%4a"), normalize_path("/users/J"));
/// assert_eq!(normalize_path("/files/a%2fb"), "/files/a%2Fb");
/// assert_ne!(normalize_path("/files/a%2Fb"), normalize_path("/files/a/b"));
/// ```
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if !path.contains('%')
        && let Cow::Borrowed(same) = Cow::from(utf8_percent_encode(path, PATH))
    {
        return Cow::Borrowed(same);
    }
    let mut canonical = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            canonical.push('/');
        }
        let decoded = percent_decode_str(segment).decode_utf8_lossy();
        canonical.extend(utf8_percent_encode(&decoded, SEGMENT));
    }
    Cow::Owned(canonical)
}

/// A path parameter as actix-web's `web::Path<String>` gives it to the
/// handler: percent-decoded whole (its router leaves `%2F`, `%25` and `%2B`
/// encoded in `match_info()`), invalid UTF-8 replaced by U+FFFD, a `%` that
/// starts no valid escape kept as is. axum's router hands its parameters over
/// decoded already.
pub fn decode_param(value: &str) -> Cow<'_, str> {
    percent_decode_str(value).decode_utf8_lossy()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths that must give one key, and the key.
    const SAME: &[(&[&str], &str)] = &[
        (
            &["/orders/42", "/orders/%34%32", "/orders/%342"],
            "/orders/42",
        ),
        (&["/users/J", "/users/%4a", "/users/%4A"], "/users/J"),
        (&["/a/!", "/a/%21"], "/a/!"),
        (&["/a/+", "/a/%2B", "/a/%2b"], "/a/+"),
        (
            &["/a/~-._", "/a/%7E%2D%2E%5F", "/a/%7e%2d%2e%5f"],
            "/a/~-._",
        ),
        (&["/files/a%2Fb", "/files/a%2fb"], "/files/a%2Fb"),
        (&["/a/%25", "/a/%"], "/a/%25"),
        (&["/a/%25%", "/a/%%"], "/a/%25%25"),
        (&["/a/%G1", "/a/%25G1"], "/a/%25G1"),
        (&["/a/%4", "/a/%254"], "/a/%254"),
        (&["/caf%C3%A9", "/caf%c3%a9", "/café"], "/caf%C3%A9"),
        (&["/a/%FF", "/a/%C3", "/a/%EF%BF%BD"], "/a/%EF%BF%BD"),
        (&["/a/%20b", "/a/ b"], "/a/%20b"),
        (&["/a/%7B%7D", "/a/{}"], "/a/%7B%7D"),
        (&["/a/%3F", "/a/%3f"], "/a/%3F"),
        (&["/a/%00%0a"], "/a/%00%0A"),
        (&[""], ""),
        (&["%", "%25"], "%25"),
    ];

    #[test]
    fn spellings_of_one_resource_give_one_key() {
        for (paths, key) in SAME {
            for path in *paths {
                assert_eq!(normalize_path(path), *key, "{path:?}");
            }
        }
    }

    #[test]
    fn structure_stays_distinct() {
        let distinct = [
            ["/files/a%2Fb", "/files/a/b"],
            ["/a/%2541", "/a/%41"],
            ["/a/%252F", "/a/%2F"],
            ["/a/../b", "/b"],
            ["/a/%2E%2E/b", "/b"],
            ["/a//b", "/a/b"],
            ["/a/", "/a"],
            ["/A", "/a"],
        ];
        for [a, b] in distinct {
            assert_ne!(normalize_path(a), normalize_path(b), "{a:?} against {b:?}");
        }
    }

    #[test]
    fn malformed_input_never_panics_and_stays_ascii() {
        let odd = [
            "%",
            "%%",
            "%%%",
            "%G1",
            "%1",
            "/%",
            "/a%",
            "/%C3",
            "/%C3%",
            "/%E2%82",
            "/%F0%9F%98",
            "/%ED%A0%80",
            "/%C0%AF",
            "/%zz%",
            "/\u{0}",
            "/\u{7f}",
            "/%2",
            "%/%",
        ];
        for path in odd {
            let key = normalize_path(path);
            assert!(key.is_ascii(), "{path:?} gave {key:?}");
            assert!(!key.contains("%%"), "{path:?} gave {key:?}");
        }
    }

    #[test]
    fn normalising_twice_is_normalising_once() {
        let inputs = SAME
            .iter()
            .flat_map(|(paths, _)| paths.iter().copied())
            .chain([
                "/files/a/b",
                "/%",
                "/%G1",
                "/a%2F%2f%25%2541",
                "/é/%C3",
                "/a b/\"q\"",
                "/%5C\\",
                "/x?y",
            ]);
        for path in inputs {
            let once = normalize_path(path).into_owned();
            let twice = normalize_path(&once);
            assert_eq!(twice, once, "{path:?}");
        }
    }

    #[test]
    fn a_canonical_path_is_borrowed() {
        for path in ["/orders/42", "/", "", "/a/b;c=d/@x:y/!$&'()*+,"] {
            assert!(
                matches!(normalize_path(path), Cow::Borrowed(p) if p == path),
                "{path:?}"
            );
        }
    }

    #[test]
    fn params_decode_as_web_path_string() {
        assert_eq!(decode_param("a%2Fb"), "a/b");
        assert_eq!(decode_param("a%2Bb"), "a+b");
        assert_eq!(decode_param("%25"), "%");
        assert_eq!(decode_param("%G1"), "%G1");
        assert_eq!(decode_param("%FF"), "\u{FFFD}");
        assert!(matches!(decode_param("plain"), Cow::Borrowed("plain")));
    }
}
