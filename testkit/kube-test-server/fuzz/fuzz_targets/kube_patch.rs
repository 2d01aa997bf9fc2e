//! Fuzz target: request bodies of the test server's writes — create and update bodies
//! (JSON, YAML, Kubernetes protobuf) and JSON, merge, strategic merge and apply patches —
//! against a fresh store holding one seeded object (`fuzzing::write_body`), plus the strategic
//! merge patch on its own. Must never panic (a panic here is a 500 or a poisoned store lock
//! in the server); an accepted write must be what a GET then returns, keep the name it was
//! written to, and carry a resourceVersion.
//!
//! Byte 0 picks the operation, byte 1 the resource and, for create and update, the media type;
//! the rest is the body.
#![no_main]

use argocd_agent_kube_test_server::fuzzing::{self, BodyOp, RESOURCES};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const MEDIA: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

fuzz_target!(|data: &[u8]| {
    let [op, target, body @ ..] = data else {
        return;
    };
    let plural = RESOURCES[usize::from(*target) % RESOURCES.len()];
    let media = MEDIA[usize::from(*target / 4) % MEDIA.len()];
    if usize::from(*op) % (BodyOp::ALL.len() + 1) == BodyOp::ALL.len() {
        // The strategic merge patch alone, on the seed object.
        if let Ok(patch) = serde_json::from_slice::<Value>(body) {
            let mut doc = fuzzing::seed_object(plural);
            let _ = fuzzing::strategic_merge(&mut doc, &patch);
        }
        return;
    }
    let op = BodyOp::ALL[usize::from(*op) % (BodyOp::ALL.len() + 1)];
    if let Ok((written, stored)) = fuzzing::write_body(plural, op, media, body) {
        assert_eq!(
            written, stored,
            "a GET does not return what the write returned"
        );
        let rv = written
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        assert!(
            rv.is_some_and(|rv| !rv.is_empty()),
            "no resourceVersion: {written}"
        );
        if op != BodyOp::Create {
            assert_eq!(written.pointer("/metadata/name"), Some(&Value::from("obj")));
        }
    }
});
