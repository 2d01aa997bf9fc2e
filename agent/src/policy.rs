//! What a managed agent does when the principal's copy of an object meets a local object
//! of the same name, with upstream argocd-agent's names for the choices:
//!
//! - `--adoption-policy always|never`: a local object the principal did not write (no
//!   managed-by-principal label) is adopted (overwritten and labelled), or the event is
//!   refused. Per object: annotation `argocd.argoproj.io/adoption-policy` on the hub copy.
//! - `--source-uid-mismatch-policy recreate|upsert`: the local copy records the hub UID it
//!   came from (`argocd.argoproj.io/source-uid`); a different UID means the hub object was
//!   deleted and recreated while we did not see the delete. `recreate` deletes the local copy
//!   and creates it anew, `upsert` updates it in place. Per object: annotation
//!   `argocd.argoproj.io/source-uid-mismatch-policy`.
//! - `--on-application-recreate ignore|clear-status|resync`: after the agent recreated an
//!   Application deleted locally, leave it, clear its stale `status.operationState` (so
//!   automated sync runs again), or start a sync.

use argocd_agent_identity::text::quoted;
use std::fmt;
use std::str::FromStr;

use argocd_agent_kubernetes::object::SOURCE_UID_ANNOTATION;
use kube::api::DynamicObject;
use serde_json::Value;

/// Per-object override of [`AdoptionPolicy`].
pub const ADOPTION_ANNOTATION: &str = "argocd.argoproj.io/adoption-policy";
/// Per-object override of [`MismatchPolicy`].
pub const MISMATCH_ANNOTATION: &str = "argocd.argoproj.io/source-uid-mismatch-policy";

/// A policy value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input}: expected one of {expected}", input = quoted(.input))]
pub struct PolicyParseError {
    what: &'static str,
    input: String,
    expected: &'static str,
}

macro_rules! policy_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal, { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// The value as written on the command line.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl FromStr for $name {
            type Err = PolicyParseError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(PolicyParseError {
                        what: $what,
                        input: s.to_owned(),
                        expected: concat!($($text, " "),+),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

policy_enum!(
    /// Whether a local object the principal did not write may be taken over.
    AdoptionPolicy, "adoption policy", {
        /// Adopt it (the default, as upstream).
        #[default]
        Always => "always",
        /// Refuse the event; the local object stays.
        Never => "never",
    }
);

policy_enum!(
    /// What to do when the local copy came from another hub object of the same name.
    MismatchPolicy, "source-uid mismatch policy", {
        /// Delete the local copy, then create the new one (the default, as upstream).
        #[default]
        Recreate => "recreate",
        /// Update the local copy in place.
        Upsert => "upsert",
    }
);

policy_enum!(
    /// What to do after recreating an Application that was deleted on the spoke.
    RecreateAction, "on-application-recreate action", {
        /// Nothing (the default, as upstream).
        #[default]
        Ignore => "ignore",
        /// Clear `status.operationState`, so automated sync runs again.
        ClearStatus => "clear-status",
        /// Start a sync operation.
        Resync => "resync",
    }
);

/// The three policies of a managed agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policies {
    /// `--adoption-policy`: may a local object the principal did not write be taken over.
    pub adoption: AdoptionPolicy,
    /// `--source-uid-mismatch-policy`: a local copy from another hub object of the name.
    pub mismatch: MismatchPolicy,
    /// `--on-application-recreate`: after recreating an Application deleted locally.
    pub on_recreate: RecreateAction,
}

/// How the principal's copy is written over what the spoke has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritePlan {
    /// Create, or update our own copy in place.
    Upsert,
    /// Delete the local copy first (source UID changed), then create.
    Recreate,
    /// Refuse: the local object is not ours and may not be adopted.
    Refuse(String),
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")?.get(key)?.as_str()
}

fn override_of<P: FromStr + Copy>(incoming: &Value, key: &str, default: P) -> P {
    match annotation(incoming, key).map(|v| (v, v.parse::<P>())) {
        Some((_, Ok(p))) => p,
        Some((v, Err(_))) => {
            tracing::warn!(
                annotation = key,
                value = v,
                "unknown policy value; using the agent's flag"
            );
            default
        }
        None => default,
    }
}

/// Decides how the principal's object `incoming` is written when `local` (if any) exists;
/// `is_ours` says whether `local` carries the managed-by-principal label.
pub fn plan_write(
    policies: &Policies,
    local: Option<&DynamicObject>,
    is_ours: bool,
    incoming: &Value,
) -> WritePlan {
    let Some(local) = local else {
        return WritePlan::Upsert;
    };
    if !is_ours {
        return match override_of(incoming, ADOPTION_ANNOTATION, policies.adoption) {
            AdoptionPolicy::Always => WritePlan::Upsert,
            AdoptionPolicy::Never => WritePlan::Refuse(
                "exists on the spoke and was not created by the principal; the adoption policy is never"
                    .into(),
            ),
        };
    }
    let local_uid = local
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SOURCE_UID_ANNOTATION));
    match (local_uid, annotation(incoming, SOURCE_UID_ANNOTATION)) {
        (Some(have), Some(want)) if have != want => {
            match override_of(incoming, MISMATCH_ANNOTATION, policies.mismatch) {
                MismatchPolicy::Recreate => WritePlan::Recreate,
                MismatchPolicy::Upsert => WritePlan::Upsert,
            }
        }
        _ => WritePlan::Upsert,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn local(uid: Option<&str>) -> DynamicObject {
        let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        if let Some(uid) = uid {
            v["metadata"]["annotations"] = json!({SOURCE_UID_ANNOTATION: uid});
        }
        serde_json::from_value(v).unwrap()
    }

    fn incoming(uid: &str, extra: &[(&str, &str)]) -> Value {
        let mut a = serde_json::Map::new();
        a.insert(SOURCE_UID_ANNOTATION.into(), json!(uid));
        for (k, v) in extra {
            a.insert((*k).into(), json!(v));
        }
        json!({"metadata": {"name": "x", "annotations": a}})
    }

    #[test]
    fn policies_parse_upstream_values_only() {
        assert_eq!(
            "never".parse::<AdoptionPolicy>().unwrap(),
            AdoptionPolicy::Never
        );
        assert_eq!(
            "upsert".parse::<MismatchPolicy>().unwrap(),
            MismatchPolicy::Upsert
        );
        assert_eq!(
            "clear-status".parse::<RecreateAction>().unwrap(),
            RecreateAction::ClearStatus
        );
        let e = "sometimes"
            .parse::<AdoptionPolicy>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("always never"), "{e}");
        assert_eq!(Policies::default().adoption, AdoptionPolicy::Always);
        assert_eq!(Policies::default().mismatch, MismatchPolicy::Recreate);
        assert_eq!(Policies::default().on_recreate, RecreateAction::Ignore);
    }

    #[test]
    fn nothing_local_is_a_plain_upsert() {
        assert_eq!(
            plan_write(&Policies::default(), None, false, &incoming("a", &[])),
            WritePlan::Upsert
        );
    }

    #[test]
    fn foreign_local_objects_follow_the_adoption_policy_and_its_annotation() {
        let l = local(None);
        let always = Policies::default();
        let never = Policies {
            adoption: AdoptionPolicy::Never,
            ..Default::default()
        };
        assert_eq!(
            plan_write(&always, Some(&l), false, &incoming("a", &[])),
            WritePlan::Upsert
        );
        assert!(
            matches!(plan_write(&never, Some(&l), false, &incoming("a", &[])), WritePlan::Refuse(m) if m.contains("adoption policy is never"))
        );
        assert_eq!(
            plan_write(
                &never,
                Some(&l),
                false,
                &incoming("a", &[(ADOPTION_ANNOTATION, "always")])
            ),
            WritePlan::Upsert
        );
        assert!(matches!(
            plan_write(
                &always,
                Some(&l),
                false,
                &incoming("a", &[(ADOPTION_ANNOTATION, "never")])
            ),
            WritePlan::Refuse(_)
        ));
    }

    #[test]
    fn a_new_source_uid_recreates_unless_upsert_is_chosen() {
        let l = local(Some("old"));
        let p = Policies::default();
        assert_eq!(
            plan_write(&p, Some(&l), true, &incoming("old", &[])),
            WritePlan::Upsert
        );
        assert_eq!(
            plan_write(&p, Some(&l), true, &incoming("new", &[])),
            WritePlan::Recreate
        );
        let upsert = Policies {
            mismatch: MismatchPolicy::Upsert,
            ..Default::default()
        };
        assert_eq!(
            plan_write(&upsert, Some(&l), true, &incoming("new", &[])),
            WritePlan::Upsert
        );
        assert_eq!(
            plan_write(
                &p,
                Some(&l),
                true,
                &incoming("new", &[(MISMATCH_ANNOTATION, "upsert")])
            ),
            WritePlan::Upsert
        );
        // An unknown override falls back to the flag.
        assert_eq!(
            plan_write(
                &upsert,
                Some(&l),
                true,
                &incoming("new", &[(MISMATCH_ANNOTATION, "bogus")])
            ),
            WritePlan::Upsert
        );
        // A copy without a recorded UID (older agent) is updated in place.
        assert_eq!(
            plan_write(&p, Some(&local(None)), true, &incoming("new", &[])),
            WritePlan::Upsert
        );
    }
}
