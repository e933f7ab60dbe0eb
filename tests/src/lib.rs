//! Real-Redis test harness: spawns `redis-server` processes on free loopback ports,
//! each in its own temp dir, and lets tests kill, restart, pause and poke them.
//!
//! Every process is killed when its [`RedisNode`] is dropped, which also happens
//! when a test panics. A missing `redis-server` fails the test with the install
//! command; it never skips.

#![deny(missing_docs)]

pub mod cluster;
pub mod history;
pub mod http;
pub mod http_timing;
pub mod monitor;
pub mod nemesis;
pub mod probe;
pub mod proxy;
pub mod redis_cluster;
pub mod replicas;
pub mod servers;
pub mod slow;
pub mod timing;
pub mod tls;
pub mod util;
pub mod workload;

pub use cluster::{Cluster, RedisNode, redis_server_binary};
pub(crate) use cluster::{read_line, write_command};
pub use redis_cluster::{RedisCluster, RedisClusters};
pub use tls::{TestCa, TlsRedisNode};

/// The README's Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
