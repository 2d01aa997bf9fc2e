//! Pod subresource `exec` over WebSocket (`v5.channel.k8s.io`/`v4.channel.k8s.io`): a
//! registered handler or a built-in simulation of a small container (no process is
//! spawned). `cat` and `sh` with stdin are interactive: they answer each stdin frame or line
//! as it arrives, with a pty's echo and line endings when `tty=true`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::Shared;
use super::status::ApiError;

/// What an exec handler returns: stdout, stderr and the exit code.
pub type ExecOutput = (Vec<u8>, Vec<u8>, i32);

/// A test-registered exec handler: gets the command (argv) and all of stdin.
pub type ExecHandler = Arc<dyn Fn(&[String], &[u8]) -> ExecOutput + Send + Sync>;

/// Exec handlers by (namespace, pod).
#[derive(Default)]
pub struct ExecHandlers(Mutex<BTreeMap<(String, String), ExecHandler>>);

impl ExecHandlers {
    /// Registers (replaces) the handler of one pod.
    pub fn set(&self, ns: &str, pod: &str, handler: ExecHandler) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ns.into(), pod.into()), handler);
    }

    fn get(&self, ns: &str, pod: &str) -> Option<ExecHandler> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.into(), pod.into()))
            .cloned()
    }
}

/// One `pods/<name>/exec` session, as [`crate::KubeTestServer::exec_sessions`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSession {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container it runs in (`container=`, or the pod's only one).
    pub container: String,
    /// The command (argv) as the client sent it.
    pub command: Vec<String>,
    /// Whether the client asked for a terminal (`tty=true`).
    pub tty: bool,
    /// Whether the client sends stdin (`stdin=true`).
    pub stdin: bool,
    /// Terminal sizes the client sent on the resize channel (4), as (width, height).
    pub resizes: Vec<(u16, u16)>,
    /// The exit code sent on the error channel; `None` while running, or when the client
    /// went away first.
    pub exit_code: Option<i32>,
}

/// Sessions kept by [`ExecSessions`] (the oldest are forgotten beyond it).
const EXEC_SESSION_LIMIT: usize = 10_000;

/// Every exec session, oldest first, each updated while it runs.
#[derive(Default)]
pub struct ExecSessions(Mutex<Vec<Arc<Mutex<ExecSession>>>>);

impl ExecSessions {
    fn start(&self, s: ExecSession) -> Arc<Mutex<ExecSession>> {
        let s = Arc::new(Mutex::new(s));
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= EXEC_SESSION_LIMIT {
            all.remove(0);
        }
        all.push(s.clone());
        s
    }

    pub fn snapshot(&self) -> Vec<ExecSession> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }
}

fn update(s: &Mutex<ExecSession>, f: impl FnOnce(&mut ExecSession)) {
    f(&mut s.lock().unwrap_or_else(|e| e.into_inner()));
}

/// The container a command runs in, as the simulation sees it.
#[derive(Clone)]
pub struct Container {
    pub pod: String,
    pub name: String,
    /// `workingDir` of the container, else `/`.
    pub working_dir: String,
    pub tty: bool,
}

/// `/etc/motd` of every simulated container.
pub const MOTD: &str =
    "Welcome to kube-test-server: a simulated container, no process runs here.\n";

/// The built-in commands, also what `ls /bin` shows.
const BUILT_INS: [&str; 11] = [
    "cat", "echo", "env", "false", "hostname", "ls", "pwd", "sh", "true", "whoami", "bash",
];

enum Entry {
    Dir(Vec<String>),
    File(String),
}

impl Container {
    /// `path` made absolute (relative to the working directory) and normalized.
    fn absolute(&self, path: &str) -> String {
        let joined = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.working_dir)
        };
        let mut parts: Vec<&str> = Vec::new();
        for p in joined.split('/') {
            match p {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                p => parts.push(p),
            }
        }
        format!("/{}", parts.join("/"))
    }

    /// The fixed read-only filesystem: `/bin` (the built-ins), `/etc/hostname`,
    /// `/etc/motd`, an empty `/tmp`, and the working directory (empty).
    fn entry(&self, path: &str) -> Option<Entry> {
        let dir = |names: &[&str]| Some(Entry::Dir(names.iter().map(|s| s.to_string()).collect()));
        match path {
            "/" => dir(&["bin", "etc", "tmp"]),
            "/bin" => {
                let mut names = BUILT_INS.to_vec();
                names.sort_unstable();
                dir(&names)
            }
            "/etc" => dir(&["hostname", "motd"]),
            "/tmp" => dir(&[]),
            "/etc/hostname" => Some(Entry::File(format!("{}\n", self.pod))),
            "/etc/motd" => Some(Entry::File(MOTD.to_string())),
            p if p
                .strip_prefix("/bin/")
                .is_some_and(|b| BUILT_INS.contains(&b)) =>
            {
                Some(Entry::File(String::new()))
            }
            p if p == self.working_dir => dir(&[]),
            _ => None,
        }
    }

    fn ls(&self, args: &[String]) -> ExecOutput {
        let paths: Vec<&str> = if args.is_empty() {
            vec!["."]
        } else {
            args.iter().map(String::as_str).collect()
        };
        let (mut out, mut err, mut code) = (String::new(), String::new(), 0);
        for p in &paths {
            match self.entry(&self.absolute(p)) {
                Some(Entry::Dir(names)) => {
                    if paths.len() > 1 {
                        out.push_str(&format!("{p}:\n"));
                    }
                    let sep = if self.tty { "  " } else { "\n" };
                    if !names.is_empty() {
                        out.push_str(&names.join(sep));
                        out.push('\n');
                    }
                }
                Some(Entry::File(_)) => out.push_str(&format!("{p}\n")),
                None => {
                    err.push_str(&format!(
                        "ls: cannot access '{p}': No such file or directory\n"
                    ));
                    code = 2;
                }
            }
        }
        (out.into_bytes(), err.into_bytes(), code)
    }

    fn cat(&self, args: &[String], stdin: &[u8]) -> ExecOutput {
        if args.is_empty() {
            return (stdin.to_vec(), Vec::new(), 0);
        }
        let (mut out, mut err, mut code) = (Vec::new(), String::new(), 0);
        for p in args {
            match self.entry(&self.absolute(p)) {
                Some(Entry::File(text)) => out.extend_from_slice(text.as_bytes()),
                Some(Entry::Dir(_)) => {
                    err.push_str(&format!("cat: {p}: Is a directory\n"));
                    code = 1;
                }
                None => {
                    err.push_str(&format!("cat: {p}: No such file or directory\n"));
                    code = 1;
                }
            }
        }
        (out, err.into_bytes(), code)
    }

    /// Runs one shell line (words split on whitespace): `Err(code)` for `exit [n]`.
    fn shell_line(&self, shell: &str, line: &str) -> Result<ExecOutput, i32> {
        let line = line.trim();
        if line == "exit" || line.starts_with("exit ") {
            let n = line["exit".len()..].trim();
            return match n.parse::<i32>() {
                _ if n.is_empty() => Err(0),
                Ok(c) => Err(c & 0xff),
                Err(_) => Ok((
                    Vec::new(),
                    format!("{shell}: exit: {n}: numeric argument required\n").into_bytes(),
                    2,
                )),
            };
        }
        if line.is_empty() {
            return Ok((Vec::new(), Vec::new(), 0));
        }
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        Ok(self.simulate(&words, b""))
    }

    /// The built-in commands (when the pod has no registered handler): `echo`, `cat [file]`,
    /// `true`, `false`, `env`, `pwd`, `whoami`, `hostname`, `ls [path]`, `sh -c '<cmd>'`,
    /// `sh` reading commands from stdin; anything else exits 127 with
    /// `<cmd>: command not found` on stderr.
    pub fn simulate(&self, command: &[String], stdin: &[u8]) -> ExecOutput {
        let ok = |out: String| (out.into_bytes(), Vec::new(), 0);
        let Some((cmd, args)) = command.split_first() else {
            return (Vec::new(), Vec::new(), 0);
        };
        let base = cmd.rsplit('/').next().unwrap_or(cmd);
        match base {
            "echo" => ok(format!("{}\n", args.join(" "))),
            "cat" => self.cat(args, stdin),
            "true" => ok(String::new()),
            "false" => (Vec::new(), Vec::new(), 1),
            "pwd" => ok(format!("{}\n", self.working_dir)),
            "whoami" => ok("root\n".into()),
            "hostname" => ok(format!("{}\n", self.pod)),
            "ls" => self.ls(args),
            "env" if args.is_empty() => ok(format!(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHOSTNAME={}\nHOME=/root\nCONTAINER={}\n",
                self.pod, self.name
            )),
            "sh" | "bash" if args.len() >= 2 && args[0] == "-c" => {
                match self.shell_line(base, &args[1]) {
                    Ok(out) => out,
                    Err(code) => (Vec::new(), Vec::new(), code),
                }
            }
            "sh" | "bash" if args.is_empty() || args == ["-i"] || args == ["-s"] => {
                // A script on stdin, line by line.
                let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), 0);
                for line in String::from_utf8_lossy(stdin).lines() {
                    match self.shell_line(base, line) {
                        Ok((o, e, c)) => {
                            out.extend(o);
                            err.extend(e);
                            code = c;
                        }
                        Err(c) => return (out, err, c),
                    }
                }
                (out, err, code)
            }
            _ => (
                Vec::new(),
                format!("{cmd}: command not found\n").into_bytes(),
                127,
            ),
        }
    }
}

/// Protocols served on `pods/<name>/exec`, best first (`channel.k8s.io` remotecommand).
pub const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// A validated exec request, ready to run once the connection is upgraded.
pub struct ExecRequest {
    namespace: String,
    /// The registered handler; `None` runs the built-in simulation.
    handler: Option<ExecHandler>,
    container: Container,
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
}

/// Checks `pods/<name>/exec` options the way the apiserver does before upgrading.
pub fn exec_request(
    shared: &Arc<Shared>,
    pod: &Value,
    q: &super::http::QueryView,
    command: Vec<String>,
) -> Result<ExecRequest, ApiError> {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (s("/metadata/namespace"), s("/metadata/name"));
    let container = super::pods::resolve_container(pod, q)?.to_string();
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let flag = |k: &str, default: bool| match q.get(k) {
        None => default,
        Some(v) => matches!(v, "true" | "1"),
    };
    let (stdin, stdout, stderr, tty) = (
        flag("stdin", false),
        flag("stdout", true),
        flag("stderr", true),
        flag("tty", false),
    );
    if !(stdin || stdout || stderr) {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    let working_dir = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(container.as_str()))
        })
        .and_then(|c| c.get("workingDir"))
        .and_then(Value::as_str)
        .filter(|d| d.starts_with('/'))
        .unwrap_or("/");
    Ok(ExecRequest {
        namespace: ns.to_string(),
        handler: shared.exec_handlers.get(ns, name),
        container: Container {
            pod: name.to_string(),
            name: container,
            working_dir: working_dir.to_string(),
            tty,
        },
        command,
        stdin,
        stdout,
        stderr,
        tty,
        shared: shared.clone(),
        shutdown: shared.shutdown.subscribe(),
    })
}

/// The error-channel `metav1.Status` for an exit code, as the kubelet writes it (v4+).
pub fn exit_status(code: i32) -> Value {
    if code == 0 {
        return serde_json::json!({"metadata": {}, "status": "Success"});
    }
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// What the client sent, read frame by frame.
enum Input {
    Stdin(Vec<u8>),
    /// End of stdin: the v5 close signal `[255, 0]`, a Close frame or the end of the
    /// connection.
    Eof,
}

/// One exec stream.
struct Session<S> {
    ws: WebSocketStream<S>,
    record: Arc<Mutex<ExecSession>>,
    stdout: bool,
    stderr: bool,
    tty: bool,
    /// The client went away: nothing more can be sent.
    gone: bool,
    stdin_closed: bool,
    shutdown: watch::Receiver<bool>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session<S> {
    /// The next stdin data (resizes are recorded on the way).
    async fn input(&mut self) -> Input {
        if self.stdin_closed {
            return Input::Eof;
        }
        loop {
            let msg = tokio::select! {
                m = self.ws.next() => m,
                _ = self.shutdown.wait_for(|s| *s) => None,
            };
            match msg {
                Some(Ok(Message::Binary(b))) => match b.first() {
                    Some(0) => return Input::Stdin(b[1..].to_vec()),
                    Some(4) => self.resize(&b[1..]),
                    Some(255) if b.get(1) == Some(&0) => break,
                    _ => {}
                },
                // base64 protocols are not offered; text frames are ignored.
                Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    self.gone = true;
                    break;
                }
            }
        }
        self.stdin_closed = true;
        Input::Eof
    }

    fn resize(&self, json: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(json) else {
            return;
        };
        let dim = |k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .and_then(|n| u16::try_from(n).ok())
        };
        if let (Some(w), Some(h)) = (dim("Width"), dim("Height")) {
            update(&self.record, |s| s.resizes.push((w, h)));
        }
    }

    async fn send(&mut self, channel: u8, data: &[u8]) {
        if self.gone || data.is_empty() {
            return;
        }
        let mut f = Vec::with_capacity(data.len() + 1);
        f.push(channel);
        f.extend_from_slice(data);
        if self.ws.send(Message::binary(f)).await.is_err() {
            self.gone = true;
        }
    }

    /// Program output: stdout on channel 1; with a tty `\n` becomes `\r\n` (a pty's ONLCR).
    async fn out(&mut self, data: &[u8]) {
        if !self.stdout {
            return;
        }
        let data = if self.tty { onlcr(data) } else { data.to_vec() };
        self.send(1, &data).await;
    }

    /// Program errors: channel 2, or mixed into channel 1 with a tty.
    async fn err(&mut self, data: &[u8]) {
        if self.tty {
            self.out(data).await;
        } else if self.stderr {
            self.send(2, data).await;
        }
    }

    /// Sends the exit status, closes normally (1000) and waits for the client's close.
    async fn finish(mut self, code: i32) {
        update(&self.record, |s| s.exit_code = Some(code));
        self.send(3, exit_status(code).to_string().as_bytes()).await;
        if self.gone {
            return;
        }
        let close = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = self.ws.send(Message::Close(Some(close))).await;
        // Drain until the client answers the close (or goes away); late resizes count.
        let wait = async {
            while let Some(Ok(m)) = self.ws.next().await {
                if let Message::Binary(b) = m
                    && b.first() == Some(&4)
                {
                    self.resize(&b[1..]);
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
    }
}

/// `\n` to `\r\n`.
fn onlcr(data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 8);
    for &b in data {
        if b == b'\n' {
            v.push(b'\r');
        }
        v.push(b);
    }
    v
}

/// The line discipline of a pty in canonical mode with echo, as far as the interactive
/// built-ins need it: input is echoed (`\r`/`\n` as `\r\n`), `\r` ends a line (ICRNL),
/// backspace erases, Ctrl-C interrupts, Ctrl-D on an empty line is end of input.
#[derive(Default)]
struct LineDiscipline {
    line: Vec<u8>,
    last_cr: bool,
}

enum TtyEvent {
    Line(String),
    Interrupt,
    Eof,
}

impl LineDiscipline {
    /// Feeds input; returns the echo to write and the events it made.
    fn feed(&mut self, input: &[u8]) -> (Vec<u8>, Vec<TtyEvent>) {
        let (mut echo, mut events) = (Vec::new(), Vec::new());
        for &b in input {
            let after_cr = std::mem::take(&mut self.last_cr);
            match b {
                b'\n' if after_cr => {}
                b'\r' | b'\n' => {
                    self.last_cr = b == b'\r';
                    echo.extend_from_slice(b"\r\n");
                    let line = std::mem::take(&mut self.line);
                    events.push(TtyEvent::Line(String::from_utf8_lossy(&line).into_owned()));
                }
                0x7f | 0x08 => {
                    if self.line.pop().is_some() {
                        echo.extend_from_slice(b"\x08 \x08");
                    }
                }
                0x03 => {
                    echo.extend_from_slice(b"^C\r\n");
                    self.line.clear();
                    events.push(TtyEvent::Interrupt);
                }
                0x04 if self.line.is_empty() => events.push(TtyEvent::Eof),
                0x04 => {}
                b => {
                    self.line.push(b);
                    echo.push(b);
                }
            }
        }
        (echo, events)
    }
}

/// Runs an upgraded exec stream and records it in the server's exec sessions.
///
/// Registered handlers and non-interactive built-ins read all of stdin (when `stdin=true`)
/// until its end, run once and send stdout (channel 1), stderr (channel 2, or 1 with a tty),
/// then the exit status (channel 3) and close. With `stdin=true`, `cat` (no arguments) and
/// `sh`/`bash` (no arguments) are interactive: see [`interactive_cat`] and
/// [`interactive_shell`].
pub async fn run_exec<S: AsyncRead + AsyncWrite + Unpin>(ws: WebSocketStream<S>, req: ExecRequest) {
    let record = req.shared.exec_sessions.start(ExecSession {
        namespace: req.namespace.clone(),
        pod: req.container.pod.clone(),
        container: req.container.name.clone(),
        command: req.command.clone(),
        tty: req.tty,
        stdin: req.stdin,
        resizes: Vec::new(),
        exit_code: None,
    });
    let mut session = Session {
        ws,
        record,
        stdout: req.stdout,
        stderr: req.stderr,
        tty: req.tty,
        gone: false,
        stdin_closed: !req.stdin,
        shutdown: req.shutdown.clone(),
    };
    let base = req
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
        .unwrap_or_default();
    let args = &req.command[1..];
    let interactive = req.stdin && req.handler.is_none();
    let code = match base.as_str() {
        "cat" if interactive && args.is_empty() => interactive_cat(&mut session).await,
        "sh" | "bash" if interactive && (args.is_empty() || args == ["-i"]) => {
            interactive_shell(&mut session, &req.container, &base).await
        }
        _ => {
            let mut input = Vec::new();
            while let Input::Stdin(data) = session.input().await {
                input.extend(data);
            }
            let (out, err, code) = match &req.handler {
                Some(h) => h(&req.command, &input),
                None => req.container.simulate(&req.command, &input),
            };
            session.out(&out).await;
            session.err(&err).await;
            code
        }
    };
    if session.gone {
        return;
    }
    session.finish(code).await;
}

/// `cat` reading stdin: each stdin frame is written back at once; with a tty, input is
/// echoed and each complete line written back (`\r\n`), Ctrl-D on an empty line ends
/// (status 0) and Ctrl-C interrupts (status 130). End of stdin: status 0.
async fn interactive_cat<S: AsyncRead + AsyncWrite + Unpin>(s: &mut Session<S>) -> i32 {
    let mut tty = LineDiscipline::default();
    loop {
        let Input::Stdin(data) = s.input().await else {
            return 0;
        };
        if !s.tty {
            s.out(&data).await;
            continue;
        }
        let (echo, events) = tty.feed(&data);
        s.send(1, &echo).await;
        for e in events {
            match e {
                TtyEvent::Line(l) => s.out(format!("{l}\n").as_bytes()).await,
                TtyEvent::Interrupt => return 130,
                TtyEvent::Eof => return 0,
            }
        }
    }
}

/// `sh` reading stdin: runs each complete line as a built-in and writes its output at once;
/// `exit [n]` ends with status `n`, end of stdin with 0. With a tty: prompt `# `, input
/// echoed, output lines end in `\r\n`, Ctrl-C drops the line, Ctrl-D on an empty line ends.
async fn interactive_shell<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut Session<S>,
    container: &Container,
    shell: &str,
) -> i32 {
    const PROMPT: &[u8] = b"# ";
    let mut tty = LineDiscipline::default();
    let mut pending = Vec::new();
    if s.tty {
        s.send(1, PROMPT).await;
    }
    loop {
        let Input::Stdin(data) = s.input().await else {
            return 0;
        };
        let events = if s.tty {
            let (echo, events) = tty.feed(&data);
            s.send(1, &echo).await;
            events
        } else {
            pending.extend_from_slice(&data);
            let mut lines = Vec::new();
            while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                lines.push(TtyEvent::Line(
                    String::from_utf8_lossy(&line[..pos]).into_owned(),
                ));
            }
            lines
        };
        for e in events {
            match e {
                TtyEvent::Line(line) => match container.shell_line(shell, &line) {
                    Ok((out, err, _)) => {
                        s.out(&out).await;
                        s.err(&err).await;
                    }
                    Err(code) => return code,
                },
                TtyEvent::Interrupt => {}
                TtyEvent::Eof => return 0,
            }
            if s.tty {
                s.send(1, PROMPT).await;
            }
        }
        if s.gone {
            return 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(tty: bool) -> Container {
        Container {
            pod: "web".into(),
            name: "app".into(),
            working_dir: "/srv".into(),
            tty,
        }
    }

    fn run(cmd: &[&str], stdin: &[u8]) -> (String, String, i32) {
        let argv: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let (out, err, code) = container(false).simulate(&argv, stdin);
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
            code,
        )
    }

    #[test]
    fn built_in_commands_are_simulated() {
        assert_eq!(
            run(&["echo", "a", "b"], b""),
            ("a b\n".into(), "".into(), 0)
        );
        assert_eq!(run(&["/bin/cat"], b"in"), ("in".into(), "".into(), 0));
        assert_eq!(run(&["false"], b"").2, 1);
        assert_eq!(run(&["true"], b"").2, 0);
        assert_eq!(run(&["sh", "-c", "exit 3"], b"").2, 3);
        assert_eq!(run(&["sh", "-c", "exit"], b"").2, 0);
        assert_eq!(run(&["sh", "-c", "exit x"], b"").2, 2);
        assert_eq!(run(&["sh", "-c", "echo hi"], b"").0, "hi\n");
        assert!(run(&["env"], b"").0.contains("HOSTNAME=web\n"));
        assert_eq!(run(&["pwd"], b"").0, "/srv\n");
        assert_eq!(run(&["whoami"], b"").0, "root\n");
        assert_eq!(run(&["hostname"], b"").0, "web\n");
        assert_eq!(run(&["sh", "-c", "hostname"], b"").0, "web\n");
        assert_eq!(
            run(&["nosuch", "x"], b""),
            ("".into(), "nosuch: command not found\n".into(), 127)
        );
    }

    #[test]
    fn the_filesystem_is_small_and_fixed() {
        assert_eq!(run(&["ls", "/"], b"").0, "bin\netc\ntmp\n");
        assert_eq!(run(&["ls", "/etc"], b"").0, "hostname\nmotd\n");
        assert_eq!(run(&["ls", "../etc/"], b"").0, "hostname\nmotd\n");
        assert_eq!(run(&["ls"], b"").0, "");
        assert_eq!(run(&["ls", "/etc/motd"], b"").0, "/etc/motd\n");
        let (_, err, code) = run(&["ls", "/nope"], b"");
        assert_eq!(
            (err.as_str(), code),
            ("ls: cannot access '/nope': No such file or directory\n", 2)
        );
        assert_eq!(run(&["cat", "/etc/hostname"], b"").0, "web\n");
        assert_eq!(run(&["sh", "-c", "cat /etc/motd"], b"").0, MOTD);
        assert_eq!(run(&["cat", "/etc"], b"").2, 1);
        assert_eq!(
            run(&["cat", "/etc/x"], b"").1,
            "cat: /etc/x: No such file or directory\n"
        );
        let argv: Vec<String> = ["ls", "/"].iter().map(|s| s.to_string()).collect();
        assert_eq!(container(true).simulate(&argv, b"").0, b"bin  etc  tmp\n");
    }

    #[test]
    fn sh_runs_a_script_from_stdin() {
        assert_eq!(
            run(&["sh"], b"pwd\nwhoami\nexit 3\necho never\n"),
            ("/srv\nroot\n".into(), "".into(), 3)
        );
        assert_eq!(run(&["sh"], b"false\n").2, 1);
    }

    #[test]
    fn line_discipline_echoes_and_splits_lines() {
        let mut ld = LineDiscipline::default();
        let (echo, ev) = ld.feed(b"pw");
        assert_eq!(echo, b"pw");
        assert!(ev.is_empty());
        let (echo, ev) = ld.feed(b"x\x7fd\r\n");
        assert_eq!(echo, b"x\x08 \x08d\r\n");
        assert!(matches!(&ev[..], [TtyEvent::Line(l)] if l == "pwd"));
        let (_, ev) = ld.feed(b"\x04");
        assert!(matches!(&ev[..], [TtyEvent::Eof]));
        assert_eq!(onlcr(b"a\nb\n"), b"a\r\nb\r\n");
    }

    #[test]
    fn exit_status_matches_the_kubelet_error_channel() {
        assert_eq!(
            exit_status(0),
            serde_json::json!({"metadata": {}, "status": "Success"})
        );
        let s = exit_status(3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"],
            serde_json::json!([{"reason": "ExitCode", "message": "3"}])
        );
    }
}
