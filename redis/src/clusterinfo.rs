//! Argo CD's cluster info in Redis: the key argocd-server reads for a cluster's connection
//! state and cache counts, and the value's encoding (JSON, gzip when Argo CD's Redis
//! compression is on, as it is by default).

use argocd_agent_domain::quoted;
use std::io::{Read, Write};

/// Argo CD's cache version, appended to every cache key.
pub const CACHE_VERSION: &str = "1.8.3";
/// The server URL of the cluster Argo CD runs in.
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";
/// Largest decompressed value read.
const MAX_DECODED: u64 = 16 * 1024 * 1024;

/// Argo CD's Redis compression (`redis.compression` in argocd-cmd-params-cm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Values gzip-compressed, keys ending in `.gz` (Argo CD's default).
    #[default]
    Gzip,
    /// Plain JSON values, keys without a suffix.
    None,
}

/// A compression name other than `gzip` or `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{q0}: expected gzip or none", q0 = quoted(.0))]
pub struct UnknownCompression(pub String);

impl std::str::FromStr for Compression {
    type Err = UnknownCompression;
    fn from_str(s: &str) -> Result<Self, UnknownCompression> {
        match s {
            "gzip" => Ok(Compression::Gzip),
            "none" => Ok(Compression::None),
            _ => Err(UnknownCompression(s.to_owned())),
        }
    }
}

/// The cluster info key of the cluster with API server URL `server`.
pub fn key(server: &str, compression: Compression) -> String {
    let gz = if compression == Compression::Gzip {
        ".gz"
    } else {
        ""
    };
    format!("cluster|info|{server}|{CACHE_VERSION}{gz}")
}

/// A value as Argo CD stores it: JSON and a newline, gzipped when compression is on.
pub fn encode(value: &serde_json::Value, compression: Compression) -> Vec<u8> {
    let mut json = serde_json::to_vec(value).unwrap_or_default();
    json.push(b'\n');
    match compression {
        Compression::None => json,
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            // Writing into a Vec cannot fail.
            let _ = enc.write_all(&json);
            enc.finish().unwrap_or_default()
        }
    }
}

/// Decodes a value Argo CD stored; `None` if it is not what it should be.
pub fn decode(bytes: &[u8], compression: Compression) -> Option<serde_json::Value> {
    match compression {
        Compression::None => serde_json::from_slice(bytes).ok(),
        Compression::Gzip => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(bytes)
                .take(MAX_DECODED)
                .read_to_end(&mut out)
                .ok()?;
            serde_json::from_slice(&out).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_match_argo_cd() {
        assert_eq!(
            key("https://x:9090?agentName=a", Compression::Gzip),
            "cluster|info|https://x:9090?agentName=a|1.8.3.gz"
        );
        assert_eq!(
            key(IN_CLUSTER, Compression::None),
            "cluster|info|https://kubernetes.default.svc|1.8.3"
        );
        let v = serde_json::json!({"applicationsCount": 3});
        for c in [Compression::Gzip, Compression::None] {
            let bytes = encode(&v, c);
            assert_eq!(decode(&bytes, c), Some(v.clone()));
        }
        assert_eq!(&encode(&v, Compression::Gzip)[..2], b"\x1f\x8b");
        assert_eq!(decode(b"not gzip", Compression::Gzip), None);
    }
}
