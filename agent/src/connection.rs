//! One connection to the principal: hello with this agent's resync state, welcome, then
//! queued events and heartbeats out, the principal's events in.

use std::sync::atomic::{AtomicBool, Ordering};

use argocd_agent_domain::event::PROTOCOL_VERSION;
use argocd_agent_domain::{AgentMode, Namespace};
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::{self as pb, Hello, Welcome};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use argocd_agent_identity::text;

use crate::AgentConfig;
use crate::dialer::Dialer;
use crate::error::SessionError;
use crate::spoke::Spoke;

/// Capabilities this agent asks for.
const CAPABILITIES: &[&str] = &[
    "resync.v1",
    argocd_agent_domain::resync::PERIODIC_CAPABILITY,
    "operations.v1",
];

/// Outbound messages buffered before the writer waits for the principal.
const OUTBOUND_BUFFER: usize = 64;

/// How long the agent waits, once connected, for the principal to answer its hello with a
/// welcome. A principal that took the stream but never welcomes it (stuck behind its hub,
/// or draining) would otherwise hold the agent on a live connection forever, since its
/// keepalive pings are answered. The principal's own steps before the welcome (hello
/// timeout 15 s, the agent Lease write) take less.
pub const WELCOME_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn hello(spoke: &Spoke) -> Event {
    let mode = match spoke.mode {
        AgentMode::Managed => pb::AgentMode::Managed,
        AgentMode::Autonomous => pb::AgentMode::Autonomous,
    };
    Event::new(
        &spoke.source,
        EventType::Hello,
        Payload::Hello(Hello {
            mode: mode as i32,
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            capabilities: CAPABILITIES
                .iter()
                .copied()
                .chain(
                    spoke
                        .redis
                        .is_some()
                        .then_some(argocd_agent_redis::CAPABILITY),
                )
                .chain(
                    spoke
                        .proxy
                        .is_some()
                        .then_some(argocd_agent_domain::proxy::CAPABILITY),
                )
                .map(str::to_owned)
                .collect(),
            state: Some(spoke.hello_state()),
        }),
    )
}

/// Checks the principal's first event: a welcome naming a valid hub namespace.
fn check_welcome(event: Event) -> Result<(Welcome, Namespace), SessionError> {
    let Payload::Welcome(w) = event.payload else {
        return Err(SessionError::Protocol(format!(
            "expected welcome, got {}",
            event.ty
        )));
    };
    let ns = Namespace::new(&w.namespace).map_err(|e| {
        SessionError::Protocol(format!("welcome names an invalid hub namespace: {e}"))
    })?;
    Ok((w, ns))
}

/// How long a shutting-down agent waits for the principal to acknowledge the events it
/// has in flight (it applies and answers the principal's events meanwhile).
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs one connection until it ends, or until `shutdown`: then it stops sending new
/// events, finishes and answers what the principal sends, and waits (up to
/// [`DRAIN_GRACE`]) for acknowledgements of the events in flight.
pub async fn run(
    spoke: &Spoke,
    dialer: &Dialer,
    config: &AgentConfig,
    connected: &AtomicBool,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(), SessionError> {
    let Opened {
        tunnel_channel,
        tx,
        mut inbound,
        welcome: w,
        hub_ns,
        answered_in,
    } = tokio::select! {
        r = open(spoke, dialer, config) => r?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    log_connected(config, &w, &hub_ns, &answered_in);
    spoke.queue.requeue_in_flight();
    spoke.after_welcome(hub_ns);
    connected.store(true, Ordering::Relaxed);
    spoke.metrics.connection(true);

    let mut heartbeat = tokio::time::interval(config.heartbeat);
    heartbeat.tick().await;
    // Answers to the principal's requests (Redis), sent beside the queue; the token ends
    // this connection's subscriptions.
    let (direct_tx, mut direct_rx) = mpsc::channel(OUTBOUND_BUFFER);
    // Acknowledgements that wait for the spoke (deletes held by finalizers) go out here.
    spoke.set_late_replies(Some(direct_tx.clone()));
    let _no_late_replies = LateReplies(spoke);
    let requests = tokio_util::sync::CancellationToken::new();
    let _end_requests = requests.clone().drop_guard();
    let requests_in = Requests {
        spoke,
        dialer,
        config,
        tunnel_channel: &tunnel_channel,
        direct_tx: &direct_tx,
        requests: &requests,
    };
    let mut cache_report = tokio::time::interval(config.cache_refresh_interval);
    cache_report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resync = periodic_resync(config, &w);
    let mut draining: Option<tokio::time::Instant> = None;
    loop {
        if draining.is_some() && spoke.queue.in_flight() == 0 {
            tracing::info!("shutting down: every event in flight was acknowledged");
            break;
        }
        let out = tokio::select! {
            _ = shutdown.cancelled(), if draining.is_none() => {
                tracing::info!(in_flight = spoke.queue.in_flight(), "shutting down: no new events; waiting for acknowledgements");
                draining = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                None
            }
            _ = tokio::time::sleep_until(draining.unwrap_or_else(tokio::time::Instant::now)), if draining.is_some() => {
                tracing::warn!(in_flight = spoke.queue.in_flight(), "shutting down: events still unacknowledged after {DRAIN_GRACE} (sent again after the restart)", DRAIN_GRACE = text::duration(DRAIN_GRACE));
                break;
            }
            _ = cache_report.tick(), if draining.is_none() => {
                report_cache_info(spoke, &direct_tx);
                None
            }
            event = spoke.queue.next(), if draining.is_none() => Some(event),
            Some(event) = direct_rx.recv() => Some(event),
            _ = heartbeat.tick(), if draining.is_none() => Some(Event::new(&spoke.source, EventType::Ping, Payload::None)),
            _ = tick(&mut resync), if draining.is_none() && resync.is_some() => {
                tracing::debug!("periodic resync: asking the principal for a round");
                Some(Event::new(&spoke.source, EventType::Resync, Payload::Resync(spoke.resync_view())))
            }
            msg = inbound.message() => {
                let Some(ce) = msg? else { return Ok(()) };
                requests_in.receive(ce).await
            }
        };
        if let Some(event) = out {
            send(spoke, &tx, event).await?;
        }
    }
    finish(tx, inbound).await;
    Ok(())
}

/// The timer of periodic resync on this connection: `--resync-interval`, stretched to the
/// principal's minimum; none when it is off or the principal does not take `resync`
/// events (one of an earlier version). The first round is one interval after connecting
/// (the hello's resync has just run).
fn periodic_resync(config: &AgentConfig, w: &Welcome) -> Option<tokio::time::Interval> {
    if config.resync_interval.is_zero() {
        return None;
    }
    let agreed = w
        .capabilities
        .iter()
        .any(|c| c == argocd_agent_domain::resync::PERIODIC_CAPABILITY);
    if !agreed {
        tracing::warn!(
            resync_interval = %text::duration(config.resync_interval),
            "the principal does not take periodic resync requests (an earlier version): resync only at connect"
        );
        return None;
    }
    let minimum = std::time::Duration::from_millis(w.resync_min_interval_ms);
    let every = config.resync_interval.max(minimum);
    if every > config.resync_interval {
        tracing::info!(
            resync_interval = %text::duration(config.resync_interval),
            principal_minimum = %text::duration(minimum),
            every = %text::duration(every),
            "periodic resync: --resync-interval is below the principal's --resync-min-interval; asking at its minimum"
        );
    } else {
        tracing::info!(every = %text::duration(every), "periodic resync on");
    }
    let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Some(timer)
}

/// The next tick of an optional timer (never, without one).
async fn tick(timer: &mut Option<tokio::time::Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The log line of a connection just welcomed: who we are to the principal, and how the
/// stream travels (compression each way, HTTP/2 or WebSocket).
fn log_connected(config: &AgentConfig, w: &Welcome, hub_ns: &Namespace, answered_in: &str) {
    tracing::info!(agent = %w.agent_name, hub_namespace = %hub_ns, principal_version = %w.version,
        sent_compressed = %config.compression.map_or("identity".to_string(), |c| c.to_string()),
        received_compressed = %answered_in,
        transport = if config.websocket { "websocket" } else { "http2" }, "connected to principal");
}

/// Clears the spoke's channel for late answers when the session ends, however it ends.
struct LateReplies<'a>(&'a Spoke);

impl Drop for LateReplies<'_> {
    fn drop(&mut self) {
        self.0.set_late_replies(None);
    }
}

/// Draining done: ends our side of the stream, and waits (briefly) for the principal to
/// end its side, which it does after reading everything we sent, the last answers
/// included. Exiting at once could lose them in buffers.
async fn finish(tx: mpsc::Sender<CloudEvent>, mut inbound: tonic::Streaming<CloudEvent>) {
    drop(tx);
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
}

/// An open event stream, welcomed by the principal.
struct Opened {
    /// The connection, for the tunnels of log and exec streams.
    tunnel_channel: tonic::transport::Channel,
    tx: mpsc::Sender<CloudEvent>,
    inbound: tonic::Streaming<CloudEvent>,
    welcome: Welcome,
    hub_ns: Namespace,
    /// The principal's `grpc-encoding` for its messages (`identity`: uncompressed).
    answered_in: String,
}

/// The agent's `EventStream` client on `channel`: messages up to `max_message_size`, sent
/// compressed in `compression` when set; compressed answers (gzip or zstd) are accepted
/// either way.
pub fn event_stream_client(
    channel: tonic::transport::Channel,
    max_message_size: usize,
    compression: Option<crate::dialer::Compression>,
) -> EventStreamClient<tonic::transport::Channel> {
    crate::compressed_client!(
        EventStreamClient::new(channel)
            .max_decoding_message_size(max_message_size)
            .max_encoding_message_size(max_message_size),
        compression
    )
}

/// `welcomed` within [`WELCOME_TIMEOUT`], or a protocol error saying it did not come.
async fn within_welcome_timeout<T>(
    welcomed: impl std::future::Future<Output = Result<T, SessionError>>,
) -> Result<T, SessionError> {
    tokio::time::timeout(WELCOME_TIMEOUT, welcomed)
        .await
        .unwrap_or_else(|_| {
            Err(SessionError::Protocol(format!(
                "no welcome from the principal within {}s",
                WELCOME_TIMEOUT.as_secs()
            )))
        })
}

/// Dials the principal, sends the hello and waits for the welcome.
async fn open(
    spoke: &Spoke,
    dialer: &Dialer,
    config: &AgentConfig,
) -> Result<Opened, SessionError> {
    let channel = dialer.connect(&config.server, config.keepalive).await?;
    let tunnel_channel = channel.clone();
    let mut client = event_stream_client(channel, config.max_message_size, config.compression);
    let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
    tx.send(hello(spoke).to_cloud_event())
        .await
        .map_err(|_| SessionError::Closed)?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    dialer.authorize(&mut request)?;
    let welcomed = async {
        let response = client.subscribe(request).await?;
        let answered_in = response
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity")
            .to_owned();
        let mut inbound = response.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| SessionError::Protocol("stream closed before welcome".into()))?;
        Ok::<_, SessionError>((answered_in, inbound, first))
    };
    let (answered_in, inbound, first) = within_welcome_timeout(welcomed).await?;
    let welcome =
        Event::from_cloud_event(first).map_err(|e| SessionError::Protocol(e.to_string()))?;
    let (welcome, hub_ns) = check_welcome(welcome)?;
    Ok(Opened {
        tunnel_channel,
        tx,
        inbound,
        welcome,
        hub_ns,
        answered_in,
    })
}

/// What handles the principal's events on one connection: the spoke, and for the
/// principal's requests (Redis, resource proxy) the channel their answers go out on.
struct Requests<'a> {
    spoke: &'a Spoke,
    dialer: &'a Dialer,
    config: &'a AgentConfig,
    tunnel_channel: &'a tonic::transport::Channel,
    direct_tx: &'a mpsc::Sender<Event>,
    requests: &'a tokio_util::sync::CancellationToken,
}

impl Requests<'_> {
    /// Handles one event from the principal; returns the answer to send, if any.
    async fn receive(&self, ce: CloudEvent) -> Option<Event> {
        let spoke = self.spoke;
        match Event::from_cloud_event(ce) {
            Ok(event) if event.ty == EventType::RedisRequest => {
                spoke.metrics.event(false, event.ty.verb());
                serve_redis(spoke, event, self.direct_tx, self.requests);
                None
            }
            Ok(event) if event.ty == EventType::ResourceRequest => {
                spoke.metrics.event(false, event.ty.verb());
                crate::proxy::serve(spoke, event, self.direct_tx);
                None
            }
            Ok(event) if matches!(event.ty, EventType::LogRequest | EventType::TerminalRequest) => {
                spoke.metrics.event(false, event.ty.verb());
                crate::proxy::streams::serve(spoke, event, self.direct_tx, self.requests, || {
                    crate::proxy::Tunnel::new(
                        self.tunnel_channel.clone(),
                        self.dialer,
                        self.config.max_message_size,
                    )
                    .map(|t| t.compressed(self.config.compression))
                });
                None
            }
            Ok(event) => {
                let span = argocd_agent_domain::event_span!("agent.receive", &event,
                    source = %spoke.source);
                on_event(spoke, event).instrument(span).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "malformed event from principal ignored");
                None
            }
        }
    }
}

/// Sends one event to the principal.
async fn send(
    spoke: &Spoke,
    tx: &mpsc::Sender<CloudEvent>,
    mut event: Event,
) -> Result<(), SessionError> {
    spoke.metrics.event(true, event.ty.verb());
    // A child of the span the event was created in (a local change, or the handling
    // of the principal's event it answers); the principal continues from here.
    let span = argocd_agent_domain::event_span!("agent.send", &event, source = %spoke.source);
    event.stamp_trace(&span);
    tx.send(event.to_cloud_event())
        .instrument(span)
        .await
        .map_err(|_| SessionError::Closed)
}

/// Sends the cluster's cache counts (read from the cluster's Redis when configured) beside
/// the queue; a report that cannot be queued at once is skipped (the next one follows).
fn report_cache_info(spoke: &Spoke, out: &mpsc::Sender<Event>) {
    let apps = i64::try_from(spoke.app_count()).unwrap_or(i64::MAX);
    let (redis, source, out) = (spoke.redis.clone(), spoke.source.clone(), out.clone());
    spoke.tasks.spawn(async move {
        let mut info = match redis {
            Some(r) => r.cluster_counts().await,
            None => pb::ClusterCacheInfo::default(),
        };
        info.applications_count = apps;
        let event = Event::new(
            &source,
            EventType::ClusterCacheInfoUpdate,
            Payload::ClusterCacheInfo(info),
        );
        let _ = out.try_send(event);
    });
}

/// Starts answering a Redis request (without holding up the stream); without a configured
/// Redis the request gets an error answer.
fn serve_redis(
    spoke: &Spoke,
    event: Event,
    out: &mpsc::Sender<Event>,
    connection: &tokio_util::sync::CancellationToken,
) {
    // Upstream's counts of Redis requests (`get`, `subscribe`) and failed ones.
    let command = match &event.payload {
        Payload::RedisRequest(r) => match pb::RedisCommand::try_from(r.command) {
            Ok(pb::RedisCommand::Get) => Some("get"),
            Ok(pb::RedisCommand::Subscribe) => Some("subscribe"),
            _ => None,
        },
        _ => None,
    };
    if let Some(c) = command {
        spoke.metrics.redis_proxy(c, false);
    }
    let Some(redis) = spoke.redis.clone() else {
        if let Some(c) = command {
            spoke.metrics.redis_proxy(c, true);
        }
        let e = crate::redis::answer(
            &spoke.source,
            &event,
            EventType::RedisResponse,
            pb::redis_response::Result::Error(
                "this agent has no Redis configured (--redis-addr)".into(),
            ),
        );
        let _ = out.try_send(e);
        return;
    };
    // What the request may touch is decided here, against the spoke's current state.
    let request = crate::redis::SpokeRedis::prepare(spoke, &event);
    let source = spoke.source.clone();
    let (out, connection) = (out.clone(), connection.clone());
    let metrics = spoke.metrics.clone();
    spoke.tasks.spawn(async move {
        let failed = redis
            .handle(request, &source, event, out, &connection)
            .await;
        if let Some(c) = command.filter(|_| failed) {
            metrics.redis_proxy(c, true);
        }
    });
}

/// Reason of the principal's error event for an event over its rate limit.
const TOO_MANY_REQUESTS: &str = "TooManyRequests";

/// At most one warning a second about rate-limited events (a flood of refusals would
/// otherwise be a flood of log lines).
fn rate_limit_log_due() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    LAST.swap(now, Ordering::Relaxed) != now
}

/// Handles one event from the principal; returns what to answer.
async fn on_event(spoke: &Spoke, event: Event) -> Option<Event> {
    spoke.metrics.event(false, event.ty.verb());
    match event.ty {
        EventType::Processed => {
            if let Some(id) = &event.ack_id {
                spoke.queue.ack(id);
            }
            None
        }
        EventType::Error => {
            let reason = match &event.payload {
                Payload::Error(d) => d.reason.as_str(),
                _ => "",
            };
            match (reason, &event.ack_id) {
                // Over the principal's rate limit: not an answer about the change itself,
                // so it stays queued and is resent after a backoff (never dropped).
                (TOO_MANY_REQUESTS, Some(id)) => {
                    if spoke.queue.retry_later(id) && rate_limit_log_due() {
                        tracing::warn!(event_id = %id, "principal is rate limiting this agent: events are resent later");
                    }
                }
                // The hub's API server could not take the change for now: resent later,
                // never dropped (a dropped status would wait for the next resync).
                (argocd_agent_domain::event::REASON_UNAVAILABLE, Some(id)) => {
                    if spoke.queue.retry_later(id) {
                        tracing::info!(object = %text::or_dash(event.resource.as_ref()), event_id = %id, "the principal could not apply this change for now: resent later");
                    }
                }
                // A delete of an object the hub does not have: the outcome the delete
                // wanted (a resend after a lost acknowledgement ends here too).
                ("NotFound", Some(id)) => {
                    tracing::info!(object = %text::or_dash(event.resource.as_ref()), event_id = %id, "delete: the hub has no such object");
                    spoke.queue.ack(id);
                }
                (_, id) => {
                    if let Payload::Error(d) = &event.payload {
                        tracing::warn!(reason = %d.reason, message = %d.message, event_id = %d.event_id, "principal refused an event");
                    }
                    // A refused event is not retried: the principal gave a final answer.
                    if let Some(id) = id {
                        spoke.queue.ack(id);
                    }
                }
            }
            None
        }
        EventType::Pong | EventType::Ping => None,
        _ => {
            let started = std::time::Instant::now();
            let reply = spoke.on_principal_event(&event).await;
            if let Some(r) = &event.resource {
                let ok = reply.as_ref().is_none_or(|e| e.ty != EventType::Error);
                let since_queued = std::time::SystemTime::now()
                    .duration_since(event.time)
                    .ok()
                    .map(|d| d.as_secs_f64());
                spoke.metrics.applied(
                    r.kind,
                    spoke.mode,
                    ok,
                    started.elapsed().as_secs_f64(),
                    since_queued,
                );
            }
            reply
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn welcome(ns: &str) -> Event {
        Event::new(
            "principal",
            EventType::Welcome,
            Payload::Welcome(Welcome {
                version: "0.1.0".into(),
                protocol_version: PROTOCOL_VERSION,
                agent_name: "edge-1".into(),
                namespace: ns.into(),
                capabilities: vec![],
                max_in_flight: 1,
                ..Default::default()
            }),
        )
    }

    fn agreed(minimum_ms: u64) -> Welcome {
        Welcome {
            capabilities: vec![argocd_agent_domain::resync::PERIODIC_CAPABILITY.into()],
            resync_min_interval_ms: minimum_ms,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn periodic_resync_runs_at_the_agents_interval_or_the_principals_minimum() {
        let secs = std::time::Duration::from_secs;
        let config = |every| AgentConfig {
            resync_interval: every,
            ..Default::default()
        };
        // Off by default, and with a principal that does not take the requests.
        assert!(periodic_resync(&AgentConfig::default(), &agreed(0)).is_none());
        assert!(periodic_resync(&config(secs(60)), &Welcome::default()).is_none());
        // The agent's own interval, or the principal's minimum when that is longer.
        let period = |every, min| {
            periodic_resync(&config(every), &agreed(min))
                .unwrap()
                .period()
        };
        assert_eq!(period(secs(60), 0), secs(60));
        assert_eq!(period(secs(60), 30_000), secs(60));
        assert_eq!(period(secs(10), 30_000), secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_welcome_that_never_comes_ends_the_attempt() {
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<Result<(), SessionError>>();
        let err = within_welcome_timeout(never).await.unwrap_err();
        assert!(matches!(err, SessionError::Protocol(ref m) if m.contains("no welcome")));
        assert_eq!(started.elapsed(), WELCOME_TIMEOUT);
        let quick = async { Ok::<_, SessionError>(7) };
        assert_eq!(within_welcome_timeout(quick).await.unwrap(), 7);
    }

    #[test]
    fn welcome_must_name_a_valid_hub_namespace() {
        let (_, ns) = check_welcome(welcome("edge-1")).unwrap();
        assert_eq!(ns.as_str(), "edge-1");
        assert!(matches!(
            check_welcome(welcome("Not/A/Namespace")),
            Err(SessionError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn hello_offers_the_resource_proxy_when_it_is_served() {
        use argocd_agent_kubernetes::{Kind, Resources, Scope};
        let (svc, _api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(svc, "default");
        let (cache, _changes) = argocd_agent_kubernetes::watch(
            client.clone(),
            Kind::Application,
            Scope::namespace("argocd"),
        );
        let mut spoke = Spoke::new(
            AgentMode::Managed,
            Namespace::new("argocd").unwrap(),
            "agent".into(),
            std::sync::Arc::new(Resources::new(client.clone(), Kind::Application)),
            std::sync::Arc::new(cache),
            argocd_agent_domain::SendQueue::new(argocd_agent_domain::QueueLimits::default()),
            crate::config_objects::ConfigKinds::new(Vec::new()),
        );
        let offers = |s: &Spoke| match hello(s).payload {
            Payload::Hello(h) => h
                .capabilities
                .contains(&argocd_agent_domain::proxy::CAPABILITY.to_string()),
            _ => false,
        };
        assert!(!offers(&spoke));
        spoke.proxy = Some(std::sync::Arc::new(crate::proxy::SpokeProxy::new(
            client,
            crate::proxy::ProxyConfig::default(),
            crate::metrics::Metrics::new(),
        )));
        assert!(offers(&spoke));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_events_stay_queued_other_refusals_are_final() {
        use argocd_agent_domain::{ResourceKind, ResourceRef};
        use argocd_agent_kubernetes::{Kind, Resources, Scope};
        let (svc, _api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(svc, "default");
        let (cache, _changes) =
            argocd_agent_kubernetes::watch(client.clone(), Kind::Application, Scope::all());
        let spoke = Spoke::new(
            AgentMode::Autonomous,
            Namespace::new("argocd").unwrap(),
            "agent".into(),
            std::sync::Arc::new(Resources::new(client, Kind::Application)),
            std::sync::Arc::new(cache),
            argocd_agent_domain::SendQueue::new(argocd_agent_domain::QueueLimits::default()),
            crate::config_objects::ConfigKinds::new(Vec::new()),
        );
        let change = |name: &str| {
            Event::resource(
                "agent",
                EventType::Delete,
                ResourceRef::new(
                    ResourceKind::Application,
                    Namespace::new("agent").unwrap(),
                    name,
                ),
                Payload::None,
            )
        };
        for name in ["limited", "gone", "forbidden"] {
            spoke.queue.push(change(name)).unwrap();
        }
        let sent: Vec<Event> = vec![
            spoke.queue.next().await,
            spoke.queue.next().await,
            spoke.queue.next().await,
        ];
        let by_name = |n: &str| {
            sent.iter()
                .find(|e| e.resource.as_ref().is_some_and(|r| r.name == n))
                .unwrap()
        };
        for (name, reason) in [
            ("limited", "TooManyRequests"),
            ("gone", "NotFound"),
            ("forbidden", "Forbidden"),
        ] {
            let reply = by_name(name).error_reply("principal", reason, "no".into());
            assert!(on_event(&spoke, reply).await.is_none());
        }
        // Only the rate-limited change is still in flight, and it comes back.
        assert_eq!(spoke.queue.len(), 1);
        let again = tokio::time::timeout(std::time::Duration::from_secs(5), spoke.queue.next())
            .await
            .expect("the rate-limited change is resent");
        assert_eq!(again.id, by_name("limited").id);
    }

    #[test]
    fn first_event_other_than_welcome_is_a_protocol_error() {
        let ping = Event::new("principal", EventType::Ping, Payload::None);
        assert!(matches!(
            check_welcome(ping),
            Err(SessionError::Protocol(m)) if m.contains("expected welcome")
        ));
    }
}
