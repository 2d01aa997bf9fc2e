//! Fuzz target: label and field selectors as the test server parses them from a list or
//! watch URL (`LabelSelector::parse`, `FieldSelector::parse_for`). Must never panic; an
//! accepted selector must evaluate against a few objects without panicking, and the empty
//! selector must match everything.
#![no_main]

use argocd_agent_kube_test_server::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let objects = [
        json!({"metadata": {"name": "a", "namespace": "default",
            "labels": {"app": "demo", "tier": "3", "x.io/y": ""}}, "type": "Opaque"}),
        json!({"metadata": {"name": "b", "labels": {"app": 7}}}),
        json!({"metadata": {"labels": null}}),
        json!(null),
    ];
    if let Ok(sel) = LabelSelector::parse(text) {
        for o in &objects {
            let _ = sel.matches(o);
        }
        if text.trim().is_empty() {
            assert!(objects.iter().all(|o| sel.matches(o)));
        }
    }
    let fields = [("type".to_owned(), "/type".to_owned())];
    if let Ok(sel) = FieldSelector::parse_for(text, &fields) {
        for o in &objects {
            let _ = sel.matches(o);
        }
        if text.trim().is_empty() {
            assert!(objects.iter().all(|o| sel.matches(o)));
        }
    }
    let _ = FieldSelector::parse(text);
});
