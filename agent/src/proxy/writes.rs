//! What a write through the resource proxy must pass before the spoke sees it: a create
//! must fit an Application's managed objects (through its owner references), a patch must
//! keep a managed object managed and its pods within the spoke's Pod Security level.

use argocd_agent_identity::text::quoted;

use argocd_agent_proto::eventstream::ResourceRequest;
use serde_json::Value;

use super::*;

impl SpokeProxy {
    /// Decides a create by the rules of [`rules::check_create`]: the object's namespaced
    /// kind from discovery, then each owner reference with a uid, until one names an object
    /// of an Application that the create fits.
    pub(super) async fn check_create(
        &self,
        apps: &Apps,
        req: &ResourceRequest,
        r: &rules::ResourcePath,
    ) -> Result<(), Failure> {
        let body = rules::read_create_body(&req.content_type, &req.body).map_err(forbidden)?;
        let Some(ns) = r.namespace.clone() else {
            return Err(Failure::Forbidden(format!(
                "{} is not created in a namespace: cluster-scoped objects are never created through the resource proxy",
                r.plural
            )));
        };
        let api_version = if r.group.is_empty() {
            r.version.clone()
        } else {
            format!("{}/{}", r.group, r.version)
        };
        let Some((ar, namespaced)) = self.resolve_plural(&api_version, &r.plural).await else {
            return Err(Failure::Forbidden(format!(
                "{} {api_version} is not a resource this cluster's discovery knows",
                r.plural
            )));
        };
        let target = rules::CreateTarget {
            group: r.group.clone(),
            version: r.version.clone(),
            kind: ar.kind.clone(),
            namespace: Some(ns.clone()),
            namespaced,
        };
        rules::check_create_shape(&target, &body).map_err(forbidden)?;
        let meta = body.get("metadata").cloned().unwrap_or(Value::Null);
        let owners = rules::create_owners(&meta);
        if owners.is_empty() {
            return Err(Failure::Forbidden(format!(
                "the new {} names no owner: only objects owned (ownerReferences with uid) by an object of an Argo CD Application are created",
                target.kind
            )));
        }
        let mut walk = OwnerWalk::new(self, apps);
        let mut why = Vec::new();
        for owner in owners {
            let what = format!("{} {}", owner.kind, text::quoted(&owner.name));
            let Some((obj, true)) = self.fetch_owner_object(&owner, Some(&ns)).await else {
                why.push(format!(
                    "owner {what} is not an object in namespace {ns} with that uid",
                    ns = quoted(&ns)
                ));
                continue;
            };
            let owner_meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
            let managing = walk.managing_apps(&owner_meta, Some(&ns)).await;
            if managing.is_empty() {
                why.push(format!(
                    "owner {what} is not managed by an Argo CD Application on this cluster"
                ));
                continue;
            }
            for app in managing.iter().filter_map(|i| apps.facts(*i)) {
                let level = self.config.pod_security;
                let checked = rules::check_create(&target, &body, &obj, app)
                    .map_err(|e| e.to_string())
                    .and_then(|()| pss::check(level, &body, None).map_err(|e| e.to_string()));
                match checked {
                    Ok(()) => return Ok(()),
                    Err(e) => why.push(e),
                }
            }
        }
        Err(Failure::Forbidden(format!(
            "the new {} is refused: {}",
            target.kind,
            why.join("; ")
        )))
    }

    /// GETs the named object as JSON: `Ok(Some(answer))` passes a failed GET on (a 404
    /// stays a 404), `Ok(None)` means the object is managed, `Err` that it is not.
    pub(super) async fn check_named(
        &self,
        apps: &Apps,
        r: &rules::ResourcePath,
    ) -> Result<Option<Answer>, Failure> {
        Ok(self.fetch_managed(apps, r).await?.err())
    }

    /// The named object, fetched as JSON, if it is managed: `Ok(Err(answer))` passes a
    /// failed GET on, `Err` refuses an unmanaged object.
    pub(super) async fn fetch_managed(
        &self,
        apps: &Apps,
        r: &rules::ResourcePath,
    ) -> Result<Result<Value, Answer>, Failure> {
        let Some(path) = r.object_path() else {
            return Err(Failure::Forbidden("no object named".into()));
        };
        let answer = self
            .send("GET", &path, "", None, "application/json", Vec::new())
            .await?;
        if !answer.ok() {
            return Ok(Err(answer));
        }
        let obj: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| Failure::Upstream(format!("unreadable object: {e}")))?;
        let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
        if self.is_managed(apps, &meta, r.namespace.as_deref()).await {
            Ok(Ok(obj))
        } else {
            Err(not_managed(r))
        }
    }

    /// Decides a patch by the object it would make: the managed object is fetched, the
    /// patch applied to it locally ([`patch::apply`]), and the result must keep its
    /// tracking and owners, add no Pod Security Standards violation ([`pss::check`]) and
    /// ask for nothing the object did not ask for ([`rules::added_asks`]). `Ok(Ok(body))`
    /// is the patch to send, conditional on the version judged; `Ok(Err(answer))` an
    /// answer to pass on instead (a failed GET, a conflict).
    pub(super) async fn check_patch(
        &self,
        apps: &Apps,
        req: &ResourceRequest,
        r: &rules::ResourcePath,
    ) -> Result<Result<Vec<u8>, Answer>, Failure> {
        fn refused<E: std::fmt::Display>(rule: &'static str) -> impl Fn(E) -> Failure {
            move |e| Failure::Refused(rule, e.to_string())
        }
        let kind = patch::patch_type(&req.content_type).map_err(refused("patch"))?;
        let before = match self.fetch_managed(apps, r).await? {
            Ok(obj) => obj,
            Err(answer) => return Ok(Err(answer)),
        };
        let after = patch::apply(kind, &before, &req.body)
            .map_err(|e| Failure::Refused("patch", format!("the patch is not applied: {e}")))?;
        let version = |o: &Value| {
            let rv = o.pointer("/metadata/resourceVersion");
            rv.and_then(Value::as_str).unwrap_or_default().to_owned()
        };
        let rv = version(&before);
        if version(&after) != rv {
            return Ok(Err(Answer::status(
                409,
                "the object has been modified; please apply your changes to the latest version and try again",
            )));
        }
        let meta = |o: &Value| o.get("metadata").cloned().unwrap_or(Value::Null);
        let (was, now) = (meta(&before), meta(&after));
        rules::check_tracking_kept(apps.tracking(), &was, &now).map_err(refused("tracking"))?;
        if was.get("ownerReferences") != now.get("ownerReferences") {
            let ns = r.namespace.as_deref();
            let mut walk = OwnerWalk::new(self, apps);
            if walk.managing_apps(&was, ns).await != walk.managing_apps(&now, ns).await {
                return Err(Failure::Refused(
                    "tracking",
                    "a patch may not change the owner references that make the object managed"
                        .into(),
                ));
            }
        }
        self.check_patched_pods(&before, &after)?;
        let body = if rv.is_empty() {
            req.body.clone()
        } else {
            patch::with_precondition(kind, &req.body, &rv).map_err(refused("patch"))?
        };
        Ok(Ok(body))
    }

    /// The pod security and owner-baseline rules for a patched object.
    pub(super) fn check_patched_pods(&self, before: &Value, after: &Value) -> Result<(), Failure> {
        pss::check(self.config.pod_security, after, Some(before))
            .map_err(|e| Failure::Refused("pod-security", e.to_string()))?;
        let added = rules::added_asks(after, before)
            .map_err(|e| Failure::Refused("owner-baseline", e.to_string()))?;
        if !added.is_empty() {
            let kind = after
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("object");
            return Err(Failure::Refused(
                "owner-baseline",
                format!(
                    "the patched {kind} would ask for {} that it does not have now",
                    added.join(", ")
                ),
            ));
        }
        Ok(())
    }
}
