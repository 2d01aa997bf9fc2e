//! Bad input from an agent, end to end with the real principal: a flood of events from one
//! agent identity is refused early by its rate limit (and does not slow another agent), a
//! real agent's rate-limited changes still arrive, deletes of names the hub does not have
//! are answered `NotFound`, and hub-authored Applications are never deleted by an agent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use argocd_agent_domain::Namespace;
use argocd_agent_domain::{Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(30);
/// Rate limit the flood test runs the principal with (events/s, burst).
const RATE: u32 = 10;
const BURST: u32 = 50;
/// Events the flooding identity sends at least.
const FLOOD: usize = 5_000;

fn refused_series(agent: &str, reason: &str) -> String {
    format!(
        "argocd_principal_events_refused_total{{agent=\"{agent}\",reason=\"{reason}\",tenant=\"\"}}"
    )
}

fn own_app(name: &str) -> ResourceRef {
    ResourceRef {
        kind: ResourceKind::Application,
        namespace: Namespace::new(AUTONOMOUS).expect("valid namespace"),
        name: name.into(),
    }
}

/// A create of Application `name` in the autonomous agent's hub namespace.
fn create_event(name: &str) -> Event {
    let mut obj = serde_json::to_value(sample_app(name, AUTONOMOUS, "guestbook"))
        .expect("sample app serializes");
    obj["metadata"]["namespace"] = json!(AUTONOMOUS);
    Event::resource(
        "test-client",
        EventType::Create,
        own_app(name),
        Payload::Object(Arc::new(obj)),
    )
}

/// What the principal answered one event with: `processed`, or an error's reason.
fn answer_kind(e: &Event) -> String {
    match (&e.ty, &e.payload) {
        (EventType::Processed, _) => "processed".into(),
        (EventType::Error, Payload::Error(d)) => d.reason.clone(),
        (ty, _) => format!("unexpected {ty}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_from_one_agent_is_refused_early_and_does_not_slow_another_agent() {
    let topo = Topology::start(TopologyOptions {
        // The managed agent is a real process; the autonomous identity floods by hand.
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--agent-event-rate".into(),
            RATE.to_string(),
            "--agent-event-burst".into(),
            BURST.to_string(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(MANAGED, T).await?;
        let principal_metrics = topo.metrics_ports["principal"];
        // The managed agent's Application, on its spoke.
        let hub_managed = apps(&topo.hub, MANAGED)?;
        hub_managed
            .create(
                &PostParams::default(),
                &sample_app("steady", MANAGED, "guestbook"),
            )
            .await?;
        let spoke_managed = apps(&topo.managed_spoke, SPOKE_NS)?;
        eventually("managed app reaches the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "steady")
        })
        .await?;
        let hub_before: HashSet<String> = topo
            .hub
            .list_objects("argoproj.io", "v1alpha1", "applications", Some(AUTONOMOUS))
            .iter()
            .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_owned))
            .collect();

        let source = topo.svid_source("autonomous.sock").await?;
        let ((tx, mut inbound), welcome) =
            open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        assert_eq!(welcome.ty, EventType::Welcome);

        // The flood: creates of distinct names as fast as the stream takes them, until the
        // other agent's edit went through (and at least FLOOD events).
        let stop = Arc::new(AtomicBool::new(false));
        let (sent_tx, mut sent_rx) = mpsc::unbounded_channel::<(String, String)>();
        let flooder = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                while n < FLOOD || !stop.load(Ordering::Relaxed) {
                    let e = create_event(&format!("flood-{n}"));
                    let _ = sent_tx.send((e.id.clone(), format!("flood-{n}")));
                    if tx.send(e.to_cloud_event()).await.is_err() {
                        break;
                    }
                    n += 1;
                }
                (n, tx)
            })
        };
        let started = Instant::now();
        // Answers, by event id, read as they come.
        let (answers_tx, mut answers_rx) = mpsc::unbounded_channel::<(String, String, Instant)>();
        let reader = tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                let Ok(e) = Event::from_cloud_event(msg) else {
                    continue;
                };
                let Some(id) = e.ack_id.clone() else { continue };
                if let Payload::Error(d) = &e.payload {
                    assert_eq!(d.event_id, id, "the error names the refused event");
                }
                if answers_tx
                    .send((id, answer_kind(&e), Instant::now()))
                    .is_err()
                {
                    break;
                }
            }
        });

        // (a) Refusals arrive at once.
        let mut answers: HashMap<String, String> = HashMap::new();
        let (first_id, first_kind, _) = loop {
            let a = tokio::time::timeout(T, answers_rx.recv())
                .await?
                .ok_or("no answers")?;
            if a.1 != "processed" {
                break a;
            }
            answers.insert(a.0, a.1);
        };
        assert_eq!(first_kind, "TooManyRequests", "first refusal of {first_id}");
        let first_refusal = started.elapsed();
        assert!(
            first_refusal < Duration::from_secs(5),
            "first refusal after {first_refusal:?}"
        );

        // (d) Meanwhile the managed agent's status reaches the hub at normal latency.
        let edited = Instant::now();
        set_status(
            &spoke_managed,
            "steady",
            json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}),
        )
        .await?;
        eventually(
            "the other agent's status reaches the hub during the flood",
            T,
            || async {
                stored_app(&topo.hub, MANAGED, "steady")
                    .filter(|a| a["status"]["health"]["status"] == "Healthy")
            },
        )
        .await?;
        let other_latency = edited.elapsed();
        let flooding_still = !flooder.is_finished();
        stop.store(true, Ordering::Relaxed);
        let (sent_count, tx) = flooder.await?;
        let flood_sent = started.elapsed();
        assert!(sent_count >= FLOOD);
        assert!(
            flooding_still,
            "the flood was over before the other agent's edit"
        );
        assert!(
            other_latency < Duration::from_secs(2),
            "the other agent's status took {other_latency:?} during the flood"
        );

        // Every event is answered, quickly: processed or TooManyRequests.
        let mut sent: HashMap<String, String> = HashMap::new();
        while let Ok(s) = sent_rx.try_recv() {
            sent.insert(s.0, s.1);
        }
        answers.insert(first_id, first_kind);
        let mut last_answer = Instant::now();
        while answers.len() < sent.len() {
            let (id, kind, at) = tokio::time::timeout(T, answers_rx.recv())
                .await
                .map_err(|_| format!("{} of {} events answered", answers.len(), sent.len()))?
                .ok_or("answer stream ended")?;
            answers.insert(id, kind);
            last_answer = at;
        }
        let all_answered = last_answer.duration_since(started);
        drop(tx);
        reader.abort();
        let processed: HashSet<&String> = answers
            .iter()
            .filter(|(_, k)| *k == "processed")
            .map(|(id, _)| &sent[id])
            .collect();
        let refused = answers.values().filter(|k| *k == "TooManyRequests").count();
        let other: Vec<&String> = answers
            .values()
            .filter(|k| *k != "processed" && *k != "TooManyRequests")
            .collect();
        assert!(other.is_empty(), "unexpected answers: {other:?}");
        // At most the burst plus the rate over the flood's duration (and a second's slack)
        // were let through.
        let allowed = BURST as f64 + RATE as f64 * (all_answered.as_secs_f64() + 1.0);
        assert!(
            (processed.len() as f64) <= allowed,
            "{} processed in {all_answered:?}, at most {allowed} allowed",
            processed.len()
        );
        assert!(
            processed.len() >= BURST as usize,
            "the burst passes: {}",
            processed.len()
        );
        assert!(
            all_answered < Duration::from_secs(60),
            "the flood took {all_answered:?}"
        );
        eprintln!(
            "flood: {} events sent in {flood_sent:?}, all answered in {all_answered:?} \
             ({} processed, {refused} refused); first refusal after {first_refusal:?}; \
             other agent's status reached the hub in {other_latency:?}",
            sent.len(),
            processed.len()
        );

        // (b) The metric counts the refusals.
        let counted = metric_sum(
            principal_metrics,
            &refused_series(AUTONOMOUS, "RateLimited"),
        )
        .await;
        assert_eq!(
            counted, refused as f64,
            "refused-events metric (RateLimited)"
        );
        // (c) The log says so, once a second at most, with counts.
        let log = topo.principal.log();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("over its event rate limit"))
            .collect();
        assert!(!lines.is_empty(), "no rate-limit log line");
        let secs = all_answered.as_secs() as usize + 2;
        assert!(
            lines.len() <= secs,
            "{} rate-limit lines in {secs} s",
            lines.len()
        );
        // (e) The hub holds exactly what was accepted: the processed creates, nothing else.
        let hub_after: HashSet<String> = topo
            .hub
            .list_objects("argoproj.io", "v1alpha1", "applications", Some(AUTONOMOUS))
            .iter()
            .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|n| !hub_before.contains(n))
            .collect();
        let expected: HashSet<String> = processed.into_iter().cloned().collect();
        assert_eq!(hub_after, expected, "hub objects after the flood");
        assert!(stored_app(&topo.hub, MANAGED, "steady").is_some());
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_agents_rate_limited_changes_are_resent_until_they_arrive() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        principal_args: vec![
            "--agent-event-rate".into(),
            "2".into(),
            "--agent-event-burst".into(),
            "4".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(AUTONOMOUS, T).await?;
        let spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        let names: Vec<String> = (0..12).map(|i| format!("burst-{i}")).collect();
        for n in &names {
            spoke
                .create(
                    &PostParams::default(),
                    &sample_app(n, SPOKE_NS, "guestbook"),
                )
                .await?;
        }
        // More changes than the burst at once: some are refused, and every one arrives.
        eventually(
            "every rate-limited create reaches the hub",
            Duration::from_secs(60),
            || async {
                names
                    .iter()
                    .all(|n| stored_app(&topo.hub, AUTONOMOUS, n).is_some())
                    .then_some(())
            },
        )
        .await?;
        let refused = metric_sum(
            topo.metrics_ports["principal"],
            &refused_series(AUTONOMOUS, "RateLimited"),
        )
        .await;
        assert!(refused > 0.0, "the burst of creates was not rate limited");
        let agent_log = topo.autonomous.as_ref().map(Proc::log).unwrap_or_default();
        assert!(
            agent_log.contains("principal is rate limiting this agent"),
            "the agent logs the rate limit"
        );
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_of_missing_names_are_not_found_and_hub_authored_apps_are_never_deleted() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let hub_apps = apps(&topo.hub, AUTONOMOUS)?;
        hub_apps
            .create(
                &PostParams::default(),
                &sample_app("hub-made", AUTONOMOUS, "guestbook"),
            )
            .await?;
        let hub_made = stored_app(&topo.hub, AUTONOMOUS, "hub-made").ok_or("hub-made missing")?;
        let source = topo.svid_source("autonomous.sock").await?;
        let ((tx, mut inbound), welcome) =
            open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        assert_eq!(welcome.ty, EventType::Welcome);
        let send = |e: &Event| tx.send(e.to_cloud_event());

        // A delete of a name the hub never had: NotFound, naming the event.
        let ghost = Event::resource(
            "test-client",
            EventType::Delete,
            own_app("ghost"),
            Payload::None,
        );
        send(&ghost).await?;
        let reply = answer_to(&mut inbound, &ghost.id).await?;
        let Payload::Error(d) = &reply.payload else {
            return Err(format!("expected NotFound, got {}", reply.ty).into());
        };
        assert_eq!(
            (d.reason.as_str(), d.event_id.as_str()),
            ("NotFound", ghost.id.as_str())
        );
        assert!(d.message.contains("ghost"), "{}", d.message);

        // Create, delete (processed), then the same delete again, as after a lost
        // acknowledgement: NotFound, a final answer rather than a failure.
        let create = create_event("mine");
        send(&create).await?;
        assert_eq!(
            answer_kind(&answer_to(&mut inbound, &create.id).await?),
            "processed"
        );
        eventually("mine on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "mine")
        })
        .await?;
        let delete = Event::resource(
            "test-client",
            EventType::Delete,
            own_app("mine"),
            Payload::None,
        );
        send(&delete).await?;
        assert_eq!(
            answer_kind(&answer_to(&mut inbound, &delete.id).await?),
            "processed"
        );
        eventually("mine deleted", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "mine")
                .is_none()
                .then_some(())
        })
        .await?;
        send(&delete).await?;
        assert_eq!(
            answer_kind(&answer_to(&mut inbound, &delete.id).await?),
            "NotFound"
        );

        // A delete of an Application authored on the hub: refused, the object stays.
        let hub_delete = Event::resource(
            "test-client",
            EventType::Delete,
            own_app("hub-made"),
            Payload::None,
        );
        send(&hub_delete).await?;
        let reply = answer_to(&mut inbound, &hub_delete.id).await?;
        let Payload::Error(d) = &reply.payload else {
            return Err(format!("expected Forbidden, got {}", reply.ty).into());
        };
        assert_eq!(d.reason, "Forbidden");
        assert!(d.message.contains("created on the hub"), "{}", d.message);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = stored_app(&topo.hub, AUTONOMOUS, "hub-made").ok_or("hub-made was deleted")?;
        assert_eq!(
            after["metadata"]["resourceVersion"],
            hub_made["metadata"]["resourceVersion"]
        );
        assert!(
            after["metadata"]
                .get("deletionTimestamp")
                .is_none_or(Value::is_null)
        );

        // Metrics and log.
        let port = topo.metrics_ports["principal"];
        assert_eq!(
            metric_sum(port, &refused_series(AUTONOMOUS, "NotFound")).await,
            2.0
        );
        assert_eq!(
            metric_sum(port, &refused_series(AUTONOMOUS, "NotOwner")).await,
            1.0
        );
        eventually("NotFound logged", T, || async {
            topo.principal
                .log()
                .lines()
                .any(|l| l.contains("answered NotFound") && l.contains("ghost"))
                .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
