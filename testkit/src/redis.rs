//! Real Redis servers for the Redis proxy tests: one process per server, on a free loopback
//! port, without persistence, stopped with the test.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::envoy::{free_loopback_port, wait_listening};
use crate::harness::{HarnessError, Proc};

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The `redis-server` binary (`$REDIS_SERVER_BIN` or `PATH`), or an error telling how to
/// install it. Tests that need Redis fail with this error rather than pass.
pub fn redis_server_bin() -> Result<PathBuf, HarnessError> {
    std::env::var_os("REDIS_SERVER_BIN")
        .map(PathBuf::from)
        .or_else(|| on_path("redis-server"))
        .ok_or_else(|| {
            "redis-server not found: set REDIS_SERVER_BIN or run .ci/run (it installs the Debian package redis-server)".into()
        })
}

/// The `redis-cli` binary (`$REDIS_CLI_BIN` or `PATH`).
pub fn redis_cli_bin() -> Result<PathBuf, HarnessError> {
    std::env::var_os("REDIS_CLI_BIN")
        .map(PathBuf::from)
        .or_else(|| on_path("redis-cli"))
        .ok_or_else(|| {
            "redis-cli not found: set REDIS_CLI_BIN or run .ci/run (the redis-server package brings it)".into()
        })
}

/// A running `redis-server`.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The `redis-server` process.
    pub proc: Proc,
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port; its log goes to `<dir>/<name>.log`.
    pub async fn start(dir: &Path, name: &str) -> Result<RedisServer, HarnessError> {
        let port = free_loopback_port()?;
        let rdb = format!("{name}.rdb");
        Self::spawn(
            dir,
            name,
            port,
            &["--port", &port.to_string(), "--dbfilename", &rdb],
        )
        .await
    }

    /// Starts `redis-server` that wants `password` from every client (`requirepass`, as
    /// Argo CD's own Redis runs with the `auth` key of its `argocd-redis` Secret).
    pub async fn start_with_password(
        dir: &Path,
        name: &str,
        password: &str,
    ) -> Result<RedisServer, HarnessError> {
        let port = free_loopback_port()?;
        let rdb = format!("{name}.rdb");
        Self::spawn(
            dir,
            name,
            port,
            &[
                "--port",
                &port.to_string(),
                "--dbfilename",
                &rdb,
                "--requirepass",
                password,
            ],
        )
        .await
    }

    /// Starts `redis-server` serving TLS only (certificate and key PEM files, no client
    /// certificates required).
    pub async fn start_tls(
        dir: &Path,
        name: &str,
        cert: &Path,
        key: &Path,
        ca: &Path,
    ) -> Result<RedisServer, HarnessError> {
        let port = free_loopback_port()?;
        Self::spawn(
            dir,
            name,
            port,
            &[
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert.display().to_string(),
                "--tls-key-file",
                &key.display().to_string(),
                "--tls-ca-cert-file",
                &ca.display().to_string(),
                "--tls-auth-clients",
                "no",
            ],
        )
        .await
    }

    /// Runs `redis-server` with `listen` (its port options) on loopback, without
    /// persistence, and waits until `port` accepts connections.
    async fn spawn(
        dir: &Path,
        name: &str,
        port: u16,
        listen: &[&str],
    ) -> Result<RedisServer, HarnessError> {
        let bin = redis_server_bin()?;
        let dir_arg = dir.display().to_string();
        let common = [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir_arg,
        ];
        let args = listen
            .iter()
            .chain(common.iter())
            .map(|a| (*a).to_owned())
            .collect();
        let mut proc = Proc::new(name, bin, args, dir.join(format!("{name}.log")));
        proc.start()?;
        wait_listening(
            format!("127.0.0.1:{port}").parse()?,
            Duration::from_secs(10),
        )
        .await?;
        Ok(RedisServer { port, proc })
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Runs `redis-cli -p <port> <args>` and returns its output.
pub async fn redis_cli(port: u16, args: &[&[u8]]) -> Result<Output, HarnessError> {
    let mut cmd = tokio::process::Command::new(redis_cli_bin()?);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    for a in args {
        cmd.arg(std::ffi::OsStr::new(&*String::from_utf8_lossy(a)));
    }
    Ok(cmd.output().await?)
}

/// A raw RESP client of a Redis server or the principal's Redis proxy: sends bytes as
/// given (pipelines, malformed frames), reads replies frame by frame.
pub struct RespClient {
    w: tokio::net::tcp::OwnedWriteHalf,
    r: argocd_agent_redis::FrameReader<tokio::net::tcp::OwnedReadHalf>,
}

impl RespClient {
    /// Over an open connection.
    pub fn from(s: tokio::net::TcpStream) -> RespClient {
        let (r, w) = s.into_split();
        RespClient {
            w,
            r: argocd_agent_redis::FrameReader::new(r, 1 << 20),
        }
    }

    /// To `127.0.0.1:<port>`.
    pub async fn connect(port: u16) -> RespClient {
        RespClient::from(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
        )
    }

    /// Writes bytes; an error is returned, not a panic (the server may have closed).
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.w.write_all(bytes).await
    }

    /// The next frame, read as `protocol`, within 10 s.
    pub async fn frame(
        &mut self,
        protocol: argocd_agent_redis::Protocol,
    ) -> argocd_agent_redis::Frame {
        tokio::time::timeout(Duration::from_secs(10), self.r.next(protocol))
            .await
            .expect("a reply within 10 s")
            .expect("a readable reply")
            .expect("a frame")
    }

    /// Sends a command and reads its RESP2 reply.
    pub async fn cmd(&mut self, args: &[&[u8]]) -> argocd_agent_redis::Frame {
        self.send(&argocd_agent_redis::resp::command(args))
            .await
            .expect("send");
        self.frame(argocd_agent_redis::Protocol::Resp2).await
    }

    /// Whether the server closed the connection within `within`.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.r.get_mut().read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }
}
