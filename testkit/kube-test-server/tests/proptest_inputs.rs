//! Property tests (proptest) of the test server's inputs, the stable-toolchain counterpart of
//! the cargo-fuzz targets in `testkit/kube-test-server/fuzz` (`kube_selector`, `kube_patch`):
//! arbitrary selectors and request bodies never panic; selectors built from valid parts parse
//! and select what a simple model of Kubernetes' rules selects; patches built from valid parts
//! change what they name and keep the rest.

use std::collections::BTreeMap;

use argocd_agent_kube_test_server::fuzzing::{self, BodyOp, RESOURCES};
use argocd_agent_kube_test_server::{FieldSelector, LabelSelector};
use proptest::prelude::*;
use serde_json::{Value, json};

const KEYS: &[&str] = &["app", "tier", "env", "example.io/team"];

#[derive(Debug, Clone)]
enum Req {
    Eq(&'static str, String),
    NotEq(&'static str, String),
    In(&'static str, Vec<String>),
    NotIn(&'static str, Vec<String>),
    Exists(&'static str),
    NotExists(&'static str),
}

fn value() -> impl Strategy<Value = String> {
    "[a-z0-9]{0,3}"
}

fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(KEYS)
}

fn req() -> impl Strategy<Value = Req> {
    let values = || prop::collection::vec(value(), 1..4);
    prop_oneof![
        (key(), value()).prop_map(|(k, v)| Req::Eq(k, v)),
        (key(), value()).prop_map(|(k, v)| Req::NotEq(k, v)),
        (key(), values()).prop_map(|(k, v)| Req::In(k, v)),
        (key(), values()).prop_map(|(k, v)| Req::NotIn(k, v)),
        key().prop_map(Req::Exists),
        key().prop_map(Req::NotExists),
    ]
}

impl Req {
    fn render(&self, spaced: bool) -> String {
        let sp = if spaced { " " } else { "" };
        match self {
            Req::Eq(k, v) => format!("{k}{sp}={sp}{v}"),
            Req::NotEq(k, v) => format!("{k}{sp}!={sp}{v}"),
            Req::In(k, vs) => format!("{k} in{sp}({})", vs.join(",")),
            Req::NotIn(k, vs) => format!("{k} notin{sp}({})", vs.join(",")),
            Req::Exists(k) => k.to_string(),
            Req::NotExists(k) => format!("!{k}"),
        }
    }

    /// Kubernetes' meaning of the requirement.
    fn model(&self, labels: &BTreeMap<&str, String>) -> bool {
        let get = |k: &str| labels.get(k).map(String::as_str);
        match self {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_selectors_never_panic(s in any::<String>(), t in "[a-z.!=()<>, -]{0,30}") {
        let obj = json!({"metadata": {"name": "a", "labels": {"app": "x", "n": "3"}}});
        for s in [&s, &t] {
            if let Ok(sel) = LabelSelector::parse(s) {
                let _ = sel.matches(&obj);
            }
            if let Ok(sel) = FieldSelector::parse_for(s, &[("type".into(), "/type".into())]) {
                let _ = sel.matches(&obj);
            }
        }
    }

    #[test]
    fn label_selectors_select_what_the_model_selects(
        reqs in prop::collection::vec(req(), 1..5),
        labels in prop::collection::btree_map(key(), value(), 0..4),
        spaced in any::<bool>(),
    ) {
        let text = reqs.iter().map(|r| r.render(spaced)).collect::<Vec<_>>().join(",");
        let sel = LabelSelector::parse(&text).unwrap();
        let obj = json!({"metadata": {"name": "a", "labels": labels}});
        let expected = reqs.iter().all(|r| r.model(&labels));
        prop_assert_eq!(sel.matches(&obj), expected, "selector {}", text);
    }

    #[test]
    fn field_selectors_select_what_the_model_selects(
        name in "[a-z]{1,3}",
        ns in "[a-z]{1,3}",
        want_name in "[a-z]{1,3}",
        want_ns in "[a-z]{1,3}",
        name_eq in any::<bool>(),
        ns_eq in any::<bool>(),
    ) {
        let op = |eq: bool| if eq { "=" } else { "!=" };
        let text = format!(
            "metadata.name{}{want_name},metadata.namespace{}{want_ns}",
            op(name_eq),
            op(ns_eq)
        );
        let sel = FieldSelector::parse(&text).unwrap();
        let obj = json!({"metadata": {"name": name, "namespace": ns}});
        let expected = ((name == want_name) == name_eq) && ((ns == want_ns) == ns_eq);
        prop_assert_eq!(sel.matches(&obj), expected);
    }

    #[test]
    fn arbitrary_request_bodies_never_panic(
        op in prop::sample::select(BodyOp::ALL.to_vec()),
        plural in prop::sample::select(RESOURCES.to_vec()),
        media in prop::sample::select(vec![
            "application/json",
            "application/yaml",
            "application/vnd.kubernetes.protobuf",
        ]),
        body in prop_oneof![
            any::<Vec<u8>>(),
            "[\\[\\]{}\":,a-z0-9/$ -]{0,40}".prop_map(String::into_bytes),
        ],
    ) {
        if let Ok((written, stored)) = fuzzing::write_body(plural, op, media, &body) {
            prop_assert_eq!(written, stored);
        }
        if let Ok(patch) = serde_json::from_slice::<Value>(&body) {
            let mut doc = fuzzing::seed_object(plural);
            let _ = fuzzing::strategic_merge(&mut doc, &patch);
        }
    }

    #[test]
    fn patches_change_what_they_name_and_keep_the_rest(
        k in "[a-z][a-z0-9]{0,8}",
        v in "[a-zA-Z0-9 ]{0,12}",
    ) {
        prop_assume!(k != "key");
        // Merge patch: one more data key.
        let body = json!({"data": {&k: &v}}).to_string();
        let (_, stored) =
            fuzzing::write_body("configmaps", BodyOp::MergePatch, "", body.as_bytes()).unwrap();
        prop_assert_eq!(&stored["data"][&k], &json!(v));
        prop_assert_eq!(&stored["data"]["key"], &json!("value"));
        // JSON patch: one more label.
        let body = json!([{"op": "add", "path": format!("/metadata/labels/{k}"), "value": "x"}]);
        let (_, stored) = fuzzing::write_body(
            "applications",
            BodyOp::JsonPatch,
            "",
            body.to_string().as_bytes(),
        )
        .unwrap();
        prop_assert_eq!(&stored["metadata"]["labels"][&k], &json!("x"));
        prop_assert_eq!(&stored["metadata"]["labels"]["app"], &json!("demo"));
        // Strategic merge patch: env merged by name, not replaced.
        let name = k.to_uppercase();
        prop_assume!(name != "A");
        let body = json!({"spec": {"containers": [{"name": "main", "env": [{"name": &name, "value": &v}]}]}});
        let (_, stored) = fuzzing::write_body(
            "pods",
            BodyOp::StrategicPatch,
            "",
            body.to_string().as_bytes(),
        )
        .unwrap();
        let env = stored["spec"]["containers"][0]["env"].as_array().unwrap();
        prop_assert!(env.iter().any(|e| e["name"] == "A"));
        prop_assert!(env.iter().any(|e| e["name"] == json!(name) && e["value"] == json!(v)));
        prop_assert_eq!(&stored["spec"]["containers"][0]["image"], &json!("busybox"));
    }
}
