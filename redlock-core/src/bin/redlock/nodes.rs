//! `--nodes` and `REDLOCK_NODES`: one string, several URLs.
//!
//! URLs are separated by commas or whitespace, but only where a URL starts
//! right after the separator (`redis://`, `rediss://`, `valkey://`,
//! `valkeys://`, `redis+unix://`, `valkey+unix://`, `unix://`, any case). A
//! comma or a space inside a password (`redis://:ab,cd@host`) therefore needs
//! no escaping and never splits the URL, so no half of a password is ever
//! taken for a URL and printed. A password holding a separator followed by a
//! scheme (`,redis://`) must be `%`-escaped. A cluster node
//! (`redis+cluster://h1:7000,h2:7000`, `cluster.rs`) is one node: the commas
//! between its hosts start no URL.

/// The schemes redis-rs reads, and a cluster node's.
const SCHEMES: [&str; 9] = [
    "redis+cluster://",
    "valkey+cluster://",
    "redis://",
    "rediss://",
    "valkey://",
    "valkeys://",
    "redis+unix://",
    "valkey+unix://",
    "unix://",
];

fn starts_url(s: &str) -> bool {
    SCHEMES.iter().any(|scheme| {
        s.get(..scheme.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(scheme))
    })
}

fn is_separator(c: char) -> bool {
    c == ',' || c.is_whitespace()
}

/// The URLs in `values` (each a `--nodes` value, or `REDLOCK_NODES`).
pub(crate) fn split(values: &[String]) -> Vec<String> {
    let mut urls = Vec::new();
    for value in values {
        let mut start = 0;
        for (i, c) in value.char_indices() {
            if i < start || !is_separator(c) {
                continue;
            }
            let next = value[i..].trim_start_matches(is_separator);
            if next.is_empty() || starts_url(next) {
                let url = value[start..i].trim_matches(is_separator);
                if !url.is_empty() {
                    urls.push(url.to_owned());
                }
                start = value.len() - next.len();
            }
        }
        let url = value[start..].trim_matches(is_separator);
        if !url.is_empty() {
            urls.push(url.to_owned());
        }
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Vec<String> {
        split(&[s.to_owned()])
    }

    #[test]
    fn splits_only_where_a_url_starts() {
        assert_eq!(
            one("redis://a:1,redis://b:2, rediss://c:3\nredis+unix:///r.sock?pass=x,y unix:///s"),
            [
                "redis://a:1",
                "redis://b:2",
                "rediss://c:3",
                "redis+unix:///r.sock?pass=x,y",
                "unix:///s"
            ]
        );
        // Commas and spaces in a password stay in it.
        assert_eq!(
            one("redis://:ab,cd@h:1,REDIS://u:e f,g@h:2 ,, "),
            ["redis://:ab,cd@h:1", "REDIS://u:e f,g@h:2"]
        );
        assert_eq!(
            split(&["redis://a:1".into(), "redis://b:2,valkey://c:3".into()]),
            ["redis://a:1", "redis://b:2", "valkey://c:3"]
        );
        assert!(one(" , ").is_empty());
        assert_eq!(one("h:1,redis://b:2"), ["h:1", "redis://b:2"]);
        assert_eq!(
            one("redis+cluster://:p,w@h1:1,h2:2 redis://c:3,valkey+cluster://h3:3,h4:4"),
            [
                "redis+cluster://:p,w@h1:1,h2:2",
                "redis://c:3",
                "valkey+cluster://h3:3,h4:4"
            ]
        );
    }
}
