//! *Layer 1, values (see `lib.rs`).*
//!
//! Node URLs: passwords kept out of every message, and the host check.
//!
//! Redaction has to hold for what a user meant as well as for what redis-rs
//! parses. `redis://:ab/cd@host` does not parse (the authority ends at the
//! `/`), yet `ab/cd` is a password; `redis+unix:///r.sock?pass=pw` carries
//! its password in the query. So a URL is shown as parsed only when redis-rs
//! parses it and its only `@`s are in the authority; otherwise everything up
//! to its last `@` is masked, and what follows is shown only when it looks
//! like a host. Query values under a password-like key are masked in both.

use percent_encoding::percent_decode_str;

/// redis-rs's query keys that carry no secret; a secret value runs on to the
/// next of these, so an unescaped `&` in a password does not show its tail.
const PLAIN_KEYS: [&str; 3] = ["db", "user", "protocol"];

/// A query key whose value is masked: redis-rs's `pass`, and what users write
/// instead (`password`, `passwd`, `pwd`, `secret`, `token`, `auth`).
fn is_secret_key(key: &str) -> bool {
    let key = form_decode(key).to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth"]
        .iter()
        .any(|s| key.contains(s))
}

fn is_plain_key(key: &str) -> bool {
    let key = form_decode(key);
    PLAIN_KEYS.iter().any(|k| key.eq_ignore_ascii_case(k))
}

/// `application/x-www-form-urlencoded` decoding, as redis-rs reads a query.
fn form_decode(s: &str) -> String {
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// `query` (the text after `?`) with every secret value masked, and the raw
/// secret values.
fn mask_query(query: &str) -> (String, Vec<String>) {
    let mut shown: Vec<String> = Vec::new();
    let mut secrets = Vec::new();
    // The raw text of the secret value being masked, with any `&`-separated
    // tail that does not start a plain key.
    let mut masking: Option<String> = None;
    for pair in query.split('&') {
        let key = pair.split_once('=').map(|(k, _)| k);
        match key {
            Some(k) if is_secret_key(k) => {
                secrets.extend(masking.take());
                let value = &pair[k.len() + 1..];
                shown.push(format!("{k}=***"));
                masking = Some(value.to_owned());
            }
            Some(k) if is_plain_key(k) => {
                secrets.extend(masking.take());
                shown.push(pair.to_owned());
            }
            _ => match &mut masking {
                Some(value) => {
                    value.push('&');
                    value.push_str(pair);
                }
                None => shown.push(pair.to_owned()),
            },
        }
    }
    secrets.extend(masking);
    (shown.join("&"), secrets)
}

/// `host[:port][/db]`, brackets allowed: what may follow a masked userinfo.
fn looks_like_host(s: &str) -> bool {
    let (host_port, db) = s.split_once('/').unwrap_or((s, ""));
    !host_port.is_empty()
        && host_port
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c))
        && db.chars().all(|c| c.is_ascii_digit())
}

/// The URL as it may be shown, and every piece of it that is or may be a
/// secret (raw and decoded).
fn redact(url: &str) -> (String, Vec<String>) {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let unix = scheme.to_ascii_lowercase().contains("unix");
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // The URL parser drops tabs and newlines, so the text it read is not the
    // text given: such a URL is never shown as parsed.
    let precise = !url.contains(|c: char| c.is_ascii_control())
        && !rest[authority_end..].contains('@')
        && redis::parse_redis_url(url).is_some();
    let at = if precise {
        rest[..authority_end].rfind('@')
    } else {
        rest.rfind('@')
    };
    let mut secrets = Vec::new();
    let mut out = String::from(scheme);
    let tail = match at {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                // A user name is shown unless the URL is ambiguous and the
                // "name" holds what may be part of a password.
                Some((user, password))
                    if precise || !user.contains(['/', '?', '#', '&', '=', '@']) =>
                {
                    secrets.push(password.to_owned());
                    if !precise {
                        secrets.push(userinfo.to_owned());
                    }
                    out.push_str(user);
                    out.push_str(":***@");
                }
                // `redis://secret@host`: a lone user part counts as the
                // password.
                _ => {
                    secrets.push(userinfo.to_owned());
                    out.push_str(if precise { ":***@" } else { "***@" });
                }
            }
            &rest[at + 1..]
        }
        None => rest,
    };
    let (head, query) = match tail.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (tail, None),
    };
    // An `=` before the last `@` says that `@` may be inside a query value
    // (`?pass=a@b`), so what follows it may be the rest of a password.
    let userinfo_is_query = at.is_some_and(|at| rest[..at].contains('='));
    if precise || at.is_none() || (!unix && !userinfo_is_query && looks_like_host(head)) {
        out.push_str(head);
        if let Some(query) = query {
            let (shown, values) = mask_query(query);
            secrets.extend(values);
            out.push('?');
            out.push_str(&shown);
        }
    } else {
        // What follows the last `@` of an ambiguous URL may be the rest of
        // a password: not shown.
        secrets.push(tail.to_owned());
        out.truncate(scheme.len());
        out.push_str("***");
    }
    let decoded: Vec<String> = secrets.iter().map(|s| form_decode(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    // Longest first, so that a secret is replaced whole before any part of it.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    (out, secrets)
}

/// A Redis URL as it may be logged: its password, and any query value under a
/// password-like key (`?pass=`, `?password=`), replaced with `***`.
///
/// Every URL form redis-rs reads is covered (`redis://`, `rediss://`,
/// `valkey://`, `redis+unix://`, `unix://`; the password in the userinfo,
/// `%`-escaped or not, or in `?pass=`), and so are URLs it rejects: a
/// password with a raw `/`, `?` or `#` ends the authority early, so in a URL
/// that does not parse, or has an `@` past its authority, everything up to the
/// last `@` is masked, and what follows is shown only when it looks like a
/// host.
///
/// ```
/// use redlock_core::redact_url;
/// assert_eq!(redact_url("redis://app:s3cr3t@10.0.0.1:6379/0"), "redis://app:***@10.0.0.1:6379/0");
/// assert_eq!(redact_url("redis+unix:///run/r.sock?pass=s3cr3t"), "redis+unix:///run/r.sock?pass=***");
/// assert_eq!(redact_url("redis://:ab/cd@10.0.0.1:6379"), "redis://:***@10.0.0.1:6379");
/// ```
pub fn redact_url(url: &str) -> String {
    redact(url).0
}

/// `message` with `url` shown redacted and every secret of `url` (raw or
/// decoded) replaced with `***`, for messages that may quote the URL or a
/// part of it.
pub(crate) fn scrub_password(url: &str, message: String) -> String {
    let (shown, secrets) = redact(url);
    let mut message = if url.is_empty() {
        message
    } else {
        message.replace(url, &shown)
    };
    for secret in &secrets {
        message = message.replace(secret.as_str(), "***");
    }
    message
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

    /// Every form, with what is shown and the pieces that must never show.
    const TABLE: &[(&str, &str, &[&str])] = &[
        // Userinfo that redis-rs parses.
        (
            "redis://user:hunter2@host:6379/0",
            "redis://user:***@host:6379/0",
            &["hunter2"],
        ),
        ("redis://:hunter2@host", "redis://:***@host", &["hunter2"]),
        (
            "rediss://hunter2@host/1",
            "rediss://:***@host/1",
            &["hunter2"],
        ),
        (
            "valkeys://u:hunter2@host:1",
            "valkeys://u:***@host:1",
            &["hunter2"],
        ),
        (
            "redis://u:hun%2Fter%40two%25@h:1",
            "redis://u:***@h:1",
            &["hun", "ter", "two"],
        ),
        // A raw `,` or `@` in the password: the URL still parses (last `@`).
        (
            "redis://:abcde,fghij@127.0.0.1:7899",
            "redis://:***@127.0.0.1:7899",
            &["abcde", "fghij"],
        ),
        (
            "redis://u:abcde@fghij@127.0.0.1:7899",
            "redis://u:***@127.0.0.1:7899",
            &["abcde", "fghij"],
        ),
        // A raw `/`, `?` or `#` ends the authority: the URL does not parse,
        // or parses into something else (port `ab`, or host `u` with the
        // password's tail as its db).
        (
            "redis://:abcde/fghij@127.0.0.1:7899",
            "redis://:***@127.0.0.1:7899",
            &["abcde", "fghij"],
        ),
        (
            "redis://:abcde?fghij@127.0.0.1:7899",
            "redis://:***@127.0.0.1:7899",
            &["abcde", "fghij"],
        ),
        (
            "redis://:abcde#fghij@127.0.0.1:7899",
            "redis://:***@127.0.0.1:7899",
            &["abcde", "fghij"],
        ),
        (
            "redis://u:12345/67890@host:1/2",
            "redis://u:***@host:1/2",
            &["12345", "67890"],
        ),
        (
            "redis://abcde/fgh:ijklm@host:1",
            "redis://***@host:1",
            &["abcde", "ijklm"],
        ),
        // Unix sockets: the password in the query.
        (
            "redis+unix:///run/r.sock?pass=hunter2",
            "redis+unix:///run/r.sock?pass=***",
            &["hunter2"],
        ),
        (
            "unix:///run/r.sock?user=bob&pass=hun%26ter2&db=2",
            "unix:///run/r.sock?user=bob&pass=***&db=2",
            &["hun", "ter2"],
        ),
        (
            "unix:///run/r.sock?password=hunter2&db=1",
            "unix:///run/r.sock?password=***&db=1",
            &["hunter2"],
        ),
        // An unescaped `&` in a query password: the tail stays masked.
        (
            "redis+unix:///run/r.sock?pass=abcde&fghij&db=1",
            "redis+unix:///run/r.sock?pass=***&db=1",
            &["abcde", "fghij"],
        ),
        // An `@` in a query password.
        (
            "unix:///run/r.sock?user=bob&pass=abcde@fghij",
            "unix://***",
            &["abcde", "fghij"],
        ),
        (
            "redis://h:1/0?pass=abcde@fghij",
            "redis://***",
            &["abcde", "fghij"],
        ),
        // TCP URLs do not read `?pass=`, but users write it.
        (
            "redis://h:1/0?password=hunter2&protocol=3",
            "redis://h:1/0?password=***&protocol=3",
            &["hunter2"],
        ),
        // Tabs and newlines are dropped by the parser: never shown as parsed.
        (
            "redis://:hun\nter2@h:1",
            "redis://:***@h:1",
            &["hun", "ter2"],
        ),
        // No password.
        ("redis://host:6379", "redis://host:6379", &[]),
        (
            "redis+unix:///run/r.sock?db=2",
            "redis+unix:///run/r.sock?db=2",
            &[],
        ),
        ("not a url", "not a url", &[]),
        // Half of a URL split at a password's comma.
        ("fghij@127.0.0.1:7899", "***@127.0.0.1:7899", &["fghij"]),
    ];

    #[test]
    fn redacts_every_form() {
        for (url, shown, secrets) in TABLE {
            let got = redact_url(url);
            assert_eq!(&got, shown, "redact_url({url:?})");
            for secret in *secrets {
                assert!(!got.contains(secret), "{secret:?} shows in {got:?}");
                let message = scrub_password(url, format!("cannot parse {url}"));
                assert!(!message.contains(secret), "{secret:?} in {message:?}");
            }
        }
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
        // The decoded form of an escaped password too.
        assert_eq!(
            scrub_password("redis://:hun%74er2@h", "auth hunter2 failed".into()),
            "auth *** failed"
        );
        assert_eq!(scrub_password("redis://h", "m".into()), "m");
        assert!(valid_host("10.0.0.1") && valid_host("[::1]") && valid_host("redis-1.internal"));
        assert!(!valid_host("bad host") && !valid_host(""));
    }
}
