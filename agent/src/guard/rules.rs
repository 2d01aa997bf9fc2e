//! The guard's rules over what the hub sends: Applications and sync operations are
//! checked, AppProjects are narrowed to the intersection of the hub's project and the
//! guard, repository Secrets are checked by URL, and the guard's own ConfigMap is never
//! written.

use argocd_agent_domain::pattern;
use argocd_agent_identity::text::quoted;
use serde_json::{Value, json};

use super::policy::{
    DestinationRule, GlobList, Guard, GuardSet, Refusal, RepositoryMode, normalize_repo,
};

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Every `repoURL` of an Application spec (`source`, `sources[]`, the source hydrator's
/// `drySource`) or a sync operation (`source`, `sources[]`).
fn repo_urls(spec: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    out.extend(str_at(spec, "/source/repoURL"));
    if let Some(sources) = spec.get("sources").and_then(Value::as_array) {
        out.extend(
            sources
                .iter()
                .map(|s| str_at(s, "/repoURL").unwrap_or_default()),
        );
    }
    out.extend(str_at(spec, "/sourceHydrator/drySource/repoURL"));
    out
}

impl GuardSet {
    fn each(&self) -> impl Iterator<Item = &Guard> {
        self.guards.iter().map(|g| g.as_ref())
    }

    /// An Application from the hub: its project, every source repository and its
    /// destination must be allowed by every guard source.
    pub fn check_application(&self, app: &Value) -> Result<(), Refusal> {
        let spec = app.get("spec").unwrap_or(&Value::Null);
        let project = str_at(spec, "/project")
            .filter(|p| !p.is_empty())
            .unwrap_or("default");
        for g in self.each() {
            g.check_project_name(project, "application's project")?;
            g.check_repos(&repo_urls(spec))?;
            g.check_destination(spec.get("destination").unwrap_or(&Value::Null))?;
        }
        Ok(())
    }

    /// A sync operation from the hub: a source it overrides must be an allowed repository.
    pub fn check_operation(&self, operation: &Value) -> Result<(), Refusal> {
        let sync = operation.get("sync").unwrap_or(&Value::Null);
        for g in self.each() {
            g.check_repos(&repo_urls(sync))?;
        }
        Ok(())
    }

    /// An AppProject from the hub, as written on the spoke: the intersection of the hub's
    /// project and every guard source; refused when its name is not allowed or it lacks
    /// required `destinationServiceAccounts`.
    pub fn shape_project(&self, project: &Value) -> Result<Value, Refusal> {
        let mut out = project.clone();
        let name = str_at(project, "/metadata/name").unwrap_or_default();
        for g in self.each() {
            g.check_project_name(name, "project")?;
            let spec = &mut out["spec"];
            if !spec.is_object() {
                *spec = json!({});
            }
            g.narrow_project(spec);
        }
        for g in self.each().filter(|g| g.require_service_accounts) {
            let has = out
                .pointer("/spec/destinationServiceAccounts")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if !has {
                return Err(Refusal {
                    rule: "destination-service-accounts",
                    message: format!(
                        "project {name} names no destinationServiceAccounts, which {} requires",
                        g.origin
                    ),
                });
            }
        }
        Ok(out)
    }

    /// A repository or repo-creds Secret from the hub: its `url` must be an allowed
    /// repository (a repo-creds URL is a prefix: it may also end where an allowed pattern
    /// continues with `/`), and no guard source may keep repositories local.
    pub fn check_repository(&self, secret: &Value) -> Result<(), Refusal> {
        let name = str_at(secret, "/metadata/name").unwrap_or_default();
        let url = secret_field(secret, "url");
        let template = str_at(secret, "/metadata/labels/argocd.argoproj.io~1secret-type")
            == Some("repo-creds");
        for g in self.each() {
            if g.repositories == RepositoryMode::LocalOnly {
                return Err(Refusal {
                    rule: "repositories",
                    message: format!(
                        "repository Secret {name}: {} keeps repository credentials local (repositories: local-only)",
                        g.origin
                    ),
                });
            }
            let Some(list) = &g.source_repos else {
                continue;
            };
            let Some(url) = &url else {
                return Err(Refusal {
                    rule: "source-repos",
                    message: format!("repository Secret {name} has no url"),
                });
            };
            let n = normalize_repo(url);
            if !(list.allows(&n) || template && list.allows(&format!("{n}/"))) {
                return Err(Refusal {
                    rule: "source-repos",
                    message: format!(
                        "repository Secret {name}: url {url} is not an allowed repository of {} ({})",
                        g.origin,
                        list.describe()
                    ),
                });
            }
        }
        Ok(())
    }

    /// A ConfigMap from the hub (only Argo CD's GPG keys are ever sent): never the guard's
    /// own ConfigMap, and under a guard nothing but [`super::policy::GPG_KEYS_CONFIGMAP`].
    pub fn check_configmap(&self, name: &str) -> Result<(), Refusal> {
        if self.configmap.as_deref() == Some(name) {
            return Err(Refusal {
                rule: "guard-configmap",
                message: format!(
                    "ConfigMap {name} is the spoke guard's own policy: the hub never writes it"
                ),
            });
        }
        if self.is_active() && name != super::policy::GPG_KEYS_CONFIGMAP {
            return Err(Refusal {
                rule: "guard-configmap",
                message: format!(
                    "ConfigMap {name} is not Argo CD's GPG keys ConfigMap ({}), the only one the hub may send",
                    super::policy::GPG_KEYS_CONFIGMAP
                ),
            });
        }
        Ok(())
    }
}

/// A Secret's string field from `stringData` or (base64) `data`.
fn secret_field(secret: &Value, key: &str) -> Option<String> {
    use base64::Engine;
    if let Some(v) = secret
        .get("stringData")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
    {
        return Some(v.to_owned());
    }
    let raw = secret.get("data")?.get(key)?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(raw).ok()?;
    String::from_utf8(bytes).ok()
}

impl Guard {
    fn check_project_name(&self, name: &str, what: &str) -> Result<(), Refusal> {
        match &self.projects {
            Some(list) if !list.allows(name) => Err(Refusal {
                rule: "projects",
                message: format!(
                    "{what} {name} is not an allowed project of {} ({})",
                    self.origin,
                    list.describe()
                ),
            }),
            _ => Ok(()),
        }
    }

    fn check_repos(&self, urls: &[&str]) -> Result<(), Refusal> {
        let Some(list) = &self.source_repos else {
            return Ok(());
        };
        match urls.iter().find(|u| !list.allows(&normalize_repo(u))) {
            Some(url) => Err(Refusal {
                rule: "source-repos",
                message: format!(
                    "source repository {url} is not an allowed repository of {} ({})",
                    self.origin,
                    list.describe(),
                    url = quoted(&url)
                ),
            }),
            None => Ok(()),
        }
    }

    fn check_destination(&self, dest: &Value) -> Result<(), Refusal> {
        let Some(rules) = &self.destinations else {
            return Ok(());
        };
        let field = |f: &str| {
            dest.get(f)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let (server, name) = (field("server"), field("name"));
        let namespace = field("namespace").unwrap_or_default();
        let fits = |r: &DestinationRule| {
            let matches = |rule: &Option<(String, regex::Regex)>, value: Option<&str>| match rule {
                None => true,
                Some((_, re)) => value.is_some_and(|v| re.is_match(v)),
            };
            matches(&r.server, server)
                && matches(&r.name, name)
                && matches(&r.namespace, Some(namespace))
        };
        if rules.iter().any(fits) {
            return Ok(());
        }
        Err(Refusal {
            rule: "destinations",
            message: format!(
                "destination server={} name={} namespace={namespace} is not an allowed destination of {} ({})",
                quoted(&server.unwrap_or_default()),
                quoted(&name.unwrap_or_default()),
                self.origin,
                rules
                    .iter()
                    .map(DestinationRule::describe)
                    .collect::<Vec<_>>()
                    .join("; "),
                namespace = quoted(&namespace)
            ),
        })
    }

    /// Narrows a project spec to this guard source.
    fn narrow_project(&self, spec: &mut Value) {
        if let Some(list) = &self.source_repos {
            let hub = string_list(spec.get("sourceRepos"));
            spec["sourceRepos"] = json!(narrow_repos(&hub, list));
        }
        if let Some(rules) = &self.destinations {
            let hub = spec
                .get("destinations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            spec["destinations"] = Value::Array(narrow_destinations(&hub, rules));
        }
        if !self.cluster_resources {
            spec["clusterResourceWhitelist"] = json!([]);
        }
        if let Some(accounts) = &self.service_accounts {
            spec["destinationServiceAccounts"] = Value::Array(accounts.clone());
        }
    }
}

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The hub's `sourceRepos` within the guard's: a literal URL stays if the guard allows it;
/// a hub glob (`*`, `https://github.com/*`) gives way to the guard's patterns it covers;
/// the hub's denials stay and the guard's are added. Every allow entry of the result is
/// allowed by the guard.
fn narrow_repos(hub: &[String], guard: &GlobList) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for entry in hub {
        if entry.starts_with('!') {
            push(entry.clone());
        } else if pattern::is_literal(entry) {
            if guard.allows(&normalize_repo(entry)) {
                push(entry.clone());
            }
        } else if let Ok(re) = pattern::compile_glob(&normalize_repo(entry)) {
            for p in guard.allow_patterns().filter(|p| re.is_match(p)) {
                push(p.to_owned());
            }
        }
    }
    for d in guard.deny_patterns() {
        push(format!("!{d}"));
    }
    out
}

/// The hub's destinations within the guard's rules: each hub entry meets each rule field by
/// field (the narrower of the two; no entry when they do not meet). Hub denials stay.
fn narrow_destinations(hub: &[Value], rules: &[DestinationRule]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for entry in hub {
        let field = |f: &str| {
            entry
                .get(f)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let denial = ["server", "name", "namespace"]
            .iter()
            .any(|f| field(f).is_some_and(|v| v.starts_with('!')));
        if denial {
            out.push(entry.clone());
            continue;
        }
        for r in rules {
            let met = (
                meet(field("server"), &r.server),
                meet(field("name"), &r.name),
                meet(field("namespace"), &r.namespace),
            );
            let (Some(server), Some(name), Some(namespace)) = met else {
                continue;
            };
            let mut d = entry.clone();
            for (k, v) in [("server", server), ("name", name), ("namespace", namespace)] {
                match v {
                    Some(v) => d[k] = Value::String(v),
                    None => {
                        if let Some(o) = d.as_object_mut() {
                            o.remove(k);
                        }
                    }
                }
            }
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// The narrower of a hub destination field and a guard glob: `Some(None)` is "no
/// constraint", `None` is "they do not meet".
fn meet(hub: Option<&str>, guard: &Option<(String, regex::Regex)>) -> Option<Option<String>> {
    let Some((text, re)) = guard else {
        return Some(hub.map(str::to_owned));
    };
    let Some(h) = hub else {
        return Some(Some(text.clone()));
    };
    if re.is_match(h) {
        return Some(Some(h.to_owned()));
    }
    let hub_re = pattern::compile_glob(h).ok()?;
    hub_re.is_match(text).then(|| Some(text.clone()))
}
