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
    /// Rendered manifests (`kubectl kustomize ...` output, `-` for standard input): the
    /// Deployment's container args and environment are checked, with `configMapKeyRef`s and
    /// files of ConfigMap volumes taken from ConfigMaps in the same stream.
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
    let mut tmp = None;
    let argv = match &a.manifests {
        Some(path) => match from_manifests(role, path) {
            Ok((argv, files, secrets)) => {
                r.1 = secrets;
                r.ok(format!(
                    "manifests: the {role} Deployment's args and environment ({} flags)",
                    argv.len()
                ));
                match materialize(&files, argv) {
                    Ok((argv, dir)) => {
                        tmp = dir;
                        argv
                    }
                    Err(e) => {
                        r.error(format!("manifests: {e}"));
                        return r;
                    }
                }
            }
            Err(e) => {
                r.error(format!("manifests: {e}"));
                return r;
            }
        },
        None => a.args.clone(),
    };
    let full = ["argocd-agent".to_string(), role.to_string()]
        .into_iter()
        .chain(argv);
    let cli = match crate::upstream::try_parse_from(full, &crate::upstream::process_env) {
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
    drop(tmp);
    r
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
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
        if principal_td.is_none() {
            r.warn("principal: neither --principal-spiffe-id nor --principal-trust-domain; any principal of the agent's own trust domain is accepted");
        }
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
                "rules: {} is agent {:?} in hub namespace {:?}, mode {} allowed (rule {:?})",
                id.as_str(),
                m.agent.as_str(),
                m.namespace.as_str(),
                ag.agent_mode,
                m.rule
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
        let socket = s
            .spiffe_endpoint_socket
            .clone()
            .unwrap_or_else(|| "SPIFFE_ENDPOINT_SOCKET (unset)".into());
        r.ok(format!(
            "svid: from the Workload API at {socket} (not checked offline)"
        ));
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
) -> Result<(), String> {
    let mut store = rustls::RootCertStore::empty();
    for c in roots {
        store
            .add(c.clone())
            .map_err(|e| format!("a bundle certificate: {e}"))?;
    }
    if store.is_empty() {
        return Err("no bundle for the SVID's trust domain".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|e| e.to_string())?;
    verifier
        .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The container args and environment of the `role` Deployment in a manifest stream, as
/// flags, and the ConfigMap volumes' files (mount path -> (file -> text)).
type Files = BTreeMap<String, BTreeMap<String, String>>;

/// Mount paths of Secret volumes (their files exist only in the cluster).
type SecretMounts = Vec<String>;

fn from_manifests(role: &str, path: &Path) -> Result<(Vec<String>, Files, SecretMounts), String> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("reading stdin: {e}"))?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?
    };
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let configmaps: BTreeMap<&str, &serde_json::Map<String, Value>> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| Some((d["metadata"]["name"].as_str()?, d["data"].as_object()?)))
        .collect();
    let container = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .filter_map(|d| {
            d["spec"]["template"]["spec"]["containers"][0]
                .as_object()
                .map(|c| (d, c))
        })
        .find(|(_, c)| c.get("args").and_then(|a| a.get(0)).and_then(Value::as_str) == Some(role))
        .ok_or_else(|| {
            format!(
                "no Deployment runs `argocd-agent {role}` in {}",
                path.display()
            )
        })?;
    let (deployment, c) = container;
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
                    return Err(format!(
                        "env {name}: ConfigMap {cm} key {key} is not in the manifests (and not optional)"
                    ));
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
    // $(VAR) in args is expanded by the kubelet from the container's env; unknown ones stay.
    for a in &mut argv {
        for (k, v) in &env {
            *a = a.replace(&format!("$({k})"), v);
        }
    }
    argv.extend(env_as_flags(role, &env)?);
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
        let cm = volumes
            .iter()
            .find(|v| v["name"] == vol)
            .and_then(|v| v["configMap"]["name"].as_str());
        if volumes
            .iter()
            .any(|v| v["name"] == vol && v.get("secret").is_some())
        {
            secrets.push(format!("{}/", mount.trim_end_matches('/')));
        }
        if let Some(data) = cm.and_then(|n| configmaps.get(n)) {
            let entries = data
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            files.insert(mount.to_string(), entries);
        }
    }
    Ok((argv, files, secrets))
}

/// Environment variables as the flags that read them (clap's own definitions say which);
/// variables no flag reads are ignored, as the binary ignores them.
fn env_as_flags(role: &str, env: &BTreeMap<String, String>) -> Result<Vec<String>, String> {
    // Upstream's variable names too (cli/src/upstream.rs), as the binary reads them.
    let cmd = crate::upstream::command(&|k| env.get(k).cloned());
    let sub = cmd
        .find_subcommand(role)
        .ok_or_else(|| format!("argocd-agent has no {role} subcommand"))?;
    let mut out = Vec::new();
    for arg in sub.get_arguments() {
        let Some(var) = arg.get_env().and_then(|v| v.to_str()) else {
            continue;
        };
        let (Some(value), Some(long)) = (env.get(var), arg.get_long()) else {
            continue;
        };
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
) -> Result<(Vec<String>, Option<tempfile::TempDir>), String> {
    if files.is_empty() {
        return Ok((argv, None));
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let mut argv = argv;
    for (i, (mount, entries)) in files.iter().enumerate() {
        let local = dir.path().join(i.to_string());
        std::fs::create_dir_all(&local).map_err(|e| e.to_string())?;
        for (name, text) in entries {
            std::fs::write(local.join(name), text).map_err(|e| e.to_string())?;
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
            &args(&["--enable-self-cluster-registration"]),
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
        let flags = env_as_flags("principal", &env).unwrap();
        assert!(
            flags.contains(&"--listen-port=9443".to_string()),
            "{flags:?}"
        );
        assert!(flags.contains(&"--ha".to_string()), "{flags:?}");
        assert_eq!(flags.len(), 2, "{flags:?}");
    }
}
