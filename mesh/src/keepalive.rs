//! Keepalive and heartbeat settings that keep a long-lived gRPC stream alive through mesh
//! and proxy idle timeouts.
//!
//! The event stream can be quiet for hours. Proxies on the path close quiet things:
//! Envoy's HTTP connection manager ends a stream after `stream_idle_timeout` (default
//! 5 min) without frames on it, its TCP proxy after `idle_timeout` (1 h), Istio's
//! `connectionPool.http.idleTimeout` closes idle upstream connections (1 h), cloud load
//! balancers drop idle TCP flows after ~4-6 min. HTTP/2 PINGs are answered hop by hop by a
//! proxy and never reach the other end, so they keep only the first hop alive and detect a
//! dead sidecar; only application messages on the stream (heartbeats) reset a proxy's
//! per-stream idle timer. Hence: heartbeats well under the shortest stream idle timeout
//! (30 s against Envoy's 5 min) and HTTP/2 keepalive to notice dead connections quickly.

use std::time::Duration;

/// Timers for the agent's connection to the principal (and the principal's server side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveSettings {
    /// Interval of HTTP/2 PINGs on an idle connection.
    pub http2_keepalive_interval: Duration,
    /// How long to wait for a PING acknowledgement before declaring the connection dead.
    pub http2_keepalive_timeout: Duration,
    /// Interval of application-level heartbeat events on the stream.
    pub heartbeat_interval: Duration,
    /// First reconnect delay after a dropped connection.
    pub reconnect_backoff_initial: Duration,
    /// Largest reconnect delay.
    pub reconnect_backoff_max: Duration,
}

impl KeepaliveSettings {
    /// Direct mTLS to the principal (no mesh). Only NAT and load-balancer idle timers
    /// (about 4 min at the shortest common cloud default) matter.
    pub fn for_direct() -> Self {
        KeepaliveSettings {
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(60),
            reconnect_backoff_initial: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(60),
        }
    }

    /// Through Envoy: heartbeat every 30 s, a tenth of the default 5 min
    /// `stream_idle_timeout`, so that even several lost heartbeats do not end the stream.
    /// Reconnects start fast because a proxy restart (config push) drops every stream at
    /// once and the sidecar is local.
    pub fn for_envoy() -> Self {
        KeepaliveSettings {
            http2_keepalive_interval: Duration::from_secs(20),
            http2_keepalive_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(30),
            reconnect_backoff_initial: Duration::from_millis(500),
            reconnect_backoff_max: Duration::from_secs(30),
        }
    }

    /// Through Istio sidecars: Istio's data plane is Envoy with the same defaults
    /// (5 min stream idle, 1 h connection idle), so the same timers.
    pub fn for_istio() -> Self {
        Self::for_envoy()
    }

    /// Through Linkerd proxies: Linkerd keeps meshed HTTP/2 connections open and answers
    /// PINGs itself, but load balancers and NAT between clusters still see one TCP flow
    /// that must not go quiet, and the proxies may restart on upgrade; heartbeats every
    /// 30 s and quick reconnects cover both.
    pub fn for_linkerd() -> Self {
        KeepaliveSettings {
            http2_keepalive_interval: Duration::from_secs(20),
            http2_keepalive_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(30),
            reconnect_backoff_initial: Duration::from_millis(500),
            reconnect_backoff_max: Duration::from_secs(30),
        }
    }

    /// Whether the heartbeat fires at least three times within `idle_timeout`, so that a
    /// stream survives two lost heartbeats. Use to check user-provided values against a
    /// proxy's configured idle timeout.
    pub fn survives_idle_timeout(&self, idle_timeout: Duration) -> bool {
        !self.heartbeat_interval.is_zero() && self.heartbeat_interval * 3 <= idle_timeout
    }
}

impl Default for KeepaliveSettings {
    fn default() -> Self {
        Self::for_direct()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_presets_survive_default_proxy_idle_timeouts() {
        let envoy_stream_idle = Duration::from_secs(300);
        for k in [
            KeepaliveSettings::for_envoy(),
            KeepaliveSettings::for_istio(),
            KeepaliveSettings::for_linkerd(),
            KeepaliveSettings::for_direct(),
        ] {
            assert!(k.survives_idle_timeout(envoy_stream_idle), "{k:?}");
            assert!(k.http2_keepalive_timeout < k.http2_keepalive_interval);
            assert!(k.reconnect_backoff_initial < k.reconnect_backoff_max);
        }
        assert!(!KeepaliveSettings::for_envoy().survives_idle_timeout(Duration::from_secs(60)));
    }
}
