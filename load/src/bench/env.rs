//! What every scenario runs against: a Kubernetes API test server as hub (in this process),
//! the development Workload API server (the principal's SVID, and the CA that issues every
//! simulated agent's), and a real `argocd-agent principal` as a separate process, whose RSS
//! and CPU time are read from `/proc`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_identity::svid::{SvidState, TrustBundles};
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use argocd_agent_testkit::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};

use argocd_agent_testkit::harness::{
    HarnessError, PRINCIPAL_ID, Proc, TRUST_DOMAIN, binary, http_get, wait_port,
};

/// The mapping rule of a bench run: `spiffe://example.org/ns/agents/sa/<agent>` is agent
/// `<agent>` with hub namespace `<agent>` (one template rule for every simulated agent).
pub const BENCH_RULE: &str = "template:spiffe://{trust_domain}/ns/agents/sa/{sa}=>{sa},namespace={sa},trustDomains=example.org,mode=both";

/// One reading of a process in `/proc`.
#[derive(Debug, Clone)]
pub struct ProcSample {
    /// Resident set size, bytes.
    pub rss: u64,
    /// Its CPU clocks at that instant; [`ProcSample::cpu_since`] gives the time between two.
    pub cpu: CpuClock,
    /// When it was read.
    pub at: Instant,
}

/// A process's CPU time at one instant, as finely as the kernel tells it: of this process
/// to the nanosecond (`CLOCK_PROCESS_CPUTIME_ID`); of another process each live thread's
/// time to the nanosecond (`/proc/<pid>/task/<tid>/schedstat`), and the whole process's in
/// clock ticks (`/proc/<pid>/stat`, 10 ms at the usual 100 Hz), which is all there is on a
/// kernel without schedstat.
#[derive(Debug, Clone)]
pub struct CpuClock {
    ticks: Duration,
    own: Option<Duration>,
    threads: Option<std::collections::HashMap<u32, u64>>,
}

/// CPU time spent between two readings, and the most it can be off by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSpent {
    /// User + system time.
    pub time: Duration,
    /// The error bound of the clock that measured it: 1 ns for the nanosecond clocks, two
    /// clock ticks for `/proc/<pid>/stat` (utime and stime are each truncated to a tick).
    pub resolution: Duration,
}

/// A figure is reported only when what it divides is at least this many times its clock's
/// resolution (an error of 10 % at most); otherwise it says "not measured" and why.
pub const MIN_RESOLUTIONS: u32 = 10;

impl CpuSpent {
    /// Whether the time is known to within a tenth ([`MIN_RESOLUTIONS`]).
    pub fn is_measured(&self) -> bool {
        self.time > Duration::ZERO && self.time >= self.resolution * MIN_RESOLUTIONS
    }

    /// The time per one of `n` (events, changes), in seconds times `scale` (1e6: µs per
    /// one), rounded ([`super::fine`]); or a string saying it was not measured and why,
    /// never a 0 that only means "too short to see".
    pub fn per(&self, n: u64, scale: f64) -> serde_json::Value {
        if n == 0 {
            return "not measured: nothing to divide by".into();
        }
        if !self.is_measured() {
            return self.not_measured().into();
        }
        super::fine(self.time.as_secs_f64() * scale / n as f64).into()
    }

    /// The time as a percentage of one core over `wall` ([`CpuSpent::per`]'s rules).
    pub fn percent_of(&self, wall: Duration) -> serde_json::Value {
        if wall.is_zero() {
            return "not measured: no time passed".into();
        }
        if !self.is_measured() {
            return self.not_measured().into();
        }
        super::fine(self.time.as_secs_f64() / wall.as_secs_f64() * 100.0).into()
    }

    fn not_measured(&self) -> String {
        format!(
            "not measured: {} µs of CPU read by a clock of {} µs resolution (at least {MIN_RESOLUTIONS}× it needed)",
            self.time.as_micros(),
            self.resolution.as_micros()
        )
    }
}

impl ProcSample {
    /// Reads `/proc/<pid>/status` (VmRSS) and the process's CPU clocks ([`CpuClock`]).
    pub fn read(pid: u32) -> Result<ProcSample, HarnessError> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or("no VmRSS in /proc/<pid>/status")?;
        Ok(ProcSample {
            rss: rss_kib * 1024,
            cpu: CpuClock::read(pid)?,
            at: Instant::now(),
        })
    }

    /// CPU time spent between `earlier` and `self`.
    pub fn cpu_since(&self, earlier: &ProcSample) -> CpuSpent {
        self.cpu.since(&earlier.cpu)
    }

    /// CPU use between `earlier` and `self` in percent of one core, or why it was not
    /// measured ([`CpuSpent::percent_of`]).
    pub fn cpu_percent_since(&self, earlier: &ProcSample) -> serde_json::Value {
        self.cpu_since(earlier)
            .percent_of(self.at.duration_since(earlier.at))
    }
}

impl CpuClock {
    /// Reads process `pid` (this process: its own clock).
    pub fn read(pid: u32) -> Result<CpuClock, HarnessError> {
        if pid == std::process::id() {
            return Ok(CpuClock {
                ticks: stat_ticks(pid)?,
                own: Some(own_cpu()),
                threads: None,
            });
        }
        CpuClock::read_other(pid)
    }

    /// Reads process `pid` as another process: per thread and in ticks.
    fn read_other(pid: u32) -> Result<CpuClock, HarnessError> {
        Ok(CpuClock {
            ticks: stat_ticks(pid)?,
            own: None,
            threads: threads_cpu(pid),
        })
    }

    /// CPU time spent since `earlier`. Another process's is the sum of each live thread's
    /// growth (a thread started since counts whole), but never less than the clock ticks
    /// prove (a thread that ended in between is missed by the sum, not by the ticks).
    pub fn since(&self, earlier: &CpuClock) -> CpuSpent {
        let tick = tick();
        let coarse = self.ticks.saturating_sub(earlier.ticks);
        match (self.own, earlier.own, &self.threads, &earlier.threads) {
            (Some(now), Some(then), _, _) => CpuSpent {
                time: now.saturating_sub(then),
                resolution: Duration::from_nanos(1),
            },
            (_, _, Some(now), Some(then)) => {
                let live = Duration::from_nanos(
                    now.iter()
                        .map(|(tid, ns)| ns.saturating_sub(then.get(tid).copied().unwrap_or(0)))
                        .sum(),
                );
                CpuSpent {
                    time: live.max(coarse.saturating_sub(2 * tick)),
                    resolution: Duration::from_nanos(1),
                }
            }
            _ => CpuSpent {
                time: coarse,
                resolution: 2 * tick,
            },
        }
    }
}

/// One clock tick of `/proc/<pid>/stat`.
fn tick() -> Duration {
    Duration::from_nanos(1_000_000_000 / rustix::param::clock_ticks_per_second().max(1))
}

/// utime + stime of `/proc/<pid>/stat`, whole clock ticks.
fn stat_ticks(pid: u32) -> Result<Duration, HarnessError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces:
    // state is field 3, utime 14, stime 15 (proc(5)).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("unreadable /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64, HarnessError> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/<pid>/stat")?
            .parse::<u64>()?)
    };
    let total = ticks(11)? + ticks(12)?;
    Ok(tick() * u32::try_from(total).unwrap_or(u32::MAX))
}

/// Each live thread's CPU time in nanoseconds (the first field of its `schedstat`); `None`
/// where the kernel does not have it.
fn threads_cpu(pid: u32) -> Option<std::collections::HashMap<u32, u64>> {
    let mut threads = std::collections::HashMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // A thread may end between the listing and the read.
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        let ns = text.split_whitespace().next()?.parse().ok()?;
        threads.insert(tid, ns);
    }
    (!threads.is_empty()).then_some(threads)
}

/// Whether this kernel gives each thread's CPU time to the nanosecond
/// (`/proc/<pid>/task/<tid>/schedstat`), so another process's CPU is read finer than clock
/// ticks.
pub fn per_thread_cpu_available() -> bool {
    threads_cpu(std::process::id()).is_some()
}

/// This process's user + system CPU time, every thread's, to the nanosecond
/// (`CLOCK_PROCESS_CPUTIME_ID`): `/proc/self/stat` counts in clock ticks (10 ms at 100 Hz),
/// which a short run (the smoke tests' backlog of 48 events) can finish inside, reading 0.
pub fn own_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Raises this process's soft `RLIMIT_NOFILE` to the hard limit (children inherit it) and
/// checks that `needed` descriptors fit. Returns the limit in force.
pub fn raise_nofile(needed: u64) -> Result<u64, HarnessError> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit)
            .map_err(|e| format!("raising RLIMIT_NOFILE to the hard limit: {e}"))?;
    }
    let have = limit.current.unwrap_or(u64::MAX);
    if have < needed {
        return Err(format!(
            "this run needs about {needed} file descriptors per process (one TCP connection per simulated agent, in this process and in the principal), but RLIMIT_NOFILE is {have}: raise the hard limit (ulimit -Hn) or use fewer agents"
        )
        .into());
    }
    Ok(have)
}

/// The hub's settings. Its event history is sized like a real apiserver's at the bench's
/// write rates: etcd keeps minutes of revisions (compaction every 5 min) and the watch cache
/// ~75 s of events, while the test server's default 1,000 events last under a second at
/// 1,500 writes/s. With the default, the principal's watch expired during bursts and its
/// paginated relists of 20,000 Applications never finished (each continue token expired
/// within the list), which measured the test server, not the principal.
fn hub_options(history_limit: usize) -> ServerOptions {
    ServerOptions {
        history_limit,
        ..ServerOptions::default()
    }
}

/// Events the bench hub keeps (each holds the object, and the previous one for updates).
pub const HUB_HISTORY: usize = 50_000;

/// Open file descriptors of process `pid` (entries of `/proc/<pid>/fd`).
pub fn open_fds(pid: u32) -> Result<usize, HarnessError> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Threads of process `pid` (`Threads:` of `/proc/<pid>/status`).
pub fn threads(pid: u32) -> Result<usize, HarnessError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("no Threads in /proc/<pid>/status")?)
}

/// A further principal replica of a run with several (`--ha --replica-id principal-<i>`).
pub struct Replica {
    /// The replica's process.
    pub proc: Proc,
    /// Its gRPC listener on 127.0.0.1.
    pub addr: SocketAddr,
    /// Port of its `/metrics`, `/healthz` and `/readyz` on 127.0.0.1.
    pub metrics_port: u16,
}

impl Replica {
    /// Waits until the replica listens and its `/readyz` says ready (at most 120 s).
    pub async fn until_ready(&self) -> Result<(), HarnessError> {
        wait_port(self.addr).await?;
        wait_ready_on(self.metrics_port, &self.proc, Duration::from_secs(120)).await
    }
}

/// The hub, the Workload API server and the principal process (with [`BenchEnv::start_ha`],
/// replica `principal-0`, and the other replicas in `replicas`).
pub struct BenchEnv {
    /// Working directory: Workload API sockets, the hub kubeconfig, admin sockets and logs.
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The development Workload API server (`principal.sock`).
    pub spiffe: DevWorkloadApiHandle,
    /// The hub's API server (event history sized for the bench's write rates), served on
    /// `_hub_runtime`.
    pub hub: KubeTestServer,
    /// The hub's own threads: a real hub API server runs apart from the agents, so its
    /// requests must not queue behind the simulated fleet's tasks on the bench's runtime
    /// (10,000 agents redialing in a storm would otherwise set the hub's latency, and with
    /// it every Lease write's).
    _hub_runtime: HubRuntime,
    /// The (first) principal process.
    pub principal: Proc,
    /// Its gRPC listener on 127.0.0.1.
    pub principal_addr: SocketAddr,
    /// Port of its `/metrics`, `/healthz` and `/readyz` on 127.0.0.1.
    pub metrics_port: u16,
    /// Replicas 1.. of a run with several (empty otherwise).
    pub replicas: Vec<Replica>,
    bundles: Arc<TrustBundles>,
}

/// The runtime the hub API server runs on, apart from the bench's: two threads of its own
/// (the OS shares the cores between them and everything else, as between processes).
/// Shut down without waiting when the environment goes (a runtime may not be dropped
/// from async code).
struct HubRuntime(Option<tokio::runtime::Runtime>);

impl HubRuntime {
    fn new() -> std::io::Result<HubRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hub-api")
            .enable_all()
            .build()?;
        Ok(HubRuntime(Some(rt)))
    }

    fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.0 {
            Some(rt) => rt.spawn(f),
            None => tokio::spawn(f),
        }
    }
}

impl Drop for HubRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A principal process (not started) named `name`, its address and metrics port; `suffix`
/// tells its admin socket and log apart from the other replicas' (empty for the first).
fn principal_proc(
    dir: &std::path::Path,
    spiffe: &DevWorkloadApiHandle,
    suffix: &str,
    extra_args: &[String],
) -> Result<Replica, HarnessError> {
    let port = argocd_agent_testkit::envoy::free_loopback_port()?;
    let metrics_port = argocd_agent_testkit::envoy::free_loopback_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut args = argocd_agent_testkit::harness::principal_args(
        port,
        &dir.join("hub.kubeconfig"),
        metrics_port,
        &spiffe.endpoint(&dir.join("principal.sock")),
    );
    args.extend([
        "--identity-rule".into(),
        BENCH_RULE.into(),
        "--admin-address".into(),
        format!(
            "unix://{}",
            dir.join(format!("admin{suffix}.sock")).display()
        ),
        // No Redis in a bench run (and no fixed port 6379 to collide on).
        "--disable-redis-proxy".into(),
        // Every simulated agent dials from 127.0.0.1, as agents behind one NAT address
        // would: the listener's per-address shares are raised to its totals.
        "--max-connections-per-client".into(),
        argocd_agent_listener::DEFAULT_MAX_CONNECTIONS.to_string(),
        "--max-handshakes-per-client".into(),
        argocd_agent_listener::DEFAULT_MAX_CONCURRENT_HANDSHAKES.to_string(),
    ]);
    // The bench measures the principal's capacity: the per-agent event rate limit (a
    // policy, tested in e2e/tests/bad_input.rs) is off unless a run sets it.
    if !extra_args
        .iter()
        .any(|a| a.starts_with("--agent-event-rate"))
    {
        args.extend(["--agent-event-rate".into(), "0".into()]);
    }
    args.extend(extra_args.iter().cloned());
    // RUST_LOG overrides --log-level: a run that sets the level gets it.
    let level = extra_args
        .iter()
        .rev()
        .find_map(|a| a.strip_prefix("--log-level="))
        .unwrap_or("warn");
    let proc = Proc::new(
        &format!("principal{suffix}"),
        binary("argocd-agent")?,
        args,
        dir.join(format!("principal{suffix}.log")),
    )
    .env("RUST_LOG", level);
    Ok(Replica {
        proc,
        addr,
        metrics_port,
    })
}

impl BenchEnv {
    /// Starts the hub and the principal (with `extra_args`), and waits until the principal
    /// answers on its metrics port.
    pub async fn start(
        dir: Option<PathBuf>,
        extra_args: &[String],
    ) -> Result<BenchEnv, HarnessError> {
        BenchEnv::start_ha(dir, extra_args, 1).await
    }

    /// [`BenchEnv::start`] with `replicas` principal processes: with more than one, each runs
    /// with `--ha --replica-id principal-<i>` (plus `extra_args`) on its own listen and
    /// metrics port, and all are ready when this returns.
    pub async fn start_ha(
        dir: Option<PathBuf>,
        extra_args: &[String],
        replicas: usize,
    ) -> Result<BenchEnv, HarnessError> {
        BenchEnv::start_with_history(dir, extra_args, replicas, HUB_HISTORY).await
    }

    /// [`BenchEnv::start_ha`] with a hub that keeps `history_limit` events (a long run
    /// wants the history full, so bounded, early: see the soak scenario).
    pub async fn start_with_history(
        dir: Option<PathBuf>,
        extra_args: &[String],
        replicas: usize,
        history_limit: usize,
    ) -> Result<BenchEnv, HarnessError> {
        let (dir, tmp) = match dir {
            Some(d) => {
                std::fs::create_dir_all(&d)?;
                (d, None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("argocd-agent-bench")
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let td = TrustDomain::new(TRUST_DOMAIN)?;
        let spiffe = DevWorkloadApi::builder(dir.join("spiffe"), td.clone())
            .socket(dir.join("principal.sock"), SpiffeId::parse(PRINCIPAL_ID)?)
            .serve()
            .await?;
        let mut bundles = TrustBundles::new();
        bundles.insert(td, vec![spiffe.ca().certificate().clone()])?;
        let hub_runtime = HubRuntime::new()?;
        let hub = hub_runtime
            .spawn(KubeTestServer::start_on(
                "127.0.0.1:0".parse()?,
                hub_options(history_limit),
            ))
            .await
            .map_err(|e| format!("starting the hub API server: {e}"))??;
        hub.write_kubeconfig(&dir.join("hub.kubeconfig"), "hub")?;
        argocd_agent_testkit::harness::create_namespace(
            &hub,
            argocd_agent_testkit::harness::HUB_ARGOCD_NS,
        )
        .await?;
        let mut first = principal_proc(&dir, &spiffe, "", &replica_args(extra_args, 0, replicas))?;
        first.proc.start()?;
        let mut others = Vec::new();
        for i in 1..replicas {
            let mut r = principal_proc(
                &dir,
                &spiffe,
                &format!("-{i}"),
                &replica_args(extra_args, i, replicas),
            )?;
            r.proc.start()?;
            others.push(r);
        }
        wait_port(first.addr).await?;
        for r in &others {
            wait_port(r.addr).await?;
        }
        let env = BenchEnv {
            _hub_runtime: hub_runtime,
            dir,
            _tmp: tmp,
            spiffe,
            hub,
            principal: first.proc,
            principal_addr: first.addr,
            metrics_port: first.metrics_port,
            replicas: others,
            bundles: Arc::new(bundles),
        };
        env.wait_ready(Duration::from_secs(60)).await?;
        for r in &env.replicas {
            wait_ready_on(r.metrics_port, &r.proc, Duration::from_secs(60)).await?;
        }
        env.wait_ready(Duration::from_secs(60)).await?;
        Ok(env)
    }

    /// Starts one more replica (`--ha --replica-id <replica_id>` unless `extra` has them,
    /// then `extra`) on its own ports, logging to `principal-<replica_id>.log`, and waits
    /// until it is ready: the new pod of a rolling update.
    pub async fn start_replica(
        &self,
        replica_id: &str,
        extra: &[String],
    ) -> Result<Replica, HarnessError> {
        let r = self.spawn_replica(replica_id, extra)?;
        r.until_ready().await?;
        Ok(r)
    }

    /// Starts a further replica as [`BenchEnv::start_replica`] does, without waiting for it.
    pub fn spawn_replica(
        &self,
        replica_id: &str,
        extra: &[String],
    ) -> Result<Replica, HarnessError> {
        let mut args = Vec::new();
        if !extra.iter().any(|a| a == "--ha") {
            args.push("--ha".to_owned());
        }
        args.extend(["--replica-id".to_owned(), replica_id.to_owned()]);
        args.extend(extra.iter().cloned());
        let mut r = principal_proc(&self.dir, &self.spiffe, &format!("-{replica_id}"), &args)?;
        r.proc.start()?;
        Ok(r)
    }

    /// Waits until the principal's `/readyz` answers 200 (hub caches synced).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), HarnessError> {
        wait_ready_on(self.metrics_port, &self.principal, timeout).await
    }

    /// An X.509-SVID for `id` from the run's CA, with the trust bundle, valid for `ttl`.
    pub fn svid(&self, id: &SpiffeId, ttl: Duration) -> Result<Arc<SvidState>, HarnessError> {
        let issued = self.spiffe.ca().issue_x509(id, ttl)?;
        Ok(Arc::new(SvidState {
            svid: Arc::new(issued.to_x509_svid()?),
            bundles: self.bundles.clone(),
        }))
    }

    /// The principal's process reading (its CPU per thread to the nanosecond where the
    /// kernel has it, see [`CpuClock`]).
    pub fn sample(&self) -> Result<ProcSample, HarnessError> {
        ProcSample::read(self.principal.pid().ok_or("the principal is not running")?)
    }

    /// Waits (at most `limit`) until the principal is quiet: under 5 % of a core over
    /// 300 ms, so what it still does for earlier work (watch events of a write burst) is
    /// not counted in the next measurement. Returns how long it took.
    pub async fn until_quiet(&self, limit: Duration) -> Result<Duration, HarnessError> {
        until_quiet(&self.principal, limit).await
    }

    /// The value of an unlabelled metric of the principal (`name` as exposed).
    pub async fn metric(&self, name: &str) -> Result<f64, HarnessError> {
        let text = http_get(self.metrics_port, "/metrics").await?;
        metric_value(&text, name).ok_or_else(|| format!("no metric {name}").into())
    }

    /// The values of several metrics of the principal from one scrape, each `None` when
    /// the principal does not expose it (or the scrape failed).
    pub async fn metrics<const N: usize>(&self, names: [&str; N]) -> [Option<f64>; N] {
        let text = http_get(self.metrics_port, "/metrics").await.ok();
        names.map(|n| text.as_deref().and_then(|t| metric_value(t, n)))
    }

    /// Requests the principal made to the hub, counted by `verb resource[/subresource]`.
    pub fn principal_requests(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for r in self.hub.requests() {
            if r.user.as_deref() == Some("e2e") {
                continue;
            }
            let key = match &r.subresource {
                Some(sub) => format!("{} {}/{sub}", r.verb, r.resource),
                None => format!("{} {}", r.verb, r.resource),
            };
            *out.entry(key).or_insert(0) += 1;
        }
        out
    }

    /// Kills the principal at once (`kill -9`).
    pub async fn kill_principal(&mut self) {
        self.principal.kill().await;
    }

    /// Starts the principal again with the same arguments and waits until it is ready.
    pub async fn restart_principal(&mut self) -> Result<(), HarnessError> {
        self.principal.start()?;
        wait_port(self.principal_addr).await?;
        self.wait_ready(Duration::from_secs(120)).await
    }

    /// The sum of an unlabelled metric over replicas 1.. (those of [`BenchEnv::start_ha`]).
    pub async fn replicas_metric(&self, name: &str) -> Result<f64, HarnessError> {
        let mut sum = 0.0;
        for r in &self.replicas {
            let text = http_get(r.metrics_port, "/metrics").await?;
            sum += metric_value(&text, name).ok_or_else(|| format!("no metric {name}"))?;
        }
        Ok(sum)
    }

    /// Every principal process's log tail (`n` lines each), named.
    pub fn logs(&self, n: usize) -> String {
        let mut out = tail(&self.principal.log(), n);
        for r in &self.replicas {
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                r.proc.name,
                tail(&r.proc.log(), n)
            ));
        }
        out
    }

    /// Stops everything.
    pub async fn stop(mut self) {
        self.principal.stop().await;
        for r in &mut self.replicas {
            r.proc.stop().await;
        }
        self.hub.shutdown().await;
    }
}

/// [`BenchEnv::until_quiet`] for any principal process (a replica, say).
pub async fn until_quiet(proc: &Proc, limit: Duration) -> Result<Duration, HarnessError> {
    let pid = proc
        .pid()
        .ok_or_else(|| format!("{} is not running", proc.name))?;
    let started = Instant::now();
    let window = Duration::from_millis(300);
    loop {
        let a = ProcSample::read(pid)?;
        tokio::time::sleep(window).await;
        let b = ProcSample::read(pid)?;
        let busy = b.cpu_since(&a).time.as_secs_f64() / (b.at - a.at).as_secs_f64();
        if busy < 0.05 || started.elapsed() >= limit {
            return Ok(started.elapsed());
        }
    }
}

/// The arguments of replica `i` of `replicas`: with several, `--ha` (unless `extra` has it)
/// and `--replica-id principal-<i>`, then `extra`.
fn replica_args(extra: &[String], i: usize, replicas: usize) -> Vec<String> {
    let mut args = Vec::new();
    if replicas > 1 {
        if !extra.iter().any(|a| a == "--ha") {
            args.push("--ha".to_owned());
        }
        args.extend(["--replica-id".to_owned(), format!("principal-{i}")]);
    }
    args.extend(extra.iter().cloned());
    args
}

/// Waits until the principal on `metrics_port` answers 200 on `/readyz` (hub caches synced).
pub(crate) async fn wait_ready_on(
    metrics_port: u16,
    proc: &Proc,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(body) = http_get(metrics_port, "/readyz").await
            && body.trim() == "ready"
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} not ready after {timeout:?}; log:\n{}",
                proc.name,
                tail(&proc.log(), 40)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub use argocd_agent_testkit::harness::metric_value;

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_are_summed_over_labels() {
        let text = "# HELP x y\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3\nfoo 7\nfoobar 1\n";
        assert_eq!(metric_value(text, "foo_total"), Some(5.0));
        assert_eq!(metric_value(text, "foo"), Some(7.0));
        assert_eq!(metric_value(text, "nope"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = ProcSample::read(std::process::id()).unwrap();
        assert!(s.rss > 0);
    }

    /// Spends about `d` of this thread's CPU.
    fn spin(d: Duration) {
        let start = own_cpu();
        let mut x = 0u64;
        while own_cpu() - start < d {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn another_process_cpu_is_read_per_thread_finer_than_a_clock_tick() {
        // Read as another process would be: per thread, from /proc.
        let pid = std::process::id();
        let before = CpuClock::read_other(pid).unwrap();
        if before.threads.is_none() {
            return; // a kernel without schedstat: ticks only
        }
        spin(Duration::from_millis(2));
        let spent = CpuClock::read_other(pid).unwrap().since(&before);
        assert_eq!(spent.resolution, Duration::from_nanos(1));
        assert!(
            spent.time >= Duration::from_millis(1) && spent.time < Duration::from_millis(8),
            "{spent:?}"
        );
        assert!(spent.is_measured());
    }

    #[test]
    fn this_process_cpu_is_read_finer_than_a_clock_tick() {
        // 1 ms of work reads as about 1 ms, not as 0 or a whole 10 ms tick.
        let start = ProcSample::read(std::process::id()).unwrap();
        spin(Duration::from_millis(1));
        let spent = ProcSample::read(std::process::id())
            .unwrap()
            .cpu_since(&start);
        assert!(
            spent.time >= Duration::from_millis(1) && spent.time < Duration::from_millis(8),
            "{spent:?}"
        );
        assert!(spent.per(48, 1e6).as_f64().is_some_and(|us| us > 0.0));
    }

    #[test]
    fn ticks_alone_do_not_pass_for_a_measurement() {
        // A kernel without schedstat: another process's CPU is whole clock ticks (each of
        // utime and stime truncated), so a short window says "not measured", not 0.
        let tick = tick();
        let at = |ticks: u32| CpuClock {
            ticks: tick * ticks,
            own: None,
            threads: None,
        };
        let short = at(3).since(&at(3));
        assert_eq!(short.resolution, 2 * tick);
        let v = short.per(48, 1e6);
        assert!(
            v.as_str().is_some_and(|s| s.starts_with("not measured")),
            "{v}"
        );
        assert!(
            at(4)
                .since(&at(3))
                .percent_of(Duration::from_secs(3))
                .is_string()
        );
        // 20 ticks and more are known to within 10 %.
        let long = at(23).since(&at(3));
        assert!(long.is_measured());
        let ms = (tick * 20).as_secs_f64() * 1e3 / 100.0;
        assert_eq!(long.per(100, 1e3).as_f64(), Some(super::super::fine(ms)));
        assert!(long.per(0, 1e3).is_string());
    }

    #[test]
    fn per_thread_time_is_never_less_than_the_ticks_prove() {
        // A thread that ended between two readings is missed by the per-thread sum; the
        // process's ticks still count it.
        let tick = tick();
        let then = CpuClock {
            ticks: tick * 10,
            own: None,
            threads: Some([(1, 5_000_000), (2, 5_000_000)].into()),
        };
        let now = CpuClock {
            ticks: tick * 60,
            own: None,
            threads: Some([(1, 6_000_000)].into()),
        };
        assert_eq!(now.since(&then).time, tick * 48);
        let busy_live = CpuClock {
            ticks: tick * 10,
            own: None,
            threads: Some([(1, 5_000_123), (2, 5_000_000), (3, 7)].into()),
        };
        assert_eq!(
            busy_live.since(&then).time,
            Duration::from_nanos(130),
            "a thread started since counts whole"
        );
    }
}
