//! What the principal's Redis proxy and the agent's Redis client share: Argo CD's
//! per-application cache keys ([`key`]), RESP2/RESP3 frames read with explicit limits
//! ([`resp`], on the `redis-protocol` crate), and a small Redis connection with optional
//! TLS and AUTH ([`client`]).
#![deny(missing_docs)]

pub mod client;
pub mod clusterinfo;
pub mod key;
pub mod resp;

pub use client::{RedisConn, RedisEndpoint, RedisTls, TlsFileError};
pub use key::{AppKey, AppKeyKind};
pub use resp::{Decoder, Frame, FrameReader, Protocol, RespError};

/// Capability an agent announces in its hello when it answers Redis requests.
pub const CAPABILITY: &str = "redis.v1";
