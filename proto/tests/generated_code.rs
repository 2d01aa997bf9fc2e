//! The Rust code generated from `proto/*.proto` is committed (so builds need no `protoc`).
//! This test regenerates it and fails if the committed copy is stale.
//! Run with `REGENERATE_PROTO=1` to rewrite `src/gen/`.

use std::path::{Path, PathBuf};

fn generate(out: &Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let protos = [
        "admin.proto",
        "cloudevents.proto",
        "eventstream.proto",
        "version.proto",
        "workload.proto",
    ]
    .map(|p| root.join("proto").join(p));
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .extern_path(".io.cloudevents.v1", "crate::cloudevents")
        // Small initial codec buffers: one long-lived stream per agent (src/codec.rs).
        .codec_path("crate::codec::LeanCodec")
        .out_dir(out)
        .compile_protos(&protos, &[root.join("proto")])
        .expect("protoc failed; install protobuf-compiler");
}

#[test]
fn committed_generated_code_matches_protos() {
    if std::process::Command::new(std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into()))
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("protoc is required for this test (apt-get install protobuf-compiler)");
    }
    let committed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    if std::env::var_os("REGENERATE_PROTO").is_some() {
        generate(&committed);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    generate(tmp.path());
    for entry in std::fs::read_dir(tmp.path()).unwrap() {
        let entry = entry.unwrap();
        let fresh = std::fs::read_to_string(entry.path()).unwrap();
        let name = entry.file_name();
        let old = std::fs::read_to_string(committed.join(&name)).unwrap_or_default();
        assert!(
            fresh == old,
            "src/gen/{} is stale: run REGENERATE_PROTO=1 cargo test -p argocd-agent-proto",
            name.to_string_lossy()
        );
    }
}
