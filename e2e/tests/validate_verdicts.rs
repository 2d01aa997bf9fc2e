//! `argocd-agentctl validate` and `argocd-agent` agree: on the same inputs (every kustomization
//! under `deploy/`, every Helm chart profile, and command lines the binary refuses), `validate`
//! reports an argument error exactly when the binary refuses to start at argument checking,
//! with the binary's own message.
//!
//! The binary's verdict: it refuses at argument checking when it exits with a usage error
//! (clap, status 2) or with an `error:` line before starting; it gets past argument checking
//! when it is still running after 3 s or fails at the start stage, on the SVID source or the
//! Kubernetes API (`error: SVID source`, `error: kubernetes`: the test gives it a kubeconfig
//! that does not exist and no SPIRE). `validate`'s verdict: an `ERROR flags:`, `ERROR
//! configuration:` or `ERROR upstream setting:` line is a refusal at argument checking (its
//! other checks, of SVID files and rules, look further than the binary's argument checks).
//! With manifests, validate reads their environment and none of its own process.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bin(name: &str) -> PathBuf {
    argocd_agent_testkit::harness::binary(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// What a program concluded about a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// Past argument checking.
    Accepted,
    /// Refused at argument checking, with the message (whitespace collapsed).
    Refused(String),
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs `argocd-agent <role> <args>` with exactly `env` and a missing kubeconfig.
fn binary_verdict(role: &str, args: &[String], env: &BTreeMap<String, String>) -> Verdict {
    let tmp = tempfile::tempdir().expect("temp dir");
    let stderr_path = tmp.path().join("stderr");
    let mut cmd = Command::new(bin("argocd-agent"));
    cmd.arg(role)
        .args(args)
        .arg(format!(
            "--kubeconfig={}",
            tmp.path().join("missing").display()
        ))
        .env_clear()
        .envs(env)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    let mut child = cmd.spawn().expect("spawning argocd-agent");
    let deadline = Instant::now() + Duration::from_secs(3);
    let status = loop {
        match child.try_wait().expect("waiting for argocd-agent") {
            Some(s) => break Some(s),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let Some(status) = status else {
        return Verdict::Accepted;
    };
    if status.code() == Some(2) {
        let usage = stderr.split("Usage:").next().unwrap_or_default();
        return Verdict::Refused(collapse(usage.trim_start_matches("error:")));
    }
    let errors: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("error: "))
        .collect();
    if errors
        .iter()
        .any(|e| e.starts_with("SVID source") || e.starts_with("kubernetes"))
    {
        return Verdict::Accepted;
    }
    assert!(
        !errors.is_empty(),
        "argocd-agent {role} exited with {status} without an error line: {stderr}"
    );
    Verdict::Refused(collapse(&errors.join(" ")))
}

/// Runs `argocd-agentctl validate <role> <args>` with exactly `env`.
fn validate_verdict(role: &str, args: &[String], env: &BTreeMap<String, String>) -> Verdict {
    let out = Command::new(bin("argocd-agentctl"))
        .args(["validate", role])
        .args(args)
        .env_clear()
        .envs(env)
        .output()
        .expect("running argocd-agentctl validate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let refusals: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ERROR "))
        .map(str::trim)
        .filter_map(|l| {
            ["flags: ", "configuration: ", "upstream setting: "]
                .iter()
                .find_map(|p| l.strip_prefix(p))
        })
        .map(collapse)
        .collect();
    if refusals.is_empty() {
        Verdict::Accepted
    } else {
        Verdict::Refused(refusals.join(" "))
    }
}

/// Both verdicts agree: both accept, or both refuse and validate's message is the binary's.
fn agree(case: &str, binary: &Verdict, validate: &Verdict) -> Result<(), String> {
    match (binary, validate) {
        (Verdict::Accepted, Verdict::Accepted) => Ok(()),
        (Verdict::Refused(b), Verdict::Refused(v)) if b == v => Ok(()),
        _ => Err(format!("{case}: binary {binary:?}, validate {validate:?}")),
    }
}

/// The Deployment's command line and environment as the kubelet would give them (the test's
/// own reading, not validate's): args with `$(VAR)` expanded, values and optional
/// `configMapKeyRef`s, the pod IP as 127.0.0.1; the rules file written to `tmp`.
fn deployment_command_line(
    objects: &[Value],
    role: &str,
    tmp: &Path,
) -> (Vec<String>, BTreeMap<String, String>) {
    let container = objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .map(|o| &o["spec"]["template"]["spec"]["containers"][0])
        .find(|c| c["args"][0] == role)
        .unwrap_or_else(|| panic!("no {role} Deployment"));
    let configmap = |name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
    };
    let mut env = BTreeMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            Some(v.to_owned())
        } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
            configmap(r["name"].as_str().unwrap_or_default())
                .and_then(|cm| cm["data"][r["key"].as_str().unwrap_or_default()].as_str())
                .map(str::to_owned)
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" {
            Some("127.0.0.1".to_owned())
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            Some("pod-0".to_owned())
        } else {
            None
        };
        if let Some(v) = value {
            env.insert(name, v);
        }
    }
    let mut args = Vec::new();
    for a in container["args"].as_array().into_iter().flatten().skip(1) {
        let mut a = a.as_str().expect("string arg").to_owned();
        for (k, v) in &env {
            a = a.replace(&format!("$({k})"), v);
        }
        if a.starts_with("--identity-rules=") {
            let rules = configmap("argocd-agent-identity-rules").expect("rules ConfigMap");
            let file = tmp.join("rules.yaml");
            std::fs::write(
                &file,
                rules["data"]["rules.yaml"].as_str().unwrap_or_default(),
            )
            .expect("writing rules");
            a = format!("--identity-rules={}", file.display());
        }
        args.push(a);
    }
    (args, env)
}

/// Renders of every kustomization under deploy/ (file, role).
fn kustomize_renders(tmp: &Path) -> Vec<(String, PathBuf, &'static str)> {
    let mut out = Vec::new();
    let dirs = [
        "principal",
        "agent",
        "overlays/spire/principal",
        "overlays/spire/agent",
        "overlays/pem-files/principal",
        "overlays/pem-files/agent",
        "overlays/istio/principal",
        "overlays/istio/agent",
        "overlays/linkerd/principal",
        "overlays/linkerd/agent",
        "examples/gateway-api/principal",
    ];
    for (i, dir) in dirs.iter().enumerate() {
        let rendered = Command::new(argocd_agent_testkit::harness::kubectl())
            .arg("kustomize")
            .arg(workspace_root().join("deploy").join(dir))
            .output()
            .expect("running kubectl kustomize");
        assert!(
            rendered.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        let file = tmp.join(format!("kustomize-{i}.yaml"));
        std::fs::write(&file, &rendered.stdout).expect("writing the render");
        let role = if dir.ends_with("principal") {
            "principal"
        } else {
            "agent"
        };
        out.push((format!("deploy/{dir}"), file, role));
    }
    out
}

/// Renders of every chart profile (empty, with a message, when helm is not installed and
/// this is not CI; helm_charts.rs has the same rule).
fn chart_renders(tmp: &Path) -> Vec<(String, PathBuf, &'static str)> {
    let helm = std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools/bin/helm"));
    if Command::new(&helm).arg("version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "helm not found at {} and CI=true: .ci/run installs it",
            helm.display()
        );
        eprintln!("chart profiles SKIPPED: helm is not installed (run .ci/run once)");
        return Vec::new();
    }
    let mut out = Vec::new();
    for (chart, role) in [
        ("argocd-agent-principal", "principal"),
        ("argocd-agent-agent", "agent"),
    ] {
        let dir = workspace_root().join("deploy/helm").join(chart);
        let mut profiles = vec![None];
        for entry in std::fs::read_dir(dir.join("profiles")).expect("profiles directory") {
            profiles.push(Some(entry.expect("profile").path()));
        }
        for profile in profiles {
            let mut cmd = Command::new(&helm);
            cmd.args(["template", "argocd-agent"])
                .arg(&dir)
                .args(["--namespace", "argocd"]);
            if let Some(p) = &profile {
                cmd.arg("-f").arg(p);
            }
            let rendered = cmd.output().expect("running helm template");
            assert!(
                rendered.status.success(),
                "helm template {chart} {profile:?}: {}",
                String::from_utf8_lossy(&rendered.stderr)
            );
            let name = profile
                .as_deref()
                .and_then(Path::file_stem)
                .map_or("default".into(), |s| s.to_string_lossy().into_owned());
            let file = tmp.join(format!("{chart}-{name}.yaml"));
            std::fs::write(&file, &rendered.stdout).expect("writing the render");
            out.push((format!("{chart} ({name})"), file, role));
        }
    }
    out
}

/// How validate and the binary disagree on the Deployment of one render, and whether the
/// binary refuses the shipped settings.
fn render_disagreements(case: &str, file: &Path, role: &str) -> Vec<String> {
    let tmp = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(file).expect("reading the render");
    let objects: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
        .expect("rendered YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect();
    let (args, env) = deployment_command_line(&objects, role, tmp.path());
    let binary = binary_verdict(role, &args, &env);
    let manifests = vec![
        "--manifests".to_owned(),
        file.to_string_lossy().into_owned(),
    ];
    let validate = validate_verdict(role, &manifests, &BTreeMap::new());
    let mut out: Vec<String> = agree(case, &binary, &validate).err().into_iter().collect();
    if binary != Verdict::Accepted {
        out.push(format!(
            "{case}: the binary refuses the shipped settings: {binary:?}"
        ));
    }
    out
}

#[test]
fn validate_and_the_binary_agree_on_every_deploy_overlay_and_chart_profile() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut cases = kustomize_renders(tmp.path());
    cases.extend(chart_renders(tmp.path()));
    // In parallel: a Workload API setup waits out the 3 s deadline.
    let mut disagreements: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(case, file, role)| s.spawn(move || render_disagreements(case, file, role)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a case panicked (see above)"))
            .collect()
    });
    // A kustomization directory is rendered by validate itself.
    let dir = workspace_root().join("deploy/overlays/istio/principal");
    let validate = validate_verdict(
        "principal",
        &["--manifests".into(), dir.to_string_lossy().into_owned()],
        &BTreeMap::new(),
    );
    if validate != Verdict::Accepted {
        disagreements.push(format!(
            "validate --manifests {}: {validate:?}",
            dir.display()
        ));
    }
    assert!(cases.len() >= 11, "only {} cases", cases.len());
    assert!(
        disagreements.is_empty(),
        "validate and the binary disagree:\n{}",
        disagreements.join("\n")
    );
}

/// A command line: a name, the role, flags, environment, and whether the binary starts.
type Case = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    bool,
);

/// A Workload API socket that does not exist (the binary then waits for it: past argument checking).
const SOCKET: (&str, &str) = (
    "SPIFFE_ENDPOINT_SOCKET",
    "unix:///nonexistent/spire-agent.sock",
);
/// The agent's pin of the principal.
const PIN: &str = "--principal-spiffe-id=spiffe://example.org/ns/argocd/sa/argocd-agent-principal";
/// Command lines of the reports, and booleans given `=false`.
const CASES: [Case; 10] = [
    ("--ha=false", "principal", &["--ha=false"], &[SOCKET], true),
    (
        "--disable-resource-proxy=false",
        "agent",
        &[
            "--server-address=hub.example.org",
            PIN,
            "--disable-resource-proxy=false",
        ],
        &[SOCKET],
        true,
    ),
    (
        "agent without a principal pin",
        "agent",
        &["--server-address=hub.example.org"],
        &[SOCKET],
        false,
    ),
    (
        "agent without a Workload API socket",
        "agent",
        &["--server-address=hub.example.org", PIN],
        &[],
        false,
    ),
    (
        "principal without a Workload API socket",
        "principal",
        &[],
        &[],
        false,
    ),
    (
        "agent without --server-address",
        "agent",
        &[PIN],
        &[SOCKET],
        false,
    ),
    (
        "unknown flag",
        "principal",
        &["--no-such-flag"],
        &[SOCKET],
        false,
    ),
    (
        "agent pinned, socket from the environment",
        "agent",
        &["--server-address=hub.example.org", PIN],
        &[SOCKET],
        true,
    ),
    (
        "principal behind Istio, listen host from flag and environment",
        "principal",
        &[
            "--auth=header:istio",
            "--listen-host=127.0.0.1",
            "--listen-port=0",
            "--metrics-port=0",
            "--redis-proxy-address=127.0.0.1:0",
            "--admin-address=off",
        ],
        &[("ARGOCD_PRINCIPAL_LISTEN_HOST", "0.0.0.0")],
        true,
    ),
    (
        "upstream subject mapping",
        "principal",
        &["--auth=mtls:CN=([^,]+)"],
        &[SOCKET],
        false,
    ),
];

#[test]
fn validate_and_the_binary_agree_on_command_lines_the_binary_refuses() {
    let mut disagreements = Vec::new();
    for (case, role, args, env, starts) in CASES {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let binary = binary_verdict(role, &args, &env);
        let mut validate_args = vec!["--".to_owned()];
        validate_args.extend(args.iter().cloned());
        let validate = validate_verdict(role, &validate_args, &env);
        if let Err(e) = agree(case, &binary, &validate) {
            disagreements.push(e);
        }
        if (binary == Verdict::Accepted) != starts {
            disagreements.push(format!(
                "{case}: expected the binary to {}: {binary:?}",
                if starts { "start" } else { "refuse" }
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "validate and the binary disagree:\n{}",
        disagreements.join("\n")
    );
}

/// With manifests, `validate` reads the Deployment's environment only: a variable of its own
/// process (here the Workload API socket the manifests lack) does not hide what the pod
/// would lack.
#[test]
fn validate_reads_the_manifests_environment_not_its_own() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (_, file, _) = kustomize_renders(tmp.path())
        .into_iter()
        .find(|(case, _, _)| case == "deploy/overlays/spire/agent")
        .expect("the SPIRE agent overlay");
    let text = std::fs::read_to_string(&file).expect("reading the render");
    let mut objects: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
        .expect("rendered YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect();
    for o in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
        let env = o["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .expect("env");
        env.retain(|e| e["name"] != "SPIFFE_ENDPOINT_SOCKET");
    }
    let stripped = tmp.path().join("without-socket.json");
    // One JSON document per object (JSON is YAML), as a multi-document stream.
    let docs: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
    std::fs::write(&stripped, docs.join("\n---\n")).expect("writing the manifests");
    let own_env = BTreeMap::from([(
        "SPIFFE_ENDPOINT_SOCKET".to_owned(),
        "unix:///run/spire/agent.sock".to_owned(),
    )]);
    let manifests = [
        "--manifests".to_owned(),
        stripped.to_string_lossy().into_owned(),
    ];
    let validate = validate_verdict("agent", &manifests, &own_env);
    let (args, env) = deployment_command_line(&objects, "agent", tmp.path());
    let binary = binary_verdict("agent", &args, &env);
    assert!(
        matches!(&binary, Verdict::Refused(m) if m.starts_with("no SVID source")),
        "{binary:?}"
    );
    agree("SPIRE agent without its socket", &binary, &validate).unwrap_or_else(|e| panic!("{e}"));
}
