//! The in-memory object store: objects, the global resourceVersion and the event history.
//!
//! All writes go through [`Store`] under one lock, so every write gets the next
//! resourceVersion and lands in the history in order, which is what watches replay.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::ResourceType;
use super::managed_fields::{self, Writer};
use super::status::ApiError;
use super::validation;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

/// One write, as kept in the history.
#[derive(Debug, Clone)]
pub struct Event {
    /// resourceVersion of the write.
    pub rv: u64,
    /// Index of the resource type.
    pub res: usize,
    /// What happened.
    pub kind: EventType,
    /// The object after the write (for `Deleted`: its last state, with the new resourceVersion).
    pub object: Arc<Value>,
    /// The object before the write (`None` for `Added`); used for selector transitions and
    /// for rebuilding older states for `resourceVersionMatch=Exact`.
    pub prev: Option<Arc<Value>>,
    /// `object` as JSON, written once by the first watch that sends it (the API server's
    /// watch cache also encodes an object once for all its watchers, `cachingObject`).
    json: Arc<OnceLock<String>>,
}

impl Event {
    /// `object` as JSON, encoded at most once for every watch that sends this event.
    pub fn object_json(&self) -> &str {
        self.json.get_or_init(|| self.object.to_string())
    }
}

type Key = (usize, String, String);

struct Inner {
    rv: u64,
    /// Shared with the history's newest event of each object (written once per write).
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Event>,
    /// Every event with `rv > history_start` is in `history`.
    history_start: u64,
    /// Set for the duration of one `dryRun=All` request: writes are computed, not stored.
    dry_run: bool,
}

/// How a patch body is to be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 7386.
    Merge,
    /// RFC 6902.
    Json,
    /// Strategic merge patch (built-in kinds only; see `strategic`).
    Strategic,
    /// Server-side apply with field ownership (see `managed_fields`).
    Apply,
}

/// What a delete did.
pub enum DeleteOutcome {
    /// The object is gone; its last state.
    Deleted(Value),
    /// The object has finalizers; it is marked for deletion and stays.
    Pending(Value),
}

/// How an update or patch is applied.
#[derive(Debug, Clone, Default)]
pub struct WriteMode {
    /// The request is on the `/status` subresource: only `.status` changes.
    pub status_only: bool,
    /// `dryRun=All`: compute the result, store nothing.
    pub dry_run: bool,
    /// The field manager, for `managedFields`.
    pub writer: Writer,
    /// `force=true`: server-side apply takes fields other managers own.
    pub force: bool,
}

/// How a create records field ownership.
enum FieldOp<'a> {
    Update(&'a Writer),
    Apply(&'a Writer),
    Untracked,
}

/// Optional delete preconditions (`DeleteOptions.preconditions`).
#[derive(Debug, Default, Clone)]
pub struct Preconditions {
    /// Required uid.
    pub uid: Option<String>,
    /// Required resourceVersion.
    pub resource_version: Option<String>,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    /// Current resourceVersion, for waking watches.
    rv_tx: watch::Sender<u64>,
    /// Registered resource types; indices are stable.
    pub resources: Vec<ResourceType>,
    history_limit: usize,
    auto_create_namespaces: bool,
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Unreachable: metadata was made an object just above.
        _ => unreachable!("metadata is an object"),
    }
}

/// The object without the fields that do not count for `generation`.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

/// Secrets: `stringData` is write-only; the apiserver base64-encodes it into `data`
/// (overriding keys there) and never stores it.
fn fold_string_data(secret: &mut Map<String, Value>) {
    use base64::Engine as _;
    let Some(Value::Object(string_data)) = secret.remove("stringData") else {
        return;
    };
    if !secret.get("data").is_some_and(Value::is_object) {
        secret.insert("data".into(), json!({}));
    }
    if let Some(Value::Object(data)) = secret.get_mut("data") {
        for (k, v) in string_data {
            let text = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(k, Value::String(encoded));
        }
    }
}

/// Delete preconditions (`DeleteOptions.preconditions`): 409 when they do not hold.
fn check_preconditions(
    r: &ResourceType,
    name: &str,
    old: &Value,
    pre: &Preconditions,
) -> Result<(), ApiError> {
    if let Some(uid) = &pre.uid
        && Some(uid.as_str()) != str_at(old, "/metadata/uid")
    {
        return Err(ApiError::conflict(
            r,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                str_at(old, "/metadata/uid").unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = &pre.resource_version
        && Some(rv.as_str()) != str_at(old, "/metadata/resourceVersion")
    {
        return Err(ApiError::conflict(
            r,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                str_at(old, "/metadata/resourceVersion").unwrap_or("")
            ),
        ));
    }
    Ok(())
}

impl Store {
    /// An empty store with the given resource types.
    pub fn new(
        resources: Vec<ResourceType>,
        history_limit: usize,
        auto_create_namespaces: bool,
    ) -> Self {
        let (rv_tx, _) = watch::channel(0);
        Self {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_start: 0,
                dry_run: false,
            }),
            rv_tx,
            resources,
            history_limit: history_limit.max(1),
            auto_create_namespaces,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written object (writes are one
        // insert + one push), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Receiver that changes on every write.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }

    /// Index of a resource type by group, version and plural.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// Whether any resource of this group/version is served.
    pub fn find_gv(&self, group: &str, version: &str) -> bool {
        self.resources
            .iter()
            .any(|r| r.group == group && r.version == version)
    }

    fn namespace_res(&self) -> Option<usize> {
        self.find("", "v1", "namespaces")
    }

    /// Current resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets the event history: watches and exact lists from older RVs get 410.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.history_start = g.rv;
    }

    fn commit(
        &self,
        g: &mut Inner,
        res: usize,
        kind: EventType,
        mut object: Value,
        prev: Option<Arc<Value>>,
    ) -> Value {
        if g.dry_run {
            // What the write would store; a created object has no resourceVersion yet.
            if kind == EventType::Added {
                meta_mut(&mut object).remove("resourceVersion");
            }
            return object;
        }
        g.rv += 1;
        let rv = g.rv;
        meta_mut(&mut object).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let ns = str_at(&object, "/metadata/namespace")
            .unwrap_or("")
            .to_string();
        let name = str_at(&object, "/metadata/name").unwrap_or("").to_string();
        let key = (res, ns, name);
        let stored = Arc::new(object.clone());
        match kind {
            EventType::Deleted => {
                g.objects.remove(&key);
            }
            _ => {
                g.objects.insert(key, stored.clone());
            }
        }
        g.history.push_back(Event {
            rv,
            res,
            kind,
            object: stored,
            prev,
            json: Arc::default(),
        });
        while g.history.len() > self.history_limit {
            if let Some(e) = g.history.pop_front() {
                g.history_start = e.rv;
            }
        }
        self.rv_tx.send_replace(rv);
        if kind == EventType::Deleted && self.resources[res].namespaced {
            let ns = str_at(&object, "/metadata/namespace")
                .unwrap_or("")
                .to_string();
            self.finalize_namespace(g, &ns);
        }
        object
    }

    /// One object.
    pub fn get(&self, res: usize, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&(res, ns.to_string(), name.to_string()))
            .map(|v| Value::clone(v))
            .ok_or_else(|| ApiError::not_found(&self.resources[res], name))
    }

    /// Current objects of a type (in one namespace, or all when `ns` is `None`) and the RV
    /// they are consistent with.
    pub fn list(&self, res: usize, ns: Option<&str>) -> (Vec<Value>, u64) {
        let g = self.lock();
        // By key range: a write-triggered list of a small type (the pod log generator lists
        // pods on every write) must not walk every object of every type.
        let items = g
            .objects
            .range((res, ns.unwrap_or("").to_string(), String::new())..)
            .take_while(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| Value::clone(v))
            .collect();
        (items, g.rv)
    }

    /// One page of a list of type `res` (in `ns` if given), as the objects were right after
    /// resourceVersion `q.at` (`resourceVersionMatch=Exact` and continued lists) or as they
    /// are now, in key order after `q.after`, keeping those `keep` accepts, at most `q.limit`
    /// (0: all). `keep` is `None` when no selector filters the list: then the objects after
    /// the page are counted (`remainingItemCount`), which with a selector they are not (the
    /// API server gives no count then, and evaluating a selector over the rest of the type
    /// for every page would make paging quadratic).
    ///
    /// Only the page is cloned: the store is walked by key range from `after`, and an older
    /// snapshot is the current objects overlaid with the states the history undoes, so a
    /// continued list of n objects costs O(n) in all, not O(n) per page.
    pub fn list_page(
        &self,
        res: usize,
        ns: Option<&str>,
        q: &PageQuery,
        keep: Option<&dyn Fn(&Value) -> bool>,
    ) -> Result<Page, ApiError> {
        let g = self.lock();
        let at = q.at.unwrap_or(g.rv);
        if at < g.history_start {
            return Err(ApiError::expired(at, g.history_start));
        }
        if at > g.rv {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {at}, current: {}", g.rv),
            ));
        }
        // The state at `at` of every key written later: the `prev` of its oldest later write.
        let mut undo: BTreeMap<(String, String), Option<&Arc<Value>>> = BTreeMap::new();
        let later = g.history.partition_point(|e| e.rv <= at);
        for e in g.history.range(later..).filter(|e| e.res == res) {
            let obj = e.prev.as_deref().unwrap_or(&e.object);
            let key = (
                str_at(obj, "/metadata/namespace").unwrap_or("").to_string(),
                str_at(obj, "/metadata/name").unwrap_or("").to_string(),
            );
            undo.entry(key).or_insert(e.prev.as_ref());
        }
        let in_scope = |n: &str, name: &str| {
            ns.is_none_or(|ns| ns == n)
                && q.after
                    .as_ref()
                    .is_none_or(|(an, am)| (n, name) > (an.as_str(), am.as_str()))
        };
        let from_ns = (res, ns.unwrap_or("").to_string(), String::new());
        let lo = match &q.after {
            Some((an, am)) => from_ns.max((res, an.clone(), am.clone())),
            None => from_ns,
        };
        // The range starts at `after` itself (or the namespace): skip that one, then every
        // key is in scope until the type or the namespace ends.
        let now = g
            .objects
            .range(lo..)
            .take_while(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
            .skip_while(|((_, n, m), _)| !in_scope(n, m))
            .map(|((_, n, m), v)| ((n.as_str(), m.as_str()), Some(v)));
        let then = undo
            .iter()
            .filter(|((n, m), _)| in_scope(n, m))
            .map(|((n, m), v)| ((n.as_str(), m.as_str()), *v));
        let mut merged = merge_by_key(now, then).filter(|v| keep.is_none_or(|k| k(v)));
        let mut items = Vec::new();
        for v in merged.by_ref() {
            // Shared, not copied: the page is encoded from the stored objects.
            items.push(Arc::clone(v));
            if q.limit > 0 && items.len() == q.limit {
                break;
            }
        }
        let (more, remaining) = match keep {
            None => {
                let n = merged.count();
                (n > 0, Some(n))
            }
            Some(_) => (merged.next().is_some(), None),
        };
        Ok(Page {
            items,
            rv: at,
            more,
            remaining,
        })
    }

    /// Events of type `res` after `rv`, or 410 if the history no longer reaches back that far.
    pub fn events_since(&self, res: usize, rv: u64) -> Result<(Vec<Event>, u64), ApiError> {
        let g = self.lock();
        if rv < g.history_start {
            return Err(ApiError::expired(rv, g.history_start));
        }
        // The history is in resourceVersion order: start after `rv` by binary search, as the
        // API server's watch cache does, instead of walking all of it at every wake-up of
        // every watch (with 50,000 events kept, that walk was most of a storm's hub CPU).
        let from = g.history.partition_point(|e| e.rv <= rv);
        let events = g
            .history
            .range(from..)
            .filter(|e| e.res == res)
            .cloned()
            .collect();
        Ok((events, g.rv))
    }

    /// Checks kind/apiVersion/namespace/name of a request body against the URL.
    fn check_body(
        &self,
        res: usize,
        ns: &str,
        body: &Value,
        url_name: Option<&str>,
    ) -> Result<(), ApiError> {
        let r = &self.resources[res];
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "the body of the request for {} is not a JSON object",
                r.qualified_plural()
            )));
        }
        if let Some(av) = body.get("apiVersion").and_then(Value::as_str)
            && av != r.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                r.api_version()
            )));
        }
        if let Some(k) = body.get("kind").and_then(Value::as_str)
            && k != r.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                r.kind
            )));
        }
        if let Some(bns) = str_at(body, "/metadata/namespace")
            && !bns.is_empty()
            && r.namespaced
            && bns != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if let Some(url_name) = url_name {
            let bname = str_at(body, "/metadata/name").unwrap_or("");
            if bname != url_name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({bname}) does not match the name on the URL ({url_name})"
                )));
            }
        }
        Ok(())
    }

    /// POST.
    pub fn create(
        &self,
        res: usize,
        ns: &str,
        body: Value,
        dry_run: bool,
        writer: &Writer,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        g.dry_run = dry_run;
        self.create_locked(&mut g, res, ns, body, FieldOp::Update(writer))
    }

    fn create_locked(
        &self,
        g: &mut Inner,
        res: usize,
        ns: &str,
        mut obj: Value,
        fields: FieldOp<'_>,
    ) -> Result<Value, ApiError> {
        self.check_body(res, ns, &obj, None)?;
        let r = &self.resources[res];
        let is_namespace = Some(res) == self.namespace_res();
        let meta = meta_mut(&mut obj);
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    r,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let suffix: String = (0..5)
                .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
                .collect();
            name = format!("{prefix}{suffix}");
        }
        if let Some(e) = validation::name_error(&name, is_namespace) {
            return Err(ApiError::invalid(r, &name, &e));
        }
        meta.insert("name".into(), Value::String(name.clone()));
        if r.namespaced {
            meta.insert("namespace".into(), Value::String(ns.to_string()));
        } else {
            meta.remove("namespace");
        }
        meta.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        meta.insert("creationTimestamp".into(), Value::String(now()));
        if r.generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if is_namespace {
            // The NamespaceDefaultLabelName admission: the name as an immutable label.
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert(
                    "kubernetes.io/metadata.name".into(),
                    Value::String(name.clone()),
                );
            }
        }
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(server_owned);
        }
        let obj_map = obj
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("body is not an object"))?;
        set_type_and_secret_defaults(r, obj_map)?;
        if r.status_subresource {
            // The apiserver drops status on create when the status subresource is enabled.
            obj_map.remove("status");
        }
        if is_namespace {
            obj_map.insert("status".into(), json!({"phase": "Active"}));
            if obj_map
                .get("spec")
                .is_none_or(|s| s.get("finalizers").is_none())
            {
                obj_map.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
            }
        }
        validation::validate(r, &obj)?;
        meta_mut(&mut obj).remove("managedFields");
        match fields {
            FieldOp::Update(w) => managed_fields::record_update(r, None, &mut obj, w, &now()),
            FieldOp::Apply(w) => managed_fields::applied_on_create(r, &mut obj, w, &now()),
            FieldOp::Untracked => {}
        }
        let key = (
            res,
            if r.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.clone(),
        );
        if g.objects.contains_key(&key) {
            return Err(ApiError::already_exists(r, &name));
        }
        if r.namespaced
            && let Some(nsr) = self.namespace_res()
            && !g
                .objects
                .contains_key(&(nsr, String::new(), ns.to_string()))
        {
            if !self.auto_create_namespaces {
                return Err(ApiError::not_found(&self.resources[nsr], ns));
            }
            self.create_locked(
                g,
                nsr,
                "",
                json!({"metadata": {"name": ns}}),
                FieldOp::Untracked,
            )?;
        }
        if r.namespaced
            && let Some(nsr) = self.namespace_res()
            && g.objects
                .get(&(nsr, String::new(), ns.to_string()))
                .is_some_and(|n| n.pointer("/metadata/deletionTimestamp").is_some())
        {
            return Err(ApiError::namespace_terminating(r, &name, ns));
        }
        Ok(self.commit(g, res, EventType::Added, obj, None))
    }

    /// PUT on the object (`status_only == false`) or on its `/status`.
    pub fn update(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        body: Value,
        mode: WriteMode,
    ) -> Result<Value, ApiError> {
        let WriteMode {
            status_only,
            dry_run,
            writer,
            ..
        } = mode;
        self.check_body(res, ns, &body, Some(name))?;
        let r = &self.resources[res];
        let mut g = self.lock();
        if !g
            .objects
            .contains_key(&(res, ns.to_string(), name.to_string()))
        {
            return Err(ApiError::not_found(r, name));
        }
        if r.custom && str_at(&body, "/metadata/resourceVersion").is_none_or(str::is_empty) {
            // CRDs do not allow unconditional updates (built-in kinds mostly do).
            return Err(ApiError::invalid(
                r,
                name,
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
            ));
        }
        g.dry_run = dry_run;
        self.update_locked(&mut g, res, ns, name, body, status_only, Some(&writer))
    }

    /// `writer: None`: `new` already carries its `managedFields` (server-side apply).
    #[allow(clippy::too_many_arguments)]
    fn update_locked(
        &self,
        g: &mut Inner,
        res: usize,
        ns: &str,
        name: &str,
        new: Value,
        status_only: bool,
        writer: Option<&Writer>,
    ) -> Result<Value, ApiError> {
        let r = &self.resources[res];
        // Shared with the store (a write replaces it, never changes it in place).
        let old: Arc<Value> = g
            .objects
            .get(&(res, ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        let wanted_rv = str_at(&new, "/metadata/resourceVersion").unwrap_or("");
        let old_rv = str_at(&old, "/metadata/resourceVersion").unwrap_or("");
        if !wanted_rv.is_empty() && wanted_rv != old_rv {
            return Err(ApiError::conflict(
                r,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut merged;
        if status_only {
            merged = Value::clone(&old);
            if writer.is_none() {
                match new.pointer("/metadata/managedFields") {
                    Some(m) => meta_mut(&mut merged).insert("managedFields".into(), m.clone()),
                    None => meta_mut(&mut merged).remove("managedFields"),
                };
            }
            match new.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        } else {
            merged = new;
            let obj_map = merged
                .as_object_mut()
                .ok_or_else(|| ApiError::bad_request("body is not an object"))?;
            set_type_and_secret_defaults(r, obj_map)?;
            if Some(res) == self.namespace_res() {
                // The name label cannot be changed or removed; spec.finalizers only changes
                // through the namespace controller (`/finalize` is not served).
                match old.get("spec") {
                    Some(spec) => obj_map.insert("spec".into(), spec.clone()),
                    None => obj_map.remove("spec"),
                };
                let labels = obj_map
                    .entry("metadata")
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .map(|m| m.entry("labels").or_insert_with(|| json!({})));
                if let Some(Value::Object(l)) = labels {
                    l.insert(
                        "kubernetes.io/metadata.name".into(),
                        Value::String(name.to_string()),
                    );
                }
            }
            if r.status_subresource {
                match old.get("status") {
                    Some(s) => {
                        obj_map.insert("status".into(), s.clone());
                    }
                    None => {
                        obj_map.remove("status");
                    }
                }
            }
            let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
            let meta = meta_mut(&mut merged);
            // Server-owned metadata cannot be changed by clients.
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "name",
                "namespace",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => meta.insert(k.into(), v.clone()),
                    None => meta.remove(k),
                };
            }
            if r.generation && spec_part(&merged) != spec_part(&old) {
                let generation = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    + 1;
                meta_mut(&mut merged).insert("generation".into(), json!(generation));
            }
        }
        meta_mut(&mut merged).insert("resourceVersion".into(), Value::String(old_rv.to_string()));
        if let Some(w) = writer {
            // Clients cannot write managedFields here; the server records the change.
            match old.pointer("/metadata/managedFields") {
                Some(m) => meta_mut(&mut merged).insert("managedFields".into(), m.clone()),
                None => meta_mut(&mut merged).remove("managedFields"),
            };
            let w = Writer {
                status: status_only,
                ..w.clone()
            };
            managed_fields::record_update(r, Some(&old), &mut merged, &w, &now());
        }
        validation::validate(r, &merged)?;
        validation::validate_update(r, &old, &merged)?;
        let deleting = old.pointer("/metadata/deletionTimestamp").is_some();
        let finalizers_empty = merged
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        let spec_finalizers_empty = merged
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        if deleting
            && finalizers_empty
            && (Some(res) != self.namespace_res() || spec_finalizers_empty)
        {
            return Ok(self.commit(g, res, EventType::Deleted, merged, Some(old)));
        }
        if merged == *old {
            // No-op updates write nothing, as on a real apiserver.
            return Ok(Value::clone(&old));
        }
        Ok(self.commit(g, res, EventType::Modified, merged, Some(old)))
    }

    /// PATCH on the object or its `/status`.
    pub fn patch(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        mode: WriteMode,
    ) -> Result<Value, ApiError> {
        let WriteMode {
            status_only,
            dry_run,
            writer,
            force,
        } = mode;
        let writer = Writer {
            status: status_only,
            ..writer
        };
        let r = &self.resources[res];
        let patch: Value = match kind {
            PatchKind::Apply => serde_saphyr::from_str::<Value>(
                std::str::from_utf8(body)
                    .map_err(|e| ApiError::bad_request(format!("apply patch is not UTF-8: {e}")))?,
            )
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML apply patch: {e}")))?,
            _ => serde_json::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!(
                    "error decoding patch for {} \"{name}\": {e}",
                    r.qualified_plural()
                ))
            })?,
        };
        let mut g = self.lock();
        g.dry_run = dry_run;
        let key = (res, ns.to_string(), name.to_string());
        let Some(old) = g.objects.get(&key).map(|v| Value::clone(v)) else {
            if kind == PatchKind::Apply && !status_only {
                self.check_body(res, ns, &patch, Some(name))?;
                return self.create_locked(&mut g, res, ns, patch, FieldOp::Apply(&writer));
            }
            return Err(ApiError::not_found(r, name));
        };
        if kind == PatchKind::Apply {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "an apply configuration must be an object",
                ));
            }
            self.check_body(res, ns, &patch, Some(name))?;
            let doc = managed_fields::apply(r, &old, &patch, &writer, force, &now())?;
            return self.update_locked(&mut g, res, ns, name, doc, status_only, None);
        }
        let mut doc = old.clone();
        match kind {
            PatchKind::Merge | PatchKind::Apply => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                json_patch::merge(&mut doc, &patch);
            }
            PatchKind::Strategic => {
                super::strategic::apply(&mut doc, &patch).map_err(|e| {
                    ApiError::bad_request(format!("invalid strategic merge patch: {e}"))
                })?;
            }
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    ApiError::invalid(r, name, &format!("JSON patch could not be applied: {e}"))
                })?;
            }
        }
        self.check_body(res, ns, &doc, Some(name))?;
        // A patch that does not touch resourceVersion is unconditional; one that sets it is a
        // precondition, checked by the update.
        self.update_locked(&mut g, res, ns, name, doc, status_only, Some(&writer))
    }

    /// DELETE.
    pub fn delete(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        pre: &Preconditions,
        dry_run: bool,
    ) -> Result<DeleteOutcome, ApiError> {
        let mut g = self.lock();
        g.dry_run = dry_run;
        if Some(res) == self.namespace_res() {
            return self.delete_namespace(&mut g, res, name, pre);
        }
        self.delete_locked(&mut g, res, ns, name, pre)
    }

    /// A namespace goes `Terminating` (deletionTimestamp, phase), its contents are deleted,
    /// and it disappears once it is empty and its finalizers are gone — what the namespace
    /// controller does, done synchronously here.
    fn delete_namespace(
        &self,
        g: &mut Inner,
        res: usize,
        name: &str,
        pre: &Preconditions,
    ) -> Result<DeleteOutcome, ApiError> {
        let r = &self.resources[res];
        let old = g
            .objects
            .get(&(res, String::new(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        check_preconditions(r, name, &old, pre)?;
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(DeleteOutcome::Pending(Value::clone(&old)));
        }
        let mut marked = Value::clone(&old);
        meta_mut(&mut marked).insert("deletionTimestamp".into(), Value::String(now()));
        meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(0));
        marked["status"] = json!({"phase": "Terminating"});
        let marked = self.commit(g, res, EventType::Modified, marked, Some(old));
        if g.dry_run {
            return Ok(DeleteOutcome::Pending(marked));
        }
        let contents: Vec<Key> = g
            .objects
            .keys()
            .filter(|(r, n, _)| self.resources[*r].namespaced && n == name)
            .cloned()
            .collect();
        for (r, n, o) in contents {
            match self.delete_locked(g, r, &n, &o, &Preconditions::default()) {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        self.finalize_namespace(g, name);
        Ok(DeleteOutcome::Pending(marked))
    }

    /// Removes a terminating namespace once nothing is left in it: first the `kubernetes`
    /// spec finalizer, then (without metadata finalizers) the namespace itself.
    fn finalize_namespace(&self, g: &mut Inner, ns: &str) {
        let Some(nsr) = self.namespace_res() else {
            return;
        };
        let key = (nsr, String::new(), ns.to_string());
        let Some(current) = g.objects.get(&key).cloned() else {
            return;
        };
        if current.pointer("/metadata/deletionTimestamp").is_none()
            || g.objects
                .keys()
                .any(|(r, n, _)| self.resources[*r].namespaced && n == ns)
        {
            return;
        }
        let mut finalized = Value::clone(&current);
        if finalized
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
        {
            finalized["spec"]["finalizers"] = json!([]);
            finalized = self.commit(g, nsr, EventType::Modified, finalized, Some(current));
        }
        let has_finalizers = finalized
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            self.commit(
                g,
                nsr,
                EventType::Deleted,
                finalized.clone(),
                Some(Arc::new(finalized)),
            );
        }
    }

    fn delete_locked(
        &self,
        g: &mut Inner,
        res: usize,
        ns: &str,
        name: &str,
        pre: &Preconditions,
    ) -> Result<DeleteOutcome, ApiError> {
        let r = &self.resources[res];
        // The stored object itself is the event's `prev`: one copy, for what is committed.
        let old = g
            .objects
            .get(&(res, ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        check_preconditions(r, name, &old, pre)?;
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            let gone = self.commit(g, res, EventType::Deleted, Value::clone(&old), Some(old));
            return Ok(DeleteOutcome::Deleted(gone));
        }
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(DeleteOutcome::Pending(Value::clone(&old)));
        }
        let mut marked = Value::clone(&old);
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        let meta = meta_mut(&mut marked);
        meta.insert("deletionTimestamp".into(), Value::String(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if r.generation {
            meta.insert("generation".into(), json!(generation));
        }
        Ok(DeleteOutcome::Pending(self.commit(
            g,
            res,
            EventType::Modified,
            marked,
            Some(old),
        )))
    }
}

/// Every write: `apiVersion` and `kind` from the resource; for Secrets, `data` must be
/// base64, `stringData` is folded into `data`, and `type` defaults to `Opaque`.
fn set_type_and_secret_defaults(
    r: &ResourceType,
    obj_map: &mut serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    obj_map.insert("apiVersion".into(), Value::String(r.api_version()));
    obj_map.insert("kind".into(), Value::String(r.kind.clone()));
    if r.group.is_empty() && r.kind == "Secret" {
        validation::check_secret_base64(r, &Value::Object(obj_map.clone()))?;
        fold_string_data(obj_map);
        if obj_map
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            obj_map.insert("type".into(), json!("Opaque"));
        }
    }
    Ok(())
}

/// Where a list page starts and how long it is (see [`Store::list_page`]).
#[derive(Debug, Clone, Default)]
pub struct PageQuery {
    /// The snapshot to list (`None`: now).
    pub at: Option<u64>,
    /// The last key of the previous page.
    pub after: Option<(String, String)>,
    /// Most objects in the page (0: all).
    pub limit: usize,
}

/// One list page.
#[derive(Debug)]
pub struct Page {
    /// The objects, in key order (as stored: shared, never changed in place).
    pub items: Vec<Arc<Value>>,
    /// The resourceVersion the page was read at.
    pub rv: u64,
    /// Whether a matching object follows the page.
    pub more: bool,
    /// How many follow it (counted only without a selector).
    pub remaining: Option<usize>,
}

/// Merges two key-ordered walks; where both hold a key, `then` (the older state) wins, and a
/// `None` there means the object did not exist yet.
fn merge_by_key<'a, K: Ord, V: 'a>(
    now: impl Iterator<Item = (K, Option<&'a V>)>,
    then: impl Iterator<Item = (K, Option<&'a V>)>,
) -> impl Iterator<Item = &'a V> {
    let mut now = now.peekable();
    let mut then = then.peekable();
    std::iter::from_fn(move || {
        loop {
            let pick = match (now.peek(), then.peek()) {
                (None, None) => return None,
                (Some(_), None) => now.next(),
                (None, Some(_)) => then.next(),
                (Some((a, _)), Some((b, _))) => match a.cmp(b) {
                    std::cmp::Ordering::Less => now.next(),
                    std::cmp::Ordering::Greater => then.next(),
                    std::cmp::Ordering::Equal => {
                        now.next();
                        then.next()
                    }
                },
            };
            if let Some((_, Some(v))) = pick {
                return Some(v);
            }
        }
    })
}

#[cfg(test)]
pub(crate) mod scale {
    use super::*;

    /// Creates `n` Applications of ~1 KB, ten per namespace; returns the type's index.
    pub(crate) fn seed_apps(store: &Store, n: usize) -> usize {
        let res = store
            .find("argoproj.io", "v1alpha1", "applications")
            .unwrap();
        let w = managed_fields::Writer {
            manager: "t".into(),
            status: false,
        };
        for i in 0..n {
            let ns = format!("bench-{:05}", i / 10);
            store
                .create(
                    res,
                    &ns,
                    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                           "metadata": {"name": format!("app-{i}"), "namespace": ns},
                           "spec": {"project": "default", "source": {"repoURL": "https://x", "targetRevision": "v1", "path": "p", "helm": {"values": "x".repeat(600)}}, "destination": {"name": "in-cluster", "namespace": "x"}}}),
                    false,
                    &w,
                )
                .unwrap();
        }
        res
    }

    /// `cargo test --release -p argocd-agent-kube-test-server --lib -- --ignored paging_cost --nocapture`
    #[test]
    #[ignore = "a measurement, run by hand"]
    fn paging_cost() {
        let store = Store::new(crate::ResourceType::defaults(), 50_000, true);
        let t = std::time::Instant::now();
        let res = seed_apps(&store, 100_000);
        eprintln!("seed {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let mut q = PageQuery {
            limit: 500,
            ..PageQuery::default()
        };
        let mut n = 0;
        loop {
            let p = store.list_page(res, None, &q, None).unwrap();
            n += p.items.len();
            if !p.more {
                break;
            }
            let last = p.items.last().unwrap();
            q.at = Some(p.rv);
            q.after = Some((
                str_at(last, "/metadata/namespace").unwrap().to_string(),
                str_at(last, "/metadata/name").unwrap().to_string(),
            ));
        }
        eprintln!("paged {n} in {:?}", t.elapsed());
    }
}
