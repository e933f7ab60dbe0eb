//! The `RateLimit-Policy` and `RateLimit` fields of a `permits(n)` route's
//! busy answer, as draft-ietf-httpapi-ratelimit-headers-11 defines them, so
//! that clients and gateways that read them back off. Opt-in
//! (`rate_limit_fields`): the draft makes both fields optional, and warns
//! servers against telling untrusted parties about their capacity.
//!
//! A permits route limits the requests per key that run at once, so its
//! policy is a quota of `n` in the draft's `concurrent-requests` unit, with
//! no time window (`w`): it is not a rate. A busy answer found no permit
//! free: none is available (`r=0`) for the next `t` seconds, `t` being the
//! answer's `Retry-After` (the draft: `Retry-After` must not end before that
//! window, and wins over it).
//!
//! The policy's name is fixed. Nothing from the request reaches these fields:
//! the key is the client's choice (a path, a header), so the draft's `pk`
//! (partition key) parameter is left out.

/// The name of the policy, in both fields.
const POLICY: &str = "permits";

/// The draft's quota unit for a limit on requests at once.
const UNIT: &str = "concurrent-requests";

/// The `RateLimit-Policy` field's name, lower-case as HTTP/2 sends it.
pub(super) const POLICY_FIELD: &str = "ratelimit-policy";

/// The `RateLimit` field's name, lower-case as HTTP/2 sends it.
pub(super) const LIMIT_FIELD: &str = "ratelimit";

/// The `RateLimit-Policy` value of a route with `permits` permits per key:
/// one Structured Fields list item, a string with its parameters.
pub(super) fn policy(permits: u32) -> String {
    format!("\"{POLICY}\";q={permits};qu=\"{UNIT}\"")
}

/// The `RateLimit` value of a busy answer whose `Retry-After` is
/// `retry_after_secs`: no permit available for that long.
pub(super) fn limit(retry_after_secs: u64) -> String {
    format!("\"{POLICY}\";r=0;t={retry_after_secs}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_are_structured_field_items_in_the_concurrent_requests_unit() {
        assert_eq!(policy(2), r#""permits";q=2;qu="concurrent-requests""#);
        assert_eq!(limit(3), r#""permits";r=0;t=3"#);
    }
}
