//! Kubernetes' Pod Security Standards, as pure functions over JSON objects, for what a
//! create or a patch through the resource proxy may make.
//!
//! The levels and their rules are those published at
//! <https://kubernetes.io/docs/concepts/security/pod-security-standards/> and implemented by
//! Pod Security admission (`k8s.io/pod-security-admission`, `policy/check_*.go`); each check
//! here carries the name of its upstream file. Fields are read with their exact (case
//! sensitive) names, as the API server decodes them; a value of the wrong type counts as a
//! violation rather than as unset.
//!
//! A pod spec is found wherever it sits: any JSON object holding a `containers`,
//! `initContainers` or `ephemeralContainers` list (a Pod's `spec`, `spec.template.spec`,
//! `spec.jobTemplate.spec.template.spec`, a custom resource's embedded pod spec). The pod's
//! metadata (for the AppArmor annotations) is the `metadata` beside the `spec` holding it.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

/// How deep an object is searched for pod specs; a deeper one is refused.
pub const MAX_DEPTH: usize = 64;

/// A Pod Security Standards level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// No restriction (the checks are off).
    Privileged,
    /// Known privilege escalations are refused (the default).
    #[default]
    Baseline,
    /// Baseline, and pods must follow current hardening practice.
    Restricted,
}

impl Level {
    /// The level's name, as Pod Security admission spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod security level that is none of `privileged`, `baseline` and `restricted`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod security level {}: expected privileged, baseline or restricted",
    argocd_agent_identity::text::quoted(.0)
)]
pub struct LevelError(pub String);

/// Why an object is refused by the pod security rules; the Display text reaches kubectl
/// users in a Kubernetes Status message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PssError {
    /// The object is nested deeper than [`MAX_DEPTH`].
    #[error("the object is nested too deeply to be checked")]
    TooDeep,
    /// The object breaks the level (the message is [`refusal`]).
    #[error("{}", refusal(*.level, .found))]
    Refused {
        /// The level checked.
        level: Level,
        /// What breaks it (not empty).
        found: Vec<Violation>,
    },
}

impl FromStr for Level {
    type Err = LevelError;

    fn from_str(s: &str) -> Result<Level, LevelError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            other => Err(LevelError(other.to_owned())),
        }
    }
}

/// One field that breaks a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The upstream check's name (`privileged`, `hostNamespaces`, ...).
    pub check: &'static str,
    /// Where, from the object's root: `spec.containers[0].securityContext.privileged`.
    pub field: String,
    /// What is wrong with it: `is true`, `adds "SYS_ADMIN"`, `must be false`.
    pub detail: String,
    /// The same place relative to its pod spec, containers and volumes by name: two objects
    /// (an owner and the object made from it, an object before and after a patch) break a
    /// check in the same way when their keys are equal.
    pub key: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} (check {})", self.field, self.detail, self.check)
    }
}

/// A pod spec inside an object.
#[derive(Debug, Clone, Copy)]
pub struct Pod<'a> {
    /// The pod spec.
    pub spec: &'a Map<String, Value>,
    /// The pod's metadata (`Value::Null` when there is none beside the spec).
    pub metadata: &'a Value,
    /// Where the spec sits, e.g. `spec.template.spec`.
    pub at: &'a str,
}

/// One container of a pod spec.
struct Container<'a> {
    /// `spec.containers[0]`.
    field: String,
    /// `containers[web]` (by name; by index when it has none).
    key: String,
    c: &'a Value,
}

/// A place in a pod: its path for messages and its key for comparisons.
struct Place {
    field: String,
    key: String,
}

impl Place {
    fn pod(pod: &Pod, rest: &str) -> Place {
        Place {
            field: join(pod.at, rest),
            key: rest.to_owned(),
        }
    }

    fn container(c: &Container, rest: &str) -> Place {
        Place {
            field: format!("{}.{rest}", c.field),
            key: format!("{}.{rest}", c.key),
        }
    }

    fn violation(self, check: &'static str, detail: impl Into<String>) -> Violation {
        let detail = detail.into();
        Violation {
            key: format!("{check} {} {detail}", self.key),
            check,
            field: self.field,
            detail,
        }
    }
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}.{b}")
    }
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .filter(|v| !v.is_null())
}

/// Set to anything but `false` (a boolean field of another type counts as set).
fn truthy(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn quoted(v: &Value) -> String {
    argocd_agent_identity::text::quoted(&text(v)).to_string()
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn containers<'a>(pod: &Pod<'a>) -> Vec<Container<'a>> {
    let mut out = Vec::new();
    for list in CONTAINER_LISTS {
        let Some(items) = pod.spec.get(list).and_then(Value::as_array) else {
            continue;
        };
        for (i, c) in items.iter().enumerate() {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            let key = if name.is_empty() {
                format!("{list}[{i}]")
            } else {
                format!("{list}[{name}]")
            };
            out.push(Container {
                field: join(pod.at, &format!("{list}[{i}]")),
                key,
                c,
            });
        }
    }
    out
}

fn spec_value<'a>(pod: &Pod<'a>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    at(pod.spec.get(*first)?, rest)
}

/// `(place, volume)` for each entry of `spec.volumes`.
fn volumes<'a>(pod: &Pod<'a>) -> Vec<(String, String, &'a Value)> {
    let items = pod.spec.get("volumes").and_then(Value::as_array);
    items
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
            (format!("volumes[{i}]"), format!("volumes[{name}]"), v)
        })
        .collect()
}

/// Whether the pod declares itself a Windows pod (`spec.os.name: windows`), which the
/// restricted checks for Linux-only fields leave out (since Kubernetes 1.25).
fn windows(pod: &Pod) -> bool {
    spec_value(pod, &["os", "name"]).and_then(Value::as_str) == Some("windows")
}

/// `check_hostNamespaces.go` (baseline): `hostNetwork`, `hostPID`, `hostIPC` unset or
/// false.
pub fn host_namespaces(pod: &Pod) -> Vec<Violation> {
    ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|f| truthy(pod.spec.get(*f)))
        .map(|f| Place::pod(pod, f).violation("hostNamespaces", "is true"))
        .collect()
}

/// `check_privileged.go` (baseline): no container sets `securityContext.privileged`.
pub fn privileged(pod: &Pod) -> Vec<Violation> {
    containers(pod)
        .iter()
        .filter(|c| truthy(at(c.c, &["securityContext", "privileged"])))
        .map(|c| {
            Place::container(c, "securityContext.privileged").violation("privileged", "is true")
        })
        .collect()
}

/// Capabilities a baseline container may add (`check_capabilities_baseline.go`).
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The added capabilities of a container outside `allowed` (a malformed `add` counts).
fn added_outside(c: &Container, allowed: &[&str], check: &'static str, out: &mut Vec<Violation>) {
    let place = || Place::container(c, "securityContext.capabilities.add");
    match at(c.c, &["securityContext", "capabilities", "add"]) {
        None => {}
        Some(Value::Array(caps)) => {
            for cap in caps {
                if !cap.as_str().is_some_and(|s| allowed.contains(&s)) {
                    out.push(place().violation(check, format!("adds {}", quoted(cap))));
                }
            }
        }
        Some(other) => out.push(place().violation(check, format!("is {other}"))),
    }
}

/// `check_capabilities_baseline.go` (baseline): containers add only capabilities of
/// [`BASELINE_CAPABILITIES`].
pub fn capabilities_baseline(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in containers(pod) {
        added_outside(&c, BASELINE_CAPABILITIES, "capabilities_baseline", &mut out);
    }
    out
}

/// `check_hostPathVolumes.go` (baseline): no `hostPath` volume.
pub fn host_path_volumes(pod: &Pod) -> Vec<Violation> {
    volumes(pod)
        .into_iter()
        .filter_map(|(field, key, v)| {
            let host = at(v, &["hostPath"])?;
            let path = host.get("path").map_or_else(|| host.to_string(), text);
            let place = Place {
                field: join(pod.at, &format!("{field}.hostPath")),
                key: format!("{key}.hostPath"),
            };
            Some(place.violation(
                "hostPathVolumes",
                format!(
                    "is set (path {path})",
                    path = argocd_agent_identity::text::quoted(&path)
                ),
            ))
        })
        .collect()
}

/// `check_hostPorts.go` (baseline): no container port sets a `hostPort` other than 0.
pub fn host_ports(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in containers(pod) {
        let ports = c.c.get("ports").and_then(Value::as_array);
        for (i, p) in ports
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let Some(hp) = at(p, &["hostPort"]).filter(|v| v.as_i64() != Some(0)) else {
                continue;
            };
            let place = Place::container(&c, &format!("ports[{i}].hostPort"));
            out.push(place.violation("hostPorts", format!("is {hp}")));
        }
    }
    out
}

/// The pod's and each container's `securityContext` with their places.
fn security_contexts<'a>(pod: &Pod<'a>) -> Vec<(Place, &'a Value)> {
    let mut out = Vec::new();
    if let Some(sc) = spec_value(pod, &["securityContext"]) {
        out.push((Place::pod(pod, "securityContext"), sc));
    }
    for c in containers(pod) {
        if let Some(sc) = at(c.c, &["securityContext"]) {
            out.push((Place::container(&c, "securityContext"), sc));
        }
    }
    out
}

fn sub(place: &Place, rest: &str) -> Place {
    Place {
        field: format!("{}.{rest}", place.field),
        key: format!("{}.{rest}", place.key),
    }
}

/// Annotation prefix of the AppArmor profiles before Kubernetes 1.30.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// `check_appArmorProfile.go` (baseline): `appArmorProfile.type` of the pod and its
/// containers unset, `RuntimeDefault` or `Localhost`; the annotations
/// `container.apparmor.security.beta.kubernetes.io/*` empty, `runtime/default` or
/// `localhost/*`.
pub fn app_armor_profile(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for (place, sc) in security_contexts(pod) {
        if let Some(profile) = at(sc, &["appArmorProfile"]) {
            let ty = profile.get("type").unwrap_or(&Value::Null);
            if !matches!(ty.as_str(), Some("RuntimeDefault" | "Localhost")) {
                let detail = format!("is {}", quoted(ty));
                out.push(sub(&place, "appArmorProfile.type").violation("appArmorProfile", detail));
            }
        }
    }
    let annotations = at(pod.metadata, &["annotations"]).and_then(Value::as_object);
    for (k, v) in annotations.into_iter().flatten() {
        let Some(container) = k.strip_prefix(APPARMOR_ANNOTATION_PREFIX) else {
            continue;
        };
        let value = v.as_str();
        let fine = value
            .is_some_and(|s| s.is_empty() || s == "runtime/default" || s.starts_with("localhost/"));
        if !fine {
            let at = pod.at.strip_suffix("spec").unwrap_or_default();
            let place = Place {
                field: format!(
                    "{at}metadata.annotations[{k}]",
                    k = argocd_agent_identity::text::quoted(&k)
                ),
                key: format!("annotations[{container}]"),
            };
            out.push(place.violation("appArmorProfile", format!("is {}", quoted(v))));
        }
    }
    out
}

/// SELinux types a baseline pod may set (`check_seLinuxOptions.go`).
pub const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// `check_seLinuxOptions.go` (baseline): `seLinuxOptions.type` of the pod and its
/// containers one of [`SELINUX_TYPES`]; `user` and `role` unset.
pub fn se_linux_options(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for (place, sc) in security_contexts(pod) {
        let Some(opts) = at(sc, &["seLinuxOptions"]) else {
            continue;
        };
        if let Some(ty) = at(opts, &["type"])
            && !ty.as_str().is_some_and(|t| SELINUX_TYPES.contains(&t))
        {
            let detail = format!("is {}", quoted(ty));
            out.push(sub(&place, "seLinuxOptions.type").violation("seLinuxOptions", detail));
        }
        for f in ["user", "role"] {
            if let Some(v) = at(opts, &[f]).filter(|v| v.as_str() != Some("")) {
                let detail = format!("is {}", quoted(v));
                let place = sub(&place, &format!("seLinuxOptions.{f}"));
                out.push(place.violation("seLinuxOptions", detail));
            }
        }
        if !opts.is_object() {
            out.push(sub(&place, "seLinuxOptions").violation("seLinuxOptions", "is not an object"));
        }
    }
    out
}

/// `check_procMount.go` (baseline): containers' `securityContext.procMount` unset or
/// `Default`. (Newer policy versions allow `Unmasked` in pods with their own user
/// namespace; this check does not.)
pub fn proc_mount(pod: &Pod) -> Vec<Violation> {
    containers(pod)
        .iter()
        .filter_map(|c| {
            let pm = at(c.c, &["securityContext", "procMount"])?;
            (pm.as_str() != Some("Default")).then(|| {
                Place::container(c, "securityContext.procMount")
                    .violation("procMount", format!("is {}", quoted(pm)))
            })
        })
        .collect()
}

fn valid_seccomp(profile: &Value) -> bool {
    matches!(
        profile.get("type").and_then(Value::as_str),
        Some("RuntimeDefault" | "Localhost")
    )
}

/// `check_seccompProfile_baseline.go` (baseline): a `seccompProfile` set on the pod or a
/// container has type `RuntimeDefault` or `Localhost` (not `Unconfined`).
pub fn seccomp_profile_baseline(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for (place, sc) in security_contexts(pod) {
        if let Some(profile) = at(sc, &["seccompProfile"])
            && !valid_seccomp(profile)
        {
            let ty = profile.get("type").unwrap_or(&Value::Null);
            let detail = format!("is {}", quoted(ty));
            let place = sub(&place, "seccompProfile.type");
            out.push(place.violation("seccompProfile_baseline", detail));
        }
    }
    out
}

/// Sysctls in Kubernetes' safe set (`check_sysctls.go`, policy version 1.32).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// `check_sysctls.go` (baseline): `securityContext.sysctls` only of [`SAFE_SYSCTLS`].
pub fn sysctls(pod: &Pod) -> Vec<Violation> {
    let Some(list) = spec_value(pod, &["securityContext", "sysctls"]) else {
        return Vec::new();
    };
    let Some(items) = list.as_array() else {
        let place = Place::pod(pod, "securityContext.sysctls");
        return vec![place.violation("sysctls", "is not a list")];
    };
    items
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let name = s.get("name").unwrap_or(&Value::Null);
            if name.as_str().is_some_and(|n| SAFE_SYSCTLS.contains(&n)) {
                return None;
            }
            let place = Place {
                field: join(pod.at, &format!("securityContext.sysctls[{i}].name")),
                key: format!("securityContext.sysctls[{}]", text(name)),
            };
            Some(place.violation(
                "sysctls",
                format!("is {} (not a safe sysctl)", quoted(name)),
            ))
        })
        .collect()
}

/// `check_windowsHostProcess.go` (baseline): `windowsOptions.hostProcess` of the pod and
/// its containers unset or false.
pub fn windows_host_process(pod: &Pod) -> Vec<Violation> {
    security_contexts(pod)
        .into_iter()
        .filter(|(_, sc)| truthy(at(sc, &["windowsOptions", "hostProcess"])))
        .map(|(place, _)| {
            sub(&place, "windowsOptions.hostProcess").violation("windowsHostProcess", "is true")
        })
        .collect()
}

/// Volume types a restricted pod may use (`check_restrictedVolumes.go`).
pub const RESTRICTED_VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// `check_restrictedVolumes.go` (restricted): volumes only of
/// [`RESTRICTED_VOLUME_TYPES`] (any other key of a volume but `name` counts).
pub fn restricted_volumes(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    for (field, key, v) in volumes(pod) {
        let Some(map) = v.as_object() else {
            let place = Place {
                field: join(pod.at, &field),
                key,
            };
            out.push(place.violation("restrictedVolumes", "is not an object"));
            continue;
        };
        for (ty, value) in map {
            if ty == "name" || value.is_null() || RESTRICTED_VOLUME_TYPES.contains(&ty.as_str()) {
                continue;
            }
            let place = Place {
                field: join(pod.at, &format!("{field}.{ty}")),
                key: format!("{key}.{ty}"),
            };
            out.push(place.violation(
                "restrictedVolumes",
                "is not a volume type restricted pods may use",
            ));
        }
    }
    out
}

/// `check_allowPrivilegeEscalation.go` (restricted): every container sets
/// `securityContext.allowPrivilegeEscalation: false` (not for Windows pods).
pub fn allow_privilege_escalation(pod: &Pod) -> Vec<Violation> {
    if windows(pod) {
        return Vec::new();
    }
    containers(pod)
        .iter()
        .filter(|c| {
            at(c.c, &["securityContext", "allowPrivilegeEscalation"]) != Some(&Value::Bool(false))
        })
        .map(|c| {
            Place::container(c, "securityContext.allowPrivilegeEscalation")
                .violation("allowPrivilegeEscalation", "must be false")
        })
        .collect()
}

/// `check_runAsNonRoot.go` (restricted): `runAsNonRoot: true` on the pod or on every
/// container, and `false` nowhere.
pub fn run_as_non_root(pod: &Pod) -> Vec<Violation> {
    let mut out = Vec::new();
    let pod_level = spec_value(pod, &["securityContext", "runAsNonRoot"]);
    if pod_level.is_some_and(|v| v != &Value::Bool(true)) {
        let place = Place::pod(pod, "securityContext.runAsNonRoot");
        out.push(place.violation("runAsNonRoot", "must not be false"));
    }
    let pod_true = pod_level == Some(&Value::Bool(true));
    for c in containers(pod) {
        let place = Place::container(&c, "securityContext.runAsNonRoot");
        match at(c.c, &["securityContext", "runAsNonRoot"]) {
            Some(Value::Bool(true)) => {}
            None if pod_true => {}
            None => out.push(place.violation("runAsNonRoot", "must be true (here or on the pod)")),
            Some(_) => out.push(place.violation("runAsNonRoot", "must not be false")),
        }
    }
    out
}

/// `check_runAsUser.go` (restricted): `runAsUser` of the pod and its containers is not 0.
pub fn run_as_user(pod: &Pod) -> Vec<Violation> {
    security_contexts(pod)
        .into_iter()
        .filter_map(|(place, sc)| {
            let uid = at(sc, &["runAsUser"])?;
            (uid.as_i64().is_none_or(|u| u == 0))
                .then(|| sub(&place, "runAsUser").violation("runAsUser", format!("is {uid}")))
        })
        .collect()
}

/// `check_seccompProfile_restricted.go` (restricted): the pod's `seccompProfile.type` is
/// `RuntimeDefault` or `Localhost`, or every container's is; none is anything else (not
/// for Windows pods).
pub fn seccomp_profile_restricted(pod: &Pod) -> Vec<Violation> {
    if windows(pod) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let pod_profile = spec_value(pod, &["securityContext", "seccompProfile"]);
    if pod_profile.is_some_and(|p| !valid_seccomp(p)) {
        let place = Place::pod(pod, "securityContext.seccompProfile.type");
        out.push(place.violation(
            "seccompProfile_restricted",
            "must be RuntimeDefault or Localhost",
        ));
    }
    let pod_valid = pod_profile.is_some_and(valid_seccomp);
    for c in containers(pod) {
        let place = Place::container(&c, "securityContext.seccompProfile.type");
        match at(c.c, &["securityContext", "seccompProfile"]) {
            None if pod_valid => {}
            Some(p) if valid_seccomp(p) => {}
            _ => out.push(place.violation(
                "seccompProfile_restricted",
                "must be RuntimeDefault or Localhost",
            )),
        }
    }
    out
}

/// `check_capabilities_restricted.go` (restricted): every container drops `ALL` and adds
/// nothing but `NET_BIND_SERVICE` (not for Windows pods).
pub fn capabilities_restricted(pod: &Pod) -> Vec<Violation> {
    if windows(pod) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for c in containers(pod) {
        let drop = at(c.c, &["securityContext", "capabilities", "drop"]).and_then(Value::as_array);
        if !drop.is_some_and(|d| d.iter().any(|x| x.as_str() == Some("ALL"))) {
            let place = Place::container(&c, "securityContext.capabilities.drop");
            out.push(place.violation("capabilities_restricted", "must include \"ALL\""));
        }
        added_outside(
            &c,
            &["NET_BIND_SERVICE"],
            "capabilities_restricted",
            &mut out,
        );
    }
    out
}

type Check = fn(&Pod) -> Vec<Violation>;

/// The baseline checks.
const BASELINE: &[Check] = &[
    host_namespaces,
    privileged,
    capabilities_baseline,
    host_path_volumes,
    host_ports,
    app_armor_profile,
    se_linux_options,
    proc_mount,
    seccomp_profile_baseline,
    sysctls,
    windows_host_process,
];

/// The checks restricted adds to baseline.
const RESTRICTED: &[Check] = &[
    restricted_volumes,
    allow_privilege_escalation,
    run_as_non_root,
    run_as_user,
    seccomp_profile_restricted,
    capabilities_restricted,
];

/// Every violation of `level` by one pod spec.
pub fn check_pod(level: Level, pod: &Pod) -> Vec<Violation> {
    let checks: Vec<Check> = match level {
        Level::Privileged => return Vec::new(),
        Level::Baseline => BASELINE.to_vec(),
        Level::Restricted => BASELINE.iter().chain(RESTRICTED).copied().collect(),
    };
    checks.iter().flat_map(|check| check(pod)).collect()
}

fn is_pod_spec(map: &Map<String, Value>) -> bool {
    CONTAINER_LISTS
        .iter()
        .any(|l| map.get(*l).is_some_and(Value::is_array))
}

/// Every violation of `level` by the pod specs in `obj`, wherever they sit. An object
/// nested deeper than [`MAX_DEPTH`] is refused.
pub fn violations(level: Level, obj: &Value) -> Result<Vec<Violation>, PssError> {
    let mut out = Vec::new();
    if level != Level::Privileged {
        walk(level, obj, &Value::Null, "", 0, &mut out)?;
    }
    Ok(out)
}

fn walk(
    level: Level,
    v: &Value,
    metadata: &Value,
    at: &str,
    depth: usize,
    out: &mut Vec<Violation>,
) -> Result<(), PssError> {
    if depth > MAX_DEPTH {
        return Err(PssError::TooDeep);
    }
    match v {
        Value::Object(map) if is_pod_spec(map) => {
            out.extend(check_pod(
                level,
                &Pod {
                    spec: map,
                    metadata,
                    at,
                },
            ));
        }
        Value::Object(map) => {
            let meta = map.get("metadata").unwrap_or(&Value::Null);
            for (k, child) in map {
                let here = join(at, k);
                let child_meta = if k == "spec" { meta } else { &Value::Null };
                walk(level, child, child_meta, &here, depth + 1, out)?;
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let here = format!("{at}[{i}]");
                walk(level, child, &Value::Null, &here, depth + 1, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The violations of `level` by `obj` that `before` does not already have in the same
/// way (same check, same place in its pod spec, same value). `before` is the object a
/// patch changes: like Pod Security admission, which does not judge an update that leaves
/// the pod spec alone again, a patch is refused only for what it adds, so a label patch
/// or a restart of a workload that already runs privileged still works. A create has no
/// `before`: the new object must meet the level.
pub fn new_violations(
    level: Level,
    obj: &Value,
    before: Option<&Value>,
) -> Result<Vec<Violation>, PssError> {
    let found = violations(level, obj)?;
    let known: BTreeSet<String> = match before {
        Some(b) => violations(level, b)?.into_iter().map(|v| v.key).collect(),
        None => BTreeSet::new(),
    };
    Ok(found
        .into_iter()
        .filter(|v| !known.contains(&v.key))
        .collect())
}

/// At most this many violations are named in one refusal.
const MAX_NAMED: usize = 8;

/// The refusal message for `found` (not empty):
/// `pod security "baseline": spec.containers[0].securityContext.privileged is true (check privileged)`.
pub fn refusal(level: Level, found: &[Violation]) -> String {
    let mut named: Vec<String> = found
        .iter()
        .take(MAX_NAMED)
        .map(ToString::to_string)
        .collect();
    if found.len() > MAX_NAMED {
        named.push(format!("and {} more", found.len() - MAX_NAMED));
    }
    format!(
        "pod security {}: {}",
        argocd_agent_identity::text::quoted(level.as_str()),
        named.join("; ")
    )
}

/// Checks `obj` against `level`, allowing what `before` (the object before a patch)
/// already has (see [`new_violations`]); `Err` is the refusal (its Display the message).
pub fn check(level: Level, obj: &Value, before: Option<&Value>) -> Result<(), PssError> {
    let found = new_violations(level, obj, before)?;
    if found.is_empty() {
        Ok(())
    } else {
        Err(PssError::Refused { level, found })
    }
}

#[cfg(test)]
mod tests;
