//! Onboarding with the shipped `argocd-agentctl`: `agent create --apply` writes an agent's
//! hub namespace and mapping rule into the hub's API server; checked with kubectl (an
//! independent client), the principal then admits a real agent with that name and SVID (the
//! rules file is the ConfigMap's content, copied as the kubelet would) and the agent syncs an
//! Application; `agent delete` removes rule, cluster Secret and namespace, after which the
//! principal refuses the agent. `validate` is run on good and bad flags, rules and SVID files.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn agentctl(args: &[&str]) -> Output {
    let bin = binary("argocd-agentctl").expect("argocd-agentctl built");
    std::process::Command::new(bin)
        .args(args)
        .env_remove("SPIFFE_ENDPOINT_SOCKET")
        .output()
        .expect("running argocd-agentctl")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// kubectl against the hub, JSON output parsed; None when kubectl fails (e.g. NotFound).
async fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = run_kubectl(kubeconfig, &all).await;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("kubectl prints JSON"))
}

async fn rules_text(kubeconfig: &Path) -> String {
    let cm = kubectl_json(
        kubeconfig,
        &[
            "get",
            "configmap",
            "argocd-agent-identity-rules",
            "-n",
            "argocd",
        ],
    )
    .await
    .expect("the rules ConfigMap exists");
    cm["data"]["rules.yaml"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The agent process as the topology starts its agents.
fn agent_proc(topo: &Topology) -> Proc {
    let dir = &topo.dir;
    let args: Vec<String> = [
        "agent",
        "--agent-mode",
        "managed",
        "--server-address",
        "127.0.0.1",
        "--server-port",
        &topo.principal_addr.port().to_string(),
        "--principal-spiffe-id",
        "spiffe://example.org/ns/argocd/sa/argocd-agent-principal",
        "--spiffe-endpoint-socket",
        &topo.spiffe.endpoint(&dir.join("managed.sock")),
        "--kubeconfig",
        &dir.join("managed.kubeconfig").display().to_string(),
        "--namespace",
        SPOKE_NS,
        "--metrics-port",
        "0",
        "--keep-alive-ping-interval",
        "5s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Proc::new(
        MANAGED,
        binary("argocd-agent").unwrap(),
        args,
        dir.join(format!("{MANAGED}.log")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_create_apply_admits_a_real_agent_and_delete_removes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let rules_file = tmp.path().join("rules.yaml");
    std::fs::write(&rules_file, "rules: []\n").unwrap();
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let mut topo = Topology::start(TopologyOptions {
        dir: Some(tmp.path().to_path_buf()),
        rules_file: Some(rules_file.clone()),
        agents: Some(vec![]),
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = scenario(&mut topo, &rules_file).await;
    topo.finish(r).await;
}

async fn scenario(topo: &mut Topology, rules_file: &Path) -> Result<(), HarnessError> {
    let hub_kc = topo.dir.join("hub.kubeconfig");
    let kc = hub_kc.display().to_string();
    let id = agent_id(MANAGED);
    // The principal's rules ConfigMap as deploy/principal ships it, with one other rule.
    let cm = object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "argocd-agent-identity-rules", "namespace": "argocd"},
        "data": {"rules.yaml": "rules:\n  - name: other\n    exact: spiffe://example.org/other\n    agent: other\n"},
    }));
    configmaps(&topo.hub, "argocd")?
        .create(&PostParams::default(), &cm)
        .await?;

    // Refusals write nothing: a bad name, and a namespace another agent owns.
    let out = agentctl(&[
        "agent",
        "create",
        "Bad_Name",
        "--trust-domain",
        "example.org",
        "--apply",
        "--kubeconfig",
        &kc,
    ]);
    let (_, err) = text(&out);
    assert!(
        !out.status.success() && err.contains("agent name:") && err.contains("DNS-1123"),
        "{err}"
    );
    let o = run_kubectl(&hub_kc, &["create", "namespace", "taken"]).await;
    assert!(o.status.success(), "{}", output_text(&o));
    let o = run_kubectl(
        &hub_kc,
        &[
            "label",
            "namespace",
            "taken",
            "argocd-agent.argoproj-labs.io/agent-name=someone",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", output_text(&o));
    let out = agentctl(&[
        "agent",
        "create",
        "edge-9",
        "--trust-domain",
        "example.org",
        "--hub-namespace",
        "taken",
        "--apply",
        "--kubeconfig",
        &kc,
    ]);
    let (_, err) = text(&out);
    assert!(
        !out.status.success() && err.contains("namespace taken belongs to agent \"someone\""),
        "{err}"
    );
    assert!(
        !rules_text(&hub_kc).await.contains("edge-9"),
        "a refused create wrote a rule"
    );

    // Create, twice: the second run changes nothing.
    let overlay = topo.dir.join("overlay");
    let deploy = workspace_root().join("deploy").display().to_string();
    let create = [
        "agent",
        "create",
        MANAGED,
        "--spiffe-id",
        &id,
        "--identity",
        "spire",
        "--apply",
        "--kubeconfig",
        &kc,
        "--output-dir",
        &overlay.display().to_string(),
        "--deploy-dir",
        &deploy,
        "--principal-address",
        "agents.hub.example.com",
    ];
    let out = agentctl(&create);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert!(
        stdout.contains(&format!(
            "namespace {MANAGED}: existed without an agent label; labelled"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "rule agent-{MANAGED}: written to ConfigMap argocd/argocd-agent-identity-rules"
        )),
        "{stdout}"
    );
    let out = agentctl(&create);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert!(
        stdout.contains("exists, labelled") && stdout.contains("unchanged"),
        "{stdout}"
    );

    // What kubectl sees.
    let ns = kubectl_json(&hub_kc, &["get", "namespace", MANAGED])
        .await
        .expect("namespace");
    assert_eq!(
        ns["metadata"]["labels"]["argocd-agent.argoproj-labs.io/agent-name"],
        MANAGED
    );
    let rules = rules_text(&hub_kc).await;
    assert!(
        rules.contains(&format!("exact: {id}")) && rules.contains("name: other"),
        "{rules}"
    );
    // The overlay renders with the same kustomize users run, on top of deploy/.
    let o = std::process::Command::new(kubectl())
        .arg("kustomize")
        .arg(&overlay)
        .output()?;
    let rendered = output_text(&o);
    assert!(o.status.success(), "{rendered}");
    assert!(rendered.contains("kind: ClusterSPIFFEID"), "{rendered}");
    assert!(
        rendered.contains(&format!(
            "spiffeIDTemplate: spiffe://{{{{ .TrustDomain }}}}/ns/agents/sa/{MANAGED}"
        )),
        "{rendered}"
    );
    assert!(
        rendered.contains("agent.server.address: agents.hub.example.com"),
        "{rendered}"
    );
    assert!(rendered.contains("name: argocd-agent-agent"), "{rendered}");

    // The kubelet's part: the mounted file follows the ConfigMap. validate agrees first.
    std::fs::write(rules_file, &rules)?;
    let out = agentctl(&[
        "validate",
        "agent",
        "--rules",
        &rules_file.display().to_string(),
        "--spiffe-id",
        &id,
        "--",
        "--server-address",
        "127.0.0.1",
        "--principal-spiffe-id",
        "spiffe://example.org/ns/argocd/sa/argocd-agent-principal",
        // The agent refuses to start without an SVID source (not read offline).
        "--spiffe-endpoint-socket",
        "unix:///run/spire/agent.sock",
    ]);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert!(stdout.contains(&format!("OK    rules: {id} is agent \"{MANAGED}\" in hub namespace \"{MANAGED}\", mode managed allowed (rule \"agent-{MANAGED}\")")), "{stdout}");

    // A real agent with that SVID connects and syncs an Application.
    let mut p = agent_proc(topo);
    p.start()?;
    topo.managed = Some(p);
    topo.wait_connected(MANAGED, T).await?;
    apps(&topo.hub, MANAGED)?
        .create(
            &PostParams::default(),
            &sample_app("guestbook", MANAGED, "guestbook"),
        )
        .await?;
    eventually("the Application reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
    })
    .await?;
    eventually(
        "the principal registers the agent's cluster Secret",
        T,
        || async { stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{MANAGED}")) },
    )
    .await?;

    // Decommission: stop the agent, delete on the hub, twice.
    if let Some(mut p) = topo.managed.take() {
        p.stop().await;
    }
    let delete = [
        "agent",
        "delete",
        MANAGED,
        "--delete-namespace",
        "--kubeconfig",
        &kc,
    ];
    let out = agentctl(&delete);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert!(
        stdout.contains(&format!("rule agent-{MANAGED}: removed")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("cluster Secret argocd/cluster-{MANAGED}: deleted")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("namespace {MANAGED}: deleted")),
        "{stdout}"
    );
    assert!(
        err.contains("WARNING") && err.contains("guestbook"),
        "{err}"
    );
    let out = agentctl(&delete);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert_eq!(stdout.matches("already absent").count(), 3, "{stdout}");
    assert!(
        kubectl_json(&hub_kc, &["get", "namespace", MANAGED])
            .await
            .is_none(),
        "namespace left"
    );
    assert!(
        kubectl_json(
            &hub_kc,
            &[
                "get",
                "secret",
                &format!("cluster-{MANAGED}"),
                "-n",
                "argocd"
            ]
        )
        .await
        .is_none(),
        "secret left"
    );
    let rules = rules_text(&hub_kc).await;
    assert!(
        !rules.contains(MANAGED) && rules.contains("name: other"),
        "{rules}"
    );

    // With the rule gone from the mounted file, the principal refuses the agent.
    std::fs::write(rules_file, &rules)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut p = agent_proc(topo);
    p.start()?;
    topo.managed = Some(p);
    eventually("the principal refuses the deleted agent", T, || async {
        let log = topo.principal.log();
        log.lines()
            .any(|l| {
                l.contains("stream refused") && l.contains(&id) && l.contains("no rule matched")
            })
            .then_some(())
    })
    .await?;
    Ok(())
}

/// A CA, and SVIDs it signs: (ca, [(name, cert, key)]).
fn svids(dir: &Path) -> PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "onboarding test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_ca_cert_der(ca.der(), ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let leaf = |name: &str, id: &str, expired: bool| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names
            .push(SanType::URI(id.try_into().unwrap()));
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 1, 2);
        }
        let cert = p.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    };
    leaf("good", "spiffe://example.org/agent/edge-1", false);
    leaf("expired", "spiffe://example.org/agent/edge-1", true);
    leaf("foreign", "spiffe://other.org/agent/edge-1", false);
    dir.to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_explains_good_and_bad_inputs_with_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = svids(tmp.path());
    let f = |n: &str| d.join(n).display().to_string();
    let agent = |cert: &str, key: &str| {
        agentctl(&[
            "validate",
            "agent",
            "--trust-domain",
            "example.org",
            "--",
            "--server-address",
            "hub.example.com",
            "--principal-spiffe-id",
            "spiffe://example.org/ns/argocd/sa/argocd-agent-principal",
            "--tls-cert",
            &f(cert),
            "--tls-key",
            &f(key),
            "--root-ca",
            &f("ca.pem"),
        ])
    };
    let out = agent("good.pem", "good.key");
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    for want in [
        "OK    flags: accepted by argocd-agent",
        "is spiffe://example.org/agent/edge-1",
        "OK    svid: trust domain example.org as expected",
        "OK    svid: valid until",
        "matches the certificate",
        "OK    bundle: verifies the SVID (example.org)",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in\n{stdout}");
    }
    assert!(
        !stdout.contains("ERROR") && !stdout.contains("WARN"),
        "{stdout}"
    );

    let out = agent("expired.pem", "expired.key");
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{err}");
    assert!(
        stdout.contains("ERROR svid: expired at 2020-01-02"),
        "{stdout}"
    );
    assert!(
        err.contains("error: 2 errors"),
        "expired leaf and a failed chain check: {stdout}{err}"
    );

    let out = agent("foreign.pem", "foreign.key");
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("ERROR svid: trust domain other.org, expected example.org"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "ERROR bundle: the peer's trust domain example.org is not the SVID's (other.org)"
        ),
        "{stdout}"
    );

    let out = agent("good.pem", "foreign.key");
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("ERROR svid: {}:", f("foreign.key")))
            && stdout.contains("does not match"),
        "{stdout}"
    );

    let out = agentctl(&[
        "validate",
        "agent",
        "--",
        "--server-address",
        "x",
        "--bogus",
    ]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(
        stdout.trim(),
        "ERROR flags: unexpected argument '--bogus' found"
    );

    let out = agentctl(&[
        "validate",
        "principal",
        "--",
        "--identity-rule",
        "template:spiffe://example.org/x/{a}=>{b}",
    ]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("ERROR rules:") && stdout.contains("{b}"),
        "{stdout}"
    );

    // The shipped manifests, as kustomize renders them, pass.
    let o = std::process::Command::new(kubectl())
        .arg("kustomize")
        .arg(workspace_root().join("deploy/overlays/spire/principal"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    let manifests = d.join("principal.yaml");
    std::fs::write(&manifests, &o.stdout).unwrap();
    let out = agentctl(&[
        "validate",
        "principal",
        "-f",
        &manifests.display().to_string(),
    ]);
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{stdout}{err}");
    assert!(
        stdout.contains("OK    rules:") && stdout.contains("loads (2 rules)"),
        "{stdout}"
    );
}
