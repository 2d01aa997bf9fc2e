//! `argocd-agentctl validate principal|agent`: offline checks of what the binary would be
//! started with — its flags and environment (given after `--`, or taken from a Deployment in
//! rendered manifests), its mapping rules, and its SVID files — printed as `OK`, `WARN` and
//! `ERROR` lines. Exits non-zero when any check is an error.
//!
//! Upstream's `validate` reads a running installation through the Kubernetes API (Secrets of
//! its own PKI, the Argo CD CR, cluster Secrets). Here identities come from SPIFFE, so the
//! checks that matter are offline: does the binary accept these flags, do the rules load,
//! is the SVID a SPIFFE SVID of the right trust domain, valid now, matching its key and
//! verified by its bundle.

use argocd_agent_identity::text::quoted;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use argocd_agent_domain::mapping::RuleSet;
use argocd_agent_identity::{SpiffeId, TrustDomain};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use serde_json::Value;

use crate::args::{Command as Role, SvidArgs};

/// Subcommands of `argocd-agentctl validate`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Checks a principal's flags, environment, mapping rules and SVID files.
    Principal(ValidateArgs),
    /// Checks an agent's flags, environment and SVID files, and (with --rules) that the
    /// principal's rules admit it.
    Agent(ValidateArgs),
}

/// Arguments of `validate principal|agent`.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Manifests: a file of rendered manifests (`kubectl kustomize ...` or `helm template ...`
    /// output), `-` for standard input, or a directory: a kustomization (rendered with
    /// `kubectl kustomize`, kubectl from `KUBECTL` or `PATH`) or rendered YAML files (e.g.
    /// `helm template --output-dir`), read recursively. The Deployment's container args and
    /// environment are checked, with `configMapKeyRef`s and files of ConfigMap volumes taken
    /// from ConfigMaps in the same manifests.
    #[arg(long, short = 'f')]
    pub manifests: Option<PathBuf>,
    /// The trust domain the SVID must be in.
    #[arg(long)]
    pub trust_domain: Option<String>,
    /// The agent's SPIFFE ID, when its SVID is not in files (Workload API): with --rules.
    #[arg(long)]
    pub spiffe_id: Option<String>,
    /// The principal's rules file: the agent's ID must map to an agent in its mode.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// The binary's flags, after `--` (the environment is read as the binary reads it).
    #[arg(last = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Fine.
    Ok,
    /// Works, but probably not as meant.
    Warn,
    /// The binary would fail or the agent would be refused.
    Error,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How it came out.
    pub level: Level,
    /// What was checked and what was found.
    pub text: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.level {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        };
        write!(f, "{tag:<5} {}", self.text)
    }
}

/// The findings of one run.
#[derive(Debug, Default)]
pub struct Report(pub Vec<Finding>, Vec<String>);

impl Report {
    fn push(&mut self, level: Level, text: impl Into<String>) {
        self.0.push(Finding {
            level,
            text: text.into(),
        });
    }
    fn ok(&mut self, t: impl Into<String>) {
        self.push(Level::Ok, t)
    }
    fn warn(&mut self, t: impl Into<String>) {
        self.push(Level::Warn, t)
    }
    fn error(&mut self, t: impl Into<String>) {
        self.push(Level::Error, t)
    }
    /// How many errors.
    pub fn errors(&self) -> usize {
        self.0.iter().filter(|f| f.level == Level::Error).count()
    }
}

/// Runs `validate`.
pub async fn run(cmd: Command) -> crate::CmdResult {
    let (role, args) = match cmd {
        Command::Principal(a) => ("principal", a),
        Command::Agent(a) => ("agent", a),
    };
    let report = validate(role, &args, SystemTime::now());
    for f in &report.0 {
        println!("{f}");
    }
    match report.errors() {
        0 => Ok(()),
        n => Err(format!("{n} error{}", if n == 1 { "" } else { "s" }).into()),
    }
}

/// All checks for `role` (`principal` or `agent`) at time `now`.
pub fn validate(role: &str, a: &ValidateArgs, now: SystemTime) -> Report {
    let mut r = Report::default();
    // With manifests: their args, then their environment as the binary would read it (and
    // nothing of this process's environment); otherwise the flags after `--` and this
    // process's environment, exactly as the binary reads them.
    let (argv, env, _tmp) = match &a.manifests {
        Some(path) => match manifest_command_line(&mut r, role, path) {
            Ok(found) => found,
            Err(e) => {
                r.error(format!("manifests: {e}"));
                return r;
            }
        },
        None => (a.args.clone(), None, None),
    };
    let full = ["argocd-agent".to_string(), role.to_string()]
        .into_iter()
        .chain(argv);
    let parsed = match &env {
        // Every variable the manifests do not set counts as unset: `upstream` then reads no
        // variable at all (their values are already flags).
        Some(_) => crate::upstream::try_parse_from(full, &|_: &str| Some(String::new())),
        None => crate::upstream::try_parse_from(full, &crate::upstream::process_env),
    };
    let cli = match parsed {
        Ok(parsed) => {
            for n in parsed.notices {
                r.warn(format!("upstream setting: {n}"));
            }
            parsed.cli
        }
        Err(crate::upstream::ParseError::Clap(e)) => {
            r.error(format!("flags: {}", clap_message(&e)));
            return r;
        }
        Err(crate::upstream::ParseError::Refused(list)) => {
            for m in list {
                r.error(format!("upstream setting: {m}"));
            }
            return r;
        }
    };
    r.ok("flags: accepted by argocd-agent");
    match cli.command {
        Role::Principal(p) => principal(&mut r, &p, a, now),
        Role::Agent(ag) => agent(&mut r, &ag, a, now),
    }
    r
}

/// The Deployment's command line in the manifests at `path`: its args, then a flag for each
/// variable of its environment that a flag reads and that the args do not set (the command
/// line wins over the environment, as in the binary), with ConfigMap volume files written to
/// a temporary directory (kept alive by the third element).
#[allow(clippy::type_complexity)]
fn manifest_command_line(
    r: &mut Report,
    role: &str,
    path: &Path,
) -> Result<
    (
        Vec<String>,
        Option<BTreeMap<String, String>>,
        Option<tempfile::TempDir>,
    ),
    ManifestError,
> {
    let m = from_manifests(role, path)?;
    r.1 = m.secrets;
    let mut argv = m.argv;
    argv.extend(env_as_flags(role, &m.env, &argv)?);
    r.ok(format!(
        "manifests: the {role} Deployment's args and environment ({} flags)",
        argv.len()
    ));
    let (argv, dir) = materialize(&m.files, argv)?;
    Ok((argv, Some(m.env), dir))
}

/// A clap error's message without its `error: ` prefix and usage lines: every line up to
/// `Usage:` (a missing required argument is named on the line after the first), joined.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    text.lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error: ")
        .to_string()
}

fn principal(r: &mut Report, p: &crate::args::PrincipalArgs, a: &ValidateArgs, now: SystemTime) {
    match p.config() {
        Ok(_) => r.ok("configuration: the principal would start with these settings"),
        Err(e) => r.error(format!(
            "configuration: {}",
            argocd_agent_domain::error_chain(&*e)
        )),
    }
    let mut flags = p.identity_rule.clone();
    if let Some(rest) = p.auth.strip_prefix("mtls:") {
        flags.push(format!("mtls:{rest}"));
    }
    let rules = load_rules(r, p.identity_rules.as_deref(), &flags);
    if rules.as_ref().is_some_and(RuleSet::is_empty) {
        r.warn("rules: none; every agent is refused");
    }
    if p.auth == "spiffe" || p.auth.starts_with("mtls:") {
        let tds: Vec<TrustDomain> = p
            .trust_domain
            .iter()
            .filter_map(|t| TrustDomain::new(t).ok())
            .collect();
        svid(r, &p.svid, a.trust_domain.as_deref(), &tds, now);
    } else {
        r.ok(format!("auth: {} (no X.509-SVID files to check)", p.auth));
    }
}

fn agent(r: &mut Report, ag: &crate::args::AgentArgs, a: &ValidateArgs, now: SystemTime) {
    match ag.config() {
        Ok(_) => r.ok("configuration: the agent would start with these settings"),
        Err(e) => r.error(format!(
            "configuration: {}",
            argocd_agent_domain::error_chain(&*e)
        )),
    }
    let principal_td = ag
        .principal_spiffe_id
        .as_deref()
        .and_then(|id| SpiffeId::parse(id).ok())
        .map(|id| id.trust_domain().clone())
        .or_else(|| {
            ag.principal_trust_domain
                .as_deref()
                .and_then(|t| TrustDomain::new(t).ok())
        });
    let mut own = None;
    if ag.creds == "spiffe" || ag.creds == "mtls" {
        own = svid(
            r,
            &ag.svid,
            a.trust_domain.as_deref(),
            principal_td.as_slice(),
            now,
        );
    } else {
        r.ok(format!(
            "creds: {} (no X.509-SVID files to check)",
            ag.creds
        ));
    }
    let id = match (&a.spiffe_id, own) {
        (Some(id), _) => match SpiffeId::parse(id) {
            Ok(id) => Some(id),
            Err(e) => {
                r.error(format!("--spiffe-id: {e}"));
                None
            }
        },
        (None, own) => own,
    };
    if let Some(path) = &a.rules {
        let Some(rules) = load_rules(r, Some(path), &[]) else {
            return;
        };
        let Some(id) = id else {
            r.warn("rules: no SPIFFE ID to map (SVID from the Workload API: pass --spiffe-id)");
            return;
        };
        match rules.map(&id).map_err(|e| e.to_string()).and_then(|m| {
            m.check_mode(ag.agent_mode)
                .map(|()| m)
                .map_err(|e| e.to_string())
        }) {
            Ok(m) => r.ok(format!(
                "rules: {} is agent {} in hub namespace {}, mode {} allowed (rule {})",
                id.as_str(),
                quoted(&m.agent.as_str()),
                quoted(&m.namespace.as_str()),
                ag.agent_mode,
                quoted(&m.rule)
            )),
            Err(e) => r.error(format!("rules: {e}")),
        }
    }
}

fn load_rules(r: &mut Report, file: Option<&Path>, flags: &[String]) -> Option<RuleSet> {
    let from_file = match file {
        Some(path) => match RuleSet::from_file(path) {
            Ok(set) => {
                r.ok(format!(
                    "rules: {} loads ({} rules)",
                    path.display(),
                    set.len()
                ));
                set
            }
            Err(e) => {
                r.error(format!("rules: {}", argocd_agent_domain::error_chain(&e)));
                return None;
            }
        },
        None => RuleSet::default(),
    };
    match RuleSet::from_flags(flags) {
        Ok(set) => {
            if !flags.is_empty() {
                r.ok(format!("rules: {} flag rules load", set.len()));
            }
            Some(from_file.append(set))
        }
        Err(e) => {
            r.error(format!("rules: {}", argocd_agent_domain::error_chain(&e)));
            None
        }
    }
}

/// Checks the SVID files (when the SVID comes from files); returns the SVID's ID.
/// `peer_tds`: trust domains the peer's SVIDs come from, which need a bundle.
fn svid(
    r: &mut Report,
    s: &SvidArgs,
    expect_td: Option<&str>,
    peer_tds: &[TrustDomain],
    now: SystemTime,
) -> Option<SpiffeId> {
    let (Some(cert), Some(key)) = (&s.tls_cert, &s.tls_key) else {
        // Unset, the configuration check has said so.
        if let Some(socket) = &s.spiffe_endpoint_socket {
            r.ok(format!(
                "svid: from the Workload API at {socket} (not checked offline)"
            ));
        }
        return None;
    };
    if let Some(m) = r.1.iter().find(|m| cert.starts_with(m.as_str())) {
        r.warn(format!(
            "svid: {} is in a Secret volume ({m}); check the files themselves with -- --tls-cert ... --tls-key ... --root-ca ...",
            cert.display()
        ));
        return None;
    }
    let chain: Vec<CertificateDer<'static>> = match CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
    {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => {
            r.error(format!("svid: {} holds no certificate", cert.display()));
            return None;
        }
        Err(e) => {
            r.error(format!("svid: {}: {e}", cert.display()));
            return None;
        }
    };
    let id = leaf_checks(r, &chain[0], cert, expect_td, now)?;
    match PrivateKeyDer::from_pem_file(key) {
        Ok(k) => match argocd_agent_identity::svid::X509Svid::new(chain.clone(), k) {
            Ok(_) => r.ok(format!("svid: {} matches the certificate", key.display())),
            Err(e) => r.error(format!("svid: {}: {e}", key.display())),
        },
        Err(e) => r.error(format!("svid: {}: {e}", key.display())),
    }
    bundles(r, s, &id, &chain, peer_tds);
    Some(id)
}

/// The leaf: a SPIFFE ID in a URI SAN, the expected trust domain, valid now.
fn leaf_checks(
    r: &mut Report,
    leaf: &CertificateDer<'_>,
    path: &Path,
    expect_td: Option<&str>,
    now: SystemTime,
) -> Option<SpiffeId> {
    let parsed = match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, c)) => c,
        Err(e) => {
            r.error(format!(
                "svid: {}: not an X.509 certificate: {e}",
                path.display()
            ));
            return None;
        }
    };
    let uris: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let id = match uris.iter().find(|u| u.starts_with("spiffe://")) {
        Some(u) => match SpiffeId::parse(u) {
            Ok(id) => id,
            Err(e) => {
                r.error(format!("svid: {}: URI SAN: {e}", path.display()));
                return None;
            }
        },
        None => {
            r.error(format!(
                "svid: {}: no SPIFFE ID (a spiffe:// URI SAN); found {}",
                path.display(),
                if uris.is_empty() {
                    "no URI SAN".to_string()
                } else {
                    uris.join(", ")
                }
            ));
            return None;
        }
    };
    r.ok(format!("svid: {} is {}", path.display(), id.as_str()));
    if let Some(td) = expect_td {
        if id.trust_domain().as_str() == td {
            r.ok(format!("svid: trust domain {td} as expected"));
        } else {
            r.error(format!(
                "svid: trust domain {}, expected {td}",
                id.trust_domain().as_str()
            ));
        }
    }
    let secs = |t: &x509_parser::time::ASN1Time| t.timestamp();
    let now_s = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let (nb, na) = (
        secs(&parsed.validity().not_before),
        secs(&parsed.validity().not_after),
    );
    let at = |s: i64| {
        jiff::Timestamp::from_second(s)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| s.to_string())
    };
    if now_s < nb {
        r.error(format!("svid: not valid before {}", at(nb)));
    } else if now_s >= na {
        r.error(format!("svid: expired at {}", at(na)));
    } else if na - now_s < Duration::from_secs(3600).as_secs() as i64 {
        r.warn(format!(
            "svid: expires at {} (in {} minutes); is it being renewed?",
            at(na),
            (na - now_s) / 60
        ));
    } else {
        r.ok(format!("svid: valid until {}", at(na)));
    }
    Some(id)
}

/// The `--root-ca` bundles: readable, one verifies the SVID, and every peer trust domain
/// has one.
fn bundles(
    r: &mut Report,
    s: &SvidArgs,
    id: &SpiffeId,
    chain: &[CertificateDer<'static>],
    peer_tds: &[TrustDomain],
) {
    if s.root_ca.is_empty() {
        r.error("bundle: no --root-ca; the peer's certificates cannot be verified");
        return;
    }
    let mut by_td: BTreeMap<Option<String>, Vec<CertificateDer<'static>>> = BTreeMap::new();
    for entry in &s.root_ca {
        let (td, path) = match entry.split_once('=') {
            Some((td, p)) => (Some(td.to_string()), p),
            None => (None, entry.as_str()),
        };
        match CertificateDer::pem_file_iter(path).and_then(|it| it.collect::<Result<Vec<_>, _>>()) {
            Ok(certs) if !certs.is_empty() => by_td.entry(td).or_default().extend(certs),
            Ok(_) => r.error(format!("bundle: {path} holds no certificate")),
            Err(e) => r.error(format!("bundle: {path}: {e}")),
        }
    }
    let own_td = id.trust_domain().as_str().to_string();
    let own: Vec<_> = by_td
        .iter()
        .filter(|(td, _)| td.as_deref().is_none_or(|t| t == own_td))
        .flat_map(|(_, c)| c.iter().cloned())
        .collect();
    match verify_chain(&own, chain) {
        Ok(()) => r.ok(format!("bundle: verifies the SVID ({own_td})")),
        Err(e) => r.error(format!("bundle: does not verify the SVID: {e}")),
    }
    for td in peer_tds {
        let named = by_td.contains_key(&Some(td.as_str().to_string()));
        if td.as_str() != own_td && !named {
            r.error(format!(
                "bundle: the peer's trust domain {} is not the SVID's ({own_td}) and no --root-ca {}=<file> gives its bundle",
                td.as_str(),
                td.as_str()
            ));
        }
    }
}

fn verify_chain(
    roots: &[CertificateDer<'static>],
    chain: &[CertificateDer<'static>],
) -> Result<(), ChainError> {
    let mut store = rustls::RootCertStore::empty();
    for c in roots {
        store.add(c.clone()).map_err(ChainError::Bundle)?;
    }
    if store.is_empty() {
        return Err(ChainError::NoBundle);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(ChainError::Verifier)?;
    verifier
        .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
        .map(|_| ())
        .map_err(ChainError::Verify)
}

/// Why the SVID's chain could not be checked against the bundle, or does not verify.
#[derive(Debug, thiserror::Error)]
enum ChainError {
    /// rustls refuses a bundle certificate.
    #[error("a bundle certificate: {0}")]
    Bundle(rustls::Error),
    /// No bundle for the trust domain.
    #[error("no bundle for the SVID's trust domain")]
    NoBundle,
    /// The verifier cannot be built.
    #[error("{0}")]
    Verifier(rustls::server::VerifierBuilderError),
    /// The chain does not verify.
    #[error("{0}")]
    Verify(rustls::Error),
}

/// Why the manifests could not be read. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
enum ManifestError {
    /// Standard input cannot be read.
    #[error("reading stdin: {0}")]
    Stdin(std::io::Error),
    /// A file or directory cannot be read.
    #[error("{}: {cause}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// `kubectl kustomize` cannot be run.
    #[error("{} is a kustomization: running {kubectl} kustomize: {cause} (set KUBECTL, or pass `kubectl kustomize` output with -f -)", path.display())]
    Kustomize {
        /// The directory.
        path: PathBuf,
        /// The kubectl used.
        kubectl: String,
        /// Why.
        cause: std::io::Error,
    },
    /// `kubectl kustomize` failed.
    #[error("kubectl kustomize {}: {stderr}", path.display())]
    KustomizeFailed {
        /// The directory.
        path: PathBuf,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// `kubectl kustomize` wrote no UTF-8.
    #[error("kubectl kustomize output: {0}")]
    KustomizeOutput(std::string::FromUtf8Error),
    /// A directory with neither a kustomization nor YAML files.
    #[error("{}: no kustomization and no .yaml/.yml file", .0.display())]
    NoYaml(PathBuf),
    /// The manifests are not YAML.
    #[error("{}: {cause}", path.display())]
    Yaml {
        /// Where they were read.
        path: PathBuf,
        /// Why (boxed: the parser's error is large).
        cause: Box<serde_saphyr::Error>,
    },
    /// No Deployment runs the role.
    #[error("no Deployment runs `argocd-agent {role}` in {}", path.display())]
    NoDeployment {
        /// The role.
        role: String,
        /// Where the manifests were read.
        path: PathBuf,
    },
    /// The Deployment runs a role the binary does not have.
    #[error("argocd-agent has no {0} subcommand")]
    NoSubcommand(String),
    /// No temporary directory for the ConfigMap volumes' files.
    #[error("temporary directory: {0}")]
    TempDir(std::io::Error),
    /// A ConfigMap volume's file cannot be written to the temporary directory.
    #[error("{0}")]
    Materialize(std::io::Error),
    /// A `configMapKeyRef` to a key the manifests do not have.
    #[error("env {name}: ConfigMap {cm} key {key} is not in the manifests (and not optional)")]
    EnvConfigMap {
        /// The variable.
        name: String,
        /// The ConfigMap.
        cm: String,
        /// The key.
        key: String,
    },
}

/// A [`ManifestError::Read`] for `path`.
fn read_error(path: &Path) -> impl Fn(std::io::Error) -> ManifestError + '_ {
    move |cause| ManifestError::Read {
        path: path.to_owned(),
        cause,
    }
}

/// The ConfigMap volumes' files: mount path -> (file -> text).
type Files = BTreeMap<String, BTreeMap<String, String>>;

/// Mount paths of Secret volumes (their files exist only in the cluster).
type SecretMounts = Vec<String>;

/// What the `role` Deployment of some manifests runs.
struct Manifest {
    /// Its container's args after the subcommand, `$(VAR)` expanded from its environment.
    argv: Vec<String>,
    /// Its container's environment (`configMapKeyRef`s resolved, stand-ins for `fieldRef`s).
    env: BTreeMap<String, String>,
    files: Files,
    secrets: SecretMounts,
}

/// The text of the manifests at `path` (see [`ValidateArgs::manifests`]).
fn read_manifests(path: &Path) -> Result<String, ManifestError> {
    if path == Path::new("-") {
        return std::io::read_to_string(std::io::stdin()).map_err(ManifestError::Stdin);
    }
    if !path.is_dir() {
        return std::fs::read_to_string(path).map_err(read_error(path));
    }
    let is_kustomization = ["kustomization.yaml", "kustomization.yml", "Kustomization"]
        .iter()
        .any(|f| path.join(f).is_file());
    if is_kustomization {
        let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
        let out = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(path)
            .output()
            .map_err(|cause| ManifestError::Kustomize {
                path: path.to_owned(),
                kubectl: kubectl.to_string_lossy().into_owned(),
                cause,
            })?;
        if !out.status.success() {
            return Err(ManifestError::KustomizeFailed {
                path: path.to_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        return String::from_utf8(out.stdout).map_err(ManifestError::KustomizeOutput);
    }
    let mut files = Vec::new();
    yaml_files(path, &mut files)?;
    if files.is_empty() {
        return Err(ManifestError::NoYaml(path.to_owned()));
    }
    files.sort();
    let texts = files
        .iter()
        .map(|f| std::fs::read_to_string(f).map_err(read_error(f)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n---\n"))
}

/// Every `.yaml`/`.yml` file under `dir`.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let entries = std::fs::read_dir(dir).map_err(read_error(dir))?;
    for entry in entries {
        let path = entry.map_err(read_error(dir))?.path();
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

fn from_manifests(role: &str, path: &Path) -> Result<Manifest, ManifestError> {
    let text = read_manifests(path)?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|cause| ManifestError::Yaml {
            path: path.to_owned(),
            cause: Box::new(cause),
        })?;
    let configmaps: BTreeMap<&str, &serde_json::Map<String, Value>> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| Some((d["metadata"]["name"].as_str()?, d["data"].as_object()?)))
        .collect();
    let (deployment, c) = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .filter_map(|d| {
            d["spec"]["template"]["spec"]["containers"][0]
                .as_object()
                .map(|c| (d, c))
        })
        .find(|(_, c)| c.get("args").and_then(|a| a.get(0)).and_then(Value::as_str) == Some(role))
        .ok_or_else(|| ManifestError::NoDeployment {
            role: role.to_owned(),
            path: path.to_owned(),
        })?;
    let env = container_env(deployment, c, &configmaps)?;
    let mut argv: Vec<String> = c
        .get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .skip(1)
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    // $(VAR) in args is expanded by the kubelet from the container's env; unknown ones stay.
    for a in &mut argv {
        for (k, v) in &env {
            *a = a.replace(&format!("$({k})"), v);
        }
    }
    let (files, secrets) = volume_files(deployment, c, &configmaps);
    Ok(Manifest {
        argv,
        env,
        files,
        secrets,
    })
}

/// The container's environment as the kubelet would set it, as far as the manifests say:
/// `configMapKeyRef`s from their ConfigMaps, stand-ins for `fieldRef`s, no `secretKeyRef`s.
fn container_env(
    deployment: &Value,
    c: &serde_json::Map<String, Value>,
    configmaps: &BTreeMap<&str, &serde_json::Map<String, Value>>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let mut env = BTreeMap::new();
    for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let value = if let Some(v) = e["value"].as_str() {
            Some(v.to_string())
        } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
            let cm = r.get("name").and_then(Value::as_str).unwrap_or_default();
            let key = r.get("key").and_then(Value::as_str).unwrap_or_default();
            let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
            match configmaps
                .get(cm)
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
            {
                Some(v) => Some(v.to_string()),
                None if optional => None,
                None => {
                    return Err(ManifestError::EnvConfigMap {
                        name: name.to_owned(),
                        cm: cm.to_owned(),
                        key: key.to_owned(),
                    });
                }
            }
        } else if let Some(field) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            // Values only the cluster has; stand-ins of the right shape.
            match field {
                "status.podIP" => Some("192.0.2.1".to_string()),
                "metadata.name" => Some(format!(
                    "{}-0",
                    deployment["metadata"]["name"].as_str().unwrap_or("pod")
                )),
                "metadata.namespace" => deployment["metadata"]["namespace"]
                    .as_str()
                    .map(str::to_string),
                _ => None,
            }
        } else {
            // secretKeyRef: only the cluster has it.
            None
        };
        if let Some(v) = value {
            env.insert(name.to_string(), v);
        }
    }
    Ok(env)
}

/// The files of the container's ConfigMap volumes, and the mount paths of its Secret volumes.
fn volume_files(
    deployment: &Value,
    c: &serde_json::Map<String, Value>,
    configmaps: &BTreeMap<&str, &serde_json::Map<String, Value>>,
) -> (Files, SecretMounts) {
    let mut files = Files::new();
    let mut secrets = SecretMounts::new();
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for m in c
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(vol), Some(mount)) = (m["name"].as_str(), m["mountPath"].as_str()) else {
            continue;
        };
        let volume = volumes.iter().find(|v| v["name"] == vol);
        if volume.is_some_and(|v| v.get("secret").is_some()) {
            secrets.push(format!("{}/", mount.trim_end_matches('/')));
        }
        let cm = volume.and_then(|v| v["configMap"]["name"].as_str());
        if let Some(data) = cm.and_then(|n| configmaps.get(n)) {
            let entries = data
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            files.insert(mount.to_string(), entries);
        }
    }
    (files, secrets)
}

/// Whether `argv` sets `arg` (by its long name, an alias or its short name).
fn on_command_line(arg: &clap::Arg, argv: &[String]) -> bool {
    let longs: Vec<&str> = arg
        .get_long()
        .into_iter()
        .chain(arg.get_all_aliases().unwrap_or_default())
        .collect();
    let shorts: Vec<char> = arg
        .get_short()
        .into_iter()
        .chain(arg.get_all_short_aliases().unwrap_or_default())
        .collect();
    argv.iter().any(|a| {
        if let Some(rest) = a.strip_prefix("--") {
            let name = rest.split_once('=').map_or(rest, |(n, _)| n);
            longs.contains(&name)
        } else if let Some(rest) = a.strip_prefix('-') {
            rest.chars().next().is_some_and(|c| shorts.contains(&c))
        } else {
            false
        }
    })
}

/// Environment variables as the flags that read them (clap's own definitions say which, with
/// upstream's variables where ours are unset, as the binary reads them); variables no flag
/// reads are ignored, as the binary ignores them, and so are those of flags `argv` sets (the
/// command line wins).
fn env_as_flags(
    role: &str,
    env: &BTreeMap<String, String>,
    argv: &[String],
) -> Result<Vec<String>, ManifestError> {
    let cmd = crate::upstream::command(&|k| env.get(k).cloned());
    let sub = cmd
        .find_subcommand(role)
        .ok_or_else(|| ManifestError::NoSubcommand(role.to_owned()))?;
    let mut out = Vec::new();
    for arg in sub.get_arguments() {
        let Some(var) = arg.get_env().and_then(|v| v.to_str()) else {
            continue;
        };
        let (Some(value), Some(long)) = (env.get(var), arg.get_long()) else {
            continue;
        };
        if on_command_line(arg, argv) {
            continue;
        }
        // Booleans: `--flag` and, taking `--flag=false` too, `--flag[=bool]`.
        let is_flag = matches!(arg.get_action(), clap::ArgAction::SetTrue)
            || arg.get_default_values() == [std::ffi::OsStr::new("false")];
        if is_flag {
            if !matches!(value.as_str(), "false" | "0" | "" | "no" | "off") {
                out.push(format!("--{long}"));
            }
        } else {
            out.push(format!("--{long}={value}"));
        }
    }
    Ok(out)
}

/// Writes the ConfigMap volumes' files into a temporary directory and points the flags that
/// name files under a mount path there.
fn materialize(
    files: &Files,
    argv: Vec<String>,
) -> Result<(Vec<String>, Option<tempfile::TempDir>), ManifestError> {
    if files.is_empty() {
        return Ok((argv, None));
    }
    let dir = tempfile::tempdir().map_err(ManifestError::TempDir)?;
    let mut argv = argv;
    for (i, (mount, entries)) in files.iter().enumerate() {
        let local = dir.path().join(i.to_string());
        std::fs::create_dir_all(&local).map_err(ManifestError::Materialize)?;
        for (name, text) in entries {
            std::fs::write(local.join(name), text).map_err(ManifestError::Materialize)?;
        }
        let prefix = format!("{}/", mount.trim_end_matches('/'));
        for a in &mut argv {
            if let Some(pos) = a.find(&prefix) {
                let rest = a[pos + prefix.len()..].to_string();
                *a = format!("{}{}", &a[..pos], local.join(rest).display());
            }
        }
    }
    Ok((argv, Some(dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> ValidateArgs {
        ValidateArgs {
            manifests: None,
            trust_domain: None,
            spiffe_id: None,
            rules: None,
            args: list.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn lines(r: &Report) -> String {
        r.0.iter().map(|f| format!("{f}\n")).collect()
    }

    #[test]
    fn an_unknown_flag_is_one_error_line() {
        let r = validate("principal", &args(&["--no-such-flag"]), SystemTime::now());
        assert_eq!(r.errors(), 1, "{}", lines(&r));
        assert!(
            lines(&r).starts_with("ERROR flags: unexpected argument '--no-such-flag'"),
            "{}",
            lines(&r)
        );
    }

    #[test]
    fn bad_rules_and_bad_settings_are_errors_with_reasons() {
        let r = validate(
            "principal",
            &args(&[
                "--identity-rule",
                "template:spiffe://{trust_domain}/x/{a}=>{b}",
            ]),
            SystemTime::now(),
        );
        let l = lines(&r);
        assert!(l.contains("ERROR rules:"), "{l}");
        let r = validate(
            "principal",
            &args(&[
                "--enable-self-cluster-registration",
                "--spiffe-endpoint-socket",
                "unix:///spire.sock",
            ]),
            SystemTime::now(),
        );
        let l = lines(&r);
        assert!(l.contains("ERROR configuration: --enable-self-cluster-registration needs --enable-resource-proxy"), "{l}");
        assert!(
            l.contains("WARN  rules: none; every agent is refused"),
            "{l}"
        );
    }

    #[test]
    fn env_reaches_the_flags_that_read_it() {
        let env = BTreeMap::from([
            (
                "ARGOCD_PRINCIPAL_LISTEN_PORT".to_string(),
                "9443".to_string(),
            ),
            ("ARGOCD_PRINCIPAL_HA".to_string(), "true".to_string()),
            (
                "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE".to_string(),
                "false".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ]);
        let flags = env_as_flags("principal", &env, &[]).unwrap();
        assert!(
            flags.contains(&"--listen-port=9443".to_string()),
            "{flags:?}"
        );
        assert!(flags.contains(&"--ha".to_string()), "{flags:?}");
        assert_eq!(flags.len(), 2, "{flags:?}");
    }

    fn manifests(dir: &Path, name: &str, text: &str) -> ValidateArgs {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        ValidateArgs {
            manifests: Some(path),
            ..args(&[])
        }
    }

    /// A principal Deployment whose args set --listen-host while its params ConfigMap sets
    /// principal.listen.host too (the Istio and Linkerd overlays): the args win.
    const MESH_PRINCIPAL: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: argocd-agent-params}
data: {principal.listen.host: "0.0.0.0", principal.auth: spiffe}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: argocd-agent-principal}
spec:
  template:
    spec:
      containers:
        - name: argocd-agent
          args: [principal, --auth=header:istio, --listen-host=127.0.0.1]
          env:
            - name: ARGOCD_PRINCIPAL_LISTEN_HOST
              valueFrom: {configMapKeyRef: {name: argocd-agent-params, key: principal.listen.host, optional: true}}
            - name: ARGOCD_PRINCIPAL_AUTH
              valueFrom: {configMapKeyRef: {name: argocd-agent-params, key: principal.auth, optional: true}}
"#;

    #[test]
    fn manifest_args_win_over_the_environment_they_also_set() {
        let dir = tempfile::tempdir().unwrap();
        let r = validate(
            "principal",
            &manifests(dir.path(), "m.yaml", MESH_PRINCIPAL),
            SystemTime::now(),
        );
        assert_eq!(r.errors(), 0, "{}", lines(&r));
        assert!(
            lines(&r).contains("OK    auth: header:istio"),
            "{}",
            lines(&r)
        );
        // A directory of rendered files is read as one stream.
        let sub = dir.path().join("rendered/templates");
        std::fs::create_dir_all(&sub).unwrap();
        let (cm, deploy) = MESH_PRINCIPAL.split_once("---").unwrap();
        std::fs::write(sub.join("a.yaml"), cm).unwrap();
        std::fs::write(sub.join("b.yml"), deploy).unwrap();
        let r = validate(
            "principal",
            &ValidateArgs {
                manifests: Some(dir.path().join("rendered")),
                ..args(&[])
            },
            SystemTime::now(),
        );
        assert_eq!(r.errors(), 0, "{}", lines(&r));
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let r = validate(
            "principal",
            &ValidateArgs {
                manifests: Some(empty),
                ..args(&[])
            },
            SystemTime::now(),
        );
        assert!(
            lines(&r).contains("no kustomization and no .yaml/.yml file"),
            "{}",
            lines(&r)
        );
    }

    #[test]
    fn what_the_binary_refuses_before_starting_is_an_error_naming_the_flag() {
        let agent = |list: &[&str]| {
            let mut all = vec!["--server-address", "hub.example.org"];
            all.extend_from_slice(list);
            lines(&validate("agent", &args(&all), SystemTime::now()))
        };
        let socket = ["--spiffe-endpoint-socket", "unix:///spire.sock"];
        let l = agent(&socket);
        assert!(
            l.contains("ERROR configuration: refusing to connect without pinning the principal: set --principal-spiffe-id"),
            "{l}"
        );
        let l = agent(&["--principal-spiffe-id", "spiffe://hub/p"]);
        assert!(
            l.contains("ERROR configuration: no SVID source: set --spiffe-endpoint-socket"),
            "{l}"
        );
        let mut ok = socket.to_vec();
        ok.extend(["--principal-spiffe-id", "spiffe://hub/p"]);
        assert!(!agent(&ok).contains("ERROR"), "{}", agent(&ok));
        let r = validate("agent", &args(&socket), SystemTime::now());
        assert_eq!(
            lines(&r),
            "ERROR flags: the following required arguments were not provided: --server-address <SERVER_ADDRESS>\n"
        );
    }
}
