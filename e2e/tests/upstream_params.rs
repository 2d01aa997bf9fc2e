//! Upstream argocd-agent's own example `argocd-agent-params` ConfigMaps, turned into
//! environment variables the way upstream's Deployments do (one `configMapKeyRef` per key),
//! given to our binaries (docs/migration.md, "Configuration").
//!
//! As upstream ships them, both are refused at start, each with exactly one message: the
//! principal's subject-based `principal.auth` and the agent's `userpass` `agent.creds`;
//! every other key is accepted (or warned about). With those two keys changed as the doc
//! says, the principal and an agent start from the ConfigMaps and the agent connects.
//!
//! Fixtures: `fixtures/upstream/*.yaml`, copied from upstream's `install/kubernetes/` (the
//! commit is named in each file).

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upstream");

fn yaml(file: &str) -> Value {
    let path = format!("{FIXTURES}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The environment upstream's Deployment gives its container from the params ConfigMap:
/// every `configMapKeyRef` to `argocd-agent-params` whose key the ConfigMap has (the refs
/// are `optional: true` upstream). Secret refs (`REDIS_PASSWORD`) are left out: there is
/// no Secret here.
fn upstream_env(deployment: &str, configmap: &str) -> BTreeMap<String, String> {
    let deploy = yaml(deployment);
    let data = yaml(configmap)["data"].clone();
    let env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap_or_else(|| panic!("{deployment}: no env"))
        .clone();
    let mut out = BTreeMap::new();
    for e in env {
        let r = &e["valueFrom"]["configMapKeyRef"];
        if r["name"] != "argocd-agent-params" {
            continue;
        }
        let key = r["key"].as_str().unwrap();
        if let Some(v) = data[key].as_str() {
            out.insert(e["name"].as_str().unwrap().to_string(), v.to_string());
        }
    }
    assert!(out.len() > 20, "{deployment}: only {} variables", out.len());
    out
}

fn principal_env() -> BTreeMap<String, String> {
    upstream_env("principal-deployment.yaml", "principal-params-cm.yaml")
}

fn agent_env() -> BTreeMap<String, String> {
    upstream_env("agent-deployment.yaml", "agent-params-cm.yaml")
}

/// Runs `argocd-agent <role>` with only `env` (nothing inherited) and returns its exit code
/// and standard error.
async fn run(role: &str, env: &BTreeMap<String, String>) -> (Option<i32>, String) {
    let mut cmd = tokio::process::Command::new(binary("argocd-agent").unwrap());
    cmd.arg(role).env_clear().envs(env).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("a refused configuration ends the process at once")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn error_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("error:")).collect()
}

#[tokio::test]
async fn upstreams_example_configmaps_as_shipped_are_refused_with_one_reason_each() {
    let env = principal_env();
    assert_eq!(env["ARGOCD_PRINCIPAL_AUTH"], "mtls:CN=([^,]+)");
    let (code, stderr) = run("principal", &env).await;
    assert_eq!(code, Some(1), "{stderr}");
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 1, "only principal.auth is refused: {stderr}");
    assert!(
        errors[0]
            .starts_with("error: --auth mtls:CN=([^,]+): agents are identified by the SPIFFE ID")
            && errors[0].contains("--auth mtls:uri:<regex>")
            && errors[0].contains("docs/migration.md"),
        "{stderr}"
    );

    let env = agent_env();
    assert_eq!(
        env["ARGOCD_AGENT_CREDS"],
        "userpass:/app/config/creds/userpass.creds"
    );
    let (code, stderr) = run("agent", &env).await;
    assert_eq!(code, Some(1), "{stderr}");
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 1, "only agent.creds is refused: {stderr}");
    assert!(
        errors[0].starts_with("error: --creds userpass:/app/config/creds/userpass.creds: there are no agent passwords here")
            && errors[0].contains("--creds spiffe"),
        "{stderr}"
    );
}

#[tokio::test]
async fn features_we_lack_are_refused_by_their_upstream_names_never_ignored() {
    let mut env = principal_env();
    env.insert(
        "ARGOCD_PRINCIPAL_AUTH".into(),
        "mtls:uri:spiffe://example.org/ns/agents/sa/(.+)".into(),
    );
    // Settings an upstream user may have changed from the example: each is named.
    env.insert(
        "ARGOCD_PRINCIPAL_TLS_SECRET_NAME".into(),
        "my-principal-tls".into(),
    );
    env.insert(
        "ARGOCD_PRINCIPAL_JWT_KEY_PATH".into(),
        "/app/config/jwt/jwt.key".into(),
    );
    env.insert("ARGOCD_PRINCIPAL_PPROF_PORT".into(), "6060".into());
    env.insert("ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED".into(), "true".into());
    env.insert("ARGOCD_PRINCIPAL_REDIS_CA_PATH".into(), "".into());
    let (code, stderr) = run("principal", &env).await;
    assert_eq!(code, Some(1), "{stderr}");
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 4, "{stderr}");
    for needle in [
        "ARGOCD_PRINCIPAL_TLS_SECRET_NAME (params key principal.tls.secret-name)=my-principal-tls: TLS comes from SPIFFE X.509-SVIDs",
        "ARGOCD_PRINCIPAL_JWT_KEY_PATH (params key principal.jwt.key-path)=/app/config/jwt/jwt.key: the principal issues no tokens",
        "ARGOCD_PRINCIPAL_PPROF_PORT (params key principal.pprof.port)=6060: no pprof endpoint",
        "redis TLS on without --redis-ca-path",
    ] {
        assert!(
            errors.iter().any(|l| l.contains(needle)),
            "{needle}\n{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_configmaps_with_the_two_documented_changes_start_and_connect() {
    let mut envs = principal_env();
    // The two changes docs/migration.md names: agents are SPIFFE IDs, and have no passwords.
    let auth = r"mtls:uri:spiffe://example\.org/ns/agents/sa/(agent-[a-z-]+)";
    envs.insert("ARGOCD_PRINCIPAL_AUTH".into(), auth.into());
    let agent = agent_env();
    envs.extend(agent);
    envs.insert("ARGOCD_AGENT_CREDS".into(), "mtls:any".into());

    let dir = tempfile::tempdir().unwrap();
    // No rule but the one in principal.auth: the agent is mapped by the ConfigMap's rule.
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "rules: []\n").unwrap();
    let rp_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        rules_file: Some(rules),
        envs: envs.into_iter().collect(),
        // The harness's own listen, metrics, SVID and kubeconfig flags stand in for the pod;
        // these ports are fixed in the ConfigMaps, and tests run side by side.
        principal_args: vec![
            "--healthz-port".into(),
            "0".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{rp_port}"),
        ],
        agent_args: vec!["--healthz-port".into(), "0".into()],
        // Upstream's mtls credentials (what the agent's creds flag is given the same as its
        // environment, since the harness always passes --creds).
        agent_creds: Some("mtls:any".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let log = topo.principal.log();
        // Read from the environment: the resource proxy (principal.resource-proxy.enable)
        // and the warnings about Secrets that are not read.
        for needle in [
            "upstream setting: ARGOCD_PRINCIPAL_TLS_SECRET_NAME (params key principal.tls.secret-name)=argocd-agent-principal-tls: upstream's default, not used here",
            "upstream setting: ARGOCD_PRINCIPAL_JWT_SECRET_NAME",
            // principal.tls.min-version: "tls1.3" is honoured (and is our default).
            "TLS versions tls=tls1.3 only",
        ] {
            assert!(log.contains(needle), "{needle}\n{log}");
        }
        eventually("the resource proxy listens", Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", rp_port))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .unwrap();
        let agent_log = topo.managed.as_ref().unwrap().log();
        assert!(
            agent_log.contains("upstream setting: ARGOCD_AGENT_TLS_SECRET_NAME (params key agent.tls.secret-name)=argocd-agent-client-tls"),
            "{agent_log}"
        );
        assert!(!log.contains(" ERROR "), "{log}");
    }
    .await;
    topo.stop().await;
    r
}
