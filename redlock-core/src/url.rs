//! Node URLs: one parser of the authority (`user:password@host:port`), used to
//! keep passwords out of every message, and the host check.

/// The parts of `scheme://[user[:password]@]host…` that redaction needs.
struct Authority<'a> {
    /// `scheme://`.
    scheme: &'a str,
    /// The user part (empty when absent).
    user: &'a str,
    /// The password, when the URL carries one. `redis://secret@host` puts the
    /// password alone in the user part: it counts as the password.
    password: Option<&'a str>,
    /// Everything after the `@`.
    rest: &'a str,
}

fn authority(url: &str) -> Option<Authority<'_>> {
    let scheme_end = url.find("://")? + 3;
    let after = &url[scheme_end..];
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let at = after[..authority_end].rfind('@')?;
    let userinfo = &after[..at];
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => ("", Some(userinfo)),
    };
    Some(Authority {
        scheme: &url[..scheme_end],
        user,
        password: password.filter(|p| !p.is_empty()),
        rest: &after[at + 1..],
    })
}

/// Replaces the password in a Redis URL with `***`, so it can be logged.
pub fn redact_url(url: &str) -> String {
    match authority(url) {
        Some(a) => format!("{}{}:***@{}", a.scheme, a.user, a.rest),
        None => url.to_owned(),
    }
}

/// Removes the URL's password from a message that may quote the URL.
pub(crate) fn scrub_password(url: &str, message: String) -> String {
    match authority(url).and_then(|a| a.password) {
        Some(password) => message.replace(password, "***"),
        None => message,
    }
}

/// A DNS name or an IP address (brackets already removed).
pub(crate) fn valid_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<std::net::IpAddr>().is_ok()
        || (!host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("redis://user:hunter2@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://:hunter2@host"), "redis://:***@host");
        assert_eq!(
            redact_url("rediss://hunter2@host/1"),
            "rediss://:***@host/1"
        );
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn scrubs_the_password_from_messages() {
        let url = "redis://user:hunter2@host:6379/0";
        assert_eq!(
            scrub_password(url, format!("cannot parse {url}")),
            "cannot parse redis://user:***@host:6379/0"
        );
        assert_eq!(
            scrub_password("redis://hunter2@h", "x hunter2 y".into()),
            "x *** y"
        );
        assert_eq!(scrub_password("redis://h", "m".into()), "m");
        assert!(valid_host("10.0.0.1") && valid_host("[::1]") && valid_host("redis-1.internal"));
        assert!(!valid_host("bad host") && !valid_host(""));
    }
}
