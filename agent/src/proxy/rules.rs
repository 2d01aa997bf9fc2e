//! The agent's own rules for the resource proxy, as pure functions: which Kubernetes API
//! paths a request may name, what each method may do, and when an object counts as
//! managed by Argo CD on this spoke.

use argocd_agent_identity::text::quoted;
use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

pub use super::refusal::RuleError;

/// Label Argo CD's default tracking puts on the objects of an Application.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Annotation of Argo CD's annotation-based tracking: `<app>:<group>/<kind>:<ns>/<name>`.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Annotation naming the Argo CD installation that tracks an object (`installationID` in
/// argocd-cm).
pub const INSTALLATION_ID_ANNOTATION: &str = "argocd.argoproj.io/installation-id";
/// Owner references followed from an object (Pod -> ReplicaSet -> Deployment).
pub const MAX_OWNER_HOPS: usize = 3;
/// Owner references of one object that are looked at (the controller first).
pub const MAX_OWNERS_PER_OBJECT: usize = 4;

/// How the spoke's Argo CD marks the objects of its Applications: argocd-cm's
/// `application.resourceTrackingMethod`, `application.instanceLabelKey` and
/// `installationID`, read as Argo CD reads them (argoproj/argo-cd
/// `util/argo/resource_tracking.go`: `GetAppName`, `ParseAppInstanceValue`,
/// `getAppInstanceValue`; and `controller/state.go`: `isSelfReferencedObj`, an annotation
/// copied onto another object does not make it managed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracking {
    /// `None`: the key is not set, so the Argo CD version decides (label before 3.0,
    /// annotation since); both are accepted then.
    pub method: Option<TrackingMethod>,
    /// The instance label (`application.instanceLabelKey`).
    pub label_key: String,
    /// `installationID`: an annotation-tracked object must carry exactly this in
    /// `argocd.argoproj.io/installation-id` (none when empty).
    pub installation_id: String,
}

/// `application.resourceTrackingMethod`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackingMethod {
    /// The instance label.
    Label,
    /// The tracking-id annotation.
    Annotation,
    /// The annotation; the label is informational only (never read).
    AnnotationAndLabel,
}

impl Default for Tracking {
    fn default() -> Self {
        Tracking {
            method: None,
            label_key: INSTANCE_LABEL.into(),
            installation_id: String::new(),
        }
    }
}

impl Tracking {
    /// From argocd-cm's `data` (absent keys keep Argo CD's defaults; an unknown method is
    /// read as `annotation`, as Argo CD 3 does).
    pub fn from_argocd_cm(data: &Value) -> Tracking {
        let get = |k: &str| data.get(k).and_then(Value::as_str).map(str::trim);
        let method = get("application.resourceTrackingMethod")
            .filter(|m| !m.is_empty())
            .map(|m| match m {
                "label" => TrackingMethod::Label,
                "annotation+label" => TrackingMethod::AnnotationAndLabel,
                _ => TrackingMethod::Annotation,
            });
        Tracking {
            method,
            label_key: get("application.instanceLabelKey")
                .filter(|k| !k.is_empty())
                .unwrap_or(INSTANCE_LABEL)
                .to_owned(),
            installation_id: get("installationID").unwrap_or_default().to_owned(),
        }
    }

    fn reads_label(&self) -> bool {
        matches!(self.method, None | Some(TrackingMethod::Label))
    }

    fn reads_annotation(&self) -> bool {
        !matches!(self.method, Some(TrackingMethod::Label))
    }

    /// The Application an object's metadata names under this tracking, if any.
    pub fn app_names<'m>(&self, metadata: &'m Value) -> Vec<&'m str> {
        let mut out = Vec::new();
        if self.reads_label()
            && let Some(instance) = metadata
                .get("labels")
                .and_then(|l| string_at(l, &self.label_key))
        {
            out.push(instance);
        }
        if self.reads_annotation()
            && let Some(id) = self.tracking_id(metadata)
        {
            out.push(id.app);
        }
        out
    }

    /// The object's tracking id, when it is well formed, from this installation, and names
    /// the object itself.
    fn tracking_id<'m>(&self, metadata: &'m Value) -> Option<TrackingId<'m>> {
        let annotations = metadata.get("annotations");
        let installation = annotations
            .and_then(|a| string_at(a, INSTALLATION_ID_ANNOTATION))
            .unwrap_or_default();
        if installation != self.installation_id {
            return None;
        }
        let id = TrackingId::parse(annotations.and_then(|a| string_at(a, TRACKING_ANNOTATION))?)?;
        let name = string_at(metadata, "name").unwrap_or_default();
        let namespace = string_at(metadata, "namespace").unwrap_or_default();
        // Cluster-scoped objects carry the Application's destination namespace.
        (id.name == name && (namespace.is_empty() || id.namespace == namespace)).then_some(id)
    }
}

/// `<app>:<group>/<kind>:<namespace>/<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackingId<'a> {
    /// The Application's name as Argo CD writes it (`<name>` or `<namespace>_<name>`).
    pub app: &'a str,
    /// The object's API group (empty for the core group).
    pub group: &'a str,
    /// The object's kind.
    pub kind: &'a str,
    /// The object's namespace (empty for a cluster-scoped object).
    pub namespace: &'a str,
    /// The object's name.
    pub name: &'a str,
}

impl<'a> TrackingId<'a> {
    /// Parses a tracking id exactly as Argo CD does (three `:`-separated parts, the last
    /// two with exactly one `/`).
    pub fn parse(value: &'a str) -> Option<TrackingId<'a>> {
        let mut parts = value.splitn(3, ':');
        let (app, gk, nn) = (parts.next()?, parts.next()?, parts.next()?);
        let (group, kind) = gk.split_once('/').filter(|(_, k)| !k.contains('/'))?;
        let (namespace, name) = nn.split_once('/').filter(|(_, n)| !n.contains('/'))?;
        Some(TrackingId {
            app,
            group,
            kind,
            namespace,
            name,
        })
    }
}

/// What the agent knows of one Application it holds, for deciding a create: where it
/// deploys and which kinds of object it manages.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AppFacts {
    /// The Application's own namespace.
    pub namespace: String,
    /// The Application's name.
    pub name: String,
    /// The namespaces it deploys to: `spec.destination.namespace` and the namespace of
    /// every object in `status.resources`.
    pub namespaces: BTreeSet<String>,
    /// `(group, kind)` of every object in `status.resources` (the core group is empty).
    pub kinds: BTreeSet<(String, String)>,
}

impl AppFacts {
    /// An Application known by name only (it deploys nowhere known, manages no known kind).
    pub fn named(namespace: &str, name: &str) -> AppFacts {
        AppFacts {
            namespace: namespace.into(),
            name: name.into(),
            ..AppFacts::default()
        }
    }

    /// From an Application object (its `spec` and `status`, as JSON).
    pub fn from_application(namespace: &str, name: &str, app: &Value) -> AppFacts {
        let mut facts = AppFacts::named(namespace, name);
        if let Some(ns) = app
            .pointer("/spec/destination/namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty())
        {
            facts.namespaces.insert(ns.into());
        }
        let resources = app
            .pointer("/status/resources")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for r in resources {
            if let Some(ns) = string_at(r, "namespace").filter(|ns| !ns.is_empty()) {
                facts.namespaces.insert(ns.into());
            }
            if let Some(kind) = string_at(r, "kind").filter(|k| !k.is_empty()) {
                let group = string_at(r, "group").unwrap_or_default();
                facts.kinds.insert((group.into(), kind.into()));
            }
        }
        facts
    }

    /// Whether it deploys to namespace `ns`.
    pub fn deploys_to(&self, ns: &str) -> bool {
        self.namespaces.contains(ns)
    }

    /// Whether it manages objects of `group`/`kind`.
    pub fn manages_kind(&self, group: &str, kind: &str) -> bool {
        self.kinds.contains(&(group.to_owned(), kind.to_owned()))
    }
}

/// The spoke's Applications, by the names under which they mark the objects they manage:
/// the bare name and `<namespace>_<name>` (Argo CD's instance name outside its own
/// namespace).
#[derive(Debug, Default, Clone)]
pub struct Apps {
    /// Instance name -> indices into `facts`.
    names: HashMap<String, Vec<usize>>,
    facts: Vec<AppFacts>,
    /// How the spoke's Argo CD marks objects.
    tracking: Tracking,
}

impl Apps {
    /// From the spoke's Applications, as `(namespace, name)`, known by name only.
    pub fn new<I, N, M>(apps: I) -> Apps
    where
        I: IntoIterator<Item = (N, M)>,
        N: AsRef<str>,
        M: AsRef<str>,
    {
        Apps::from_facts(
            apps.into_iter()
                .map(|(ns, name)| AppFacts::named(ns.as_ref(), name.as_ref())),
        )
    }

    /// From what is known of each Application.
    pub fn from_facts(apps: impl IntoIterator<Item = AppFacts>) -> Apps {
        let mut out = Apps::default();
        for facts in apps {
            if facts.name.is_empty() {
                continue;
            }
            let i = out.facts.len();
            out.names.entry(facts.name.clone()).or_default().push(i);
            if !facts.namespace.is_empty() {
                let qualified = format!("{}_{}", facts.namespace, facts.name);
                out.names.entry(qualified).or_default().push(i);
            }
            out.facts.push(facts);
        }
        out
    }

    /// The same Applications, with the spoke's Argo CD tracking settings.
    pub fn with_tracking(mut self, tracking: Tracking) -> Apps {
        self.tracking = tracking;
        self
    }

    /// How the spoke's Argo CD marks objects.
    pub fn tracking(&self) -> &Tracking {
        &self.tracking
    }

    /// Whether `name` names one of the Applications.
    pub fn contains(&self, name: &str) -> bool {
        !name.is_empty() && self.names.contains_key(name)
    }

    /// The Applications `name` names (indices for [`Apps::facts`]).
    pub fn named(&self, name: &str) -> &[usize] {
        self.names.get(name).map(Vec::as_slice).unwrap_or_default()
    }

    /// What is known of Application `i`.
    pub fn facts(&self, i: usize) -> Option<&AppFacts> {
        self.facts.get(i)
    }

    /// No Application is held.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

fn string_at<'a>(map: &'a Value, key: &str) -> Option<&'a str> {
    map.get(key)?.as_str()
}

/// Rules (a) and (b): the object's metadata names one of the Applications under the spoke's
/// Argo CD tracking ([`Tracking`]): its instance label, or a tracking-id annotation of this
/// installation that names the object itself.
pub fn marked(metadata: &Value, apps: &Apps) -> bool {
    !marking_apps(metadata, apps).is_empty()
}

/// The Applications (indices for [`Apps::facts`]) that rules (a) and (b) find on the
/// object's metadata.
pub fn marking_apps(metadata: &Value, apps: &Apps) -> BTreeSet<usize> {
    let mut found = BTreeSet::new();
    for app in apps.tracking.app_names(metadata) {
        found.extend(apps.named(app));
    }
    found
}

/// A patch keeps what makes an object managed: the values the spoke's tracking reads
/// (the instance label, the tracking-id and installation-id annotations) are the same in
/// `after` as in `before` (both metadata). Removing them would take the object out of
/// management; changing them would hand it to another Application.
pub fn check_tracking_kept(
    tracking: &Tracking,
    before: &Value,
    after: &Value,
) -> Result<(), RuleError> {
    let mut kept: Vec<(&str, &str)> = Vec::new();
    if tracking.reads_label() {
        kept.push(("labels", tracking.label_key.as_str()));
    }
    if tracking.reads_annotation() {
        kept.push(("annotations", TRACKING_ANNOTATION));
        kept.push(("annotations", INSTALLATION_ID_ANNOTATION));
    }
    for (map, key) in kept {
        let was = before.get(map).and_then(|m| m.get(key));
        let now = after.get(map).and_then(|m| m.get(key));
        if was != now {
            let show = |v: Option<&Value>| v.map_or_else(|| "unset".to_owned(), |v| v.to_string());
            return Err(RuleError::TrackingChanged {
                map,
                key: key.to_owned(),
                was: show(was),
                now: show(now),
            });
        }
    }
    Ok(())
}

/// The asks of `obj` (see [`privilege_asks`]) that `baseline` (the object before a patch,
/// or a created object's owner) does not have.
pub fn added_asks(obj: &Value, baseline: &Value) -> Result<Vec<String>, RuleError> {
    let wanted = privilege_asks(obj)?;
    let granted = privilege_asks(baseline)?;
    Ok(wanted.difference(&granted).cloned().collect())
}

/// One owner reference of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    /// The owner's `apiVersion` (`<group>/<version>`, or `v1`).
    pub api_version: String,
    /// The owner's kind.
    pub kind: String,
    /// The owner's name (in the object's namespace).
    pub name: String,
    /// The owner's UID, if the reference carries one.
    pub uid: Option<String>,
}

/// The owner references of an object (controller first), at most
/// [`MAX_OWNERS_PER_OBJECT`]; malformed entries are skipped.
pub fn owner_refs(metadata: &Value) -> Vec<OwnerRef> {
    let Some(refs) = metadata.get("ownerReferences").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out: Vec<(bool, OwnerRef)> = refs
        .iter()
        .filter_map(|r| {
            let api_version = string_at(r, "apiVersion")?;
            let kind = string_at(r, "kind")?;
            let name = string_at(r, "name")?;
            if api_version.is_empty() || kind.is_empty() || name.is_empty() {
                return None;
            }
            let controller = r.get("controller").and_then(Value::as_bool) == Some(true);
            Some((
                controller,
                OwnerRef {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: string_at(r, "uid").map(str::to_owned),
                },
            ))
        })
        .collect();
    out.sort_by_key(|(controller, _)| !controller);
    out.into_iter()
        .take(MAX_OWNERS_PER_OBJECT)
        .map(|(_, r)| r)
        .collect()
}

/// The owner references a create may be admitted by: those with a uid (at most
/// [`MAX_OWNERS_PER_OBJECT`], the controller first). A reference without a uid names no
/// particular object and admits nothing.
pub fn create_owners(metadata: &Value) -> Vec<OwnerRef> {
    owner_refs(metadata)
        .into_iter()
        .filter(|r| r.uid.as_deref().is_some_and(|u| !u.is_empty()))
        .collect()
}

// What a create may do.
//
// argocd-server creates objects in exactly one place: a resource action whose Lua returns a
// `create` operation (`RunResourceActionV2` in Argo CD's `server/application/application.go`;
// it creates each object once with `dryRun=All`, then for real). Argo CD's built-in actions
// that do so (`resource_customizations/batch/CronJob/actions/create-job`,
// `argoproj.io/CronWorkflow/actions/create-workflow`,
// `argoproj.io/WorkflowTemplate/actions/create-workflow`) all build the new object from the
// resource the action runs on: same namespace, an owner reference (apiVersion, kind, name,
// uid) to that resource, and the spec copied from it. The rules below admit exactly that
// shape and nothing the Application does not already have:
//
// 1. the object is namespaced (by discovery) and created in the namespace of the request;
// 2. it names, by owner reference with a uid, an existing object in that namespace whose uid
//    matches and which an Application X manages (its own mark or its owner chain; the new
//    object's own labels and annotations count for nothing, since the caller wrote them);
// 3. the namespace is one of X's destination namespaces (`spec.destination.namespace` and
//    the namespaces of `status.resources`);
// 4. an RBAC object (`rbac.authorization.k8s.io`) only if X manages objects of that kind;
// 5. a service-account token Secret only if X manages Secrets;
// 6. the object asks for no host access or privilege that the owner object does not
//    itself ask for (see [`privilege_asks`]): an action may copy what the Application
//    already runs, never add to it;
// 7. its pod specs meet the spoke's Pod Security Standards level (`super::pss`, checked
//    by the caller after these rules).

/// The RBAC API group.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// Type of a Secret the token controller fills with a service account's token.
pub const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
/// How deep an object is searched for privilege; a deeper one is refused.
pub const MAX_SCAN_DEPTH: usize = 64;

/// The resource a create names, as discovery describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTarget {
    /// Empty for the core group.
    pub group: String,
    /// The API version, e.g. `v1`.
    pub version: String,
    /// The kind discovery gives for the path's plural.
    pub kind: String,
    /// The request's namespace (`None`: a cluster-wide path).
    pub namespace: Option<String>,
    /// Whether discovery says the resource is namespaced.
    pub namespaced: bool,
}

impl CreateTarget {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Reads a create body exactly as the API server would, or refuses it: only JSON (an
/// empty Content-Type or `application/json`), a JSON object, and no key twice in any object
/// (the API server's decoder merges a repeated object into the first, this one would keep
/// the last: the two would see different objects).
pub fn read_create_body(content_type: &str, body: &[u8]) -> Result<Value, RuleError> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if !(media.is_empty() || media.eq_ignore_ascii_case("application/json")) {
        return Err(RuleError::CreateNotJson(content_type.to_owned()));
    }
    let StrictValue(v) = serde_json::from_slice(body).map_err(RuleError::CreateUnreadable)?;
    if !v.is_object() {
        return Err(RuleError::CreateNotObject);
    }
    Ok(v)
}

/// Reads any JSON value with every repeated object key refused (see
/// [`read_create_body`]).
pub fn read_strict_json(body: &[u8]) -> Result<Value, RuleError> {
    let StrictValue(v) = serde_json::from_slice(body).map_err(RuleError::NotStrictJson)?;
    Ok(v)
}

/// A JSON value read with every repeated object key refused.
struct StrictValue(Value);

impl<'de> serde::Deserialize<'de> for StrictValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let StrictValue(v) = map.next_value()?;
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "key {key} repeated",
                    key = quoted(&key)
                )));
            }
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Rule 1 and the body's consistency with the request, before any owner is looked at.
pub fn check_create_shape(target: &CreateTarget, body: &Value) -> Result<(), RuleError> {
    let Some(ns) = target.namespace.as_deref().filter(|_| target.namespaced) else {
        return Err(RuleError::ClusterScoped(target.kind.clone()));
    };
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != target.kind
    {
        return Err(RuleError::KindMismatch {
            body: kind.to_owned(),
            request: target.kind.clone(),
        });
    }
    let api_version = target.api_version();
    if let Some(v) = body.get("apiVersion").and_then(Value::as_str)
        && v != api_version
    {
        return Err(RuleError::ApiVersionMismatch {
            body: v.to_owned(),
            request: api_version,
        });
    }
    if let Some(b) = body.pointer("/metadata/namespace").and_then(Value::as_str)
        && !b.is_empty()
        && b != ns
    {
        return Err(RuleError::NamespaceMismatch {
            body: b.to_owned(),
            request: ns.to_owned(),
        });
    }
    Ok(())
}

/// Rules 3 to 6 for a create whose `owner` (the whole object, fetched from the cluster, in
/// the same namespace, uid matched) is managed by Application `app`.
pub fn check_create(
    target: &CreateTarget,
    body: &Value,
    owner: &Value,
    app: &AppFacts,
) -> Result<(), RuleError> {
    check_create_shape(target, body)?;
    let ns = target.namespace.as_deref().unwrap_or_default();
    let app_name = &app.name;
    if !app.deploys_to(ns) {
        return Err(RuleError::NotDestination {
            namespace: ns.to_owned(),
            app: app_name.clone(),
        });
    }
    if target.group == RBAC_GROUP && !app.manages_kind(&target.group, &target.kind) {
        return Err(RuleError::KindNotManaged {
            app: app_name.clone(),
            kind: target.kind.clone(),
        });
    }
    if target.group.is_empty()
        && target.kind == "Secret"
        && body.get("type").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_TOKEN)
        && !app.manages_kind("", "Secret")
    {
        return Err(RuleError::TokenNotManaged(app_name.clone()));
    }
    let wanted = privilege_asks(body)?;
    if !wanted.is_empty() {
        let granted = privilege_asks(owner)?;
        let extra: Vec<String> = wanted.difference(&granted).cloned().collect();
        if !extra.is_empty() {
            let owner_kind = owner.get("kind").and_then(Value::as_str).unwrap_or("owner");
            return Err(RuleError::OwnerLacks {
                kind: target.kind.clone(),
                asks: extra,
                owner_kind: owner_kind.to_owned(),
            });
        }
    }
    Ok(())
}

/// Everything an object asks for in host access or privilege, wherever it sits (a Pod's
/// spec, a pod template at `spec.template.spec` or `spec.jobTemplate.spec.template.spec`, an
/// Argo Workflow's templates, any custom resource), as comparable strings:
///
/// - `hostPID`, `hostIPC`, `hostNetwork` set to true; `hostPath <path>` volumes;
///   `hostPort <n>`; Windows `hostProcess`;
/// - on any container (containers, initContainers, ephemeralContainers, a Workflow's
///   templates): `privileged`, `allowPrivilegeEscalation` set to true,
///   `capabilities.add <cap>`, a `procMount` other than `Default`, `seLinuxOptions`, an
///   `Unconfined` seccomp or AppArmor profile;
/// - a `serviceAccountName` (or `serviceAccount`) other than `default`: a pod runs with its
///   service account's permissions;
/// - an Argo Workflow's `podSpecPatch` (it can say anything);
/// - what a pod can read or where it runs (security issue 39): `secret <name>` and
///   `configMap <name>` for every Secret or ConfigMap it references (volumes, projected
///   sources, `secretKeyRef`, `configMapKeyRef`, `envFrom`, any `...SecretRef`),
///   `persistentVolumeClaim <claim>`, `serviceAccountToken audience <aud>` for a projected
///   token, `automountServiceAccountToken` for a pod spec that does not set it to `false`
///   (or any `true`), `nodeName <node>`, `toleration ...` for each toleration (`toleration
///   of every taint` for `operator: Exists` without a key), `runtimeClassName <c>`,
///   `priorityClassName <c>`, `priority <n>`, `runAsUser 0 (root)` and `runAsGroup 0
///   (root)`, `sysctl <name>` for a sysctl outside
///   Kubernetes' safe set, and `volume type <t>` for a volume type that restricted pods
///   may not use or that reaches outside the pod (anything but `configMap`, `secret`,
///   `projected`, `downwardAPI`, `emptyDir`, `ephemeral`, `persistentVolumeClaim`: `nfs`,
///   `csi`, `iscsi`, ...).
///
/// Keys are matched ignoring ASCII case, and the whole object is searched, so a field
/// cannot hide at a path this list does not know. An object nested deeper than
/// [`MAX_SCAN_DEPTH`] is refused.
pub fn privilege_asks(obj: &Value) -> Result<BTreeSet<String>, RuleError> {
    let mut asks = BTreeSet::new();
    let is_data = matches!(
        (string_at(obj, "apiVersion"), string_at(obj, "kind")),
        (Some("v1"), Some("ConfigMap" | "Secret"))
    );
    match obj {
        // A ConfigMap's or Secret's data keys are the user's own words, not fields.
        Value::Object(map) if is_data => {
            let fields = map
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "data" | "binaryData" | "stringData"));
            for (key, value) in fields {
                privilege_of(key, value, &mut asks);
                access_of(key, value, &mut asks);
                scan_privilege(value, 1, &mut asks)?;
            }
        }
        _ => scan_privilege(obj, 0, &mut asks)?,
    }
    Ok(asks)
}

fn scan_privilege(v: &Value, depth: usize, asks: &mut BTreeSet<String>) -> Result<(), RuleError> {
    if depth > MAX_SCAN_DEPTH {
        return Err(RuleError::TooDeep);
    }
    match v {
        Value::Array(items) => {
            for item in items {
                scan_privilege(item, depth + 1, asks)?;
            }
        }
        Value::Object(map) => {
            pod_spec_asks(map, asks);
            for (key, value) in map {
                privilege_of(key, value, asks);
                access_of(key, value, asks);
                scan_privilege(value, depth + 1, asks)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// What one field asks for (see [`privilege_asks`]).
fn privilege_of(key: &str, value: &Value, asks: &mut BTreeSet<String>) {
    let truthy = value.as_bool() == Some(true);
    let text = value.as_str().unwrap_or_default();
    match key.to_ascii_lowercase().as_str() {
        "hostpid" if truthy => {
            asks.insert("hostPID".into());
        }
        "hostipc" if truthy => {
            asks.insert("hostIPC".into());
        }
        "hostnetwork" if truthy => {
            asks.insert("hostNetwork".into());
        }
        "hostprocess" if truthy => {
            asks.insert("hostProcess".into());
        }
        "privileged" if truthy => {
            asks.insert("privileged".into());
        }
        "allowprivilegeescalation" if truthy => {
            asks.insert("allowPrivilegeEscalation".into());
        }
        "hostpath" if !value.is_null() => {
            let path = value.get("path").map_or_else(
                || value.to_string(),
                |p| p.as_str().map_or_else(|| p.to_string(), str::to_owned),
            );
            asks.insert(format!("hostPath {path}"));
        }
        "hostport" if value.as_i64().is_some_and(|p| p != 0) || value.is_string() => {
            asks.insert(format!("hostPort {value}"));
        }
        "capabilities" => {
            let added = value
                .as_object()
                .and_then(|m| m.iter().find(|(k, _)| k.eq_ignore_ascii_case("add")))
                .map(|(_, v)| v);
            match added {
                Some(Value::Array(caps)) => {
                    for cap in caps {
                        let cap = cap.as_str().map_or_else(|| cap.to_string(), str::to_owned);
                        asks.insert(format!("capabilities.add {cap}"));
                    }
                }
                Some(Value::Null) | None => {}
                Some(other) => {
                    asks.insert(format!("capabilities.add {other}"));
                }
            }
        }
        "procmount" if !value.is_null() && text != "Default" => {
            asks.insert(format!("procMount {}", text_or_json(value)));
        }
        "selinuxoptions" if value.as_object().is_some_and(|m| !m.is_empty()) => {
            asks.insert(format!("seLinuxOptions {value}"));
        }
        "seccompprofile" | "apparmorprofile" => {
            let ty = value
                .as_object()
                .and_then(|m| m.iter().find(|(k, _)| k.eq_ignore_ascii_case("type")))
                .and_then(|(_, t)| t.as_str());
            if ty.is_some_and(|t| t.eq_ignore_ascii_case("unconfined")) {
                asks.insert(format!("{key} Unconfined"));
            }
        }
        "serviceaccountname" | "serviceaccount"
            if !value.is_null() && !matches!(text, "" | "default") =>
        {
            asks.insert(format!("serviceAccountName {}", text_or_json(value)));
        }
        "podspecpatch" if !value.is_null() && !text.is_empty() => {
            asks.insert(format!("podSpecPatch {}", text_or_json(value)));
        }
        _ => {}
    }
}

/// Ask of a service-account token mounted into a pod.
const AUTOMOUNT: &str = "automountServiceAccountToken";

/// A pod spec (a map with a list of containers, keys in any case) that does not set
/// `automountServiceAccountToken: false` gets its service account's token.
fn pod_spec_asks(map: &serde_json::Map<String, Value>, asks: &mut BTreeSet<String>) {
    let field = |name: &str| {
        map.iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
            .collect::<Vec<_>>()
    };
    let is_pod = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .any(|l| field(l).iter().any(|v| v.is_array()));
    let automount = field(AUTOMOUNT);
    if is_pod && (automount.is_empty() || automount.iter().any(|v| **v != Value::Bool(false))) {
        asks.insert(AUTOMOUNT.into());
    }
}

/// The `name` (or `secretName`, `claimName`) a reference object carries.
fn ref_name(value: &Value, keys: &[&str]) -> Option<String> {
    let map = value.as_object()?;
    keys.iter().find_map(|want| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(want))
            .map(|(_, v)| text_or_json(v))
    })
}

/// Volume types a pod may use without reaching outside itself and the namespace's own
/// objects (Kubernetes' restricted volume types, but `csi`).
const CONTAINED_VOLUME_TYPES: &[&str] = &[
    "name",
    "configmap",
    "secret",
    "projected",
    "downwardapi",
    "emptydir",
    "ephemeral",
    "persistentvolumeclaim",
];

/// What one field lets a pod read or where it lets it run (see [`privilege_asks`]).
fn access_of(key: &str, value: &Value, asks: &mut BTreeSet<String>) {
    let lower = key.to_ascii_lowercase();
    let mut ask = |s: String| {
        asks.insert(s);
    };
    match lower.as_str() {
        "secret" | "secretkeyref" => {
            if let Some(n) = ref_name(value, &["secretName", "name"]) {
                ask(format!("secret {n}"));
            }
        }
        k if k.ends_with("secretref") => {
            if let Some(n) = ref_name(value, &["name"]) {
                ask(format!("secret {n}"));
            }
        }
        "configmap" | "configmapkeyref" | "configmapref" => {
            if let Some(n) = ref_name(value, &["name"]) {
                ask(format!("configMap {n}"));
            }
        }
        "persistentvolumeclaim" => {
            if let Some(n) = ref_name(value, &["claimName"]) {
                ask(format!("persistentVolumeClaim {n}"));
            }
        }
        "serviceaccounttoken" if value.is_object() => {
            let aud = ref_name(value, &["audience"]).unwrap_or_else(|| "(the API server)".into());
            ask(format!("serviceAccountToken audience {aud}"));
        }
        "automountserviceaccounttoken" if value.as_bool() == Some(true) => ask(AUTOMOUNT.into()),
        "nodename" if !value.is_null() && value.as_str() != Some("") => {
            ask(format!("nodeName {}", text_or_json(value)));
        }
        "runtimeclassname" | "priorityclassname" if !value.is_null() => {
            let field = if lower == "runtimeclassname" {
                "runtimeClassName"
            } else {
                "priorityClassName"
            };
            ask(format!("{field} {}", text_or_json(value)));
        }
        "priority" if value.is_number() => ask(format!("priority {value}")),
        "runasuser" | "runasgroup" if value.as_i64() == Some(0) => {
            let field = if lower == "runasuser" {
                "runAsUser"
            } else {
                "runAsGroup"
            };
            ask(format!("{field} 0 (root)"));
        }
        "tolerations" => {
            for t in value.as_array().map(Vec::as_slice).unwrap_or_default() {
                ask(toleration_ask(t));
            }
        }
        "sysctls" => {
            for s in value.as_array().map(Vec::as_slice).unwrap_or_default() {
                let name = ref_name(s, &["name"]).unwrap_or_else(|| s.to_string());
                if !super::pss::SAFE_SYSCTLS.contains(&name.as_str()) {
                    ask(format!("sysctl {name}"));
                }
            }
        }
        "volumes" => {
            for v in value.as_array().map(Vec::as_slice).unwrap_or_default() {
                for (ty, _) in v.as_object().into_iter().flatten() {
                    if !CONTAINED_VOLUME_TYPES.contains(&ty.to_ascii_lowercase().as_str()) {
                        ask(format!("volume type {ty}"));
                    }
                }
            }
        }
        _ => {}
    }
}

/// A toleration as an ask: `toleration of every taint` for `operator: Exists` without a
/// key, else `toleration <key>:<operator>:<value>:<effect>`.
fn toleration_ask(t: &Value) -> String {
    let get = |k: &str| ref_name(t, &[k]).unwrap_or_default();
    let (key, op, value, effect) = (get("key"), get("operator"), get("value"), get("effect"));
    if key.is_empty() && op == "Exists" {
        let of = if effect.is_empty() {
            "every taint".to_owned()
        } else {
            format!("every {effect} taint")
        };
        return format!("toleration of {of}");
    }
    if !t.is_object() {
        return format!("toleration {t}");
    }
    format!("toleration {key}:{op}:{value}:{effect}")
}

fn text_or_json(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

pub use super::paths::{
    ApiPath, PathError, Plan, ResourcePath, accepts_plain_json, entries_mut, entry_metadata,
    is_watch, json_accept, method_verb, parse_path, plan, reason_for, status_body,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // The rules' errors as the text kubectl users read, so the tests pin the wording.
    fn plan(method: &str, path: &str, query: &str) -> Result<Plan, String> {
        super::plan(method, path, query).map_err(|e| e.to_string())
    }

    fn check_create(
        target: &CreateTarget,
        body: &Value,
        owner: &Value,
        app: &AppFacts,
    ) -> Result<(), String> {
        super::check_create(target, body, owner, app).map_err(|e| e.to_string())
    }

    fn check_tracking_kept(
        tracking: &Tracking,
        before: &Value,
        after: &Value,
    ) -> Result<(), String> {
        super::check_tracking_kept(tracking, before, after).map_err(|e| e.to_string())
    }

    fn apps() -> Apps {
        Apps::new([("argocd", "guestbook"), ("team-a", "web")])
    }

    fn meta(v: Value) -> Value {
        v
    }

    #[test]
    fn marks_by_label_and_tracking_id() {
        let apps = apps();
        let table: Vec<(Value, bool)> = vec![
            (json!({"labels": {INSTANCE_LABEL: "guestbook"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "team-a_web"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "web"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "other"}}), false),
            (json!({"labels": {INSTANCE_LABEL: ""}}), false),
            (json!({"labels": {"app": "guestbook"}}), false),
            (
                json!({"name": "web", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:default/web"}}),
                true,
            ),
            (
                json!({"name": "web", "namespace": "team-a",
                    "annotations": {TRACKING_ANNOTATION: "team-a_web:/Service:team-a/web"}}),
                true,
            ),
            // Cluster-scoped: the tracking id carries the destination namespace.
            (
                json!({"name": "web-role",
                    "annotations": {TRACKING_ANNOTATION: "guestbook:rbac.authorization.k8s.io/ClusterRole:default/web-role"}}),
                true,
            ),
            (
                json!({"name": "web", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: "guestbookx:apps/Deployment:default/web"}}),
                false,
            ),
            (
                json!({"name": "web", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: ":apps/Deployment:default/web"}}),
                false,
            ),
            // Malformed, as Argo CD parses it.
            (
                json!({"name": "web", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: "guestbook"}}),
                false,
            ),
            (
                json!({"name": "web", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: "guestbook:apps/v1/Deployment:default/web"}}),
                false,
            ),
            // Copied onto another object: the id names someone else.
            (
                json!({"name": "loot", "namespace": "default",
                    "annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:default/web"}}),
                false,
            ),
            (
                json!({"name": "web", "namespace": "kube-system",
                    "annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:default/web"}}),
                false,
            ),
            (json!({"labels": {INSTANCE_LABEL: 5}}), false),
            (json!({}), false),
            (json!(null), false),
        ];
        for (m, want) in table {
            assert_eq!(marked(&meta(m.clone()), &apps), want, "{m}");
        }
        assert!(!marked(
            &json!({"labels": {INSTANCE_LABEL: "guestbook"}}),
            &Apps::default()
        ));
    }

    #[test]
    fn argocd_cm_tracking_settings_decide_what_marks_an_object() {
        let cm = |d: Value| Tracking::from_argocd_cm(&d);
        let by_label = json!({"name": "web", "namespace": "default",
            "labels": {INSTANCE_LABEL: "guestbook"}});
        let by_annotation = json!({"name": "web", "namespace": "default",
            "annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:default/web"}});
        let custom = json!({"name": "web", "namespace": "default",
            "labels": {"example.com/app": "guestbook"}});
        let marked_with = |t: Tracking, m: &Value| marked(m, &apps().with_tracking(t));
        // Unset: either (the Argo CD version decides its default).
        assert!(marked_with(cm(json!({})), &by_label));
        assert!(marked_with(cm(json!({})), &by_annotation));
        // label: the label only, under its configured key.
        let label = cm(json!({"application.resourceTrackingMethod": "label"}));
        assert!(marked_with(label.clone(), &by_label));
        assert!(!marked_with(label, &by_annotation));
        let custom_key = cm(json!({"application.resourceTrackingMethod": "label",
            "application.instanceLabelKey": "example.com/app"}));
        assert!(marked_with(custom_key.clone(), &custom));
        assert!(!marked_with(custom_key, &by_label));
        // annotation and annotation+label: the annotation only (the label is
        // informational); an unknown method reads as annotation, as Argo CD 3 does.
        for m in ["annotation", "annotation+label", "something-else"] {
            let t = cm(json!({"application.resourceTrackingMethod": m}));
            assert!(marked_with(t.clone(), &by_annotation), "{m}");
            assert!(!marked_with(t, &by_label), "{m}");
        }
        // installationID: exactly this installation's objects.
        let installed = cm(json!({"application.resourceTrackingMethod": "annotation",
            "installationID": "hub-a"}));
        assert!(!marked_with(installed.clone(), &by_annotation));
        let mut ours = by_annotation.clone();
        ours["annotations"][INSTALLATION_ID_ANNOTATION] = json!("hub-a");
        assert!(marked_with(installed.clone(), &ours));
        let mut theirs = by_annotation.clone();
        theirs["annotations"][INSTALLATION_ID_ANNOTATION] = json!("hub-b");
        assert!(!marked_with(installed, &theirs));
        assert!(
            !marked_with(cm(json!({})), &theirs),
            "another installation's object"
        );
    }

    #[test]
    fn tracking_ids_parse_as_argo_cd_parses_them() {
        assert_eq!(
            TrackingId::parse("ns_app:apps/Deployment:team/web"),
            Some(TrackingId {
                app: "ns_app",
                group: "apps",
                kind: "Deployment",
                namespace: "team",
                name: "web"
            })
        );
        assert_eq!(
            TrackingId::parse("app:/Service:team/web").map(|t| t.group),
            Some("")
        );
        // The third part keeps every ':' after the second.
        assert_eq!(
            TrackingId::parse("app:/ConfigMap:ns/a:b").map(|t| t.name),
            Some("a:b")
        );
        for bad in [
            "app",
            "app:/Service",
            "app:Service:ns/web",
            "app:/Service:web",
            "app:a/b/c:ns/web",
            "app:/Service:ns/a/b",
        ] {
            assert_eq!(TrackingId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn owner_refs_put_the_controller_first_and_skip_malformed() {
        let m = json!({"ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u1", "controller": true},
            {"kind": "Broken", "name": "x"},
            {"apiVersion": "v1", "kind": "", "name": "x"},
        ]});
        let refs = owner_refs(&m);
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].kind, "ReplicaSet");
        assert_eq!(refs[0].uid.as_deref(), Some("u1"));
        assert_eq!(refs[1].kind, "ConfigMap");
        assert!(owner_refs(&json!({"ownerReferences": "nope"})).is_empty());
    }

    fn res(
        group: &str,
        ns: Option<&str>,
        plural: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> ApiPath {
        ApiPath::Resource(ResourcePath {
            group: group.into(),
            version: "v1".into(),
            namespace: ns.map(Into::into),
            plural: plural.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn parses_paths() {
        for p in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
        ] {
            assert_eq!(parse_path(p), Ok(ApiPath::Discovery), "{p}");
        }
        assert_eq!(
            parse_path("/api/v1/pods"),
            Ok(res("", None, "pods", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/pods/web-0"),
            Ok(res("", Some("ns"), "pods", Some("web-0"), None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/pods/web-0/status"),
            Ok(res("", Some("ns"), "pods", Some("web-0"), Some("status")))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns"),
            Ok(res("", None, "namespaces", Some("ns"), None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            Ok(res("", None, "namespaces", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/status"),
            Ok(res("", None, "namespaces", Some("ns"), Some("status")))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/ns/deployments"),
            Ok(res("apps", Some("ns"), "deployments", None, None))
        );
        assert_eq!(
            parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles/system:view"),
            Ok(res(
                "rbac.authorization.k8s.io",
                None,
                "clusterroles",
                Some("system:view"),
                None
            ))
        );
        for bad in [
            "",
            "api",
            "/",
            "//api",
            "/api/",
            "/api/v1//pods",
            "/api/v1/namespaces/../pods",
            "/api/v1/namespaces/./pods",
            "/api/v1/namespaces/ns%2Fx/pods",
            "/api/v1/namespaces/ns/pods/a/b/c",
            "/api/v1/watch/pods",
            "/apis/apps/v1/watch/namespaces/ns/deployments",
            "/healthz",
            "/logs/x",
            "/api/v1/namespaces/ns/pods/a\u{1b}b",
            "/api/v1/namespaces/ns/pods/a b",
        ] {
            assert!(parse_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plans_requests() {
        let ok = |m: &str, p: &str, q: &str| plan(m, p, q);
        assert_eq!(ok("GET", "/apis", ""), Ok(Plan::PassThrough));
        assert_eq!(
            ok("GET", "/openapi/v3/apis/apps/v1", "hash=x"),
            Ok(Plan::PassThrough)
        );
        assert!(ok("POST", "/apis", "").is_err());
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods", "limit=5"),
            Ok(Plan::List(_))
        ));
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods/p", ""),
            Ok(Plan::Get(_))
        ));
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods/p/status", ""),
            Ok(Plan::Get(_))
        ));
        assert_eq!(
            ok("GET", "/api/v1/namespaces/n/events", ""),
            Ok(Plan::PassThrough)
        );
        assert_eq!(ok("GET", "/api/v1/events", ""), Ok(Plan::PassThrough));
        assert_eq!(
            ok("GET", "/apis/events.k8s.io/v1/namespaces/n/events/e1", ""),
            Ok(Plan::PassThrough)
        );
        assert!(matches!(
            ok("DELETE", "/api/v1/namespaces/n/events/e1", ""),
            Ok(Plan::Delete(_))
        ));
        assert!(matches!(
            ok("PATCH", "/apis/apps/v1/namespaces/n/deployments/d", ""),
            Ok(Plan::Patch(_))
        ));
        assert!(matches!(
            ok("DELETE", "/api/v1/namespaces/n/pods/p", ""),
            Ok(Plan::Delete(_))
        ));
        assert!(matches!(
            ok("POST", "/apis/batch/v1/namespaces/n/jobs", ""),
            Ok(Plan::Create(_))
        ));
        for (m, p, q) in [
            ("GET", "/api/v1/namespaces/n/pods", "watch=true"),
            ("GET", "/api/v1/namespaces/n/pods", "watch=1"),
            (
                "GET",
                "/api/v1/namespaces/n/pods/p",
                "labelSelector=a&watch=true",
            ),
            ("GET", "/api/v1/watch/namespaces/n/pods", ""),
            ("PUT", "/api/v1/namespaces/n/pods/p", ""),
            ("OPTIONS", "/api", ""),
            ("get", "/api", ""),
            ("GET", "/api/v1/namespaces/n/pods/p/log", ""),
            ("POST", "/api/v1/namespaces/n/pods/p/exec", ""),
            ("GET", "/api/v1/namespaces/n/secrets/s/proxy", ""),
            ("PATCH", "/api/v1/namespaces/n/pods/p/status", ""),
            ("PATCH", "/api/v1/namespaces/n/pods", ""),
            ("DELETE", "/api/v1/namespaces/n/pods", ""),
            ("POST", "/api/v1/namespaces/n/pods/p", ""),
            ("POST", "/api/v1/namespaces/n/pods/p/eviction", ""),
            ("PUT", "/api/v1/namespaces/n/namespaces/n/finalize", ""),
            ("GET", "/api/v1/namespaces/n/finalize", ""),
        ] {
            assert!(ok(m, p, q).is_err(), "{m} {p}?{q}");
        }
        assert!(ok("GET", "/api/v1/namespaces/n/pods", "watch=false").is_ok());
        assert!(ok("GET", "/api/v1/namespaces/n/pods", "watch=0").is_ok());
    }

    /// The API server reads every present `watch` value but `0` and `false` (any case) as
    /// true; each such request is refused before anything reaches the cluster.
    #[test]
    fn every_value_the_api_server_reads_as_a_watch_is_refused() {
        for q in [
            "watch",
            "watch=",
            "watch=f",
            "watch=F",
            "watch=t",
            "watch=1",
            "w%61tch=1",
            "%77atch",
            "watch=false&watch=1",
            "labelSelector=a&watch=f",
        ] {
            assert_eq!(
                plan("GET", "/api/v1/namespaces/n/pods", q),
                Err("watch requests are not served".into()),
                "{q:?}"
            );
        }
        for q in [
            "watch=0",
            "watch=false",
            "watch=False",
            "watch=FaLsE",
            "watch=FALSE",
        ] {
            assert!(plan("GET", "/api/v1/namespaces/n/pods", q).is_ok(), "{q:?}");
        }
    }

    // What a create may do (rules 1 to 6 of `check_create`).

    fn guestbook() -> AppFacts {
        AppFacts::from_application(
            "argocd",
            "guestbook",
            &json!({
                "spec": {"destination": {"server": "https://kubernetes.default.svc", "namespace": "gb"}},
                "status": {"resources": [
                    {"group": "batch", "version": "v1", "kind": "CronJob", "namespace": "gb", "name": "nightly"},
                    {"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "gb", "name": "web"},
                    {"group": "argoproj.io", "version": "v1alpha1", "kind": "CronWorkflow", "namespace": "gb-jobs", "name": "report"},
                    {"version": "v1", "kind": "Namespace", "name": "gb"},
                ]},
            }),
        )
    }

    fn target(
        group: &str,
        version: &str,
        kind: &str,
        ns: Option<&str>,
        namespaced: bool,
    ) -> CreateTarget {
        CreateTarget {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            namespace: ns.map(Into::into),
            namespaced,
        }
    }

    /// The CronJob Argo CD manages, as the API server returns it.
    fn cronjob(pod_spec: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "gb", "uid": "cj-uid",
                "labels": {INSTANCE_LABEL: "guestbook"}},
            "spec": {"schedule": "0 1 * * *", "jobTemplate": {"spec": {"template": {"spec": pod_spec}}}}})
    }

    /// What Argo CD's `batch/CronJob/actions/create-job` action makes of it.
    fn job_from(cronjob: &Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "nightly-2611241000", "namespace": "gb",
                "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                    "uid": "cj-uid", "blockOwnerDeletion": true, "controller": true}]},
            "spec": cronjob["spec"]["jobTemplate"]["spec"].clone()})
    }

    fn plain_pod_spec() -> Value {
        json!({"restartPolicy": "Never", "containers": [{"name": "run", "image": "busybox"}]})
    }

    #[test]
    fn application_facts_come_from_destination_and_status() {
        let g = guestbook();
        assert_eq!(
            g.namespaces.iter().map(String::as_str).collect::<Vec<_>>(),
            ["gb", "gb-jobs"]
        );
        assert!(g.manages_kind("batch", "CronJob"));
        assert!(g.manages_kind("", "Namespace"));
        assert!(!g.manages_kind("", "Secret"));
        let bare = AppFacts::from_application("argocd", "x", &json!({"spec": {}}));
        assert!(bare.namespaces.is_empty() && bare.kinds.is_empty());
        let apps = Apps::from_facts([g.clone(), AppFacts::named("team-a", "guestbook")]);
        assert_eq!(
            marking_apps(&json!({"labels": {INSTANCE_LABEL: "guestbook"}}), &apps),
            BTreeSet::from([0, 1])
        );
        assert_eq!(
            marking_apps(
                &json!({"labels": {INSTANCE_LABEL: "team-a_guestbook"}}),
                &apps
            ),
            BTreeSet::from([1])
        );
        assert_eq!(apps.facts(0), Some(&g));
    }

    #[test]
    fn argo_cds_create_job_action_is_allowed() {
        let cj = cronjob(plain_pod_spec());
        let job = job_from(&cj);
        let t = target("batch", "v1", "Job", Some("gb"), true);
        assert_eq!(check_create(&t, &job, &cj, &guestbook()), Ok(()));
        assert_eq!(create_owners(&job["metadata"]).len(), 1);
        // A CronJob that already runs privileged with a host path: the Job copies it.
        let host = json!({"hostPID": true, "volumes": [{"name": "h", "hostPath": {"path": "/var/log"}}],
            "containers": [{"name": "run", "image": "busybox",
                "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_PTRACE"]}}}]});
        let cj = cronjob(host);
        assert_eq!(check_create(&t, &job_from(&cj), &cj, &guestbook()), Ok(()));
    }

    #[test]
    fn argo_cds_create_workflow_actions_are_allowed() {
        let cron = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "CronWorkflow",
            "metadata": {"name": "report", "namespace": "gb-jobs", "uid": "cw-uid",
                "annotations": {TRACKING_ANNOTATION: "guestbook:argoproj.io/CronWorkflow:gb-jobs/report"}},
            "spec": {"schedule": "@daily", "workflowSpec": {"entrypoint": "main", "serviceAccountName": "reporter",
                "templates": [{"name": "main", "container": {"image": "alpine", "command": ["date"]}}]}}});
        // What `argoproj.io/CronWorkflow/actions/create-workflow` makes of it.
        let wf = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "report-202611241000", "namespace": "gb-jobs",
                "labels": {"workflows.argoproj.io/cron-workflow": "report"},
                "annotations": {"workflows.argoproj.io/scheduled-time": "2026-11-24T24:10:00Z"},
                "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "CronWorkflow",
                    "name": "report", "uid": "cw-uid"}]},
            "spec": cron["spec"]["workflowSpec"].clone()});
        let t = target("argoproj.io", "v1alpha1", "Workflow", Some("gb-jobs"), true);
        assert_eq!(check_create(&t, &wf, &cron, &guestbook()), Ok(()));
        // A Workflow that adds a privileged step or another service account is not a copy.
        let mut worse = wf.clone();
        worse["spec"]["templates"][0]["container"]["securityContext"] = json!({"privileged": true});
        assert!(check_create(&t, &worse, &cron, &guestbook()).is_err());
        let mut other_sa = wf.clone();
        other_sa["spec"]["serviceAccountName"] = json!("argocd-application-controller");
        assert!(check_create(&t, &other_sa, &cron, &guestbook()).is_err());
        let mut patched = wf;
        patched["spec"]["podSpecPatch"] = json!("{\"hostPID\": true}");
        assert!(check_create(&t, &patched, &cron, &guestbook()).is_err());
    }

    /// Each attack of the issue, with an owner reference to an object the Application
    /// really manages: refused.
    #[test]
    fn attacks_with_a_managed_owner_are_refused() {
        let cj = cronjob(plain_pod_spec());
        let owner_ref = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "cj-uid"}]);
        let meta = |ns: &str| {
            json!({"name": "x", "namespace": ns, "ownerReferences": owner_ref,
            "labels": {INSTANCE_LABEL: "guestbook"},
            "annotations": {TRACKING_ANNOTATION: "guestbook:/Secret:kube-system/x"}})
        };
        let app = guestbook();
        let refused = |t: CreateTarget, body: Value, why: &str| {
            let r = check_create(&t, &body, &cj, &app);
            assert!(r.as_ref().is_err_and(|e| e.contains(why)), "{body}: {r:?}");
        };
        // A Secret in kube-system.
        refused(
            target("", "v1", "Secret", Some("kube-system"), true),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("kube-system"), "data": {}}),
            "not a destination",
        );
        // A service-account token Secret, even in the Application's own namespace.
        refused(
            target("", "v1", "Secret", Some("gb"), true),
            json!({"apiVersion": "v1", "kind": "Secret", "type": SERVICE_ACCOUNT_TOKEN,
                "metadata": {"name": "tok", "ownerReferences": owner_ref,
                    "annotations": {"kubernetes.io/service-account.name": "argocd-application-controller"}}}),
            "service-account token",
        );
        // A privileged hostPID/hostPath Pod in kube-system, and in the Application's namespace.
        let evil = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("kube-system"),
            "spec": {"hostPID": true, "hostNetwork": true,
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "containers": [{"name": "sh", "image": "busybox",
                    "securityContext": {"privileged": true}}]}});
        refused(
            target("", "v1", "Pod", Some("kube-system"), true),
            evil.clone(),
            "not a destination",
        );
        let mut here = evil;
        here["metadata"] = meta("gb");
        refused(
            target("", "v1", "Pod", Some("gb"), true),
            here,
            "asks for hostNetwork, hostPID, hostPath /, privileged",
        );
        // A Namespace and a ClusterRoleBinding to cluster-admin: cluster-scoped.
        refused(
            target("", "v1", "Namespace", None, false),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil", "ownerReferences": owner_ref}}),
            "cluster-scoped",
        );
        refused(
            target(RBAC_GROUP, "v1", "ClusterRoleBinding", None, false),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "pwn", "ownerReferences": owner_ref},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "gb"}]}),
            "cluster-scoped",
        );
        // A namespaced path for a cluster-scoped kind is still cluster-scoped.
        refused(
            target(RBAC_GROUP, "v1", "ClusterRoleBinding", Some("gb"), false),
            json!({"metadata": {"name": "pwn", "ownerReferences": owner_ref}}),
            "cluster-scoped",
        );
        // A RoleBinding in its own namespace: the Application manages no RBAC.
        refused(
            target(RBAC_GROUP, "v1", "RoleBinding", Some("gb"), true),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta("gb"),
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "gb"}]}),
            "manages no RoleBinding",
        );
        // A body whose namespace or kind disagrees with the request.
        refused(
            target("", "v1", "ConfigMap", Some("gb"), true),
            json!({"kind": "ConfigMap", "metadata": meta("kube-system")}),
            "not the request's",
        );
        refused(
            target("", "v1", "ConfigMap", Some("gb"), true),
            json!({"kind": "Secret", "metadata": meta("gb")}),
            "not the request's",
        );
    }

    #[test]
    fn rbac_and_token_secrets_follow_what_the_application_manages() {
        let cj = cronjob(plain_pod_spec());
        let mut app = guestbook();
        let rb = target(RBAC_GROUP, "v1", "RoleBinding", Some("gb"), true);
        let body = json!({"metadata": {"name": "rb"}});
        assert!(check_create(&rb, &body, &cj, &app).is_err());
        app.kinds.insert((RBAC_GROUP.into(), "RoleBinding".into()));
        assert_eq!(check_create(&rb, &body, &cj, &app), Ok(()));
        let secret = target("", "v1", "Secret", Some("gb"), true);
        let tok = json!({"type": SERVICE_ACCOUNT_TOKEN, "metadata": {"name": "t"}});
        assert!(check_create(&secret, &tok, &cj, &app).is_err());
        app.kinds.insert(("".into(), "Secret".into()));
        assert_eq!(check_create(&secret, &tok, &cj, &app), Ok(()));
    }

    #[test]
    fn labels_and_annotations_of_a_new_object_admit_nothing() {
        let meta = json!({"name": "x", "labels": {INSTANCE_LABEL: "guestbook"},
            "annotations": {TRACKING_ANNOTATION: "guestbook:/Secret:gb/x"}});
        assert!(create_owners(&meta).is_empty());
        // An owner reference without a uid names no particular object.
        let meta = json!({"ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly"}]});
        assert!(create_owners(&meta).is_empty());
    }

    #[test]
    fn privilege_is_found_wherever_a_pod_spec_sits() {
        // The mounted token of a pod spec without `automountServiceAccountToken: false` is
        // its own ask, tested below.
        let asks = |v: Value| {
            let mut found = privilege_asks(&v).unwrap();
            found.remove(AUTOMOUNT);
            found.into_iter().collect::<Vec<_>>()
        };
        let pod = |spec: Value| json!({"kind": "Pod", "spec": spec});
        let template =
            |spec: Value| json!({"kind": "Deployment", "spec": {"template": {"spec": spec}}});
        let cron = |spec: Value| json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        for wrap in [pod, template, cron] {
            assert!(asks(wrap(plain_pod_spec())).is_empty());
            assert_eq!(
                asks(wrap(json!({"hostIPC": true, "hostPID": false}))),
                ["hostIPC"]
            );
            assert_eq!(
                asks(wrap(
                    json!({"initContainers": [{"securityContext": {"allowPrivilegeEscalation": true}}]})
                )),
                ["allowPrivilegeEscalation"]
            );
            assert_eq!(
                asks(wrap(
                    json!({"ephemeralContainers": [{"securityContext": {"procMount": "Unmasked"}}]})
                )),
                ["procMount Unmasked"]
            );
            assert_eq!(
                asks(wrap(
                    json!({"containers": [{"securityContext": {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"], "drop": ["ALL"]}}}]})
                )),
                ["capabilities.add NET_ADMIN", "capabilities.add SYS_ADMIN"]
            );
            assert_eq!(
                asks(wrap(
                    json!({"containers": [{"ports": [{"containerPort": 80, "hostPort": 80}]}]})
                )),
                ["hostPort 80"]
            );
        }
        // Keys in any case; defaults that ask for nothing.
        assert_eq!(
            asks(json!({"spec": {"HostNetwork": true}})),
            ["hostNetwork"]
        );
        assert!(
            asks(json!({"spec": {"serviceAccountName": "default",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"securityContext": {"procMount": "Default", "privileged": false}}]}}))
            .is_empty()
        );
        assert_eq!(
            asks(json!({"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}})),
            ["seccompProfile Unconfined"]
        );
        assert_eq!(
            asks(json!({"spec": {"serviceAccountName": "admin"}})),
            ["serviceAccountName admin"]
        );
        // Too deep to check: refused.
        let mut deep = json!(true);
        for _ in 0..(MAX_SCAN_DEPTH + 2) {
            deep = json!({"a": deep});
        }
        assert!(privilege_asks(&deep).is_err());
    }

    #[test]
    fn what_a_pod_reads_and_where_it_runs_are_asks() {
        let asks = |spec: Value| {
            let pod = json!({"kind": "Pod", "spec": spec});
            privilege_asks(&pod)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>()
        };
        let c = |extra: Value| {
            let mut c = json!({"name": "c", "image": "i"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!({"automountServiceAccountToken": false, "containers": [c]})
        };
        assert!(asks(c(json!({}))).is_empty());
        assert_eq!(asks(json!({"containers": []})), [AUTOMOUNT]);
        assert_eq!(
            asks(json!({"automountServiceAccountToken": true, "containers": []})),
            [AUTOMOUNT]
        );
        assert_eq!(
            asks(c(json!({"env": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}],
                "envFrom": [{"secretRef": {"name": "api"}}, {"configMapRef": {"name": "env"}}]}))),
            ["configMap cfg", "configMap env", "secret api", "secret db"]
        );
        let mut spec = c(json!({}));
        spec["volumes"] = json!([
            {"name": "a", "secret": {"secretName": "tls"}},
            {"name": "b", "configMap": {"name": "web"}},
            {"name": "c", "projected": {"sources": [{"secret": {"name": "p"}},
                {"serviceAccountToken": {"audience": "vault", "path": "t"}},
                {"serviceAccountToken": {"path": "u"}}]}},
            {"name": "d", "nfs": {"server": "s", "path": "/"}},
            {"name": "e", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-creds"}}},
            {"name": "f", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "g", "emptyDir": {}}]);
        assert_eq!(
            asks(spec),
            [
                "configMap web",
                "persistentVolumeClaim data",
                "secret csi-creds",
                "secret p",
                "secret tls",
                "serviceAccountToken audience (the API server)",
                "serviceAccountToken audience vault",
                "volume type csi",
                "volume type nfs"
            ]
        );
        let mut spec = c(json!({}));
        spec["nodeName"] = json!("control-plane-1");
        spec["runtimeClassName"] = json!("runc-unconfined");
        spec["priorityClassName"] = json!("system-node-critical");
        spec["priority"] = json!(2000001000);
        spec["containers"][0]["securityContext"] = json!({"runAsUser": 0, "runAsGroup": 1000});
        spec["tolerations"] = json!([{"operator": "Exists"}, {"operator": "Exists", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]);
        spec["securityContext"] = json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"},
            {"name": "net.ipv4.tcp_syncookies", "value": "1"}]});
        assert_eq!(
            asks(spec),
            [
                "nodeName control-plane-1",
                "priority 2000001000",
                "priorityClassName system-node-critical",
                "runAsUser 0 (root)",
                "runtimeClassName runc-unconfined",
                "sysctl kernel.msgmax",
                "toleration gpu:Equal:yes:NoSchedule",
                "toleration of every NoSchedule taint",
                "toleration of every taint"
            ]
        );
    }

    #[test]
    fn configmap_and_secret_data_keys_are_not_fields() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"nodeName": "worker-1", "hostPID": "true"}});
        assert!(privilege_asks(&cm).unwrap().is_empty());
        // Any other kind is searched whole.
        let other = json!({"kind": "Thing", "data": {"nodeName": "worker-1"}});
        assert_eq!(
            privilege_asks(&other)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            ["nodeName worker-1"]
        );
    }

    #[test]
    fn the_owner_baseline_admits_only_what_the_owner_references() {
        let cj = cronjob(json!({"restartPolicy": "Never",
            "volumes": [{"name": "cfg", "secret": {"secretName": "app-config"}}],
            "containers": [{"name": "run", "image": "busybox",
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "app-config", "key": "pw"}}}]}]}));
        let t = target("batch", "v1", "Job", Some("gb"), true);
        assert_eq!(check_create(&t, &job_from(&cj), &cj, &guestbook()), Ok(()));
        let mut other = job_from(&cj);
        other["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
            ["name"] = json!("argocd-secret");
        let e = check_create(&t, &other, &cj, &guestbook()).unwrap_err();
        assert!(e.contains("secret argocd-secret"), "{e}");
        let mut pinned = job_from(&cj);
        pinned["spec"]["template"]["spec"]["nodeName"] = json!("master");
        assert!(
            check_create(&t, &pinned, &cj, &guestbook())
                .unwrap_err()
                .contains("nodeName master")
        );
        // An owner that turns the token off does not let a copy turn it back on.
        let mut quiet = cj.clone();
        quiet["spec"]["jobTemplate"]["spec"]["template"]["spec"]["automountServiceAccountToken"] =
            json!(false);
        let e = check_create(&t, &job_from(&cj), &quiet, &guestbook()).unwrap_err();
        assert!(e.contains(AUTOMOUNT), "{e}");
    }

    #[test]
    fn patches_keep_the_tracking_that_makes_an_object_managed() {
        let before = json!({"name": "web", "namespace": "gb",
            "labels": {INSTANCE_LABEL: "guestbook", "tier": "web"},
            "annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:gb/web"}});
        let t = Tracking::default();
        let mut relabelled = before.clone();
        relabelled["labels"]["tier"] = json!("front");
        assert_eq!(check_tracking_kept(&t, &before, &relabelled), Ok(()));
        let mut dropped = before.clone();
        dropped["labels"]
            .as_object_mut()
            .unwrap()
            .remove(INSTANCE_LABEL);
        let e = check_tracking_kept(&t, &before, &dropped).unwrap_err();
        assert!(
            e.contains("app.kubernetes.io/instance") && e.contains("unset"),
            "{e}"
        );
        let mut moved = before.clone();
        moved["annotations"][TRACKING_ANNOTATION] = json!("other:apps/Deployment:gb/web");
        assert!(check_tracking_kept(&t, &before, &moved).is_err());
        let mut installed = before.clone();
        installed["annotations"][INSTALLATION_ID_ANNOTATION] = json!("elsewhere");
        assert!(check_tracking_kept(&t, &before, &installed).is_err());
        // With label tracking only the label counts; the annotation is not read.
        let label =
            Tracking::from_argocd_cm(&json!({"application.resourceTrackingMethod": "label"}));
        assert_eq!(check_tracking_kept(&label, &before, &moved), Ok(()));
        assert!(check_tracking_kept(&label, &before, &dropped).is_err());
    }

    #[test]
    fn create_bodies_are_read_as_the_api_server_reads_them() {
        assert!(read_create_body("application/json", br#"{"kind":"Job"}"#).is_ok());
        assert!(read_create_body("", br#"{"kind":"Job"}"#).is_ok());
        assert!(read_create_body("application/json; charset=utf-8", br#"{}"#).is_ok());
        for (ct, body) in [
            ("application/yaml", &br#"{"kind":"Job"}"#[..]),
            ("application/vnd.kubernetes.protobuf", b"k8s\0"),
            ("application/json", b"[]"),
            ("application/json", b"\"x\""),
            ("application/json", b"{"),
            // A repeated key: Go's decoder would merge the two `spec`s (hostPID stays).
            (
                "application/json",
                br#"{"spec":{"hostPID":true},"spec":{"containers":[]}}"#,
            ),
            (
                "application/json",
                br#"{"metadata":{"namespace":"gb","namespace":"kube-system"}}"#,
            ),
        ] {
            assert!(
                read_create_body(ct, body).is_err(),
                "{ct} {}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn status_bodies_are_kubernetes_status() {
        let v: Value = serde_json::from_slice(&status_body(403, "Forbidden", "no")).unwrap();
        assert_eq!(
            v,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"no","reason":"Forbidden","code":403})
        );
    }

    #[test]
    fn list_and_table_entries() {
        let mut list = json!({"kind": "PodList", "metadata": {"resourceVersion": "5"},
            "items": [{"metadata": {"name": "a"}}]});
        assert_eq!(entries_mut(&mut list).map(|e| e.len()), Some(1));
        let mut table = json!({"kind": "Table", "rows": [
            {"cells": ["a"], "object": {"metadata": {"name": "a"}}},
            {"cells": ["b"]}]});
        let rows = entries_mut(&mut table).unwrap();
        assert!(entry_metadata(&rows[0]).is_some());
        assert!(entry_metadata(&rows[1]).is_none());
        assert!(entries_mut(&mut json!({"kind": "Pod"})).is_none());
    }

    #[test]
    fn accept_headers() {
        assert!(accepts_plain_json(""));
        assert!(accepts_plain_json("application/json"));
        assert!(accepts_plain_json("application/json, */*"));
        assert!(!accepts_plain_json(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!accepts_plain_json(
            "application/vnd.kubernetes.protobuf,application/json"
        ));
        assert_eq!(
            json_accept("application/vnd.kubernetes.protobuf,application/json"),
            "application/json"
        );
        assert_eq!(
            json_accept(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            "application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json"
        );
        assert_eq!(json_accept(""), "application/json");
    }
}
