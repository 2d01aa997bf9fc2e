//! Pod subresources: `log` (text set by tests with `KubeTestServer::set_pod_log`) and
//! `exec` over WebSocket (`v5.channel.k8s.io`/`v4.channel.k8s.io`), running a registered
//! handler or a built-in simulation (no process is spawned).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::Value;

use super::Shared;
use super::status::ApiError;

/// Largest log text kept per container (longer text keeps its tail).
pub const POD_LOG_LIMIT: usize = 1 << 20;

/// Container logs by (namespace, pod, container).
#[derive(Default)]
pub struct PodLogs(Mutex<BTreeMap<(String, String, String), String>>);

impl PodLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String, String), String>> {
        // Values are replaced whole; a poisoned lock still holds consistent text.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the log text of one container.
    pub fn set(&self, ns: &str, pod: &str, container: &str, text: &str) {
        let mut start = text.len().saturating_sub(POD_LOG_LIMIT);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        self.lock().insert(
            (ns.into(), pod.into(), container.into()),
            text[start..].to_string(),
        );
    }

    fn get(&self, ns: &str, pod: &str, container: &str) -> String {
        self.lock()
            .get(&(ns.into(), pod.into(), container.into()))
            .cloned()
            .unwrap_or_default()
    }
}

/// The container a `log`/`exec` request names (`container=`, or the only one).
fn resolve_container<'a>(pod: &'a Value, q: &super::http::QueryView) -> Result<&'a str, ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    match q.get("container") {
        Some(c) if containers.contains(&c) => {
            Ok(containers[containers.iter().position(|x| *x == c).unwrap_or(0)])
        }
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0]),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// `GET pods/<name>/log[?container=c&tailLines=n]`.
pub fn log(shared: &Shared, pod: &Value, q: &super::http::QueryView) -> Result<String, ApiError> {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (s("/metadata/namespace"), s("/metadata/name"));
    let container = resolve_container(pod, q)?;
    let text = shared.pod_logs.get(ns, name, container);
    match q.get("tailLines") {
        None => Ok(text),
        Some(n) => {
            let n: usize = n
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid tailLines {n:?}")))?;
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(n)..];
            Ok(tail.iter().map(|l| format!("{l}\n")).collect())
        }
    }
}

/// What an exec handler returns: stdout, stderr and the exit code.
pub type ExecOutput = (Vec<u8>, Vec<u8>, i32);

/// A test-registered exec handler: gets the command (argv) and all of stdin.
pub type ExecHandler = std::sync::Arc<dyn Fn(&[String], &[u8]) -> ExecOutput + Send + Sync>;

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

/// The built-in simulation used when a pod has no registered handler: no process is
/// spawned. `echo`, `cat`, `true`, `false`, `env`, `sh -c 'exit N'` / `sh -c 'echo ...'`;
/// anything else exits 127 with `<cmd>: command not found` on stderr.
pub fn simulate(pod: &str, container: &str, command: &[String], stdin: &[u8]) -> ExecOutput {
    let ok = |out: Vec<u8>| (out, Vec::new(), 0);
    let Some((cmd, args)) = command.split_first() else {
        return (Vec::new(), Vec::new(), 0);
    };
    let base = cmd.rsplit('/').next().unwrap_or(cmd);
    match base {
        "echo" => ok(format!("{}\n", args.join(" ")).into_bytes()),
        "cat" if args.is_empty() => ok(stdin.to_vec()),
        "true" => ok(Vec::new()),
        "false" => (Vec::new(), Vec::new(), 1),
        "env" if args.is_empty() => ok(format!(
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHOSTNAME={pod}\nHOME=/root\nCONTAINER={container}\n"
        )
        .into_bytes()),
        "sh" | "bash" if args.len() >= 2 && args[0] == "-c" => {
            let script = args[1].trim();
            if let Some(n) = script.strip_prefix("exit") {
                let n = n.trim();
                let code = if n.is_empty() { Ok(0) } else { n.parse::<i32>() };
                return match code {
                    Ok(c) => (Vec::new(), Vec::new(), c & 0xff),
                    Err(_) => (
                        Vec::new(),
                        format!("{base}: exit: {n}: numeric argument required\n").into_bytes(),
                        2,
                    ),
                };
            }
            let words: Vec<String> = script.split_whitespace().map(str::to_string).collect();
            simulate(pod, container, &words, stdin)
        }
        _ => (
            Vec::new(),
            format!("{cmd}: command not found\n").into_bytes(),
            127,
        ),
    }
}

/// Protocols served on `pods/<name>/exec`, best first (`channel.k8s.io` remotecommand).
pub const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// A validated exec request, ready to run once the connection is upgraded.
pub struct ExecRequest {
    pub handler: ExecHandler,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Checks `pods/<name>/exec` options the way the apiserver does before upgrading.
pub fn exec_request(
    shared: &Shared,
    pod: &Value,
    q: &super::http::QueryView,
    command: Vec<String>,
) -> Result<ExecRequest, ApiError> {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (s("/metadata/namespace"), s("/metadata/name"));
    let container = resolve_container(pod, q)?.to_string();
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
    let handler = shared.exec_handlers.get(ns, name).unwrap_or_else(|| {
        let (pod, c) = (name.to_string(), container.clone());
        std::sync::Arc::new(move |cmd: &[String], input: &[u8]| simulate(&pod, &c, cmd, input))
    });
    Ok(ExecRequest {
        handler,
        command,
        stdin,
        stdout,
        stderr,
        tty,
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

/// Runs an upgraded exec stream: collects stdin (until the v5 close signal `[255, 0]`, a
/// Close frame or the end of the connection), runs the handler, sends stdout (channel 1),
/// stderr (channel 2, or channel 1 with a tty), then the exit status on channel 3 and closes.
pub async fn run_exec(mut ws: axum::extract::ws::WebSocket, req: ExecRequest) {
    use axum::extract::ws::Message;
    let mut input = Vec::new();
    if req.stdin {
        while let Some(Ok(msg)) = ws.recv().await {
            match msg {
                Message::Binary(b) => match b.first() {
                    Some(0) => input.extend_from_slice(&b[1..]),
                    Some(255) if b.get(1) == Some(&0) => break,
                    _ => {}
                },
                // base64 protocols are not offered; text frames are ignored.
                Message::Close(_) => break,
                _ => {}
            }
        }
    }
    let (out, err, code) = (req.handler)(&req.command, &input);
    let frame = |ch: u8, data: &[u8]| {
        let mut f = Vec::with_capacity(data.len() + 1);
        f.push(ch);
        f.extend_from_slice(data);
        Message::Binary(f.into())
    };
    let mut frames = Vec::new();
    if req.stdout && !out.is_empty() {
        frames.push(frame(1, &out));
    }
    if !err.is_empty() {
        if req.tty && req.stdout {
            frames.push(frame(1, &err));
        } else if req.stderr {
            frames.push(frame(2, &err));
        }
    }
    frames.push(frame(3, exit_status(code).to_string().as_bytes()));
    for f in frames {
        if ws.send(f).await.is_err() {
            return;
        }
    }
    // A normal closure (1000): clients read it as the end of every stream.
    let close = axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::NORMAL,
        reason: "".into(),
    };
    let _ = ws.send(Message::Close(Some(close))).await;
    // Drain until the client answers the close (or goes away).
    let wait = async { while let Some(Ok(_)) = ws.recv().await {} };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cmd: &[&str], stdin: &[u8]) -> (String, String, i32) {
        let argv: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let (out, err, code) = simulate("web", "app", &argv, stdin);
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
        assert_eq!(
            run(&["ls", "/"], b""),
            ("".into(), "ls: command not found\n".into(), 127)
        );
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
