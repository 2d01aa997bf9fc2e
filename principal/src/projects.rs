//! AppProject rules, without side effects: which managed agents a hub project goes to and
//! what their copy looks like, what an autonomous agent's project becomes on the hub, and
//! which project a repository secret belongs to.
//!
//! Matching follows upstream argocd-agent: a project goes to a managed agent when one of its
//! `.spec.destinations` names the agent (`name` glob, or a `server` URL whose `agentName`
//! query parameter is a glob matching the agent, or `server: "*"` without a name), no
//! `!`-prefixed destination name matches it, and (with namespace-based mapping) one of its
//! `.spec.sourceNamespaces` globs matches the agent's hub namespace. The `default` project
//! goes to every managed agent.

use argocd_agent_domain::{AgentName, Namespace};
use base64::Engine;
use serde_json::{Map, Value, json};

/// Name of Argo CD's built-in project, propagated to every managed agent.
pub const DEFAULT_PROJECT: &str = "default";
/// Destination an agent's copy of a project points at: the spoke's own cluster.
const IN_CLUSTER_NAME: &str = "in-cluster";
const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// Role policy resources whose object field names `<project>/<application>`.
const APP_SCOPED_RESOURCES: [&str; 4] = ["applications", "applicationsets", "logs", "exec"];

/// Compiled globs: every agent is matched against the same few project patterns on each
/// project change, so each pattern is compiled once (bounded; cleared when full).
static GLOBS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, Option<regex::Regex>>>,
> = std::sync::LazyLock::new(Default::default);
const MAX_CACHED_GLOBS: usize = 4096;

/// Shell glob over the whole string (`*`, `?`, `[a-z]`, `{a,b}`), as Argo CD matches
/// destination names (`util/glob`). A pattern without glob syntax is compared as a string:
/// most destinations name one cluster, and a fleet has more of those than a regex cache
/// holds. A glob's regex is compiled once and matched outside the cache's lock.
pub fn glob_match(pattern: &str, s: &str) -> bool {
    if argocd_agent_domain::pattern::is_literal(pattern) {
        return pattern == s;
    }
    let re = {
        let mut cache = GLOBS.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED_GLOBS && !cache.contains_key(pattern) {
            cache.clear();
        }
        cache
            .entry(pattern.to_owned())
            .or_insert_with(|| argocd_agent_domain::pattern::compile_glob(pattern).ok())
            .clone()
    };
    re.is_some_and(|r| r.is_match(s))
}

fn destinations(spec: &Value) -> impl Iterator<Item = &Map<String, Value>> {
    spec.get("destinations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn str_field<'a>(m: &'a Map<String, Value>, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Whether one destination (not a deny pattern) points at `agent`.
fn destination_matches(dst: &Map<String, Value>, agent: &str) -> bool {
    let name = str_field(dst, "name");
    if !name.is_empty() {
        return !name.starts_with('!') && glob_match(name, agent);
    }
    let server = str_field(dst, "server");
    if server == "*" {
        return true;
    }
    url::Url::parse(server).is_ok_and(|u| {
        u.query_pairs()
            .any(|(k, v)| k == "agentName" && !v.is_empty() && glob_match(&v, agent))
    })
}

fn denied(dst: &Map<String, Value>, agent: &str) -> bool {
    str_field(dst, "name")
        .strip_prefix('!')
        .is_some_and(|p| glob_match(p, agent))
}

/// Whether the hub project `project` (a whole object as JSON) goes to the managed agent
/// `agent` whose hub namespace is `namespace`. `by_namespace`: agents are mapped by
/// namespace (the default), so `.spec.sourceNamespaces` must match too.
pub fn matches_agent(
    project: &Value,
    agent: &AgentName,
    namespace: &Namespace,
    by_namespace: bool,
) -> bool {
    if project.pointer("/metadata/name").and_then(Value::as_str) == Some(DEFAULT_PROJECT) {
        return true;
    }
    let spec = project.get("spec").unwrap_or(&Value::Null);
    let agent = agent.as_str();
    if destinations(spec).any(|d| denied(d, agent)) {
        return false;
    }
    if !destinations(spec).any(|d| destination_matches(d, agent)) {
        return false;
    }
    !by_namespace
        || spec
            .get("sourceNamespaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|p| glob_match(p, namespace.as_str()))
}

/// The managed agent's copy of a hub project: only the destinations that point at the
/// agent, rewritten to the spoke's own cluster (namespaces kept); `sourceNamespaces`
/// dropped (with namespace-based mapping they only route on the hub) and `roles` dropped
/// (the hub's RBAC, meaningless on the spoke).
pub fn spoke_copy(project: &Value, agent: &AgentName, by_namespace: bool) -> Value {
    let mut out = project.clone();
    let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) else {
        return out;
    };
    let kept: Vec<Value> = spec
        .get("destinations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .filter(|d| destination_matches(d, agent.as_str()))
        .map(|d| {
            let mut d = d.clone();
            d.insert("name".into(), json!(IN_CLUSTER_NAME));
            d.insert("server".into(), json!(IN_CLUSTER_SERVER));
            Value::Object(d)
        })
        .collect();
    if spec.contains_key("destinations") {
        spec.insert("destinations".into(), Value::Array(kept));
    }
    if by_namespace {
        spec.remove("sourceNamespaces");
    }
    spec.remove("roles");
    out
}

/// Name on the hub of the autonomous agent `agent`'s project `project`.
pub fn hub_name(agent: &AgentName, project: &str) -> String {
    format!("{agent}-{project}")
}

/// The project an autonomous agent's Application refers to on the hub.
pub fn hub_project_ref(agent: &AgentName, project: &str) -> String {
    hub_name(
        agent,
        if project.is_empty() {
            DEFAULT_PROJECT
        } else {
            project
        },
    )
}

/// The spoke's project name for a hub project reference of the autonomous agent `agent`
/// (the inverse of [`hub_project_ref`]); other names are returned unchanged.
pub fn spoke_project_ref<'a>(agent: &AgentName, hub_project: &'a str) -> &'a str {
    hub_project
        .strip_prefix(agent.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|rest| !rest.is_empty())
        .unwrap_or(hub_project)
}

/// The hub copy of an autonomous agent's project: renamed `<agent>-<project>`, every
/// destination pinned to the agent (`name: <agent>`, `server: "*"`, namespace kept),
/// `sourceNamespaces: [<agent namespace>]`, and role policies rewritten to the new name.
pub fn hub_copy(project: &Value, agent: &AgentName, namespace: &Namespace) -> Value {
    let name = project
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut out = project.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("name".into(), json!(hub_name(agent, &name)));
    }
    let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) else {
        return out;
    };
    if let Some(dsts) = spec.get_mut("destinations").and_then(Value::as_array_mut) {
        for d in dsts.iter_mut().filter_map(Value::as_object_mut) {
            d.insert("name".into(), json!(agent.as_str()));
            d.insert("server".into(), json!("*"));
        }
    }
    spec.insert("sourceNamespaces".into(), json!([namespace.as_str()]));
    if let Some(roles) = spec.get_mut("roles").and_then(Value::as_array_mut) {
        for role in roles.iter_mut() {
            if let Some(policies) = role.get_mut("policies").and_then(Value::as_array_mut) {
                for p in policies.iter_mut() {
                    if let Some(line) = p.as_str() {
                        *p = json!(rewrite_policy(line, &name, agent, namespace));
                    }
                }
            }
        }
    }
    out
}

/// Rewrites one Casbin policy line of project `project` for its hub copy:
/// `p, proj:<project>:<role>, <resource>, <action>, <project>/<app>, <effect>` becomes
/// `p, proj:<agent>-<project>:<role>, <resource>, <action>, <agent>-<project>/<ns>/<app>, <effect>`.
/// The object is rewritten only for application-scoped resources; other lines keep it.
pub fn rewrite_policy(
    line: &str,
    project: &str,
    agent: &AgentName,
    namespace: &Namespace,
) -> String {
    let mut fields: Vec<String> = line.split(',').map(|f| f.trim().to_owned()).collect();
    if fields.len() < 6 || fields[0] != "p" {
        return line.to_owned();
    }
    let new_project = hub_name(agent, project);
    if let Some(role) = fields[1]
        .strip_prefix("proj:")
        .and_then(|r| r.strip_prefix(project))
        .and_then(|r| r.strip_prefix(':'))
    {
        fields[1] = format!("proj:{new_project}:{role}");
    }
    if APP_SCOPED_RESOURCES.contains(&fields[2].as_str())
        && let Some(app) = fields[4]
            .strip_prefix(project)
            .and_then(|r| r.strip_prefix('/'))
    {
        fields[4] = format!("{new_project}/{namespace}/{app}");
    }
    fields.join(", ")
}

/// The project a repository secret is scoped to: `data.project` (base64, as the API server
/// stores it) or `stringData.project`. `None` for unscoped repositories, which stay on the hub.
pub fn repository_project(secret: &Value) -> Option<String> {
    if let Some(p) = secret
        .pointer("/stringData/project")
        .and_then(Value::as_str)
    {
        return Some(p.to_owned()).filter(|p| !p.is_empty());
    }
    let encoded = secret.pointer("/data/project").and_then(Value::as_str)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok().filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }
    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    fn project(name: &str, spec: Value) -> Value {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
               "metadata": {"name": name, "namespace": "argocd"}, "spec": spec})
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("agent-*", "agent-a"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("edge-?", "edge-1"));
        assert!(!glob_match("edge-?", "edge-12"));
        assert!(!glob_match("agent", "agent-a"));
        assert!(glob_match("a.b", "a.b") && !glob_match("a.b", "axb"));
        // Argo CD's glob (gobwas) also reads classes and alternatives.
        assert!(glob_match("edge-[0-9]", "edge-7") && !glob_match("edge-[0-9]", "edge-x"));
        assert!(
            glob_match("{prod,stage}-*", "stage-eu") && !glob_match("{prod,stage}-*", "dev-eu")
        );
        // Literal names never touch the regex cache: 10,000 of them leave it empty.
        let before = GLOBS.lock().unwrap().len();
        for i in 0..10_000 {
            assert!(glob_match(&format!("agent-{i}"), &format!("agent-{i}")));
        }
        assert!(
            GLOBS.lock().unwrap().len() <= before + 4,
            "literals are not cached"
        );
    }

    #[test]
    fn projects_match_by_destination_name_server_query_and_source_namespace() {
        let p = project(
            "team",
            json!({"sourceNamespaces": ["agent-*"],
                   "destinations": [{"name": "agent-*", "namespace": "guestbook", "server": "*"}]}),
        );
        assert!(matches_agent(&p, &agent("agent-a"), &ns("agent-a"), true));
        assert!(!matches_agent(&p, &agent("other"), &ns("other"), true));
        // The name matches but the hub namespace does not.
        assert!(!matches_agent(&p, &agent("agent-a"), &ns("hub-a"), true));
        // Destination-based mapping does not consult sourceNamespaces.
        assert!(matches_agent(&p, &agent("agent-a"), &ns("hub-a"), false));

        let by_server = project(
            "s",
            json!({"sourceNamespaces": ["*"],
                   "destinations": [{"server": "https://proxy:9090?agentName=edge-*", "namespace": "*"}]}),
        );
        assert!(matches_agent(
            &by_server,
            &agent("edge-1"),
            &ns("edge-1"),
            true
        ));
        assert!(!matches_agent(
            &by_server,
            &agent("core-1"),
            &ns("core-1"),
            true
        ));
    }

    #[test]
    fn deny_patterns_win_over_matches() {
        let p = project(
            "team",
            json!({"sourceNamespaces": ["*"],
                   "destinations": [{"name": "*", "namespace": "*"}, {"name": "!dev-*"}]}),
        );
        assert!(matches_agent(&p, &agent("prod-1"), &ns("prod-1"), true));
        assert!(!matches_agent(&p, &agent("dev-1"), &ns("dev-1"), true));
    }

    #[test]
    fn the_default_project_goes_everywhere() {
        let p = project(
            "default",
            json!({"destinations": [{"server": "*", "namespace": "*"}]}),
        );
        assert!(matches_agent(&p, &agent("x"), &ns("y"), true));
    }

    #[test]
    fn spoke_copy_keeps_matching_destinations_in_cluster_and_drops_hub_fields() {
        let p = project(
            "team",
            json!({"sourceNamespaces": ["agent-*"], "sourceRepos": ["*"],
                   "roles": [{"name": "r", "policies": ["p, proj:team:r, applications, get, team/*, allow"]}],
                   "destinations": [{"name": "agent-*", "namespace": "guestbook", "server": "*"},
                                    {"name": "other", "namespace": "x", "server": "*"}]}),
        );
        let c = spoke_copy(&p, &agent("agent-a"), true);
        assert_eq!(
            c["spec"]["destinations"],
            json!([{"name": "in-cluster", "namespace": "guestbook", "server": "https://kubernetes.default.svc"}])
        );
        assert!(c["spec"].get("sourceNamespaces").is_none());
        assert!(c["spec"].get("roles").is_none());
        assert_eq!(c["spec"]["sourceRepos"], json!(["*"]));
        assert!(
            spoke_copy(&p, &agent("agent-a"), false)["spec"]
                .get("sourceNamespaces")
                .is_some()
        );
    }

    #[test]
    fn autonomous_projects_are_renamed_pinned_and_their_policies_rewritten() {
        let p = project(
            "my-project",
            json!({"sourceNamespaces": ["argocd"], "sourceRepos": ["*"],
                   "destinations": [{"name": "in-cluster", "namespace": "*", "server": "https://kubernetes.default.svc"},
                                    {"name": "another", "namespace": "specific-ns", "server": "https://x"}],
                   "roles": [{"name": "read-only", "policies": [
                       "p, proj:my-project:read-only, applications, get, my-project/*, allow",
                       "p, proj:my-project:read-only, repositories, get, my-project/*, allow",
                       "g, someone, proj:my-project:read-only"]}]}),
        );
        let h = hub_copy(&p, &agent("agent-prod"), &ns("agent-prod"));
        assert_eq!(h["metadata"]["name"], "agent-prod-my-project");
        assert_eq!(
            h["spec"]["destinations"],
            json!([{"name": "agent-prod", "namespace": "*", "server": "*"},
                   {"name": "agent-prod", "namespace": "specific-ns", "server": "*"}])
        );
        assert_eq!(h["spec"]["sourceNamespaces"], json!(["agent-prod"]));
        assert_eq!(
            h["spec"]["roles"][0]["policies"],
            json!([
                "p, proj:agent-prod-my-project:read-only, applications, get, agent-prod-my-project/agent-prod/*, allow",
                "p, proj:agent-prod-my-project:read-only, repositories, get, my-project/*, allow",
                "g, someone, proj:my-project:read-only"
            ])
        );
    }

    #[test]
    fn application_project_references_round_trip() {
        let a = agent("edge-1");
        assert_eq!(hub_project_ref(&a, "team"), "edge-1-team");
        assert_eq!(hub_project_ref(&a, ""), "edge-1-default");
        assert_eq!(spoke_project_ref(&a, "edge-1-team"), "team");
        assert_eq!(spoke_project_ref(&a, "team"), "team");
        assert_eq!(spoke_project_ref(&a, "edge-1-"), "edge-1-");
    }

    #[test]
    fn repository_project_is_read_from_data_or_string_data() {
        let s = json!({"data": {"project": "dGVhbQ==", "url": "eA=="}});
        assert_eq!(repository_project(&s).as_deref(), Some("team"));
        let s = json!({"stringData": {"project": "team"}});
        assert_eq!(repository_project(&s).as_deref(), Some("team"));
        assert_eq!(repository_project(&json!({"data": {"url": "eA=="}})), None);
        assert_eq!(
            repository_project(&json!({"data": {"project": "!!"}})),
            None
        );
    }
}
