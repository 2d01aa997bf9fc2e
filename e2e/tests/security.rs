//! Identity and authorization at the stream level, with the real principal: an agent may act
//! only on its own namespace; unmapped and foreign-trust-domain identities cannot open a stream.

use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::{AgentMode, Hello};
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::workload_api::DevCa;
use kube::api::PostParams;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const T: Duration = Duration::from_secs(20);

/// A hand-driven agent stream: sends hello, returns (sender, inbound stream, welcome).
async fn open_stream(
    source: &SvidSource,
    addr: std::net::SocketAddr,
    mode: AgentMode,
) -> Result<
    (
        mpsc::Sender<argocd_agent_proto::cloudevents::CloudEvent>,
        tonic::Streaming<argocd_agent_proto::cloudevents::CloudEvent>,
        Event,
    ),
    HarnessError,
> {
    let ((tx, inbound), welcome) = open_agent_stream(source, addr, mode).await?;
    Ok((tx, inbound, welcome))
}

/// The SVID source of one of the topology's Workload API sockets, ready.
async fn agent_svid(topo: &Topology, sock: &str) -> Result<SvidSource, HarnessError> {
    topo.svid_source(sock).await
}

/// Sends `event` and returns the error the principal answers it with (anything else fails).
async fn refusal(
    tx: &mpsc::Sender<argocd_agent_proto::cloudevents::CloudEvent>,
    inbound: &mut tonic::Streaming<argocd_agent_proto::cloudevents::CloudEvent>,
    event: &Event,
) -> Result<argocd_agent_proto::eventstream::ErrorDetail, HarnessError> {
    tx.send(event.to_cloud_event()).await?;
    let reply = answer_to(inbound, &event.id).await?;
    match reply.payload {
        Payload::Error(d) => Ok(d),
        _ => Err(format!(
            "{} {:?}: expected an error, got {}",
            event.ty, event.resource, reply.ty
        )
        .into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_cannot_touch_another_agents_applications() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        // Agent B (managed) owns "victim" in its hub namespace.
        let hub_b = apps(&topo.hub, MANAGED)?;
        hub_b.create(&PostParams::default(), &sample_app("victim", MANAGED, "guestbook")).await?;
        let before = stored_app(&topo.hub, MANAGED, "victim").ok_or("victim missing")?;

        // Agent A is the autonomous agent's identity.
        let source = SvidSource::workload_api(Some(topo.spiffe.endpoint(&topo.dir.join("autonomous.sock")))).await?;
        source.wait_ready(T).await?;
        let (tx, mut inbound, welcome) = open_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        let Payload::Welcome(w) = &welcome.payload else { return Err("no welcome".into()) };
        assert_eq!(w.agent_name, AUTONOMOUS);

        let victim = ResourceRef { kind: ResourceKind::Application, namespace: argocd_agent_domain::Namespace::new(MANAGED)?, name: "victim".into() };
        // Status for B's application.
        let status = Event::resource("test-client", EventType::StatusUpdate, victim.clone(),
            Payload::Object(std::sync::Arc::new(json!({"metadata": {"name": "victim"}, "status": {"health": {"status": "Degraded"}}}))));
        tx.send(status.to_cloud_event()).await?;
        let reply = answer_to(&mut inbound, &status.id).await?;
        let Payload::Error(d) = &reply.payload else { return Err(format!("expected error, got {}", reply.ty).into()) };
        assert_eq!(d.reason, "Forbidden");
        assert!(d.message.contains(AUTONOMOUS) && d.message.contains(MANAGED), "message names both: {}", d.message);

        // A create in B's namespace.
        let mut obj = serde_json::to_value(sample_app("planted", MANAGED, "guestbook"))?;
        obj["metadata"]["namespace"] = json!(MANAGED);
        let create = Event::resource("test-client", EventType::Create,
            ResourceRef { name: "planted".into(), ..victim.clone() }, Payload::Object(std::sync::Arc::new(obj)));
        tx.send(create.to_cloud_event()).await?;
        let reply = answer_to(&mut inbound, &create.id).await?;
        assert!(matches!(&reply.payload, Payload::Error(d) if d.reason == "Forbidden"), "create refused: {reply:?}");

        // A name that is not a DNS-1123 subdomain, and an Application sent as an
        // AppProject: refused at decode, answered with the refused event's id.
        let own_ns = argocd_agent_domain::Namespace::new(AUTONOMOUS)?;
        let traversal = Event::resource("test-client", EventType::Create,
            ResourceRef { kind: ResourceKind::Application, namespace: own_ns.clone(), name: "../victim".into() },
            Payload::Object(std::sync::Arc::new(json!({"metadata": {"name": "../victim"}, "spec": {}}))));
        let confused = Event::resource("test-client", EventType::Create,
            ResourceRef { kind: ResourceKind::AppProject, namespace: own_ns, name: "planted".into() },
            Payload::Object(std::sync::Arc::new(serde_json::to_value(sample_app("planted", AUTONOMOUS, "guestbook"))?)));
        for bad in [&traversal, &confused] {
            tx.send(bad.to_cloud_event()).await?;
            let reply = answer_to(&mut inbound, &bad.id).await?;
            assert!(matches!(&reply.payload, Payload::Error(d) if d.reason == "Malformed" && d.event_id == bad.id),
                "malformed event refused with its id: {reply:?}");
        }

        // B's objects are unchanged and nothing was planted.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = stored_app(&topo.hub, MANAGED, "victim").ok_or("victim vanished")?;
        assert_eq!(before["metadata"]["resourceVersion"], after["metadata"]["resourceVersion"]);
        assert!(after.get("status").is_none_or(|s| s.get("health").is_none()));
        assert!(stored_app(&topo.hub, MANAGED, "planted").is_none());
        // The refusal is logged with agent, object and reason.
        eventually("refusal logged", T, || async {
            topo.principal.log().lines().any(|l| l.contains("event refused") && l.contains("victim")).then_some(())
        }).await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_id_and_wrong_trust_domain_cannot_open_a_stream() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let tmp = tempfile::tempdir()?;
        let bundle = tmp.path().join("bundle.pem");
        std::fs::write(&bundle, topo.spiffe.ca().certificate_pem())?;

        // A valid SVID of the right trust domain whose ID matches no rule.
        let intruder = SpiffeId::parse("spiffe://example.org/ns/other/sa/intruder")?;
        let svid = topo
            .spiffe
            .ca()
            .issue_x509(&intruder, Duration::from_secs(600))?;
        let (cert, key) = (tmp.path().join("i.pem"), tmp.path().join("i.key"));
        std::fs::write(&cert, svid.chain_pem())?;
        std::fs::write(&key, svid.key_pem())?;
        let source = SvidSource::pem_files(
            cert,
            key,
            vec![(None, bundle.clone())],
            Duration::from_secs(60),
        )?;
        source.wait_ready(T).await?;
        match open_stream(&source, topo.principal_addr, AgentMode::Managed).await {
            Ok(_) => return Err("unmapped identity opened a stream".into()),
            Err(e) => {
                let s = e.to_string();
                assert!(
                    s.contains("PermissionDenied")
                        || s.contains("permission")
                        || s.contains("rule"),
                    "{s}"
                );
            }
        }

        // An SVID from another trust domain (its own CA), trusting the principal's bundle.
        let evil = DevCa::ephemeral(TrustDomain::new("evil.org")?)?;
        let foreign = SpiffeId::parse(&agent_id(MANAGED).replace("example.org", "evil.org"))?;
        let svid = evil.issue_x509(&foreign, Duration::from_secs(600))?;
        let (cert, key) = (tmp.path().join("e.pem"), tmp.path().join("e.key"));
        std::fs::write(&cert, svid.chain_pem())?;
        std::fs::write(&key, svid.key_pem())?;
        let ebundle = tmp.path().join("ebundle.pem");
        std::fs::write(&ebundle, evil.certificate_pem())?;
        let source = SvidSource::pem_files(
            cert,
            key,
            vec![
                (Some(TrustDomain::new("example.org")?), bundle),
                (Some(TrustDomain::new("evil.org")?), ebundle),
            ],
            Duration::from_secs(60),
        )?;
        source.wait_ready(T).await?;
        if open_stream(&source, topo.principal_addr, AgentMode::Managed)
            .await
            .is_ok()
        {
            return Err("foreign trust domain opened a stream".into());
        }
        // Refused at the TLS layer: the principal holds no bundle for evil.org.
        eventually(
            "foreign trust domain refused at the handshake",
            T,
            || async {
                topo.principal
                    .log()
                    .contains("TLS handshake failed")
                    .then_some(())
            },
        )
        .await?;
        // Both refusals are visible to the operator.
        eventually("unmapped refusal logged", T, || async {
            topo.principal.log().contains("intruder").then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_is_closed_when_rules_stop_mapping_its_identity() {
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_dir.path().join("rules.yaml");
    let mapping = r#"rules:
  - name: agents
    template: "spiffe://{trust_domain}/ns/agents/sa/{sa}"
    agent: "{sa}"
    namespace: "{sa}"
"#;
    std::fs::write(&rules, mapping).unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        rules_file: Some(rules.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        // The operator removes the agent's mapping: its live session is closed and it cannot
        // come back.
        let written = std::time::SystemTime::now();
        std::fs::write(
            &rules,
            "rules:\n  - name: only-edge\n    exact: \"spiffe://example.org/ns/agents/sa/edge-1\"\n    agent: edge-1\n",
        )?;
        let closed = eventually("revoked session closed", T, || async {
            logged_at(&topo.principal.log(), "identity no longer maps: closing session", written)
        })
        .await?;
        println!(
            "rule revocation: rules file write to session closed in {} ms",
            closed.duration_since(written).unwrap_or_default().as_millis()
        );
        eventually("reconnect refused", T, || async {
            topo.principal
                .log()
                .contains("stream refused: identity does not map to an agent")
                .then_some(())
        })
        .await?;
        // Mapping restored: the agent is admitted again.
        let before = topo.connect_count(MANAGED);
        std::fs::write(&rules, mapping)?;
        eventually("agent admitted again", Duration::from_secs(40), || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_style_header_regex_capturing_an_agent_name() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        principal_args: vec!["--auth".into(), "header:x-agent-name:^([^,]+)$".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let open = |name: &'static str| async move {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://{}", topo.principal_addr))?
                    .connect()
                    .await?;
            let mut client = EventStreamClient::new(channel);
            let hello = Event::new(
                "test",
                EventType::Hello,
                Payload::Hello(Hello {
                    mode: AgentMode::Managed as i32,
                    protocol_version: 1,
                    ..Default::default()
                }),
            );
            let (tx, rx) = mpsc::channel(4);
            tx.send(hello.to_cloud_event()).await?;
            let mut req = tonic::Request::new(ReceiverStream::new(rx));
            req.metadata_mut().insert("x-agent-name", name.parse()?);
            let mut inbound = client.subscribe(req).await?.into_inner();
            let first = inbound.message().await?.ok_or("closed")?;
            drop(tx);
            Ok::<Event, HarnessError>(Event::from_cloud_event(first)?)
        };
        let welcome = open(MANAGED).await?;
        let Payload::Welcome(w) = welcome.payload else {
            return Err("no welcome".into());
        };
        assert_eq!(
            (w.agent_name.as_str(), w.namespace.as_str()),
            (MANAGED, MANAGED)
        );
        // A capture that is not a valid agent name (not a DNS-1123 label) is refused.
        let err = open("Not_A_Label")
            .await
            .err()
            .ok_or("invalid agent name admitted")?;
        assert!(err.to_string().contains("not a valid agent name"), "{err}");
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_cannot_write_projects_repositories_or_gpg_keys_they_do_not_own() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        // An administrator's project on the hub whose name an autonomous agent could aim at.
        let claimed = format!("{AUTONOMOUS}-claimed");
        projects(&topo.hub, HUB_ARGOCD_NS)?
            .create(
                &PostParams::default(),
                &object(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": claimed, "namespace": HUB_ARGOCD_NS},
                "spec": {"sourceRepos": ["https://git.example/admin/*"]}})),
            )
            .await?;
        let before =
            stored_project(&topo.hub, HUB_ARGOCD_NS, &claimed).ok_or("admin project missing")?;
        let object_for = |name: &str| {
            Payload::Object(std::sync::Arc::new(json!({
                "metadata": {"name": name},
                "spec": {"sourceRepos": ["*"]},
                "data": {"url": "aHR0cHM6Ly9ldmls"}
            })))
        };
        let ns = |n: &str| argocd_agent_domain::Namespace::new(n).unwrap();

        // The managed agent may write no project, repository or GPG keys.
        let source = agent_svid(&topo, "managed.sock").await?;
        let (tx, mut inbound, _) =
            open_stream(&source, topo.principal_addr, AgentMode::Managed).await?;
        for (kind, ty, name) in [
            (ResourceKind::AppProject, EventType::SpecUpdate, "team"),
            (ResourceKind::AppProject, EventType::Delete, "team"),
            (ResourceKind::Repository, EventType::Create, "planted-repo"),
            (
                ResourceKind::GpgKeys,
                EventType::SpecUpdate,
                "argocd-gpg-keys-cm",
            ),
        ] {
            let e = Event::resource(
                "test-client",
                ty,
                ResourceRef::new(kind, ns(MANAGED), name),
                object_for(name),
            );
            let d = refusal(&tx, &mut inbound, &e).await?;
            assert_eq!(d.reason, "Forbidden", "{kind} {ty}: {}", d.message);
            assert!(
                d.message.contains(&kind.as_str().to_ascii_lowercase()),
                "denial names the kind: {}",
                d.message
            );
        }
        drop(tx);

        // The autonomous agent may not take over the admin's project, nor write in another
        // agent's namespace, nor write repositories.
        let source = agent_svid(&topo, "autonomous.sock").await?;
        let (tx, mut inbound, _) =
            open_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        for (kind, namespace, name, want) in [
            (
                ResourceKind::AppProject,
                AUTONOMOUS,
                "claimed",
                "created on the hub",
            ),
            (
                ResourceKind::AppProject,
                MANAGED,
                "elsewhere",
                "belongs to another agent",
            ),
            (
                ResourceKind::Repository,
                AUTONOMOUS,
                "planted-repo",
                "no agent may write them",
            ),
        ] {
            let e = Event::resource(
                "test-client",
                EventType::SpecUpdate,
                ResourceRef::new(kind, ns(namespace), name),
                object_for(name),
            );
            let d = refusal(&tx, &mut inbound, &e).await?;
            assert_eq!(d.reason, "Forbidden", "{kind}: {}", d.message);
            assert!(d.message.contains(want), "{kind}: {}", d.message);
        }

        // Nothing changed on the hub.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after =
            stored_project(&topo.hub, HUB_ARGOCD_NS, &claimed).ok_or("admin project vanished")?;
        assert_eq!(
            before["metadata"]["resourceVersion"],
            after["metadata"]["resourceVersion"]
        );
        assert!(
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-elsewhere")).is_none()
        );
        assert!(
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{MANAGED}-elsewhere")).is_none()
        );
        assert!(stored_secret(&topo.hub, HUB_ARGOCD_NS, "planted-repo").is_none());
        assert!(stored_secret(&topo.hub, MANAGED, "planted-repo").is_none());
        // Every refusal is counted per agent and reason.
        let metrics = http_get(topo.metrics_ports["principal"], "/metrics").await?;
        for (agent, reason) in [
            (MANAGED, "ModeForbids"),
            (AUTONOMOUS, "NotOwner"),
            (AUTONOMOUS, "WrongNamespace"),
        ] {
            let line = format!(
                "argocd_principal_events_refused_total{{agent=\"{agent}\",reason=\"{reason}\",tenant=\"\"}}"
            );
            let count: f64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&line))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("{line} missing:\n{metrics}"))?;
            assert!(count >= 1.0, "{line} = {count}");
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// Destination-based mapping with two managed agents: an Application in a shared hub
/// namespace goes to the agent its destination names (in the same namespace on that spoke),
/// moves as a delete and a create when the destination changes, and only the bound agent's
/// status is accepted (upstream accepts status from any agent here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_mapping_routes_by_destination_and_accepts_status_only_from_the_bound_agent() {
    let flag = || vec!["--destination-based-mapping".to_string()];
    let mut topo = Topology::start(TopologyOptions {
        principal_args: flag(),
        agent_args: [
            flag(),
            vec!["--allowed-namespaces".into(), "team-apps".into()],
        ]
        .concat(),
        second_agent_mode: Some("managed"),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        const SHARED: &str = "team-apps";
        for server in [&topo.hub, &topo.managed_spoke, &topo.autonomous_spoke] {
            create_namespace(server, SHARED).await?;
        }
        let (first, second) = (&topo.managed_spoke, &topo.autonomous_spoke);
        let hub = apps(&topo.hub, SHARED)?;
        let mut app = sample_app("guestbook", SHARED, "guestbook");
        app.data["spec"]["destination"] = json!({"name": MANAGED, "namespace": "guestbook"});
        hub.create(&PostParams::default(), &app).await?;
        eventually("application reaches the agent its destination names, same namespace", T, || async {
            stored_app(first, SHARED, "guestbook")
        })
        .await?;
        assert!(stored_app(second, SHARED, "guestbook").is_none());

        // Status from the bound agent lands on the hub.
        set_status(&apps(first, SHARED)?, "guestbook", json!({"health": {"status": "Healthy"}})).await?;
        eventually("bound agent's status reaches the hub", T, || async {
            stored_app(&topo.hub, SHARED, "guestbook").filter(|a| a["status"]["health"]["status"] == "Healthy")
        })
        .await?;

        // A status update from the other managed agent is refused and changes nothing.
        let second_agent = topo.autonomous.as_mut().ok_or("no second agent")?;
        second_agent.stop().await;
        let source = agent_svid(&topo, "autonomous.sock").await?;
        let (tx, mut inbound, _) = open_stream(&source, topo.principal_addr, AgentMode::Managed).await?;
        let forged = Event::resource(
            "test-client",
            EventType::StatusUpdate,
            ResourceRef::new(ResourceKind::Application, argocd_agent_domain::Namespace::new(SHARED)?, "guestbook"),
            Payload::Object(std::sync::Arc::new(json!({"metadata": {"name": "guestbook"}, "status": {"health": {"status": "Degraded"}}}))),
        );
        let d = refusal(&tx, &mut inbound, &forged).await?;
        assert_eq!(d.reason, "Forbidden");
        assert!(d.message.contains(&format!("its destination is agent \"{MANAGED}\"")), "{}", d.message);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(stored_app(&topo.hub, SHARED, "guestbook").unwrap()["status"]["health"]["status"], "Healthy");
        drop(tx);
        drop(inbound);
        let before = topo.connect_count(AUTONOMOUS);
        topo.autonomous.as_mut().ok_or("no second agent")?.start()?;
        eventually("second agent back", T, || async { (topo.connect_count(AUTONOMOUS) > before).then_some(()) }).await?;

        // After a principal restart the principal still knows where the application is.
        topo.principal.stop().await;
        let (m, a) = (topo.connect_count(MANAGED), topo.connect_count(AUTONOMOUS));
        topo.principal.start()?;
        eventually("both agents back after a principal restart", Duration::from_secs(40), || async {
            (topo.connect_count(MANAGED) > m && topo.connect_count(AUTONOMOUS) > a).then_some(())
        })
        .await?;

        // A destination change moves the application: deleted on the first, created on the second.
        merge_patch(&hub, "guestbook", json!({"spec": {"destination": {"name": AUTONOMOUS}}})).await?;
        eventually("application moved to the new destination's agent", T, || async {
            (stored_app(first, SHARED, "guestbook").is_none() && stored_app(second, SHARED, "guestbook").is_some())
                .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
