use std::sync::Arc;

use rustls::{ClientConnection, ProtocolVersion, ServerConnection};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::*;

fn profile(min: Option<&str>, max: Option<&str>, suites: &[&str]) -> Result<TlsProfile, String> {
    let suites: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
    TlsProfile::from_settings(min, max, &suites).map_err(|e| e.to_string())
}

fn versions(p: &TlsProfile) -> Vec<ProtocolVersion> {
    p.protocol_versions().iter().map(|v| v.version).collect()
}

fn suites(p: &TlsProfile) -> Vec<String> {
    p.provider()
        .cipher_suites
        .iter()
        .map(|s| format!("{:?}", s.suite()))
        .collect()
}

#[test]
fn the_default_is_tls13_only_with_all_of_its_suites() {
    let p = TlsProfile::default();
    assert_eq!(versions(&p), [ProtocolVersion::TLSv1_3]);
    let names = suites(&p);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("TLS13_")), "{names:?}");
    assert_eq!(profile(None, None, &[]).unwrap(), p);
    assert_eq!(profile(Some(""), Some(" "), &[""]).unwrap(), p);
    assert_eq!(profile(Some("tls1.3"), None, &[]).unwrap(), p);
    assert_eq!(p.to_string(), "tls1.3 only");
}

#[test]
fn upstream_spellings_select_the_versions() {
    for v in ["tls1.2", "TLS1.2", "TLSv1.2", "1.2", " tls1.2 "] {
        let p = profile(Some(v), None, &[]).unwrap();
        assert_eq!(
            versions(&p),
            [ProtocolVersion::TLSv1_3, ProtocolVersion::TLSv1_2],
            "{v}"
        );
    }
    let p = profile(Some("tls1.2"), Some("tls1.2"), &[]).unwrap();
    assert_eq!(versions(&p), [ProtocolVersion::TLSv1_2]);
    assert!(suites(&p).iter().all(|n| n.starts_with("TLS_ECDHE_")));
    // A maximum of 1.2 alone lowers the minimum with it.
    let p = profile(None, Some("tls1.2"), &[]).unwrap();
    assert_eq!((p.min(), p.max()), (TlsVersion::Tls12, TlsVersion::Tls12));
}

#[test]
fn old_unknown_and_inverted_versions_are_refused_clearly() {
    for v in ["tls1.1", "tls1.0", "TLSv1.1"] {
        let e = profile(Some(v), None, &[]).unwrap_err();
        assert!(e.contains("TLS 1.1 and older are not offered"), "{e}");
        assert!(e.contains("tls1.2"), "{e}");
    }
    let e = profile(Some("ssl3"), None, &[]).unwrap_err();
    assert!(e.contains("not a TLS version"), "{e}");
    let e = profile(Some("tls1.3"), Some("tls1.2"), &[]).unwrap_err();
    assert!(e.contains("cannot be higher"), "{e}");
}

#[test]
fn a_suite_list_restricts_only_the_versions_it_names() {
    let p = profile(
        Some("tls1.2"),
        None,
        &["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"],
    )
    .unwrap();
    let names = suites(&p);
    assert!(names.contains(&"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".to_string()));
    assert_eq!(
        names.iter().filter(|n| n.starts_with("TLS_ECDHE_")).count(),
        1,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| n.starts_with("TLS13_")).count(),
        3,
        "{names:?}"
    );
    let p = profile(None, None, &["TLS_AES_256_GCM_SHA384"]).unwrap();
    assert_eq!(suites(&p), ["TLS13_AES_256_GCM_SHA384"]);
}

#[test]
fn suites_that_are_not_offered_or_not_allowed_are_refused() {
    let e = profile(Some("tls1.2"), None, &["TLS_RSA_WITH_AES_128_CBC_SHA"]).unwrap_err();
    assert!(e.contains("is not offered here"), "{e}");
    assert!(
        e.contains("TLS_AES_128_GCM_SHA256"),
        "lists known suites: {e}"
    );
    let e = profile(None, None, &["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]).unwrap_err();
    assert!(e.contains("outside the TLS versions allowed"), "{e}");
}

#[test]
fn installing_a_second_different_profile_is_refused() {
    // The only test in this binary that installs: the first install wins.
    let p = profile(Some("tls1.2"), None, &[]).unwrap();
    p.clone().install().unwrap();
    p.clone().install().expect("the same profile again is fine");
    assert_eq!(TlsProfile::process(), p);
    let e = TlsProfile::default().install().unwrap_err().to_string();
    assert!(e.contains("already installed"), "{e}");
}

/// A self-signed certificate for `localhost`.
fn cert() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = PrivateKeyDer::try_from(c.signing_key.serialize_der()).unwrap();
    (c.cert.der().clone(), key)
}

/// Runs a handshake in memory; the negotiated version, or the first error.
fn handshake(server: &TlsProfile, client: &TlsProfile) -> Result<ProtocolVersion, rustls::Error> {
    let (der, key) = cert();
    let server = server
        .server_builder()?
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let client = client
        .client_builder()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(Arc::new(client), name)?;
    let mut s = ServerConnection::new(Arc::new(server))?;
    for _ in 0..10 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        s.read_tls(&mut buf.as_slice()).unwrap();
        s.process_new_packets()?;
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        c.read_tls(&mut buf.as_slice()).unwrap();
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() {
            return Ok(c.protocol_version().expect("negotiated"));
        }
    }
    panic!("handshake did not finish");
}

#[test]
fn a_tls12_client_is_refused_by_the_default_and_served_with_tls12_allowed() {
    let tls12_client = profile(Some("tls1.2"), Some("tls1.2"), &[]).unwrap();
    let e = handshake(&TlsProfile::default(), &tls12_client).unwrap_err();
    assert!(
        matches!(
            e,
            rustls::Error::PeerIncompatible(_) | rustls::Error::AlertReceived(_)
        ),
        "{e:?}"
    );
    let tls12_server = profile(Some("tls1.2"), None, &[]).unwrap();
    assert_eq!(
        handshake(&tls12_server, &tls12_client).unwrap(),
        ProtocolVersion::TLSv1_2
    );
    assert_eq!(
        handshake(&tls12_server, &TlsProfile::default()).unwrap(),
        ProtocolVersion::TLSv1_3
    );
    assert_eq!(
        handshake(&TlsProfile::default(), &TlsProfile::default()).unwrap(),
        ProtocolVersion::TLSv1_3
    );
}
