//! OpenTelemetry tracing end to end: both binaries export spans over OTLP/gRPC to an
//! in-test collector, and one hub change gives one trace from the principal's hub watch to
//! the agent's spoke write. An unreachable collector never holds up the sync.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use serde_json::json;

const T: Duration = Duration::from_secs(20);
const PRINCIPAL_SERVICE: &str = "argocd-agent-principal";
const AGENT_SERVICE: &str = "argocd-agent-agent";

/// One received span, reduced to what the assertions need.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn string_of(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// An OTLP trace collector keeping every span in memory.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = Vec::new();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(string_of)
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Received {
                        service: service.clone(),
                        name: s.name.clone(),
                        trace_id: s.trace_id.clone(),
                        span_id: s.span_id.clone(),
                        parent_span_id: s.parent_span_id.clone(),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), string_of(kv)))
                            .collect(),
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(out);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    async fn start(self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(self))
                .serve_with_incoming(incoming),
        );
        addr
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

fn otlp_args(addr: &str) -> Vec<String> {
    vec![
        "--otlp-address".into(),
        format!("http://{addr}"),
        "--otlp-insecure".into(),
    ]
}

fn fast_export() -> Vec<(String, String)> {
    vec![("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into())]
}

/// The chain of spans from `leaf` up to its trace's root, as far as received.
fn ancestry<'a>(spans: &'a [Received], leaf: &'a Received) -> Vec<&'a Received> {
    let mut chain = vec![leaf];
    let mut cur = leaf;
    while !cur.parent_span_id.is_empty() {
        let Some(parent) = spans
            .iter()
            .find(|s| s.trace_id == cur.trace_id && s.span_id == cur.parent_span_id)
        else {
            break;
        };
        chain.push(parent);
        cur = parent;
    }
    chain
}

fn describe(chain: &[&Received]) -> String {
    chain
        .iter()
        .map(|s| format!("{}:{}", s.service, s.name))
        .collect::<Vec<_>>()
        .join(" <- ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_hub_watch_to_the_spoke_write() {
    let collector = Collector::default();
    let addr = collector.clone().start().await;
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: otlp_args(&addr.to_string()),
        agent_args: otlp_args(&addr.to_string()),
        envs: fast_export(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let name = "traced-app";
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app(name, MANAGED, "guestbook"),
            )
            .await?;
        eventually("application on the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, name)
        })
        .await?;
        // The agent's write of the app, traced back to the principal's hub watch event.
        let chain = eventually("a trace from the hub watch to the spoke write", T, || {
            let spans = collector.spans();
            async move {
                spans
                    .iter()
                    .filter(|s| {
                        s.service == AGENT_SERVICE
                            && s.name == "agent.spoke_write"
                            && s.attr("object.name") == Some(name)
                    })
                    .map(|leaf| {
                        ancestry(&spans, leaf)
                            .into_iter()
                            .cloned()
                            .collect::<Vec<_>>()
                    })
                    .find(|chain| {
                        chain.last().is_some_and(|root| {
                            root.service == PRINCIPAL_SERVICE
                                && root.name == "principal.route"
                                && root.parent_span_id.is_empty()
                        })
                    })
            }
        })
        .await
        .map_err(|e| {
            let spans = collector.spans();
            let chains: Vec<String> = spans
                .iter()
                .filter(|s| s.service == AGENT_SERVICE && s.name == "agent.spoke_write")
                .map(|leaf| describe(&ancestry(&spans, leaf)))
                .collect();
            format!(
                "{e}; {} spans received; spoke-write chains: {chains:?}",
                spans.len()
            )
        })?;
        let refs: Vec<&Received> = chain.iter().collect();
        eprintln!("trace: {}", describe(&refs));
        let names: Vec<&str> = chain.iter().map(|s| s.name.as_str()).collect();
        for expected in [
            "agent.spoke_write",
            "agent.apply",
            "agent.receive",
            "principal.send",
            "principal.enqueue",
            "principal.hub_change",
            "principal.route",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {}",
                describe(&refs)
            );
        }
        let trace = &chain[0].trace_id;
        assert!(chain.iter().all(|s| &s.trace_id == trace));
        // Attributes: who and what, never the payload.
        let send = chain.iter().find(|s| s.name == "principal.send").unwrap();
        assert_eq!(send.attr("agent"), Some(MANAGED));
        assert!(
            send.attr("client")
                .is_some_and(|c| c.starts_with("spiffe://")),
            "{send:?}"
        );
        assert_eq!(send.attr("event.type"), Some("spec-update"));
        assert_eq!(send.attr("object.kind"), Some("Application"));
        assert_eq!(send.attr("object.namespace"), Some(MANAGED));
        assert_eq!(send.attr("object.name"), Some(name));
        // The agent acknowledged in the same trace.
        eventually(
            "the ack handled by the principal in the same trace",
            T,
            || {
                let spans = collector.spans();
                let trace = trace.clone();
                async move {
                    spans
                        .iter()
                        .any(|s| {
                            s.service == PRINCIPAL_SERVICE
                                && s.name == "principal.handle_inbound"
                                && s.attr("event.type") == Some("processed")
                                && s.trace_id == trace
                        })
                        .then_some(())
                }
            },
        )
        .await?;

        // The reverse: the spoke's status, up to the principal's hub write, in one trace.
        set_status(
            &apps(&topo.managed_spoke, SPOKE_NS)?,
            name,
            json!({"health": {"status": "Healthy"}}),
        )
        .await?;
        let chain = eventually(
            "a trace from the spoke's status to the hub write",
            T,
            || {
                let spans = collector.spans();
                async move {
                    spans
                        .iter()
                        .filter(|s| {
                            s.service == PRINCIPAL_SERVICE
                                && s.name == "principal.hub_write"
                                && s.attr("op") == Some("status")
                                && s.attr("object.name") == Some(name)
                        })
                        .map(|leaf| {
                            ancestry(&spans, leaf)
                                .into_iter()
                                .cloned()
                                .collect::<Vec<_>>()
                        })
                        .find(|chain| {
                            chain.last().is_some_and(|root| {
                                root.service == AGENT_SERVICE
                                    && root.name == "agent.local_change"
                                    && root.parent_span_id.is_empty()
                            })
                        })
                }
            },
        )
        .await?;
        let refs: Vec<&Received> = chain.iter().collect();
        eprintln!("status trace: {}", describe(&refs));
        assert!(
            chain.iter().any(|s| s.name == "principal.handle_inbound"
                && s.attr("event.type") == Some("status-update")
                && s.attr("rule").is_some()),
            "{}",
            describe(&refs)
        );
        // What the collector received is what /metrics says was exported, and none lost.
        for (process, prefix) in [("principal", "argocd_principal"), (MANAGED, "argocd_agent")] {
            let exported = span_outcome(&topo, process, prefix, "exported").await?;
            let lost = span_outcome(&topo, process, prefix, "failed").await?
                + span_outcome(&topo, process, prefix, "dropped").await?;
            if exported == 0 || lost != 0 {
                return Err(format!(
                    "{process}: {exported} spans exported, {lost} lost; want >0 and 0"
                )
                .into());
            }
        }
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_does_not_hold_up_the_sync() {
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // A queue of 4 spans: a burst of changes overflows it.
    let mut envs = fast_export();
    envs.push(("OTEL_BSP_MAX_QUEUE_SIZE".into(), "4".into()));
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: otlp_args(&closed.to_string()),
        agent_args: otlp_args(&closed.to_string()),
        envs,
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        // Twenty at once: a burst of spans well beyond the queue of 4, however slow the
        // machine (created one by one under load, five changes could fit between exports).
        let names: Vec<String> = (0..20).map(|i| format!("untraced-app-{i}")).collect();
        let hub_apps = apps(&topo.hub, MANAGED)?;
        futures::future::try_join_all(names.iter().map(|name| {
            let hub_apps = hub_apps.clone();
            async move {
                hub_apps
                    .create(
                        &PostParams::default(),
                        &sample_app(name, MANAGED, "guestbook"),
                    )
                    .await
            }
        }))
        .await?;
        for name in &names {
            eventually("application on the spoke", T, || async {
                stored_app(&topo.managed_spoke, SPOKE_NS, name)
            })
            .await?;
        }
        // The exporter was on, and said so when it could not deliver.
        eventually("export failures logged", T, || async {
            topo.logs().contains("span export failing").then_some(())
        })
        .await?;
        // ... and counted what it lost on both sides: failed exports and queue overflow.
        for (process, prefix) in [("principal", "argocd_principal"), (MANAGED, "argocd_agent")] {
            for outcome in ["failed", "dropped"] {
                eventually(&format!("{process} counts {outcome} spans"), T, || async {
                    (span_outcome(&topo, process, prefix, outcome).await.ok()? > 0).then_some(())
                })
                .await?;
            }
        }
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

/// `<prefix>_trace_spans_total{outcome}` on `process`'s `/metrics`.
async fn span_outcome(
    topo: &Topology,
    process: &str,
    prefix: &str,
    outcome: &str,
) -> Result<u64, HarnessError> {
    let text = http_get(topo.metrics_ports[process], "/metrics").await?;
    let series = format!("{prefix}_trace_spans_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .ok_or_else(|| format!("{process}: no {series:?} in /metrics:\n{text}"))?
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("{process}: {series}: {e}").into())
}
