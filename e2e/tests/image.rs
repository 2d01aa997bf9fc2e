//! The container image: the `Dockerfile` at the repository root is checked statically (base
//! images cannot be pulled here), and an image with the same runtime stage is built `FROM
//! scratch` from the already-built binaries and their shared libraries with podman, then
//! inspected (entrypoint, user, labels) and unpacked (file list). `podman run` is not used:
//! the sandbox refuses it. Without a working podman the build test prints why and skips.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use serde_json::Value;

/// The crate version, which is also the image tag and the `VERSION` label.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the runtime stage puts the binaries.
const BIN_DIR: &str = "/usr/local/bin";
const BINARIES: [&str; 2] = ["argocd-agent", "argocd-agentctl"];
/// The non-root user of the distroless `nonroot` images (and of the manifests).
const USER: &str = "65532:65532";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One Dockerfile instruction: keyword (upper case) and its arguments, continuations joined.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// One `FROM` stage.
#[derive(Debug, Clone)]
struct Stage {
    base: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }
}

/// Parses a Dockerfile into its global `ARG`s and stages (comments, parser directives and
/// `\` line continuations handled; enough for this repository's file).
fn parse_dockerfile(text: &str) -> (Vec<Instruction>, Vec<Stage>) {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if trimmed.starts_with('#') {
            continue; // comment inside a continued instruction
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    assert!(
        current.is_empty(),
        "Dockerfile ends inside a continued line"
    );
    let mut globals = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for l in logical {
        let (kw, args) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
        let ins = Instruction {
            keyword: kw.to_ascii_uppercase(),
            args: args.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        if ins.keyword == "FROM" {
            let words: Vec<&str> = ins.args.split(' ').collect();
            let name = match words.as_slice() {
                [_, as_, n] if as_.eq_ignore_ascii_case("as") => Some((*n).to_owned()),
                _ => None,
            };
            stages.push(Stage {
                base: words[0].to_owned(),
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(ins);
        } else {
            globals.push(ins);
        }
    }
    (globals, stages)
}

fn dockerfile() -> (Vec<Instruction>, Vec<Stage>) {
    let path = workspace_root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading Dockerfile: {e}"));
    parse_dockerfile(&text)
}

/// `ARG NAME=default` of a stage (or the globals), as name -> default.
fn arg_defaults<'a>(args: impl Iterator<Item = &'a str>) -> BTreeMap<String, String> {
    args.map(|a| match a.split_once('=') {
        Some((k, v)) => (k.to_owned(), v.trim_matches('"').to_owned()),
        None => (a.to_owned(), String::new()),
    })
    .collect()
}

/// `LABEL k="v" k2="v2"` of a stage, as key -> value (quotes removed).
fn labels(stage: &Stage) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for args in stage.all("LABEL") {
        let mut rest = args;
        while let Some((key, tail)) = rest.trim_start().split_once('=') {
            let tail = tail.trim_start();
            let (value, next) = if let Some(q) = tail.strip_prefix('"') {
                let end = q.find('"').expect("closing quote in LABEL");
                (&q[..end], &q[end + 1..])
            } else {
                tail.split_once(' ').unwrap_or((tail, ""))
            };
            out.insert(key.trim().to_owned(), value.to_owned());
            rest = next;
        }
    }
    out
}

#[test]
fn dockerfile_builds_release_binaries_in_a_builder_stage_and_ships_only_them() {
    let (_, stages) = dockerfile();
    assert!(
        stages.len() >= 2,
        "Dockerfile must be multi-stage, found {} stage(s)",
        stages.len()
    );
    let build = &stages[0];
    let build_name = build
        .name
        .clone()
        .expect("the builder stage has a name (FROM ... AS x)");
    assert!(
        build.base.contains("rust:"),
        "builder stage must start from a Rust image, found {}",
        build.base
    );
    let cargo = build
        .all("RUN")
        .find(|r| r.contains("cargo build"))
        .expect("builder stage runs cargo build");
    for want in ["--release", "--locked", "-p argocd-agent-cli"] {
        assert!(cargo.contains(want), "cargo build lacks {want}: {cargo}");
    }
    // The CLI package alone: no developer package, no feature that could pull test code in.
    for unwanted in [
        "--workspace",
        "--all-features",
        "--features",
        "argocd-agent-devtools",
    ] {
        assert!(
            !cargo.contains(unwanted),
            "cargo build has {unwanted}: {cargo}"
        );
    }

    let runtime = stages.last().expect("a runtime stage");
    assert!(
        runtime.base.starts_with("gcr.io/distroless/static")
            || runtime.base.starts_with("gcr.io/distroless/cc")
            || runtime.base == "scratch",
        "runtime base must be minimal (distroless static/cc or scratch), found {}",
        runtime.base
    );
    assert_eq!(
        runtime.all("RUN").count(),
        0,
        "the runtime stage must not RUN anything (no shell in the image)"
    );
    let copies: Vec<&str> = runtime.all("COPY").collect();
    for bin in BINARIES {
        let dest = format!("{BIN_DIR}/{bin}");
        assert!(
            copies
                .iter()
                .any(|c| c.contains(&format!("--from={build_name}")) && c.ends_with(&dest)),
            "runtime stage does not copy {bin} from stage {build_name} to {dest}: {copies:?}"
        );
    }
    assert_eq!(
        copies.len(),
        BINARIES.len(),
        "runtime stage copies something besides the binaries: {copies:?}"
    );
}

#[test]
fn dockerfile_runtime_runs_as_65532_with_oci_labels_of_this_version() {
    let (_, stages) = dockerfile();
    let runtime = stages.last().expect("a runtime stage");
    let users: Vec<&str> = runtime.all("USER").collect();
    assert_eq!(users, [USER], "runtime USER");
    let entrypoint: Vec<&str> = runtime.all("ENTRYPOINT").collect();
    assert_eq!(
        entrypoint,
        [format!("[\"{BIN_DIR}/argocd-agent\"]").as_str()],
        "ENTRYPOINT must be the exec form of argocd-agent"
    );
    let args = arg_defaults(runtime.all("ARG"));
    assert_eq!(
        args.get("VERSION").map(String::as_str),
        Some(VERSION),
        "ARG VERSION default must be the crate version"
    );
    let labels = labels(runtime);
    for (key, want) in [
        ("org.opencontainers.image.version", "${VERSION}"),
        ("org.opencontainers.image.revision", "${GIT_COMMIT}"),
        (
            "org.opencontainers.image.source",
            "https://github.com/argoproj-labs/argocd-agent-rs",
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(want),
            "LABEL {key}"
        );
    }
    // The commit reaches cli/build.rs in the builder, where there is no .git.
    let build = &stages[0];
    assert!(
        build
            .all("ENV")
            .any(|e| e.replace(' ', "=") == "ARGOCD_AGENT_GIT_COMMIT=${GIT_COMMIT}"),
        "builder stage must pass GIT_COMMIT to cli/build.rs as ARGOCD_AGENT_GIT_COMMIT"
    );
}

#[test]
fn dockerignore_keeps_git_target_and_venv_out_of_the_build_context() {
    let text = std::fs::read_to_string(workspace_root().join(".dockerignore"))
        .unwrap_or_else(|e| panic!("reading .dockerignore: {e}"));
    let entries: BTreeSet<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for want in [".git", "target", ".venv"] {
        assert!(entries.contains(want), ".dockerignore lacks {want}");
    }
}

#[test]
fn deployments_run_the_image_entrypoint_by_version_tag() {
    for file in [
        "deploy/principal/deployment.yaml",
        "deploy/agent/deployment.yaml",
    ] {
        let text = std::fs::read_to_string(workspace_root().join(file))
            .unwrap_or_else(|e| panic!("reading {file}: {e}"));
        let deploy: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let c = deploy
            .pointer("/spec/template/spec/containers/0")
            .unwrap_or_else(|| panic!("{file}: no container"));
        assert_eq!(
            c.pointer("/image").and_then(Value::as_str),
            Some(format!("ghcr.io/argoproj-labs/argocd-agent-rs:{VERSION}").as_str()),
            "{file}: image must be pinned to the crate version"
        );
        assert_eq!(
            c.pointer("/command"),
            Some(&serde_json::json!([format!("{BIN_DIR}/argocd-agent")])),
            "{file}: command must be the image's entrypoint"
        );
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Why podman cannot be used here, or `None` when `podman info` works.
fn podman_unavailable() -> Option<String> {
    match Command::new("podman").arg("info").output() {
        Err(e) => Some(format!(
            "podman not found ({e}); .ci/run installs it with apt"
        )),
        Ok(o) if !o.status.success() => Some(format!(
            "podman refuses to run here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// The shared libraries `ldd` lists for `bin`, as absolute paths (the vDSO has no file).
fn shared_libraries(bin: &Path) -> Vec<PathBuf> {
    let out = run(Command::new("ldd").arg(bin));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rhs)) => rhs.trim(),
                None => l,
            };
            let path = path.split(" (").next().unwrap_or("").trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Removes the test image when the test ends, also on failure.
struct ImageGuard(String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// Files (not directories) in every layer of a `docker-archive`, as absolute paths with
/// their `tar -tv` mode string.
fn image_files(archive: &Path, dir: &Path) -> BTreeMap<String, String> {
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(dir));
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json")).expect("manifest.json in the archive"),
    )
    .expect("manifest.json is JSON");
    let layers = manifest
        .pointer("/0/Layers")
        .and_then(Value::as_array)
        .expect("Layers in manifest.json");
    let mut files = BTreeMap::new();
    for layer in layers {
        let layer = dir.join(layer.as_str().expect("layer path"));
        let out = run(Command::new("tar").arg("-tvf").arg(&layer));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mode = line.split_whitespace().next().unwrap_or("");
            let path = line.split_whitespace().last().unwrap_or("");
            if mode.starts_with('d') {
                continue;
            }
            files.insert(
                format!("/{}", path.trim_start_matches("./").trim_start_matches('/')),
                mode.to_owned(),
            );
        }
    }
    files
}

#[test]
fn image_of_the_built_binaries_has_the_entrypoint_user_labels_and_only_binaries_and_libraries() {
    if let Some(reason) = podman_unavailable() {
        println!("SKIPPED image build test: {reason}");
        return;
    }
    let (_, stages) = dockerfile();
    let runtime = stages.last().expect("a runtime stage").clone();

    // Build context: rootfs/ with the binaries at their image paths and their libraries.
    let tmp = tempfile::tempdir().expect("temp dir");
    let rootfs = tmp.path().join("context/rootfs");
    let mut expected = BTreeSet::new();
    for bin in BINARIES {
        let src =
            argocd_agent_testkit::harness::binary(bin).unwrap_or_else(|e| panic!("{bin}: {e}"));
        let dest = rootfs.join(BIN_DIR.trim_start_matches('/')).join(bin);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&src, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
        expected.insert(format!("{BIN_DIR}/{bin}"));
        for lib in shared_libraries(&src) {
            let dest = rootfs.join(lib.strip_prefix("/").expect("absolute"));
            if dest.exists() {
                continue;
            }
            std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
            // Copies the file a symlink points to: the image needs the content.
            std::fs::copy(&lib, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", lib.display()));
            expected.insert(lib.display().to_string());
        }
    }
    // The Dockerfile's runtime stage, with the base replaced by scratch and the binaries
    // (and libraries) copied from the context instead of the builder stage.
    let mut containerfile = String::from("FROM scratch\nCOPY rootfs/ /\n");
    for ins in &runtime.instructions {
        if ins.keyword != "COPY" {
            containerfile.push_str(&format!("{} {}\n", ins.keyword, ins.args));
        }
    }
    let context = tmp.path().join("context");
    std::fs::write(context.join("Containerfile"), &containerfile).expect("writing Containerfile");

    let commit = "0123456789ab";
    let tag = format!(
        "localhost/argocd-agent-rs-image-test:{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let _guard = ImageGuard(tag.clone());
    run(Command::new("podman")
        .args(["build", "--quiet", "--tag", &tag])
        .arg(format!("--build-arg=GIT_COMMIT={commit}"))
        .arg("--file")
        .arg(context.join("Containerfile"))
        .arg(&context));

    let inspect = run(Command::new("podman").args(["image", "inspect", &tag]));
    let inspect: Value = serde_json::from_slice(&inspect.stdout).expect("inspect is JSON");
    let config = inspect
        .pointer("/0/Config")
        .unwrap_or_else(|| panic!("no Config in {inspect}"));
    assert_eq!(
        config.pointer("/Entrypoint"),
        Some(&serde_json::json!([format!("{BIN_DIR}/argocd-agent")])),
        "entrypoint: {config}"
    );
    assert_eq!(
        config.pointer("/User").and_then(Value::as_str),
        Some(USER),
        "user: {config}"
    );
    let label = |k: &str| {
        config
            .pointer("/Labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    assert_eq!(
        label("org.opencontainers.image.version").as_deref(),
        Some(VERSION)
    );
    assert_eq!(
        label("org.opencontainers.image.revision").as_deref(),
        Some(commit)
    );
    assert_eq!(
        label("org.opencontainers.image.source").as_deref(),
        Some("https://github.com/argoproj-labs/argocd-agent-rs")
    );

    let archive = tmp.path().join("image.tar");
    run(Command::new("podman")
        .args(["save", "--format", "docker-archive", "--output"])
        .arg(&archive)
        .arg(&tag));
    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    let files = image_files(&archive, &unpacked);
    let found: BTreeSet<String> = files.keys().cloned().collect();
    assert_eq!(
        found, expected,
        "image must hold the two binaries and their shared libraries, nothing else"
    );
    for bin in BINARIES {
        let mode = &files[&format!("{BIN_DIR}/{bin}")];
        assert!(
            mode.starts_with("-rwx") && mode.ends_with('x'),
            "{bin} must be executable by any user (the image runs as {USER}): {mode}"
        );
    }
}

#[test]
fn binaries_print_version_commit_and_protocol_range() {
    for (bin, args) in [
        ("argocd-agent", &["--version"][..]),
        ("argocd-agentctl", &["version"][..]),
        ("argocd-agentctl", &["--version"][..]),
    ] {
        let path =
            argocd_agent_testkit::harness::binary(bin).unwrap_or_else(|e| panic!("{bin}: {e}"));
        let out = run(Command::new(&path).args(args));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.trim();
        assert!(
            line.starts_with(&format!("{bin} {VERSION} (commit ")),
            "{bin} {args:?}: {line}"
        );
        let commit = line
            .split("(commit ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .unwrap_or("");
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{bin} {args:?}: commit {commit:?}"
        );
        let range =
            format!("protocol {PROTOCOL_VERSION}, accepts {PROTOCOL_MIN}..={PROTOCOL_VERSION})");
        assert!(
            line.ends_with(&range),
            "{bin} {args:?}: protocol range missing: {line}"
        );
    }
}
