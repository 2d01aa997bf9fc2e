//! Which TLS versions and cipher suites this process speaks, on every listener and dialer
//! it owns: TLS 1.3 only unless `--tls-min-version tls1.2` (or a cipher-suite list) says
//! otherwise. Upstream argocd-agent's principal defaults to TLS 1.3 too.
//!
//! The binaries read the settings once at start and [`TlsProfile::install`] them; every
//! rustls configuration of the process (gRPC, WebSocket, resource proxy, Redis proxy, the
//! agent's dialer) is built from [`TlsProfile::process`], as rustls' own process-wide
//! crypto provider is. A process that installs nothing speaks TLS 1.3 only.

use crate::text::quoted;
use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::{ConfigBuilder, SupportedCipherSuite, SupportedProtocolVersion, WantsVerifier};

/// A TLS version setting that is not one this process speaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// TLS 1.0 or 1.1.
    #[error(
        "{}: TLS 1.1 and older are not offered (only TLS 1.2 and 1.3 are \
         implemented); use tls1.2 to accept TLS 1.2 clients too, or leave it unset \
         for TLS 1.3 only",
        quoted(.0)
    )]
    TooOld(String),
    /// Not a TLS version at all.
    #[error("{}: not a TLS version (expected tls1.2 or tls1.3)", quoted(.0))]
    Unknown(String),
}

/// TLS settings that do not make a profile, or a second, different profile installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// `--tls-min-version` or `--tls-max-version` is not a version spoken here. The message
    /// carries the cause, so it is no `source`.
    #[error("--{flag} {cause}")]
    Version {
        /// The flag, without `--`.
        flag: &'static str,
        /// What is wrong with its value.
        cause: VersionError,
    },
    /// The minimum is above the maximum.
    #[error(
        "--tls-min-version {min}: the minimum TLS version cannot be higher than the \
         maximum (--tls-max-version {max})"
    )]
    MinAboveMax {
        /// The minimum asked for.
        min: TlsVersion,
        /// The maximum asked for (or the default).
        max: TlsVersion,
    },
    /// A suite ring does not offer.
    #[error(
        "--tls-ciphersuites: {} is not offered here (only AEAD suites with \
         ECDHE key exchange are): known suites are {known}",
        quoted(.name)
    )]
    UnknownSuite {
        /// The name as given.
        name: String,
        /// The suites that are offered, comma-separated.
        known: String,
    },
    /// A suite of a TLS version the profile does not speak.
    #[error(
        "--tls-ciphersuites: {} is a {version} suite, outside the TLS versions \
         allowed ({min} to {max})",
        quoted(.name)
    )]
    SuiteOutside {
        /// The name as given.
        name: String,
        /// The suite's version.
        version: TlsVersion,
        /// The profile's minimum.
        min: TlsVersion,
        /// The profile's maximum.
        max: TlsVersion,
    },
    /// [`TlsProfile::install`] was called before with another profile.
    #[error("a different TLS profile is already installed ({installed}); refusing {refused}")]
    AlreadyInstalled {
        /// The profile in force.
        installed: TlsProfile,
        /// The one refused.
        refused: TlsProfile,
    },
}

/// A TLS protocol version this process can speak (rustls implements 1.2 and 1.3 only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl TlsVersion {
    /// Parses upstream's spellings (`tls1.2`, `tls1.3`; also `1.2`, `TLSv1.3`, any case).
    /// `tls1.0` and `tls1.1` are refused: no TLS 1.1 or older is spoken here.
    pub fn parse(value: &str) -> Result<TlsVersion, VersionError> {
        let v = value.trim().to_ascii_lowercase();
        let number = v
            .strip_prefix("tlsv")
            .or_else(|| v.strip_prefix("tls"))
            .unwrap_or(&v);
        match number {
            "1.3" => Ok(TlsVersion::Tls13),
            "1.2" => Ok(TlsVersion::Tls12),
            "1.0" | "1.1" | "1" => Err(VersionError::TooOld(value.to_owned())),
            _ => Err(VersionError::Unknown(value.to_owned())),
        }
    }

    fn rustls(self) -> &'static SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }

    fn of(version: &'static SupportedProtocolVersion) -> TlsVersion {
        if version.version == rustls::ProtocolVersion::TLSv1_3 {
            TlsVersion::Tls13
        } else {
            TlsVersion::Tls12
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsVersion::Tls12 => "tls1.2",
            TlsVersion::Tls13 => "tls1.3",
        })
    }
}

/// TLS versions and cipher suites for every rustls configuration of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsProfile {
    min: TlsVersion,
    max: TlsVersion,
    /// Suites named by `--tls-ciphersuites` (empty: all of ring's for the versions).
    suites: Vec<rustls::CipherSuite>,
}

impl Default for TlsProfile {
    /// TLS 1.3 only, all of its suites.
    fn default() -> Self {
        TlsProfile {
            min: TlsVersion::Tls13,
            max: TlsVersion::Tls13,
            suites: Vec::new(),
        }
    }
}

static PROCESS: OnceLock<TlsProfile> = OnceLock::new();

impl TlsProfile {
    /// A profile from upstream's settings: `--tls-min-version` (default `tls1.3`),
    /// `--tls-max-version` (default `tls1.3`) and `--tls-ciphersuites` (IANA / Go names,
    /// e.g. `TLS_AES_128_GCM_SHA256`, `TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384`). A list
    /// naming only TLS 1.2 suites leaves TLS 1.3's suites alone (as Go's `crypto/tls` does),
    /// and the other way round.
    pub fn from_settings(
        min: Option<&str>,
        max: Option<&str>,
        suites: &[String],
    ) -> Result<TlsProfile, ProfileError> {
        let parse = |flag: &'static str, v: Option<&str>| {
            given(v)
                .map(TlsVersion::parse)
                .transpose()
                .map_err(|cause| ProfileError::Version { flag, cause })
        };
        let min = parse("tls-min-version", min)?;
        let max = parse("tls-max-version", max)?;
        let max = max.unwrap_or(TlsVersion::Tls13);
        let min = min.unwrap_or(TlsVersion::Tls13.min(max));
        if min > max {
            return Err(ProfileError::MinAboveMax { min, max });
        }
        let mut profile = TlsProfile {
            min,
            max,
            suites: Vec::new(),
        };
        for name in suites.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let suite = profile.named_suite(name)?;
            if !profile.suites.contains(&suite) {
                profile.suites.push(suite);
            }
        }
        Ok(profile)
    }

    /// The lowest version spoken.
    pub fn min(&self) -> TlsVersion {
        self.min
    }

    /// The highest version spoken.
    pub fn max(&self) -> TlsVersion {
        self.max
    }

    /// One of ring's suites by its IANA name, usable with the profile's versions.
    fn named_suite(&self, name: &str) -> Result<rustls::CipherSuite, ProfileError> {
        let found = rustls::crypto::ring::ALL_CIPHER_SUITES
            .iter()
            .find(|s| suite_names(s).iter().any(|n| n.eq_ignore_ascii_case(name)));
        let Some(suite) = found else {
            let known: Vec<String> = rustls::crypto::ring::ALL_CIPHER_SUITES
                .iter()
                .map(|s| suite_names(s)[0].clone())
                .collect();
            return Err(ProfileError::UnknownSuite {
                name: name.to_owned(),
                known: known.join(", "),
            });
        };
        let version = TlsVersion::of(suite.version());
        if version < self.min || version > self.max {
            return Err(ProfileError::SuiteOutside {
                name: name.to_owned(),
                version,
                min: self.min,
                max: self.max,
            });
        }
        Ok(suite.suite())
    }

    /// The rustls protocol versions, newest first.
    pub fn protocol_versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        [TlsVersion::Tls13, TlsVersion::Tls12]
            .into_iter()
            .filter(|v| (self.min..=self.max).contains(v))
            .map(TlsVersion::rustls)
            .collect()
    }

    /// The ring provider with only the suites this profile allows.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        let mut provider = rustls::crypto::ring::default_provider();
        let named = |v: TlsVersion| self.suites.iter().any(|s| suite_version(*s) == Some(v));
        provider.cipher_suites.retain(|s| {
            let v = TlsVersion::of(s.version());
            (self.min..=self.max).contains(&v) && (!named(v) || self.suites.contains(&s.suite()))
        });
        Arc::new(provider)
    }

    /// A server configuration builder with the profile's provider and versions.
    pub fn server_builder(
        &self,
    ) -> Result<ConfigBuilder<rustls::ServerConfig, WantsVerifier>, rustls::Error> {
        rustls::ServerConfig::builder_with_provider(self.provider())
            .with_protocol_versions(&self.protocol_versions())
    }

    /// A client configuration builder with the profile's provider and versions.
    pub fn client_builder(
        &self,
    ) -> Result<ConfigBuilder<rustls::ClientConfig, WantsVerifier>, rustls::Error> {
        rustls::ClientConfig::builder_with_provider(self.provider())
            .with_protocol_versions(&self.protocol_versions())
    }

    /// Makes `self` the profile of every configuration the process builds from now on.
    /// Installing twice is refused unless it is the same profile.
    pub fn install(self) -> Result<(), ProfileError> {
        let installed = PROCESS.get_or_init(|| self.clone());
        if *installed == self {
            Ok(())
        } else {
            Err(ProfileError::AlreadyInstalled {
                installed: installed.clone(),
                refused: self,
            })
        }
    }

    /// The installed profile, or the default (TLS 1.3 only).
    pub fn process() -> TlsProfile {
        PROCESS.get().cloned().unwrap_or_default()
    }
}

impl fmt::Display for TlsProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{} only", self.min)?;
        } else {
            write!(f, "{} to {}", self.min, self.max)?;
        }
        if !self.suites.is_empty() {
            let names: Vec<String> = self.suites.iter().map(|s| suite_name(*s)).collect();
            write!(f, ", suites {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// A setting's value, `None` when unset or empty (upstream's manifests leave keys empty).
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// A suite's names: the IANA one (which Go uses) first, then rustls' (`TLS13_...`).
fn suite_names(suite: &SupportedCipherSuite) -> Vec<String> {
    let rustls_name = suite_name(suite.suite());
    match rustls_name.strip_prefix("TLS13_") {
        Some(rest) => vec![format!("TLS_{rest}"), rustls_name],
        None => vec![rustls_name],
    }
}

/// rustls' name of a suite (`TLS13_AES_128_GCM_SHA256`), or its code point.
fn suite_name(suite: rustls::CipherSuite) -> String {
    suite
        .as_str()
        .map_or_else(|| format!("0x{:04x}", u16::from(suite)), str::to_owned)
}

fn suite_version(suite: rustls::CipherSuite) -> Option<TlsVersion> {
    rustls::crypto::ring::ALL_CIPHER_SUITES
        .iter()
        .find(|s| s.suite() == suite)
        .map(|s| TlsVersion::of(s.version()))
}

#[cfg(test)]
mod tests;
