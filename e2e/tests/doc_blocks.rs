//! Every code block of `README.md` and `docs/*.md` marked runnable runs, as written, against
//! the built binaries and the project's development servers, so the documentation cannot drift
//! from what the binaries do. The marker convention is described for writers in
//! `docs/contributing-docs.md`; in short, an HTML comment on the line right before the fence:
//!
//! ```text
//! <!-- runnable -->                                   a command block: run it
//! <!-- runnable: session=demo -->                     ... in session `demo` of this file
//! <!-- runnable: session=demo background ready=URL --> a server: run it in the background
//! <!-- runnable: file=rules.yaml -->                  write the block to rules.yaml
//! <!-- runnable: output -->                           the previous command block's output
//! <!-- runnable: exit=1 timeout=40 -->                expected exit status, time limit (s)
//! ```
//!
//! **Sessions.** The marked blocks of one file that name the same `session` (or none: the
//! file's default session) run in document order, in one scratch directory (the working
//! directory of every block), and see the shell variables earlier blocks of the session set.
//! Sessions run in parallel with each other. Background blocks run until their session ends;
//! then their whole process group is stopped (SIGTERM, SIGKILL after 3 s). Every other block
//! runs in its own process group too, which is killed when the block ends, so nothing a block
//! starts outlives it.
//!
//! **Kinds of blocks.** A command block whose first line starts with `$ ` is a console
//! transcript: each `$ ` line (with its `\` continuation lines) runs on its own, and the
//! lines after it are its expected output; a command with no output shown must exit 0, one
//! with output is judged by its output only (a denial's exit status is part of what it shows).
//! Any other command block is a bash script, run with `set -euo pipefail`; it must exit with
//! `exit=N` (default 0) within `timeout=S` seconds (default [`DEFAULT_TIMEOUT`]). An `output`
//! block holds the expected output of the session's previous command or background block; a
//! background block is ready when the lines of the `output` block after it, or else the text
//! `ready=TEXT`, appear in what it printed.
//!
//! **Expected output.** Each non-blank line of an expected output must appear, in order, as a
//! line of what the command printed (standard output, then standard error), trailing spaces
//! ignored. A line `...` stands for any lines; a line ending in `...` matches any line that
//! starts with the text before it (for times, ages, ports and keys that differ per run).
//!
//! **Rewrite rules.** Only what must differ on a test machine is changed, in command blocks,
//! file blocks (content and path) and expected output alike:
//!
//! 1. `cargo run -p argocd-agent-devtools --` becomes `argocd-agent-dev`, and
//!    `cargo run -p argocd-agent-cli --bin NAME --` becomes `NAME` (the binaries are already
//!    built; the test never builds).
//! 2. `/tmp`, as the start of an absolute path (also inside `unix:///tmp/...`), becomes the
//!    session's own `<scratch>/tmp`, so sessions and parallel test runs never share files.
//! 3. A port on `127.0.0.1:PORT` or `localhost:PORT` (not 0) becomes a free port, the same
//!    one for the same number throughout the session.
//!
//! The binary names are not rewritten in the text: `PATH` starts with a directory of links
//! named `argocd-agent`, `argocd-agentctl`, `argocd-agent-dev` (the built binaries, found as
//! the other e2e tests find them), `kubectl` (`KUBECTL`, else `.venv/bin/kubectl`, else
//! PATH), `helm` (`HELM`, else `.tools/bin/helm`, else PATH) and `curl` (PATH); a missing
//! tool fails the test (`.ci/run` installs them all). The scratch directory holds what commands expect to find relative to
//! the repository root: a link `deploy` to the repository's `deploy/` and
//! `.venv/bin/kubectl` (the kubectl above). The environment is the test's, with `HOME` a
//! fresh directory and `KUBECONFIG`, `SPIFFE_ENDPOINT_SOCKET`, `RUST_LOG` and every
//! `ARGOCD_*` variable removed, so a developer's settings never reach a block (nor a block a
//! developer's cluster).
//!
//! A marker that is not followed by a fence, an unknown key, or an HTML comment starting with
//! `run` that is not a valid marker fails the test: a typo must not skip a block silently.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use regex::Regex;

/// Time limit of one block (and of a background block's readiness) without `timeout=`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Sessions run at once.
const PARALLEL_SESSIONS: usize = 3;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

// ---------------------------------------------------------------------------------------
// Extraction
// ---------------------------------------------------------------------------------------

/// What a marked block is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A bash script.
    Script,
    /// `$ command` lines, each followed by its expected output.
    Console,
    /// Written to this path (relative to the scratch directory).
    File(String),
    /// The expected output of the session's previous command or background block.
    Output,
    /// A server, run until the session ends.
    Background,
}

/// One marked block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    /// Path relative to the repository root, e.g. `docs/identity.md`.
    file: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The block's text, without the fences and the list indentation.
    body: String,
    kind: Kind,
    /// `session=` (empty: the file's default session).
    session: String,
    /// `ready=`: the text a background block prints once it serves.
    ready: Option<String>,
    /// `exit=`: the status a script must exit with.
    exit: i32,
    /// `timeout=`.
    timeout: Duration,
}

impl Block {
    fn place(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
    fn runs(&self) -> bool {
        matches!(self.kind, Kind::Script | Kind::Console | Kind::Background)
    }
}

/// An opening fence: (indentation, fence character, fence length).
fn opening_fence(line: &str) -> Option<(usize, char, usize)> {
    let trimmed = line.trim_start_matches(' ');
    let indent = line.len() - trimmed.len();
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = trimmed.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((indent, c, n))
}

fn closes(line: &str, c: char, n: usize) -> bool {
    let t = line.trim();
    t.len() >= n && t.chars().all(|x| x == c)
}

/// Parses `runnable[: key[=value] ...]` (the comment's inside).
fn parse_marker(inner: &str, block: &mut Block) -> Result<(), String> {
    let rest = inner.strip_prefix("runnable").unwrap_or_default();
    let rest = match rest.trim_start().strip_prefix(':') {
        Some(r) => r,
        None if rest.trim().is_empty() => "",
        None => return Err(format!("not a marker: `{inner}`")),
    };
    let token = Regex::new(r#"^\s*([a-z]+)(?:=("[^"]*"|\S+))?"#).unwrap();
    let mut s = rest;
    let mut kinds = Vec::new();
    while !s.trim().is_empty() {
        let Some(c) = token.captures(s) else {
            return Err(format!("cannot read `{}` in the marker", s.trim()));
        };
        let key = c[1].to_owned();
        let value = c.get(2).map(|v| v.as_str().trim_matches('"').to_owned());
        s = &s[c[0].len()..];
        let need = |v: &Option<String>| {
            v.clone()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("`{key}` needs a value (`{key}=...`)"))
        };
        match key.as_str() {
            "session" => block.session = need(&value)?,
            "file" => kinds.push(Kind::File(need(&value)?)),
            "output" | "background" if value.is_some() => {
                return Err(format!("`{key}` takes no value"));
            }
            "output" => kinds.push(Kind::Output),
            "background" => kinds.push(Kind::Background),
            "ready" => block.ready = Some(need(&value)?),
            "exit" => {
                block.exit = need(&value)?
                    .parse()
                    .map_err(|_| "`exit` needs a number".to_owned())?
            }
            "timeout" => {
                let secs: u64 = need(&value)?
                    .parse()
                    .map_err(|_| "`timeout` needs a number of seconds".to_owned())?;
                block.timeout = Duration::from_secs(secs);
            }
            other => {
                return Err(format!(
                    "unknown key `{other}` (known: session, file, output, background, ready, exit, timeout)"
                ));
            }
        }
    }
    match kinds.as_slice() {
        [] => {}
        [k] => block.kind = k.clone(),
        _ => return Err("at most one of `file`, `output`, `background`".into()),
    }
    if block.ready.is_some() && block.kind != Kind::Background {
        return Err("`ready` belongs to a `background` block".into());
    }
    if block.exit != 0 && block.kind != Kind::Script {
        return Err("`exit` belongs to a script block".into());
    }
    Ok(())
}

/// The marked blocks of one Markdown file (`file` is its name in messages), or every problem
/// found: markers not followed by a fence, unknown keys, comments that look like a mistyped
/// marker, sessions whose blocks do not fit together.
fn extract(file: &str, text: &str) -> Result<Vec<Block>, Vec<String>> {
    let comment = Regex::new(r"^\s*<!--\s*(.*?)\s*-->\s*$").unwrap();
    let looks_like_marker = Regex::new(r"(?i)^\s*<!--\s*-?\s*run").unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some((_, c, n)) = opening_fence(line) {
            // Skip the whole fenced block: markers shown inside code are examples.
            i += 1;
            while i < lines.len() && !closes(lines[i], c, n) {
                i += 1;
            }
            i += 1;
            continue;
        }
        if !looks_like_marker.is_match(line) {
            i += 1;
            continue;
        }
        let at = format!("{file}:{}", i + 1);
        let inner = comment
            .captures(line)
            .map(|c| c[1].to_owned())
            .filter(|inner| {
                inner == "runnable"
                    || inner.starts_with("runnable:")
                    || inner.starts_with("runnable ")
            });
        let Some(inner) = inner else {
            errors.push(format!(
                "{at}: `{}` looks like a runnable marker but is not one: write `<!-- runnable -->` or `<!-- runnable: key=value ... -->` alone on the line",
                line.trim()
            ));
            i += 1;
            continue;
        };
        let Some((indent, c, n)) = lines.get(i + 1).and_then(|l| opening_fence(l)) else {
            errors.push(format!(
                "{at}: runnable marker not followed by a code fence on the next line"
            ));
            i += 1;
            continue;
        };
        let mut block = Block {
            file: file.to_owned(),
            line: i + 2,
            body: String::new(),
            kind: Kind::Script,
            session: String::new(),
            ready: None,
            exit: 0,
            timeout: DEFAULT_TIMEOUT,
        };
        if let Err(e) = parse_marker(&inner, &mut block) {
            errors.push(format!("{at}: {e}"));
        }
        let mut j = i + 2;
        let mut body = String::new();
        while j < lines.len() && !closes(lines[j], c, n) {
            let l = lines[j];
            let strip = l.len() - l.trim_start_matches(' ').len();
            body.push_str(&l[strip.min(indent)..]);
            body.push('\n');
            j += 1;
        }
        if j == lines.len() {
            errors.push(format!("{}: code fence never closed", block.place()));
        }
        if block.kind == Kind::Script
            && body
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.starts_with("$ "))
        {
            block.kind = Kind::Console;
        }
        block.body = body;
        blocks.push(block);
        i = j + 1;
    }
    errors.extend(check_sessions(&blocks));
    if errors.is_empty() {
        Ok(blocks)
    } else {
        Err(errors)
    }
}

/// Sessions whose blocks do not fit together: an `output` block after no command, a file no
/// command follows, a background block with no way to tell it is ready.
fn check_sessions(blocks: &[Block]) -> Vec<String> {
    let mut errors = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let same: Vec<&Block> = blocks.iter().filter(|o| o.session == b.session).collect();
        let pos = same.iter().position(|o| o.line == b.line).unwrap();
        let prev = pos.checked_sub(1).map(|p| same[p]);
        let next = same.get(pos + 1).copied();
        let used_later = blocks[k + 1..]
            .iter()
            .any(|o| o.session == b.session && o.runs());
        let after_command = prev.is_some_and(|p| matches!(p.kind, Kind::Script | Kind::Background));
        let ready_known = b.ready.is_some() || next.is_some_and(|n| n.kind == Kind::Output);
        let problem = match &b.kind {
            Kind::Output if !after_command => Some(
                "an `output` block must follow a script or background block of the same session"
                    .to_owned(),
            ),
            Kind::File(path) if !used_later => Some(format!(
                "file {path} is used by no command block after it in the same session"
            )),
            Kind::Background if !ready_known => Some(
                "a background block needs `ready=TEXT` or an `output` block after it".to_owned(),
            ),
            Kind::Background if !used_later => Some(
                "a background block needs a command block after it in the same session".to_owned(),
            ),
            _ => None,
        };
        if let Some(p) = problem {
            errors.push(format!("{}: {p}", b.place()));
        }
    }
    errors
}

/// Every documentation file the test reads: `README.md` and `docs/*.md`, relative names.
fn doc_files(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn all_blocks(root: &Path) -> Result<Vec<Block>, Vec<String>> {
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    for f in doc_files(root) {
        let text = fs::read_to_string(root.join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        match extract(&f, &text) {
            Ok(b) => blocks.extend(b),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(blocks)
    } else {
        Err(errors)
    }
}

/// Console blocks: (command, expected output lines) per `$ ` line.
fn console_commands(body: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut continued = false;
    for line in body.lines() {
        if continued {
            let last = out.last_mut().unwrap();
            last.0.push('\n');
            last.0.push_str(line);
            continued = line.trim_end().ends_with('\\');
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            out.push((cmd.to_owned(), String::new()));
            continued = cmd.trim_end().ends_with('\\');
        } else if let Some(last) = out.last_mut() {
            last.1.push_str(line);
            last.1.push('\n');
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Rewrites and output checks
// ---------------------------------------------------------------------------------------

/// The rewrite rules of one session (see the module documentation).
struct Rewriter {
    scratch_tmp: String,
    ports: Mutex<BTreeMap<u16, u16>>,
}

impl Rewriter {
    fn new(scratch: &Path) -> Rewriter {
        Rewriter {
            scratch_tmp: scratch.join("tmp").display().to_string(),
            ports: Mutex::new(BTreeMap::new()),
        }
    }

    fn apply(&self, text: &str) -> String {
        let cargo_dev = Regex::new(r"cargo run -p argocd-agent-devtools --(\s|$)").unwrap();
        let text = cargo_dev.replace_all(text, "argocd-agent-dev$1");
        let cargo_cli =
            Regex::new(r"cargo run -p argocd-agent-cli --bin ([a-z-]+) --(\s|$)").unwrap();
        let text = cargo_cli.replace_all(&text, "$1$2");
        let tmp = Regex::new(r"(^|[^A-Za-z0-9._-])/tmp\b").unwrap();
        let text = tmp.replace_all(&text, |c: &regex::Captures| {
            format!("{}{}", &c[1], self.scratch_tmp)
        });
        let port = Regex::new(r"\b(127\.0\.0\.1|localhost):([0-9]{1,5})\b").unwrap();
        port.replace_all(&text, |c: &regex::Captures| {
            let n: u16 = c[2].parse().unwrap_or(0);
            if n == 0 {
                return c[0].to_owned();
            }
            let mut ports = self.ports.lock().unwrap();
            let free = *ports.entry(n).or_insert_with(free_port);
            format!("{}:{free}", &c[1])
        })
        .into_owned()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `None` when every expected line is found in order in `actual`, else the first missing.
fn missing_line(expected: &str, actual: &str) -> Option<String> {
    let actual: Vec<&str> = actual.lines().map(str::trim_end).collect();
    let mut at = 0;
    for want in expected.lines().map(str::trim_end) {
        if want.trim().is_empty() || want.trim() == "..." {
            continue;
        }
        let found = match want.strip_suffix("...") {
            Some(prefix) => {
                let prefix = prefix.trim_end();
                actual[at..].iter().position(|l| l.starts_with(prefix))
            }
            None => actual[at..].iter().position(|l| *l == want),
        };
        match found {
            Some(p) => at += p + 1,
            None => return Some(want.to_owned()),
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------

/// What the blocks need outside the repository.
struct Tools {
    bin_dir: PathBuf,
    path: String,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn resolve(candidate: PathBuf, what: &str) -> PathBuf {
    let found = if candidate.components().count() == 1 {
        find_on_path(&candidate.to_string_lossy())
    } else {
        candidate.is_file().then_some(candidate)
    };
    found.unwrap_or_else(|| {
        panic!("{what} not found: marked doc blocks need it (.ci/run installs it)")
    })
}

fn tools(dir: &Path, root: &Path) -> Tools {
    let bin_dir = dir.join("bin");
    fs::create_dir_all(&bin_dir).unwrap();
    let link = |name: &str, target: PathBuf| {
        std::os::unix::fs::symlink(&target, bin_dir.join(name))
            .unwrap_or_else(|e| panic!("link {name} -> {}: {e}", target.display()));
    };
    for name in ["argocd-agent", "argocd-agentctl", "argocd-agent-dev"] {
        let built =
            argocd_agent_testkit::harness::binary(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        link(name, built);
    }
    link(
        "kubectl",
        resolve(
            argocd_agent_testkit::harness::kubectl(),
            "kubectl (KUBECTL, .venv/bin/kubectl or PATH)",
        ),
    );
    let helm = std::env::var_os("HELM")
        .map(PathBuf::from)
        .or_else(|| Some(root.join(".tools/bin/helm")).filter(|p| p.is_file()))
        .unwrap_or_else(|| PathBuf::from("helm"));
    link(
        "helm",
        resolve(helm, "helm (HELM, .tools/bin/helm or PATH)"),
    );
    link("curl", resolve(PathBuf::from("curl"), "curl"));
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Tools { bin_dir, path }
}

/// A process group started for a block; killed when dropped.
struct Group {
    child: Child,
    graceful: bool,
}

impl Group {
    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.graceful && matches!(self.child.try_wait(), Ok(None)) {
            self.signal("-TERM");
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.signal("-KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One session's scratch directory, state and servers.
struct Session<'a> {
    tools: &'a Tools,
    work: PathBuf,
    state: PathBuf,
    home: PathBuf,
    rewriter: Rewriter,
    background: Vec<Group>,
    _dir: tempfile::TempDir,
}

/// What a finished (or still running) command printed.
struct Printed {
    stdout: String,
    stderr: String,
}

impl Printed {
    fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
    fn tail(text: &str, n: usize) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let skip = lines.len().saturating_sub(n);
        let mut s = lines[skip..].join("\n");
        if skip > 0 {
            s = format!("[{skip} lines before]\n{s}");
        }
        s
    }
    fn report(&self) -> String {
        format!(
            "--- stderr ---\n{}\n--- stdout ---\n{}",
            Printed::tail(&self.stderr, 40),
            Printed::tail(&self.stdout, 40)
        )
    }
}

impl<'a> Session<'a> {
    fn new(tools: &'a Tools, root: &Path) -> Session<'a> {
        let dir = tempfile::Builder::new()
            .prefix("doc-blocks-")
            .tempdir()
            .unwrap();
        let work = dir.path().join("work");
        let state = dir.path().join("state");
        let home = dir.path().join("home");
        for d in [
            &work,
            &state,
            &home,
            &work.join("tmp"),
            &work.join(".venv/bin"),
        ] {
            fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(root.join("deploy"), work.join("deploy")).unwrap();
        std::os::unix::fs::symlink(
            tools.bin_dir.join("kubectl"),
            work.join(".venv/bin/kubectl"),
        )
        .unwrap();
        Session {
            tools,
            rewriter: Rewriter::new(&work),
            work,
            state,
            home,
            background: Vec::new(),
            _dir: dir,
        }
    }

    /// Starts `script` (already rewritten) with bash in its own process group; its output
    /// goes to `<state>/<name>.out` and `.err`.
    fn spawn(&self, name: &str, script: &str, graceful: bool) -> Group {
        let vars = self.state.join("vars.sh");
        let wrapper = format!(
            r#"set -euo pipefail
__doc_pristine=" $(compgen -v | tr '\n' ' ') "
if [ -f '{vars}' ]; then source '{vars}'; fi
__doc_save() {{
  local __doc_v
  : > '{vars}.new'
  for __doc_v in $(compgen -v); do
    case "$__doc_pristine" in *" $__doc_v "*) continue ;; esac
    case "$__doc_v" in __doc*|BASH*|FUNCNAME|PIPESTATUS|_) continue ;; esac
    declare -p "$__doc_v" >> '{vars}.new' 2>/dev/null || true
  done
  mv '{vars}.new' '{vars}'
}}
trap __doc_save EXIT
{script}
"#,
            vars = vars.display()
        );
        let path = self.state.join(format!("{name}.sh"));
        fs::write(&path, wrapper).unwrap();
        let out = fs::File::create(self.state.join(format!("{name}.out"))).unwrap();
        let err = fs::File::create(self.state.join(format!("{name}.err"))).unwrap();
        let mut cmd = Command::new("bash");
        cmd.arg(&path)
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("ARGOCD_")
                || ["KUBECONFIG", "SPIFFE_ENDPOINT_SOCKET", "RUST_LOG"].contains(&k.as_ref())
            {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("PATH", &self.tools.path)
            .env("HOME", &self.home)
            .env("NO_COLOR", "1");
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Group {
            child: cmd.spawn().expect("bash"),
            graceful,
        }
    }

    fn printed(&self, name: &str) -> Printed {
        let read = |ext: &str| {
            fs::read(self.state.join(format!("{name}.{ext}")))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        Printed {
            stdout: read("out"),
            stderr: read("err"),
        }
    }

    /// Runs a script to completion; Err names the place, the status and the output.
    fn run(
        &self,
        b: &Block,
        name: &str,
        script: &str,
        exit: Option<i32>,
    ) -> Result<Printed, String> {
        let started = Instant::now();
        let mut group = self.spawn(name, script, false);
        let status = loop {
            if let Some(s) = group.child.try_wait().unwrap() {
                break Some(s);
            }
            if started.elapsed() > b.timeout {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(group); // and whatever it left running
        let printed = self.printed(name);
        let Some(status) = status else {
            return Err(format!(
                "{}: still running after {:?} (timeout={}):\n{script}\n{}",
                b.place(),
                b.timeout,
                b.timeout.as_secs(),
                printed.report()
            ));
        };
        if let Some(want) = exit
            && status.code() != Some(want)
        {
            return Err(format!(
                "{}: exited with {status} (expected {want}) after {:.1}s:\n{script}\n{}",
                b.place(),
                started.elapsed().as_secs_f64(),
                printed.report()
            ));
        }
        Ok(printed)
    }

    /// Runs the session's blocks in order; stops at the first failure.
    fn run_blocks(&mut self, blocks: &[&Block]) -> Result<(), String> {
        let mut last: Option<Printed> = None;
        let mut k = 0;
        while k < blocks.len() {
            let b = blocks[k];
            let name = format!("block-{}", b.line);
            match &b.kind {
                Kind::File(path) => {
                    let target = self.work.join(self.rewriter.apply(path));
                    if let Some(parent) = target.parent() {
                        fs::create_dir_all(parent).unwrap();
                    }
                    fs::write(&target, self.rewriter.apply(&b.body)).unwrap();
                }
                Kind::Script => {
                    let script = self.rewriter.apply(&b.body);
                    last = Some(self.run(b, &name, &script, Some(b.exit))?);
                }
                Kind::Console => {
                    for (n, (cmd, expected)) in console_commands(&b.body).into_iter().enumerate() {
                        let cmd = self.rewriter.apply(&cmd);
                        let expected = self.rewriter.apply(&expected);
                        let checked = expected.lines().any(|l| !l.trim().is_empty());
                        let printed =
                            self.run(b, &format!("{name}-{n}"), &cmd, (!checked).then_some(0))?;
                        if let Some(line) = missing_line(&expected, &printed.both()) {
                            return Err(format!(
                                "{}: `$ {cmd}` did not print the line\n  {line}\n{}",
                                b.place(),
                                printed.report()
                            ));
                        }
                    }
                    last = None;
                }
                Kind::Background => {
                    let script = self.rewriter.apply(&b.body);
                    let mut group = self.spawn(&name, &script, true);
                    // Ready: the next block's expected output, else `ready=`.
                    let (expected, consumed) = match blocks.get(k + 1) {
                        Some(o) if o.kind == Kind::Output => (self.rewriter.apply(&o.body), true),
                        _ => (b.ready.clone().unwrap_or_default(), false),
                    };
                    let started = Instant::now();
                    loop {
                        let printed = self.printed(&name);
                        let ready = if consumed {
                            missing_line(&expected, &printed.both()).is_none()
                        } else {
                            printed.both().contains(&expected)
                        };
                        if ready {
                            break;
                        }
                        if let Some(status) = group.child.try_wait().unwrap() {
                            return Err(format!(
                                "{}: background block exited with {status} before it was ready:\n{script}\n{}",
                                b.place(),
                                printed.report()
                            ));
                        }
                        if started.elapsed() > b.timeout {
                            let missing = if consumed {
                                missing_line(&expected, &printed.both()).unwrap_or_default()
                            } else {
                                expected.clone()
                            };
                            group.graceful = false;
                            return Err(format!(
                                "{}: background block not ready after {:?} (no line `{missing}`):\n{script}\n{}",
                                b.place(),
                                b.timeout,
                                printed.report()
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    self.background.push(group);
                    last = None;
                    if consumed {
                        k += 1;
                    }
                }
                Kind::Output => {
                    let printed = last.take().expect("checked: output follows a command");
                    let expected = self.rewriter.apply(&b.body);
                    if let Some(line) = missing_line(&expected, &printed.both()) {
                        return Err(format!(
                            "{}: the output shown is not what the block before printed: no line\n  {line}\n{}",
                            b.place(),
                            printed.report()
                        ));
                    }
                }
            }
            k += 1;
        }
        Ok(())
    }
}

#[test]
fn marked_doc_blocks_run() {
    let root = workspace_root();
    let blocks = all_blocks(&root).unwrap_or_else(|e| panic!("{}", e.join("\n")));
    assert!(!blocks.is_empty(), "no runnable block in the docs");
    let dir = tempfile::Builder::new()
        .prefix("doc-blocks-tools-")
        .tempdir()
        .unwrap();
    let tools = tools(dir.path(), &root);

    // Sessions in order of first appearance; those with servers first (they take longest).
    let mut sessions: Vec<(String, Vec<&Block>)> = Vec::new();
    for b in &blocks {
        let key = format!("{} session `{}`", b.file, b.session);
        match sessions.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(b),
            None => sessions.push((key, vec![b])),
        }
    }
    sessions.sort_by_key(|(_, v)| !v.iter().any(|b| b.kind == Kind::Background));

    let queue = Mutex::new(sessions.into_iter());
    let failures = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..PARALLEL_SESSIONS {
            s.spawn(|| {
                loop {
                    let Some((key, blocks)) = queue.lock().unwrap().next() else {
                        return;
                    };
                    let t = Instant::now();
                    let mut session = Session::new(&tools, &root);
                    let result = session.run_blocks(&blocks);
                    drop(session);
                    eprintln!(
                        "{key}: {} blocks, {:.1}s{}",
                        blocks.len(),
                        t.elapsed().as_secs_f64(),
                        if result.is_ok() { "" } else { ", FAILED" }
                    );
                    if let Err(e) = result {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    eprintln!(
        "{} marked blocks in {:.1}s",
        blocks.len(),
        started.elapsed().as_secs_f64()
    );
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---------------------------------------------------------------------------------------
// The extractor and the rewrites
// ---------------------------------------------------------------------------------------

#[test]
fn extractor_finds_marked_blocks_and_ignores_unmarked() {
    let md = r#"# Title

```sh
echo unmarked
```

<!-- runnable -->
```sh
echo one
```

<!-- a comment that is not a marker -->
```sh
echo unmarked too
```

1. A list item:

   <!-- runnable: session=s file=/tmp/x.yaml -->
   ```yaml
   key: value
     nested: kept
   ```

   <!-- runnable: session=s background ready=ready timeout=5 -->
   ```sh
   server --serve
   ```

   <!-- runnable: session=s -->
   ```
   $ client --ask \
       --twice
   answer
   $ client --quiet
   ```

<!-- runnable: exit=2 -->
```bash
exit 2
```

<!-- runnable: output -->
```text
shown <!-- runnable --> inside a block is text
```
"#;
    let blocks = extract("x.md", md).expect("valid");
    let summary: Vec<(usize, &Kind, &str)> = blocks
        .iter()
        .map(|b| (b.line, &b.kind, b.session.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (8, &Kind::Script, ""),
            (20, &Kind::File("/tmp/x.yaml".into()), "s"),
            (26, &Kind::Background, "s"),
            (31, &Kind::Console, "s"),
            (39, &Kind::Script, ""),
            (44, &Kind::Output, ""),
        ]
    );
    assert_eq!(blocks[0].body, "echo one\n");
    assert_eq!(blocks[1].body, "key: value\n  nested: kept\n");
    assert_eq!(blocks[2].ready.as_deref(), Some("ready"));
    assert_eq!(blocks[2].timeout, Duration::from_secs(5));
    assert_eq!(blocks[4].exit, 2);
    assert_eq!(
        console_commands(&blocks[3].body),
        vec![
            (
                "client --ask \\\n    --twice".to_owned(),
                "answer\n".to_owned()
            ),
            ("client --quiet".to_owned(), String::new()),
        ]
    );
}

#[test]
fn a_marker_without_a_fence_or_with_a_typo_fails() {
    let cases = [
        (
            "<!-- runnable -->\n\n```sh\necho x\n```\n",
            "x.md:1: runnable marker not followed by a code fence",
        ),
        (
            "<!-- runnable -->\nSome text.\n",
            "x.md:1: runnable marker not followed by a code fence",
        ),
        (
            "<!-- runable -->\n```sh\necho x\n```\n",
            "x.md:1: `<!-- runable -->` looks like a runnable marker but is not one",
        ),
        (
            "<!--runnable: sesion=a -->\n```sh\necho x\n```\n",
            "x.md:1: unknown key `sesion`",
        ),
        (
            "<!-- runnable: session -->\n```sh\necho x\n```\n",
            "x.md:1: `session` needs a value",
        ),
        (
            "<!-- runnable: output -->\n```text\nx\n```\n",
            "x.md:2: an `output` block must follow a script or background block",
        ),
        (
            "<!-- runnable: file=a.yaml -->\n```yaml\nx: 1\n```\n",
            "x.md:2: file a.yaml is used by no command block after it",
        ),
        (
            "<!-- runnable: background -->\n```sh\nserve\n```\n<!-- runnable -->\n```sh\nx\n```\n",
            "x.md:2: a background block needs `ready=TEXT` or an `output` block after it",
        ),
        (
            "<!-- runnable: ready=x -->\n```sh\nx\n```\n",
            "x.md:1: `ready` belongs to a `background` block",
        ),
        (
            "<!-- runnable -->\n```sh\necho x\n",
            "x.md:2: code fence never closed",
        ),
    ];
    for (md, want) in cases {
        let errors = extract("x.md", md).expect_err(md);
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{md:?}: expected an error starting with {want:?}, got {errors:?}"
        );
    }
}

#[test]
fn rewrites_and_expected_output() {
    let scratch = Path::new("/scratch/work");
    let r = Rewriter::new(scratch);
    assert_eq!(
        r.apply("cargo run -p argocd-agent-devtools -- demo"),
        "argocd-agent-dev demo"
    );
    assert_eq!(
        r.apply("cargo run -p argocd-agent-cli --bin argocd-agentctl -- version"),
        "argocd-agentctl version"
    );
    assert_eq!(
        r.apply("--dir /tmp/spiffe --socket unix:///tmp/spiffe/a.sock a/tmp/b /tmpfoo"),
        "--dir /scratch/work/tmp/spiffe --socket unix:///scratch/work/tmp/spiffe/a.sock a/tmp/b /tmpfoo"
    );
    let once = r.apply("--listen 127.0.0.1:6443 https://localhost:6443/x 127.0.0.1:0");
    let port = once
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap()
        .to_owned();
    assert_ne!(port, "6443");
    assert_eq!(
        once,
        format!("--listen 127.0.0.1:{port} https://localhost:{port}/x 127.0.0.1:0")
    );
    assert_eq!(r.apply("127.0.0.1:6443"), format!("127.0.0.1:{port}"));

    let actual = "a\nNAME   AGE\nhello  3s\nb  \nc\n";
    assert_eq!(missing_line("a\n\nb\nc\n", actual), None);
    assert_eq!(missing_line("a\n...\nhello  ...\nc", actual), None);
    assert_eq!(missing_line("c\na", actual), Some("a".into()));
    assert_eq!(
        missing_line("hello  4...", actual),
        Some("hello  4...".into())
    );
}
