//! The operator CLI against a running principal: `argocd-agentctl agent list / inspect /
//! disconnect` through the principal's admin API (`--admin-address`).

use std::process::Output;
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

async fn ctl(admin: &str, args: &[&str]) -> Result<Output, HarnessError> {
    let out = tokio::process::Command::new(binary("argocd-agentctl")?)
        .arg("agent")
        .args(args)
        .args(["--principal-admin-address", admin])
        .output()
        .await?;
    Ok(out)
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn list_json(admin: &str) -> Result<Vec<Value>, HarnessError> {
    let out = ctl(admin, &["list", "-o", "json"]).await?;
    if !out.status.success() {
        return Err(format!("agent list failed: {}", text(&out)).into());
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

fn find<'a>(agents: &'a [Value], name: &str) -> Option<&'a Value> {
    agents.iter().find(|a| a["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentctl_lists_inspects_and_disconnects_agents() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let admin = format!("127.0.0.1:{port}");
    let topo = Topology::start(TopologyOptions {
        principal_args: vec!["--admin-address".into(), admin.clone()],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(topo.admin_address, admin);
    let r = async {
        // 1. JSON: both agents, their SPIFFE IDs, the rule, the mode, connected.
        let agents = eventually("both agents listed as connected", T, || async {
            let agents = list_json(&admin).await.ok()?;
            [MANAGED, AUTONOMOUS]
                .iter()
                .all(|n| find(&agents, n).is_some_and(|a| a["connected"] == true))
                .then_some(agents)
        })
        .await?;
        for (name, mode) in [(MANAGED, "managed"), (AUTONOMOUS, "autonomous")] {
            let a = find(&agents, name).unwrap();
            let expect = [
                ("client", Value::from(agent_id(name))),
                ("rule", "flag-1".into()),
                ("mode", mode.into()),
                ("namespace", name.into()),
                ("connected", true.into()),
            ];
            for (field, want) in expect {
                if a[field] != want {
                    return Err(format!("{name}.{field}: want {want}, got {a}").into());
                }
            }
            for field in [
                "connectedSince",
                "remoteAddress",
                "agentVersion",
                "lastEvent",
                "svidExpiry",
            ] {
                if a.get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(format!("{name}: {field} missing in {a}").into());
                }
            }
        }

        // 2. Table: a header and both names.
        let out = ctl(&admin, &["list"]).await?;
        let table = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success()
            || !table
                .lines()
                .next()
                .is_some_and(|h| h.starts_with("NAME") && h.contains("MODE"))
            || !table.contains(MANAGED)
            || !table.contains(AUTONOMOUS)
        {
            return Err(format!("table output: {}", text(&out)).into());
        }

        // 3. YAML and inspect.
        let out = ctl(&admin, &["inspect", MANAGED, "-o", "yaml"]).await?;
        let yaml = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success()
            || !yaml.contains(&agent_id(MANAGED))
            || !yaml.contains("mode: managed")
        {
            return Err(format!("inspect -o yaml: {}", text(&out)).into());
        }

        // 4. Disconnect: the session closes and the agent reconnects.
        let before = topo.connect_count(MANAGED);
        let out = ctl(&admin, &["disconnect", MANAGED]).await?;
        if !out.status.success() || !String::from_utf8_lossy(&out.stdout).contains("session closed")
        {
            return Err(format!("disconnect: {}", text(&out)).into());
        }
        eventually(
            "the principal logs the operator's disconnect",
            T,
            || async {
                topo.principal
                    .log()
                    .contains("session closed by an operator")
                    .then_some(())
            },
        )
        .await?;
        eventually("agent-managed reconnects", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        eventually("agent-managed listed as connected again", T, || async {
            let agents = list_json(&admin).await.ok()?;
            find(&agents, MANAGED)
                .is_some_and(|a| a["connected"] == true)
                .then_some(())
        })
        .await?;

        // 5. An unknown agent: non-zero exit, a clear message.
        let out = ctl(&admin, &["inspect", "nope"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("\"nope\" is unknown to this principal") {
            return Err(format!("inspect nope: {}", text(&out)).into());
        }

        // 6. No principal at the address: non-zero exit naming the address.
        let out = ctl("127.0.0.1:1", &["list"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || !stderr.contains("cannot reach the principal's admin API at 127.0.0.1:1")
        {
            return Err(format!("list against nothing: {}", text(&out)).into());
        }
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_on_a_unix_socket() {
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("admin.sock");
    let admin = format!("unix://{}", sock.display());
    let topo = Topology::start(TopologyOptions {
        principal_args: vec!["--admin-address".into(), admin.clone()],
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock)?.permissions());
        if mode & 0o077 != 0 {
            return Err(format!("admin socket is mode {mode:o}; want owner only").into());
        }
        eventually("agent-managed listed over the Unix socket", T, || async {
            let agents = list_json(&admin).await.ok()?;
            find(&agents, MANAGED)
                .is_some_and(|a| a["connected"] == true && a["client"] == agent_id(MANAGED))
                .then_some(())
        })
        .await?;
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

/// `argocd-agentctl agent ...` against the principal's agent listener over mTLS, with the
/// SVID of the workload behind `socket` (a file in the topology directory).
async fn ctl_mtls(topo: &Topology, socket: &str, args: &[&str]) -> Result<Output, HarnessError> {
    let endpoint = topo.spiffe.endpoint(&topo.dir.join(socket));
    let out = tokio::process::Command::new(binary("argocd-agentctl")?)
        .arg("agent")
        .args(args)
        .args([
            "--principal-address",
            &topo.principal_addr.to_string(),
            "--spiffe-endpoint-socket",
            &endpoint,
            "--principal-spiffe-id",
            PRINCIPAL_ID,
        ])
        .output()
        .await?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_over_mtls_is_for_spiffe_ids_with_an_admin_rule() {
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![
            "--identity-rule".into(),
            format!("admin:{OPERATOR_ID},name=operators"),
        ],
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        // 1. The operator's SVID: agents listed, over the agent listener.
        eventually("the operator lists agent-managed over mTLS", T, || async {
            let out = ctl_mtls(&topo, "operator.sock", &["list", "-o", "json"])
                .await
                .ok()?;
            let agents: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
            find(&agents, MANAGED)
                .is_some_and(|a| a["connected"] == true && a["client"] == agent_id(MANAGED))
                .then_some(())
        })
        .await?;

        // 2. An agent's SVID is no operator: refused, naming the rule it matched.
        let out = ctl_mtls(&topo, "managed.sock", &["list"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || !stderr.contains("PermissionDenied")
            || !stderr.contains("role: admin")
            || !stderr.contains("agent rule \"flag-1\"")
        {
            return Err(format!("agent SVID against the admin API: {}", text(&out)).into());
        }
        let out = ctl_mtls(&topo, "managed.sock", &["disconnect", AUTONOMOUS]).await?;
        if out.status.success() {
            return Err(format!("agent SVID disconnected someone: {}", text(&out)).into());
        }
        eventually("the refusal is logged and counted", T, || async {
            let metrics = http_get(topo.metrics_ports["principal"], "/metrics")
                .await
                .ok()?;
            (topo.principal.log().contains("admin call refused")
                && metrics.contains("argocd_principal_auth_failures_total{reason=\"NotAdmin\"} 2"))
            .then_some(())
        })
        .await?;

        // 3. The operator disconnects the agent; it reconnects; the log names the operator.
        let before = topo.connect_count(MANAGED);
        let out = ctl_mtls(&topo, "operator.sock", &["disconnect", MANAGED]).await?;
        if !out.status.success() {
            return Err(format!("operator disconnect: {}", text(&out)).into());
        }
        eventually("agent-managed reconnects", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        if !topo
            .principal
            .log()
            .lines()
            .any(|l| l.contains("session closed by an operator") && l.contains(OPERATOR_ID))
        {
            return Err("the disconnect log line does not name the operator".into());
        }

        // 4. Without pinning the principal the CLI refuses to dial.
        let out = tokio::process::Command::new(binary("argocd-agentctl")?)
            .args(["agent", "list", "--principal-address"])
            .arg(topo.principal_addr.to_string())
            .output()
            .await?;
        if out.status.success()
            || !String::from_utf8_lossy(&out.stderr).contains("--principal-spiffe-id")
        {
            return Err(format!("unpinned dial: {}", text(&out)).into());
        }
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}
