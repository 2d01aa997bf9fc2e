//! Simulated agents: many in one process, each real on the wire. Each has its own
//! X.509-SVID (its own SPIFFE ID, from the run's CA), its own TLS 1.3 mTLS connection and
//! stream, sends the hello with its resync state, heartbeats, acknowledges the principal's
//! events like a spoke that applied them, and sends what the scenario asks (status updates).
//! They keep only what a resync needs (each Application's spec checksum and source UID), not
//! the objects. They dial and back off with the agent's own code
//! (`argocd_agent_agent::dialer::Dialer`, `argocd_agent_agent::redial::Backoff` with the
//! agent's default bounds), so a reconnect storm here is the one real agents make.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_domain::event::PROTOCOL_VERSION;
use argocd_agent_domain::names::Namespace;
use argocd_agent_domain::sync::lock;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::svid::SvidState;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_kubernetes::object::{SOURCE_UID_ANNOTATION, checksum_of};
use argocd_agent_proto::cloudevents::cloud_event::Data;
use argocd_agent_proto::eventstream::{self as pb, Hello};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use argocd_agent_agent::dialer::Dialer;
use argocd_agent_agent::redial::{Attempt, Backoff};
use argocd_agent_testkit::harness::{HarnessError, PRINCIPAL_ID};

/// SPIFFE ID of simulated agent `name` (mapped by [`super::env::BENCH_RULE`]).
pub fn sim_id(name: &str) -> String {
    format!("spiffe://example.org/ns/agents/sa/{name}")
}

/// Name of simulated agent `i`.
pub fn sim_name(i: usize) -> String {
    format!("bench-{i:05}")
}

/// Counters over every simulated agent.
#[derive(Debug, Default)]
pub struct Stats {
    /// Agents with a live session (welcome received, stream open).
    pub connected: AtomicUsize,
    /// Welcomes received (sessions established), in total.
    pub sessions: AtomicU64,
    /// Sessions that ended while the run did not ask for it (dropped streams).
    pub dropped: AtomicU64,
    /// Connection or handshake attempts that failed (refused dials included).
    pub failed_attempts: AtomicU64,
    /// Of those, dials refused: nothing listened, or the modelled Service had no ready
    /// endpoint. They cost the principals nothing.
    pub dials_refused: AtomicU64,
    /// Resource events received from the principal (create, spec-update, delete).
    pub events_in: AtomicU64,
    /// Events sent (status updates).
    pub events_out: AtomicU64,
    /// Acknowledgements (`processed`) received from the principal.
    pub acked_out: AtomicU64,
    /// Events the principal refused (error events).
    pub refused: AtomicU64,
    /// Payload bytes received in resource events.
    pub bytes_in: AtomicU64,
    /// Application events whose object (its JSON as received: the server-owned metadata
    /// stripped, so the same hub version gives the same bytes) the agent already held,
    /// applied and acknowledged: the same change applied twice.
    pub redelivered: AtomicU64,
}

/// Arrivals of resource events, for latency measurements (when tracking is on).
#[derive(Debug, Default)]
pub struct Arrivals {
    on: std::sync::atomic::AtomicBool,
    seen: Mutex<HashMap<String, Instant>>,
}

impl Arrivals {
    /// Starts recording `<app name>@<marker>` -> first arrival time.
    pub fn track(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    fn record(&self, key: String) {
        if self.on.load(Ordering::Relaxed) {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(key)
                .or_insert_with(Instant::now);
        }
    }

    /// How many recorded keys `f` accepts.
    pub fn count(&self, f: impl Fn(&str) -> bool) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|k| f(k))
            .count()
    }

    /// When `key` first arrived.
    pub fn get(&self, key: &str) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }
}

/// What one simulated agent holds of an Application.
#[derive(Debug, Clone)]
struct Held {
    checksum: String,
    uid: String,
    /// Hash of the object's JSON as received; set once the acknowledgement is written.
    acked: Option<u64>,
}

/// One simulated agent.
pub struct SimAgent {
    /// The agent's name ([`sim_name`] in a bench run); the bench's mapping rule makes it its
    /// hub namespace too.
    pub name: String,
    svid: watch::Sender<Option<Arc<SvidState>>>,
    tls: Arc<rustls::ClientConfig>,
    apps: Mutex<HashMap<String, Held>>,
    hub_ns: Mutex<Option<Namespace>>,
    outbox_tx: mpsc::UnboundedSender<Event>,
    outbox_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Event>>,
    /// Closes the current session without stopping the agent (it reconnects).
    kick: Mutex<CancellationToken>,
    /// Index in [`FleetConfig::principals`] of the live session's principal (`usize::MAX`
    /// while there is none).
    on: AtomicUsize,
}

impl SimAgent {
    /// An agent named `name` presenting `svid`.
    pub fn new(name: String, svid: Arc<SvidState>) -> Result<Arc<SimAgent>, HarnessError> {
        let (tx, rx) = watch::channel(Some(svid));
        let source = SvidSource::from_receiver(rx);
        let tls = argocd_agent_identity::tls::client_config(
            &source,
            PeerPolicy::Exact(SpiffeId::parse(PRINCIPAL_ID)?),
        )?;
        let (outbox_tx, outbox_rx) = mpsc::unbounded_channel();
        Ok(Arc::new(SimAgent {
            name,
            svid: tx,
            tls,
            apps: Mutex::new(HashMap::new()),
            hub_ns: Mutex::new(None),
            outbox_tx,
            outbox_rx: tokio::sync::Mutex::new(outbox_rx),
            kick: Mutex::new(CancellationToken::new()),
            on: AtomicUsize::new(usize::MAX),
        }))
    }

    /// Replaces the agent's SVID (what a Workload API rotation does); the next handshake
    /// uses it, the open stream stays.
    pub fn rotate(&self, svid: Arc<SvidState>) {
        self.svid.send_replace(Some(svid));
    }

    /// The agent's TLS client configuration (its SVID; the principal pinned).
    pub fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls.clone()
    }

    /// The spec checksum the agent holds for Application `name`.
    pub fn checksum(&self, name: &str) -> Option<String> {
        lock(&self.apps).get(name).map(|h| h.checksum.clone())
    }

    /// How many Applications the agent holds.
    pub fn app_count(&self) -> usize {
        lock(&self.apps).len()
    }

    /// Queues a status update of Application `name` (in its hub namespace) carrying `status`.
    pub fn send_status(&self, name: &str, status: Value) -> Result<(), HarnessError> {
        let ns = lock(&self.hub_ns)
            .clone()
            .ok_or("the agent has no hub namespace yet")?;
        let event = Event::resource(
            &self.name,
            EventType::StatusUpdate,
            argocd_agent_domain::event::ResourceRef::new(
                argocd_agent_domain::ResourceKind::Application,
                ns,
                name,
            ),
            Payload::Object(Arc::new(
                serde_json::json!({"metadata": {"name": name}, "status": status}),
            )),
        );
        self.outbox_tx
            .send(event)
            .map_err(|_| "the agent stopped".into())
    }

    /// Index in [`FleetConfig::principals`] of the principal serving the agent's live
    /// session, if it has one.
    pub fn principal_index(&self) -> Option<usize> {
        Some(self.on.load(Ordering::Relaxed)).filter(|&i| i != usize::MAX)
    }

    /// Closes the current session; the agent reconnects at once.
    pub fn kick(&self) {
        lock(&self.kick).cancel();
    }

    fn hello(&self) -> Event {
        let apps = lock(&self.apps);
        let sums: argocd_agent_domain::resync::Checksums = apps
            .iter()
            .map(|(n, h)| (n.clone(), h.checksum.clone()))
            .collect();
        let mut state = argocd_agent_domain::resync::to_state("Application", &sums);
        for r in &mut state.resources {
            r.source_uid = apps.get(&r.name).map(|h| h.uid.clone()).unwrap_or_default();
        }
        Event::new(
            &self.name,
            EventType::Hello,
            Payload::Hello(Hello {
                mode: pb::AgentMode::Managed as i32,
                version: concat!(env!("CARGO_PKG_VERSION"), "-bench").into(),
                protocol_version: PROTOCOL_VERSION,
                capabilities: vec!["resync.v1".into(), "operations.v1".into()],
                state: Some(state),
            }),
        )
    }

    /// Applies a principal event as a spoke would (`json`: its data as received, which
    /// `event` was decoded from); returns the answer, and the Application and object hash
    /// to mark acknowledged once the answer is on the stream.
    ///
    /// What a real agent needs of an Application is done for each: the event decoded and
    /// validated (JSON parsed into a tree), the spec's checksum and the source UID taken
    /// from it. Counting bytes and telling a redelivery apart are the bench's own, and read
    /// the bytes as received instead of writing the tree back to JSON.
    fn apply(
        &self,
        event: &Event,
        json: &[u8],
        stats: &Stats,
        arrivals: &Arrivals,
    ) -> Option<(Event, Option<(String, u64)>)> {
        let resource = event.resource.as_ref()?;
        let name = resource.name.clone();
        if resource.kind == argocd_agent_domain::ResourceKind::AppProject {
            // `<agent>:<project>@<description>` (the projects scenario's marker).
            if let Some(marker) = event
                .object()
                .and_then(|o| o.pointer("/spec/description"))
                .and_then(Value::as_str)
            {
                arrivals.record(format!("{}:{name}@{marker}", self.name));
            }
            stats.events_in.fetch_add(1, Ordering::Relaxed);
            return Some((event.ack(&self.name), None));
        }
        let mut applied = None;
        match event.ty {
            EventType::Create | EventType::SpecUpdate => {
                let obj = event.object()?;
                let spec = obj.get("spec").unwrap_or(&Value::Null);
                let uid = obj
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                stats
                    .bytes_in
                    .fetch_add(json.len() as u64, Ordering::Relaxed);
                let object = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    json.hash(&mut h);
                    h.finish()
                };
                if let Some(marker) = spec
                    .pointer("/source/targetRevision")
                    .and_then(Value::as_str)
                {
                    arrivals.record(format!("{name}@{marker}"));
                }
                let mut apps = lock(&self.apps);
                if apps.get(&name).and_then(|h| h.acked) == Some(object) {
                    stats.redelivered.fetch_add(1, Ordering::Relaxed);
                }
                apps.insert(
                    name.clone(),
                    Held {
                        checksum: checksum_of(spec),
                        uid,
                        acked: None,
                    },
                );
                applied = Some((name, object));
            }
            EventType::Delete => {
                lock(&self.apps).remove(&name);
            }
            _ => {}
        }
        stats.events_in.fetch_add(1, Ordering::Relaxed);
        Some((event.ack(&self.name), applied))
    }

    /// Records that the acknowledgement of `object` (a hash) of Application `name` was
    /// written to the stream.
    fn acked(&self, name: &str, object: u64) {
        if let Some(h) = lock(&self.apps).get_mut(name) {
            h.acked = Some(object);
        }
    }
}

/// Where and how the fleet connects.
#[derive(Clone)]
pub struct FleetConfig {
    /// The principal's address, or the replicas' (as behind a Service): agent `i` dials
    /// `principals[i % len]` first and moves to the next one after every failed attempt or
    /// ended session.
    pub principals: Vec<std::net::SocketAddr>,
    /// Heartbeat (ping event) interval; the real agent's default is 30 s.
    pub heartbeat: Duration,
    /// HTTP/2 keepalive; the real agent's default is 30 s.
    pub keepalive: Duration,
    /// What the agents compress their messages in (`None`: nothing, the agent's default);
    /// compressed messages of the principal are accepted either way, as the agent does.
    pub compression: Option<argocd_agent_agent::dialer::Compression>,
}

/// Every simulated agent of a run, and their tasks.
pub struct Fleet {
    /// The agents, in start order (agent `i` is `agents[i]`).
    pub agents: Vec<Arc<SimAgent>>,
    /// Counters over every agent.
    pub stats: Arc<Stats>,
    /// Arrival times of resource events, when tracking is on.
    pub arrivals: Arc<Arrivals>,
    /// Where the agents dial: [`FleetConfig::principals`] until [`Fleet::set_principals`].
    principals: Principals,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Fleet {
    /// Starts `agents`, each connecting at once.
    pub fn start(agents: Vec<Arc<SimAgent>>, config: FleetConfig) -> Fleet {
        let stats = Arc::new(Stats::default());
        let arrivals = Arc::new(Arrivals::default());
        let shutdown = CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        let principals = Arc::new(Dialed {
            addrs: std::sync::RwLock::new(config.principals.clone()),
            spread: std::sync::atomic::AtomicBool::new(false),
        });
        for (i, agent) in agents.iter().enumerate() {
            tasks.spawn(run(
                agent.clone(),
                i,
                config.clone(),
                principals.clone(),
                stats.clone(),
                arrivals.clone(),
                shutdown.clone(),
            ));
        }
        Fleet {
            agents,
            stats,
            arrivals,
            principals,
            shutdown,
            tasks,
        }
    }

    /// Changes where the agents dial from their next attempt on (what a Service's endpoints
    /// do when a replica is replaced); live sessions stay.
    pub fn set_principals(&self, principals: Vec<std::net::SocketAddr>) {
        self.principals.set(principals);
    }

    /// From now on, an agent whose session ended or whose attempt failed dials one of the
    /// addresses at random (as a Service's proxy picks an endpoint per connection), not the
    /// next one.
    pub fn spread_reconnects(&self) {
        self.principals.spread.store(true, Ordering::Relaxed);
    }

    /// Agents with a live session.
    pub fn connected(&self) -> usize {
        self.stats.connected.load(Ordering::Relaxed)
    }

    /// Closes every session and stops the agents.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The addresses a fleet dials, changeable while it runs.
struct Dialed {
    addrs: std::sync::RwLock<Vec<std::net::SocketAddr>>,
    /// Reconnect to a random address instead of the next.
    spread: std::sync::atomic::AtomicBool,
}

impl Dialed {
    fn set(&self, principals: Vec<std::net::SocketAddr>) {
        *self.addrs.write().unwrap_or_else(|p| p.into_inner()) = principals;
    }

    /// The endpoint a connection made now goes to, and its index: the `turn`-th in turn,
    /// or with `spread` one at random, among the addresses at this moment (`None` while
    /// there is none: the Service refuses the dial).
    fn pick(&self, turn: usize) -> (usize, Option<std::net::SocketAddr>) {
        let addrs = self.addrs.read().unwrap_or_else(|p| p.into_inner());
        let i = match addrs.len() {
            0 => 0,
            n if self.spread.load(Ordering::Relaxed) => fastrand::usize(..n),
            n => turn % n,
        };
        (i, addrs.get(i).copied())
    }
}

type Principals = Arc<Dialed>;

/// Set (to anything) in the bench's environment, the simulated agents back off after a
/// refused dial as after any failure, as agents did before [`Attempt::Refused`]: the
/// baseline a storm is compared with.
pub const REFUSED_AS_FAILURE: &str = "ARGOCD_AGENT_BENCH_REFUSED_AS_FAILURE";

/// One agent: sessions, reconnecting with backoff, until shutdown.
async fn run(
    agent: Arc<SimAgent>,
    index: usize,
    config: FleetConfig,
    principals: Principals,
    stats: Arc<Stats>,
    arrivals: Arc<Arrivals>,
    shutdown: CancellationToken,
) {
    // The agent's own backoff, with its default bounds.
    let defaults = argocd_agent_agent::AgentConfig::default();
    let mut backoff = Backoff::new(defaults.backoff_initial, defaults.backoff_max);
    // The next principal in turn (without `spread`): the agents start spread evenly.
    let mut turn = index;
    // The comparison switch of docs/benchmarks.md: agents as they were before refused dials
    // had their own short retry.
    let refused_as_failure = std::env::var_os(REFUSED_AS_FAILURE).is_some();
    loop {
        // The endpoint is picked when the connection is made, among the endpoints the
        // Service has at that moment, as kube-proxy picks one per new connection. (Picked
        // when the previous attempt ended instead, every agent that was refused while one
        // replica alone was ready would dial that replica after its wait, even with the
        // others ready by then.)
        let (target, address) = principals.pick(turn);
        let kick = {
            let mut k = lock(&agent.kick);
            if k.is_cancelled() {
                *k = CancellationToken::new();
            }
            k.clone()
        };
        let started = Instant::now();
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = session(&agent, target, address, &config, &stats, &arrivals, &kick) => r,
        };
        // Whatever ended, the next attempt goes to the next principal (one: the same), or
        // with `spread` to one picked at random when it dials.
        turn = turn.wrapping_add(1);
        let attempt = match result {
            Ok(Ended::Kicked) => {
                backoff.reset();
                continue;
            }
            Ok(Ended::Dropped) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                Attempt::Session
            }
            Ok(Ended::Redirected) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                Attempt::Redirected
            }
            Ok(Ended::Refused) => {
                stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                stats.dials_refused.fetch_add(1, Ordering::Relaxed);
                if refused_as_failure {
                    Attempt::Session
                } else {
                    Attempt::Refused
                }
            }
            Err(_) => {
                stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                Attempt::Session
            }
        };
        let wait = backoff.after(started.elapsed(), attempt);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// How a session attempt ended (an established session, or a refused dial).
enum Ended {
    /// The stream or connection went away.
    Dropped,
    /// The run closed it on purpose ([`SimAgent::kick`]).
    Kicked,
    /// None was made: the dial was refused, because nothing listens or the modelled Service
    /// has no ready endpoint (kube-proxy rejects the connection).
    Refused,
    /// The principal ended it to send the agent to another replica (rebalancing, a
    /// handover): redialed at once, as the agent does.
    Redirected,
}

/// Decrements the connected count (and forgets the agent's principal) when a live session
/// ends, however it ends.
struct Live<'a>(&'a Stats, &'a SimAgent);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.1.on.store(usize::MAX, Ordering::Relaxed);
        self.0.connected.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn session(
    agent: &SimAgent,
    target: usize,
    address: Option<std::net::SocketAddr>,
    config: &FleetConfig,
    stats: &Stats,
    arrivals: &Arrivals,
    kick: &CancellationToken,
) -> Result<Ended, HarnessError> {
    // Dialed as the agent dials: its dialer over this agent's SVID.
    let Some(principal) = address.map(|a| a.to_string()) else {
        return Ok(Ended::Refused);
    };
    let channel = match Dialer::mtls(agent.tls())
        .connect(&principal, config.keepalive)
        .await
    {
        Ok(channel) => channel,
        Err(e) if e.is_refused() => return Ok(Ended::Refused),
        Err(e) => return Err(argocd_agent_domain::error_chain(&e).into()),
    };
    // The agent's own client, with its compression settings.
    let mut client =
        argocd_agent_agent::connection::event_stream_client(channel, 16 << 20, config.compression);
    let (tx, rx) = mpsc::channel(64);
    tx.send(agent.hello().to_cloud_event())
        .await
        .map_err(|_| "stream closed")?;
    // Within the agent's own welcome timeout.
    let welcomed = async {
        let mut inbound = client
            .subscribe(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or("stream closed before the welcome")?;
        Ok::<_, HarnessError>((inbound, first))
    };
    let (mut inbound, first) =
        tokio::time::timeout(argocd_agent_agent::connection::WELCOME_TIMEOUT, welcomed)
            .await
            .map_err(|_| "no welcome within the agent's welcome timeout")??;
    let welcome = Event::from_cloud_event(first)?;
    let Payload::Welcome(w) = welcome.payload else {
        return Err(format!("expected a welcome, got {}", welcome.ty).into());
    };
    *lock(&agent.hub_ns) = Some(Namespace::new(&w.namespace)?);
    stats.sessions.fetch_add(1, Ordering::Relaxed);
    agent.on.store(target, Ordering::Relaxed);
    stats.connected.fetch_add(1, Ordering::Relaxed);
    let _live = Live(stats, agent);
    let mut outbox = agent.outbox_rx.lock().await;
    let mut heartbeat = tokio::time::interval(config.heartbeat);
    heartbeat.tick().await;
    let mut applied: Option<(String, u64)> = None;
    loop {
        let out = tokio::select! {
            _ = kick.cancelled() => return Ok(Ended::Kicked),
            _ = heartbeat.tick() => Some(Event::new(&agent.name, EventType::Ping, Payload::None)),
            Some(event) = outbox.recv() => {
                stats.events_out.fetch_add(1, Ordering::Relaxed);
                Some(event)
            }
            msg = inbound.message() => {
                let ce = match msg {
                    Ok(Some(ce)) => ce,
                    Err(status) if argocd_agent_agent::sends_elsewhere(&status) => {
                        return Ok(Ended::Redirected);
                    }
                    _ => return Ok(Ended::Dropped),
                };
                // The data as received (shared, not copied), for the bench's own counts.
                let json = match &ce.data {
                    Some(Data::BinaryData(b)) => b.clone(),
                    _ => Default::default(),
                };
                let Ok(event) = Event::from_cloud_event(ce) else { continue };
                match event.ty {
                    EventType::Processed => {
                        stats.acked_out.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    EventType::Error => {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    EventType::Ping | EventType::Pong => None,
                    _ => agent.apply(&event, &json, stats, arrivals).map(|(ack, held)| {
                        applied = held;
                        ack
                    }),
                }
            }
        };
        if let Some(event) = out
            && tx.send(event.to_cloud_event()).await.is_err()
        {
            return Ok(Ended::Dropped);
        }
        if let Some((name, object)) = applied.take() {
            agent.acked(&name, object);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_dial_goes_to_an_endpoint_the_service_has_when_it_dials() {
        let dialed = Dialed {
            addrs: std::sync::RwLock::new(Vec::new()),
            spread: std::sync::atomic::AtomicBool::new(true),
        };
        // No endpoint: refused.
        assert_eq!(dialed.pick(0).1, None);
        // One replica ready first, then the two others: dials made after they joined
        // spread over all three, whatever the endpoints were when the agent last failed.
        dialed.set(vec![addr(1)]);
        assert_eq!(dialed.pick(7).1, Some(addr(1)));
        dialed.set(vec![addr(1), addr(2), addr(3)]);
        let mut seen = [0usize; 3];
        for turn in 0..3000 {
            let (i, a) = dialed.pick(turn);
            assert_eq!(a, Some(addr(i as u16 + 1)));
            seen[i] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn without_spread_agents_take_the_endpoints_in_turn() {
        let dialed = Dialed {
            addrs: std::sync::RwLock::new(vec![addr(1), addr(2), addr(3)]),
            spread: std::sync::atomic::AtomicBool::new(false),
        };
        let picked: Vec<_> = (0..4).map(|t| dialed.pick(t).1.unwrap().port()).collect();
        assert_eq!(picked, [1, 2, 3, 1]);
    }
}
