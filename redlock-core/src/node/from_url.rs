//! A node from its URL: the pool, the label and the address (never the
//! password), with `TCP_NODELAY` and no timeouts of redis' own (every call is
//! bounded by the node timeout).

use deadpool_redis::{Pool, Runtime};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo};

use super::Node;
use crate::error::Error;
use crate::url::{redact_url, scrub_password, valid_host};

impl Node {
    /// Parses a node URL into a pool, its label and its address (no password kept).
    pub(crate) fn from_url(url: &str) -> Result<Node, Error> {
        let (url, acks) = super::split_url(url)?;
        let url = url.as_str();
        if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            return Err(invalid_url(
                url,
                "rediss:// needs the `tls` feature of redlock-core".into(),
            ));
        }
        if url.starts_with("rediss://") && url.split_once('#').is_some_and(|(_, f)| f == "insecure")
        {
            // redis-rs would accept the URL and fail every connect with "Cannot
            // create insecure client without tls-rustls-insecure feature": say
            // what to do instead, once, at build time.
            return Err(invalid_url(
                url,
                "`#insecure` (no certificate check) is not supported; to trust a \
                 private CA, give its PEM with `RedlockBuilder::tls_url(url, \
                 TlsCertificates { root_cert: Some(ca), client_tls: None })`, or \
                 set SSL_CERT_FILE=/path/to/ca.pem"
                    .into(),
            ));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| invalid_url(url, e.to_string()))?;
        let (label, address, pool) = pool_from_info(url, info.clone())?;
        let mut node = Node::new(label.into(), Some(address), pool).with_pubsub(info);
        node.replica_acks = acks;
        Ok(node)
    }
}

/// [`Error::InvalidUrl`] for `url`, with its password kept out of both fields.
pub(crate) fn invalid_url(url: &str, reason: String) -> Error {
    Error::InvalidUrl {
        url: redact_url(url),
        reason: scrub_password(url, reason),
    }
}

/// The label, the address and the pool of the node `url` (parsed into `info`).
pub(crate) fn pool_from_info(
    url: &str,
    info: redis::ConnectionInfo,
) -> Result<(String, String, Pool), Error> {
    let invalid = |reason: String| invalid_url(url, reason);
    let address = match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            if !valid_host(host) {
                return Err(invalid(format!(
                    "{host:?} is not a host name or IP address"
                )));
            }
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase();
            let host = if host == "localhost" {
                "127.0.0.1".to_owned()
            } else {
                host
            };
            format!("{host}:{port}")
        }
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        _ => redact_url(url),
    };
    #[cfg(feature = "tls")]
    if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        crate::node::ensure_crypto_provider();
    }
    let db = info.redis_settings().db();
    let label = if db == 0 {
        address.clone()
    } else {
        format!("{address}/{db}")
    };
    // Calls are small and pipelined on one connection: with Nagle's algorithm on
    // (redis' default), a command sent while an earlier one is unacknowledged
    // waits for the peer's delayed ACK, up to 40 ms on Linux.
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    let info = info.set_tcp_settings(tcp);
    // No response or connect timeout in the connection itself: every call is
    // bounded by `node_timeout`, which may be longer than redis' defaults.
    let manager = deadpool_redis::Manager::new_with_config(
        info,
        AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(None),
    )
    .map_err(|e| invalid(e.to_string()))?;
    let pool = Pool::builder(manager)
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    // Two databases of one server are one failure domain: compare the address only.
    Ok((label, address, pool))
}
