//! Watches with a local cache.
//!
//! Built on kube-runtime's [`watcher`](kube::runtime::watcher()): initial list, then a
//! watch from the list's `resourceVersion` with bookmarks, resume after a dropped
//! connection, re-list after `410 Gone`, exponential backoff between attempts. On top of
//! that this module keeps a cache and turns every (re)list into the *differences*
//! against it, so consumers see each change once: never a duplicate `Applied` for an
//! unchanged `resourceVersion`, never a missed `Deleted` for an object that vanished
//! while the watch was down.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use argocd_agent_domain::{JsonObject, LazyObject};
use bytes::Bytes;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch as signal;

use crate::Kind;
use crate::lease::CompactLease;
use crate::scope::{Namespaces, Scope, is_sync_ignored};

/// One change seen by a watch, after de-duplication against the cache.
#[derive(Debug, Clone)]
pub enum Change {
    /// The object was created or changed (its `resourceVersion` differs from the cache).
    Applied(Arc<DynamicObject>),
    /// The object is gone, or gained the ignore-sync label, or left the selector.
    Deleted(Arc<DynamicObject>),
    /// The cache is complete: every watched namespace has been (re)listed.
    Synced,
}

/// Cache key: namespace (empty for cluster-scoped objects) and name.
type Key = (String, String);

fn key_of(obj: &DynamicObject) -> Key {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// Objects per page of a watch's initial list (and of every re-list) of the kinds agents
/// write (Applications, AppProjects). kube-runtime's default is 500: 500 Applications of
/// ~1 MiB each (the API server takes objects up to ~1.5 MiB) would be one response of
/// hundreds of MiB, read whole, then decoded while the response is still held. 50 bounds a
/// page to ~75 MiB of JSON at worst (measured: a principal restarted with 450 objects of
/// 1 MiB on the hub peaks 180–195 MiB above idle with 50 a page, ~350 MiB with 100), and
/// costs a 100,000-object list 2,000 requests.
pub const LIST_PAGE_SIZE: u32 = 50;

/// Objects per page of other kinds' lists (kube-runtime's default): their objects are
/// written by hub admins and Kubernetes, not by agents.
pub const ADMIN_LIST_PAGE_SIZE: u32 = 500;

/// The list page size for `kind` ([`LIST_PAGE_SIZE`] or [`ADMIN_LIST_PAGE_SIZE`]).
pub fn list_page_size(kind: Kind) -> u32 {
    match kind {
        Kind::Application | Kind::AppProject => LIST_PAGE_SIZE,
        _ => ADMIN_LIST_PAGE_SIZE,
    }
}

/// One cached object and what is derived from it, computed at most once per version.
#[derive(Debug)]
struct Entry {
    obj: Arc<DynamicObject>,
    /// [`crate::object::spec_checksum`] of `obj`, once asked for.
    spec_checksum: Arc<OnceLock<String>>,
    /// [`crate::object::metadata_checksum`] of `obj`, once asked for.
    metadata_checksum: Arc<OnceLock<String>>,
    /// The JSON a managed copy receives of `obj`, once an event sending it was encoded
    /// ([`Cache::managed_json`]). These three are taken over by the next version when it
    /// differs only in its status ([`Entry::inherit`]).
    managed_json: Arc<OnceLock<Bytes>>,
    /// The weight ([`crate::object::object_weight`]) of the object as listed or watched (of
    /// the whole object when `obj` is a stub), once asked for.
    size: Arc<OnceLock<usize>>,
    /// `obj` is a stub ([`Cache::stub_oversized`]), made here: known by the cache, not by
    /// the annotation, which the object's writer could forge.
    stub: bool,
}

impl Entry {
    fn new(obj: Arc<DynamicObject>, admitted: Admitted) -> Self {
        let memo = OnceLock::new();
        if let Some(size) = admitted.size {
            let _ = memo.set(size);
        }
        Entry {
            obj,
            spec_checksum: Arc::default(),
            metadata_checksum: Arc::default(),
            managed_json: Arc::default(),
            size: Arc::new(memo),
            stub: admitted.stub,
        }
    }
}

impl Entry {
    /// Whether anything was derived from this version yet.
    fn has_derived(&self) -> bool {
        self.spec_checksum.get().is_some()
            || self.metadata_checksum.get().is_some()
            || self.managed_json.get().is_some()
    }

    /// The object and what was derived from it, for its next version.
    fn derived(&self) -> Entry {
        Entry {
            obj: self.obj.clone(),
            spec_checksum: self.spec_checksum.clone(),
            metadata_checksum: self.metadata_checksum.clone(),
            managed_json: self.managed_json.clone(),
            size: Arc::default(),
            stub: self.stub,
        }
    }

    /// Takes over what `previous` derived, for a version that differs from it only where
    /// none of it looks ([`crate::object::same_without_status`]): the spec and metadata
    /// checksums and the managed copy's JSON. The size is the new version's own.
    fn inherit(&mut self, previous: Entry) {
        self.spec_checksum = previous.spec_checksum;
        self.metadata_checksum = previous.metadata_checksum;
        self.managed_json = previous.managed_json;
    }
}

/// What [`Cache::admit`] found out about an object it keeps.
#[derive(Debug, Clone, Copy, Default)]
struct Admitted {
    /// Its weight, when measured.
    size: Option<usize>,
    /// It is kept as a stub.
    stub: bool,
}

/// One cached object as the cache keeps it.
#[derive(Debug)]
enum Slot {
    /// The object and what was derived from it.
    Object(Entry),
    /// A Lease in typed fields ([`CompactLease::exact`]: the object rebuilt from them is
    /// the one received), rebuilt when an object is asked for.
    Lease(Arc<CompactLease>),
    /// An object of a namespace this cache does not hold ([`Cache::shard`]): its JSON
    /// (without `managedFields`), decoded again each time it is read.
    Compact(Compact),
}

/// An object kept as JSON bytes, and the little the cache reads without decoding it.
#[derive(Debug)]
struct Compact {
    json: Box<[u8]>,
    resource_version: Option<Box<str>>,
}

impl Compact {
    /// `obj` as JSON; `None` if it cannot be written (then it stays decoded).
    fn new(obj: &DynamicObject) -> Option<Compact> {
        let json = serde_json::to_vec(obj).ok()?;
        Some(Compact {
            json: json.into_boxed_slice(),
            resource_version: obj.metadata.resource_version.as_deref().map(Box::from),
        })
    }

    /// The object, decoded afresh (`None` only if the bytes this cache wrote do not read
    /// back, which would be a bug).
    fn decode(&self) -> Option<DynamicObject> {
        match serde_json::from_slice(&self.json) {
            Ok(obj) => Some(obj),
            Err(error) => {
                tracing::error!(%error, "a compact cached object does not decode");
                None
            }
        }
    }
}

impl Slot {
    /// The slot for `obj` (as admitted), and `obj` for the change announcing it: a Lease
    /// cache keeps the Leases whose typed form holds all of them that way.
    fn new(kind: Kind, obj: DynamicObject, admitted: Admitted) -> (Slot, Arc<DynamicObject>) {
        let obj = Arc::new(obj);
        if kind == Kind::Lease
            && !admitted.stub
            && let Some(lease) = CompactLease::exact(&obj)
        {
            return (Slot::Lease(Arc::new(lease)), obj);
        }
        (Slot::Object(Entry::new(obj.clone(), admitted)), obj)
    }

    /// The object (a Lease rebuilt from its typed fields: a new `Arc` each time).
    fn object(&self) -> Arc<DynamicObject> {
        match self {
            Slot::Object(e) => e.obj.clone(),
            Slot::Lease(l) => Arc::new(l.to_object()),
            Slot::Compact(c) => Arc::new(c.decode().unwrap_or_else(|| DynamicObject {
                types: None,
                metadata: Default::default(),
                data: serde_json::Value::Null,
            })),
        }
    }

    /// Whether the slot is kept as JSON.
    fn is_compact(&self) -> bool {
        matches!(self, Slot::Compact(_))
    }

    /// The slot as JSON, when it holds a whole object (not a stub, not a typed Lease).
    fn compacted(self) -> Slot {
        match self {
            Slot::Object(e) if !e.stub => match Compact::new(&e.obj) {
                Some(c) => Slot::Compact(c),
                None => Slot::Object(e),
            },
            other => other,
        }
    }

    /// The slot decoded (a compact one becomes an entry with nothing derived yet).
    fn decoded(self) -> Slot {
        match self {
            Slot::Compact(c) => match c.decode() {
                Some(obj) => Slot::Object(Entry::new(Arc::new(obj), Admitted::default())),
                None => Slot::Compact(c),
            },
            other => other,
        }
    }

    /// The object's entry, unless it is kept in typed fields.
    fn entry(&self) -> Option<&Entry> {
        match self {
            Slot::Object(e) => Some(e),
            Slot::Lease(_) | Slot::Compact(_) => None,
        }
    }

    /// The object as a Lease (read from the object when it is not kept as one).
    fn lease(&self) -> Arc<CompactLease> {
        match self {
            Slot::Object(e) => Arc::new(CompactLease::read(&e.obj)),
            Slot::Lease(l) => l.clone(),
            Slot::Compact(_) => Arc::new(CompactLease::read(&self.object())),
        }
    }

    /// Whether `obj` is the version held here.
    fn same_version(&self, obj: &DynamicObject) -> bool {
        self.same_version_as(obj.metadata.resource_version.as_deref())
    }

    /// Whether `resource_version` is the version held here.
    fn same_version_as(&self, resource_version: Option<&str>) -> bool {
        let held = match self {
            Slot::Object(e) => e.obj.metadata.resource_version.as_deref(),
            Slot::Lease(l) => l.resource_version(),
            Slot::Compact(c) => c.resource_version.as_deref(),
        };
        held.is_some() && held == resource_version
    }
}

/// Which objects a cache keeps as stubs when they are large ([`Cache::stub_oversized`]).
#[derive(Debug, Clone, Copy)]
struct StubRule {
    /// Heavier objects ([`crate::object::object_weight`]) are kept as stubs.
    max: usize,
    /// Only objects this holds for are measured and stubbed.
    applies: fn(&DynamicObject) -> bool,
}

#[derive(Debug)]
struct CacheInner {
    kind: Kind,
    objects: RwLock<BTreeMap<Key, Slot>>,
    synced: signal::Sender<bool>,
    stub_rule: OnceLock<StubRule>,
    /// Whether objects outside the held namespaces are kept compact ([`Cache::shard`]).
    sharded: AtomicBool,
    /// The held namespaces, each with the number of holders ([`Cache::hold`]).
    held: Mutex<HashMap<String, usize>>,
}

/// The objects a [`watch`] has seen, updated as its stream is polled.
///
/// Cheap to clone; all clones share one store. The cache changes only while the change
/// stream is being polled, and it is updated *before* the matching [`Change`] is
/// yielded, so a consumer reacting to a change reads the new state.
#[derive(Debug, Clone)]
pub struct Cache {
    inner: Arc<CacheInner>,
}

impl Cache {
    fn new(kind: Kind) -> Self {
        let (synced, _) = signal::channel(false);
        Self {
            inner: Arc::new(CacheInner {
                kind,
                objects: RwLock::new(BTreeMap::new()),
                synced,
                stub_rule: OnceLock::new(),
                sharded: AtomicBool::new(false),
                held: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The kind of object this cache holds.
    pub fn kind(&self) -> Kind {
        self.inner.kind
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Key, Slot>> {
        // A poisoned lock means a panic elsewhere; the map itself is still consistent
        // because every write is a single insert/remove.
        self.inner.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Key, Slot>> {
        self.inner
            .objects
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, objects of a namespace nobody holds ([`Cache::hold`]) are kept as their
    /// JSON and decoded again each time they are read (`get`, `list`, `list_namespace`: the
    /// cold path; their checksums and managed JSON are computed afresh too). Objects of a
    /// held namespace are kept decoded, with what is derived from them. Stubs and Leases
    /// in typed fields stay as they are. Without it (the default) every object is decoded.
    pub fn shard(&self) {
        if self.inner.kind == Kind::Lease || self.inner.sharded.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut objects = self.write();
        let keys: Vec<Key> = objects.keys().cloned().collect();
        for key in keys {
            self.settle(&mut objects, key);
        }
    }

    /// Whether this cache keeps the objects of namespaces nobody holds compact.
    pub fn is_sharded(&self) -> bool {
        self.inner.sharded.load(Ordering::SeqCst)
    }

    /// Keeps the objects of `namespace` decoded until as many [`Cache::unhold`]s: those
    /// kept compact are decoded before this returns.
    pub fn hold(&self, namespace: &str) {
        *self.held().entry(namespace.to_string()).or_default() += 1;
        // A cache that does not shard keeps everything decoded: nothing to settle, and no
        // write lock over the cache for every session a storm registers.
        if self.is_sharded() {
            self.settle_namespace(namespace);
        }
    }

    /// Undoes one [`Cache::hold`]: after the last, the namespace's objects are kept compact
    /// again (if the cache shards).
    pub fn unhold(&self, namespace: &str) {
        {
            let mut held = self.held();
            match held.get_mut(namespace) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    held.remove(namespace);
                }
                None => return,
            }
        }
        if self.is_sharded() {
            self.settle_namespace(namespace);
        }
    }

    /// How many objects are kept decoded and how many compact.
    pub fn forms(&self) -> (usize, usize) {
        let objects = self.read();
        let compact = objects.values().filter(|s| s.is_compact()).count();
        (objects.len() - compact, compact)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether objects of `namespace` are kept compact now.
    fn keeps_compact(&self, namespace: &str) -> bool {
        self.is_sharded() && !self.held().contains_key(namespace)
    }

    /// Brings the slot at `key` to the form its namespace is kept in.
    fn settle(&self, objects: &mut BTreeMap<Key, Slot>, key: Key) {
        let compact = self.keeps_compact(&key.0);
        if let Some(slot) = objects.remove(&key) {
            let slot = if compact {
                slot.compacted()
            } else {
                slot.decoded()
            };
            objects.insert(key, slot);
        }
    }

    /// Brings every slot of `namespace` to the form the namespace is kept in.
    fn settle_namespace(&self, namespace: &str) {
        let mut objects = self.write();
        let keys: Vec<Key> = objects
            .range((namespace.to_string(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.settle(&mut objects, key);
        }
    }

    /// The object `namespace/name` (`namespace` is `None` for cluster-scoped kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        self.read()
            .get(&(namespace.unwrap_or_default().to_string(), name.to_string()))
            .map(Slot::object)
    }

    /// The Lease `namespace/name` in typed fields (read from the object when the cache
    /// keeps it whole); without rebuilding an object.
    pub fn lease(&self, namespace: Option<&str>, name: &str) -> Option<Arc<CompactLease>> {
        self.read()
            .get(&(namespace.unwrap_or_default().to_string(), name.to_string()))
            .map(Slot::lease)
    }

    /// The Leases of one namespace in typed fields, ordered by name (see [`Cache::lease`]).
    pub fn leases(&self, namespace: &str) -> Vec<Arc<CompactLease>> {
        self.read()
            .range((namespace.to_string(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|(_, s)| s.lease())
            .collect()
    }

    /// The spec checksum ([`crate::object::spec_checksum`]) of `obj`, computed once per
    /// cached version and shared by every caller (every agent's resync, every change sent):
    /// for the object this cache holds now (the same `Arc` as `get` and the change stream
    /// give); any other object is computed afresh.
    pub fn spec_checksum(&self, obj: &Arc<DynamicObject>) -> String {
        match self.memo(obj, |e| &e.spec_checksum) {
            // Computed outside the lock, so writers never wait for a checksum.
            Some(memo) => memo
                .get_or_init(|| crate::object::spec_checksum(obj))
                .clone(),
            None => crate::object::spec_checksum(obj),
        }
    }

    /// The metadata checksum ([`crate::object::metadata_checksum`]) of `obj`, computed once
    /// per cached version like [`Cache::spec_checksum`].
    pub fn metadata_checksum(&self, obj: &Arc<DynamicObject>) -> String {
        match self.memo(obj, |e| &e.metadata_checksum) {
            Some(memo) => memo
                .get_or_init(|| crate::object::metadata_checksum(obj))
                .clone(),
            None => crate::object::metadata_checksum(obj),
        }
    }

    /// `obj` as a managed copy receives it
    /// ([`crate::object::write_stamped_without_status`]), for an event's payload: its JSON
    /// is written when the first event carrying it is encoded, then kept with this
    /// version in the cache and shared, without a copy, by every later event that sends
    /// it (another agent's, a resend, the next resync). Later versions that differ only in
    /// their status (status writes) keep the same bytes; any other change starts afresh.
    /// An object this cache does not hold now is written afresh for each event.
    pub fn managed_json(&self, obj: &Arc<DynamicObject>) -> LazyObject {
        let memo = self.memo(obj, |e| &e.managed_json).unwrap_or_default();
        LazyObject::new(ManagedJson {
            obj: obj.clone(),
            memo,
        })
    }

    /// The memo `field` of `obj`'s entry, if `obj` is the version this cache holds.
    fn memo<T>(
        &self,
        obj: &Arc<DynamicObject>,
        field: impl Fn(&Entry) -> &Arc<OnceLock<T>>,
    ) -> Option<Arc<OnceLock<T>>> {
        self.read()
            .get(&key_of(obj))
            .and_then(Slot::entry)
            .filter(|e| Arc::ptr_eq(&e.obj, obj))
            .map(|e| field(e).clone())
    }

    /// What this cache knows of `namespace/name` for a write (see
    /// [`crate::Resources::upsert_copy_known`]): nothing before the first list completed,
    /// nor of an object it keeps as a stub (the write reads the whole object first).
    pub fn known(&self, namespace: Option<&str>, name: &str) -> crate::Known {
        if !self.is_synced() {
            return crate::Known::Unknown;
        }
        match self.get(namespace, name) {
            Some(o) if self.is_stub(&o) => crate::Known::Unknown,
            Some(o) => crate::Known::Present(o),
            None => crate::Known::Absent,
        }
    }

    /// From now on, objects for which `applies` holds and whose weight
    /// ([`crate::object::object_weight`]) is larger than `max` are cached as stubs ([`crate::object::oversized_stub`]: identity, labels and
    /// this project's annotations, no spec or status), each logged once per version. Set
    /// before the change stream is first polled, so the initial list is kept that way too;
    /// a second call changes nothing.
    pub fn stub_oversized(&self, max: usize, applies: fn(&DynamicObject) -> bool) {
        let _ = self.inner.stub_rule.set(StubRule { max, applies });
    }

    /// The weight ([`crate::object::object_weight`]) of `obj` as the cache received it (for
    /// a stub, of the whole object it stands for), computed once per cached version; any
    /// object this cache does not hold now is measured afresh.
    pub fn object_size(&self, obj: &Arc<DynamicObject>) -> usize {
        match self.memo(obj, |e| &e.size) {
            Some(memo) => *memo.get_or_init(|| crate::object::object_weight(obj)),
            None => crate::object::object_weight(obj),
        }
    }

    /// Whether `obj` is the stub this cache holds for an object too large to keep
    /// ([`Cache::stub_oversized`]).
    pub fn is_stub(&self, obj: &Arc<DynamicObject>) -> bool {
        self.read()
            .get(&key_of(obj))
            .and_then(Slot::entry)
            .is_some_and(|e| e.stub && Arc::ptr_eq(&e.obj, obj))
    }

    /// The object as this cache keeps it, and its size when it was measured: a stub when
    /// the stub rule applies and it is too large.
    fn admit(&self, mut obj: DynamicObject) -> (DynamicObject, Admitted) {
        // The API server's field-ownership records are never read from a cache and weigh as
        // much as a small object (a Lease's are as large as the Lease): dropped, as
        // client-go's informers are commonly told to, from listed and watched objects alike.
        obj.metadata.managed_fields = None;
        let Some(rule) = self.inner.stub_rule.get().filter(|r| (r.applies)(&obj)) else {
            return (obj, Admitted::default());
        };
        let size = crate::object::object_weight(&obj);
        if size <= rule.max {
            return (
                obj,
                Admitted {
                    size: Some(size),
                    stub: false,
                },
            );
        }
        tracing::warn!(kind = %self.inner.kind, namespace = %argocd_agent_domain::or_dash(obj.metadata.namespace.as_deref()),
            name = %argocd_agent_domain::or_dash(obj.metadata.name.as_deref()), size, max = rule.max,
            "object too large to cache: kept as a stub without spec or status");
        let admitted = Admitted {
            size: Some(size),
            stub: true,
        };
        (crate::object::oversized_stub(&obj, size), admitted)
    }

    /// Takes in an object a watch (or a [`Feed`]) saw created or changed: the change
    /// consumers see, if any (`Deleted` for one that gained the ignore-sync label; nothing
    /// for a version the cache holds already).
    fn applied(&self, obj: DynamicObject) -> Option<Change> {
        let key = key_of(&obj);
        if is_sync_ignored(&obj) {
            // Gaining the label must look like a deletion to the sync engine.
            return self
                .write()
                .remove(&key)
                .map(|_| Change::Deleted(Arc::new(obj)));
        }
        if self.read().get(&key).is_some_and(|c| c.same_version(&obj)) {
            return None;
        }
        // Measured (and stubbed) outside the lock.
        let (obj, admitted) = self.admit(obj);
        let (mut slot, obj) = Slot::new(self.inner.kind, obj, admitted);
        let previous = self
            .read()
            .get(&key)
            .and_then(Slot::entry)
            .filter(|e| !e.stub && !admitted.stub && e.has_derived())
            .map(Entry::derived);
        if let (Some(previous), Slot::Object(entry)) = (previous, &mut slot)
            && crate::object::same_without_status(&previous.obj, &obj)
        {
            // A status write: what was derived from the spec and metadata still holds.
            entry.inherit(previous);
        }
        // Written outside the lock; settled under it, in case a hold came in between.
        if self.keeps_compact(&key.0) {
            slot = slot.compacted();
        }
        let mut objects = self.write();
        objects.insert(key.clone(), slot);
        if self.is_sharded() {
            self.settle(&mut objects, key);
        }
        Some(Change::Applied(obj))
    }

    /// Takes in an object a watch (or a [`Feed`]) saw deleted: `Deleted`, unless the cache
    /// never announced it.
    fn deleted(&self, obj: DynamicObject) -> Option<Change> {
        self.write()
            .remove(&key_of(&obj))
            .map(|_| Change::Deleted(Arc::new(obj)))
    }

    /// Every cached object, ordered by namespace then name.
    pub fn list(&self) -> Vec<Arc<DynamicObject>> {
        self.read().values().map(Slot::object).collect()
    }

    /// The cached objects of one namespace, ordered by name.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<DynamicObject>> {
        self.read()
            .range((namespace.to_string(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|(_, s)| s.object())
            .collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// True once every watched namespace has completed its first list.
    pub fn is_synced(&self) -> bool {
        *self.inner.synced.borrow()
    }

    /// Waits until [`Cache::is_synced`]. Someone must be polling the change stream.
    pub async fn wait_synced(&self) {
        let mut rx = self.inner.synced.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|synced| *synced).await;
    }
}

/// A cached object's JSON as a managed copy receives it ([`Cache::managed_json`]): written
/// once, into the memo it shares with the cache entry of its version.
#[derive(Debug)]
struct ManagedJson {
    obj: Arc<DynamicObject>,
    memo: Arc<OnceLock<Bytes>>,
}

impl JsonObject for ManagedJson {
    fn write_json(&self, out: &mut Vec<u8>) {
        crate::object::write_stamped_without_status(&self.obj, out);
    }

    fn to_bytes(&self) -> Bytes {
        self.memo
            .get_or_init(|| argocd_agent_domain::event::json_bytes(|out| self.write_json(out)))
            .clone()
    }
}

/// A [`Cache`] fed by hand, for backends other than the API server's watch (the in-memory
/// store): each object handed in goes through what a watch does with it (de-duplication by
/// `resourceVersion`, ignore-sync, stubs) and comes out as the [`Change`] a watch would
/// yield, after the cache was updated.
#[derive(Debug, Clone)]
pub struct Feed {
    cache: Cache,
}

impl Feed {
    /// An empty, not yet synced cache of `kind`.
    pub fn new(kind: Kind) -> Feed {
        Feed {
            cache: Cache::new(kind),
        }
    }

    /// The cache this feed keeps.
    pub fn cache(&self) -> Cache {
        self.cache.clone()
    }

    /// `obj` was created or changed.
    pub fn applied(&self, obj: DynamicObject) -> Option<Change> {
        self.cache.applied(obj)
    }

    /// `obj` was deleted.
    pub fn deleted(&self, obj: DynamicObject) -> Option<Change> {
        self.cache.deleted(obj)
    }

    /// Everything was listed once: the cache is synced ([`Change::Synced`]).
    pub fn synced(&self) -> Change {
        self.cache.inner.synced.send_replace(true);
        Change::Synced
    }
}

/// Per-watcher bookkeeping inside the merged stream.
struct Partition {
    /// Namespace this watcher covers, `None` for all namespaces / cluster-scoped.
    namespace: Option<String>,
    /// Objects listed so far during an ongoing (re)list: decoded with their sizes when
    /// measured, or already compact when their namespace is kept so.
    listing: Option<HashMap<Key, Listed>>,
    synced: bool,
}

/// Turns raw watcher events into de-duplicated [`Change`]s and keeps the cache.
struct Reconciler {
    kind: Kind,
    cache: Cache,
    partitions: Vec<Partition>,
}

impl Reconciler {
    fn handle(
        &mut self,
        idx: usize,
        event: Result<Event<DynamicObject>, watcher::Error>,
    ) -> Vec<Pending> {
        let Some(part) = self.partitions.get_mut(idx) else {
            return Vec::new();
        };
        match event {
            Err(err) => {
                tracing::warn!(kind = %self.kind, namespace = %argocd_agent_domain::or_dash(part.namespace.as_deref()), error = %err,
                    "watch interrupted; retrying with backoff");
                Vec::new()
            }
            Ok(Event::Init) => {
                part.listing = Some(HashMap::new());
                Vec::new()
            }
            Ok(Event::InitApply(obj)) => {
                if let Some(listing) = part.listing.as_mut()
                    && !is_sync_ignored(&obj)
                {
                    listing.insert(key_of(&obj), Listed::new(&self.cache, obj));
                }
                Vec::new()
            }
            Ok(Event::InitDone) => {
                let listed = part.listing.take().unwrap_or_default();
                part.synced = true;
                let namespace = part.namespace.clone();
                let mut changes = self.reconcile_list(namespace.as_deref(), listed);
                if self.partitions.iter().all(|p| p.synced) {
                    self.cache.inner.synced.send_replace(true);
                    changes.push(Pending::Ready(Change::Synced));
                }
                changes
            }
            Ok(Event::Apply(obj)) => self
                .cache
                .applied(obj)
                .map(Pending::Ready)
                .into_iter()
                .collect(),
            Ok(Event::Delete(obj)) => self
                .cache
                .deleted(obj)
                .map(Pending::Ready)
                .into_iter()
                .collect(),
        }
    }

    /// Replaces the cache contents of one partition with a fresh list, yielding only
    /// what differs: vanished objects as `Deleted`, new or changed ones as `Applied` (those
    /// kept compact decoded one at a time as the changes are taken, [`Pending::Cached`], so
    /// a list is never held decoded whole).
    fn reconcile_list(
        &self,
        namespace: Option<&str>,
        mut listed: HashMap<Key, Listed>,
    ) -> Vec<Pending> {
        let mut objects = self.cache.write();
        let in_partition = |key: &Key| namespace.is_none_or(|ns| key.0 == ns);
        let mut changes = Vec::new();
        let stale: Vec<Key> = objects
            .keys()
            .filter(|k| in_partition(k) && !listed.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            if let Some(gone) = objects.remove(&key) {
                changes.push(Pending::Ready(Change::Deleted(gone.object())));
            }
        }
        let mut keys: Vec<Key> = listed.keys().cloned().collect();
        keys.sort_unstable();
        for key in keys {
            let Some(item) = listed.remove(&key) else {
                continue;
            };
            if objects
                .get(&key)
                .is_some_and(|c| c.same_version_as(item.resource_version()))
            {
                continue;
            }
            let pending = match item {
                Listed::Whole(obj, admitted) => {
                    let (slot, obj) = Slot::new(self.kind, *obj, admitted);
                    objects.insert(key.clone(), slot);
                    Pending::Ready(Change::Applied(obj))
                }
                Listed::Compact(compact) => {
                    objects.insert(key.clone(), Slot::Compact(compact));
                    Pending::Cached(key.clone())
                }
            };
            if self.cache.is_sharded() {
                self.cache.settle(&mut objects, key);
            }
            changes.push(pending);
        }
        changes
    }
}

/// One object of an ongoing (re)list.
enum Listed {
    /// Decoded, as [`Cache::admit`] keeps it.
    Whole(Box<DynamicObject>, Admitted),
    /// As JSON: its namespace is kept compact ([`Cache::shard`]), so the decoded object is
    /// dropped as soon as it is read from its page.
    Compact(Compact),
}

impl Listed {
    fn new(cache: &Cache, obj: DynamicObject) -> Listed {
        let (obj, admitted) = cache.admit(obj);
        let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
        if !admitted.stub
            && cache.keeps_compact(namespace)
            && let Some(compact) = Compact::new(&obj)
        {
            return Listed::Compact(compact);
        }
        Listed::Whole(Box::new(obj), admitted)
    }

    fn resource_version(&self) -> Option<&str> {
        match self {
            Listed::Whole(obj, _) => obj.metadata.resource_version.as_deref(),
            Listed::Compact(c) => c.resource_version.as_deref(),
        }
    }
}

/// A change of a (re)list, as the reconciler leaves it for the stream.
enum Pending {
    /// Ready to yield.
    Ready(Change),
    /// `Applied` of the object cached at this key, read (decoded, if compact) only when
    /// the change is taken: the cache changes only while the stream is polled, so it is
    /// the version just listed.
    Cached(Key),
}

impl Pending {
    fn resolve(self, cache: &Cache) -> Option<Change> {
        match self {
            Pending::Ready(change) => Some(change),
            Pending::Cached(key) => cache.read().get(&key).map(|s| Change::Applied(s.object())),
        }
    }
}

type RawEvent = Result<Event<DynamicObject>, watcher::Error>;

/// kube-runtime's watcher, restarted from a fresh list when the server refuses to
/// *start* a watch with `410 Gone` (kube-runtime only re-lists on a 410 delivered inside
/// the watch stream and would otherwise retry the expired resourceVersion forever).
fn relisting_watcher(
    api: Api<DynamicObject>,
    config: watcher::Config,
) -> BoxStream<'static, RawEvent> {
    stream::unfold(None::<BoxStream<'static, RawEvent>>, move |current| {
        let api = api.clone();
        let config = config.clone();
        async move {
            let mut inner = current.unwrap_or_else(|| watcher::watcher(api, config).boxed());
            let item = inner.next().await?;
            let expired = matches!(
                &item,
                Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) if status.code == 410
            );
            Some((item, if expired { None } else { Some(inner) }))
        }
    })
    .default_backoff()
    .boxed()
}

/// Watches `kind` within `scope`, returning the cache and the stream of changes.
///
/// The stream never ends; errors are logged and retried with kube-runtime's default
/// backoff. Objects labelled [`IGNORE_SYNC_LABEL`](crate::IGNORE_SYNC_LABEL) are
/// excluded server-side (selector) and client-side (an object that gains the label is
/// reported as `Deleted`). For [`Namespaces::Set`] one watch per namespace runs and
/// `Synced` is emitted once all of them have listed.
pub fn watch(
    client: Client,
    kind: Kind,
    scope: Scope,
) -> (Cache, impl Stream<Item = Change> + Send + 'static) {
    let ar = kind.api_resource();
    let config = watcher::Config::default()
        .labels(&scope.server_label_selector())
        .page_size(list_page_size(kind));
    let apis: Vec<(Option<String>, Api<DynamicObject>)> = if !kind.namespaced() {
        vec![(None, Api::all_with(client, &ar))]
    } else {
        match &scope.namespaces {
            Namespaces::All => vec![(None, Api::all_with(client, &ar))],
            Namespaces::One(ns) => vec![(Some(ns.clone()), Api::namespaced_with(client, ns, &ar))],
            Namespaces::Set(set) => {
                let mut set = set.clone();
                set.sort_unstable();
                set.dedup();
                set.into_iter()
                    .map(|ns| {
                        let api = Api::namespaced_with(client.clone(), &ns, &ar);
                        (Some(ns), api)
                    })
                    .collect()
            }
        }
    };
    let cache = Cache::new(kind);
    if apis.is_empty() {
        // Watching an empty set of namespaces: trivially complete.
        cache.inner.synced.send_replace(true);
        let changes = stream::once(async { Change::Synced })
            .chain(stream::pending())
            .boxed();
        return (cache, changes);
    }
    let mut partitions = Vec::with_capacity(apis.len());
    let mut streams = Vec::with_capacity(apis.len());
    for (idx, (namespace, api)) in apis.into_iter().enumerate() {
        partitions.push(Partition {
            namespace,
            listing: None,
            synced: false,
        });
        streams.push(
            relisting_watcher(api, config.clone())
                .map(move |ev| (idx, ev))
                .boxed(),
        );
    }
    let reconciler = Reconciler {
        kind,
        cache: cache.clone(),
        partitions,
    };
    let changes = stream::select_all(streams)
        .scan(reconciler, |rec, (idx, ev)| {
            futures::future::ready(Some(rec.handle(idx, ev)))
        })
        .flat_map({
            let cache = cache.clone();
            move |pending| {
                let cache = cache.clone();
                stream::iter(pending.into_iter().filter_map(move |p| p.resolve(&cache)))
            }
        })
        .boxed();
    (cache, changes)
}

#[cfg(test)]
mod shard_tests;
