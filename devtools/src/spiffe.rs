//! `argocd-agent-dev spiffe`: the development SPIFFE Workload API server (a SPIRE agent
//! stand-in for tests and local demos).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_testkit::workload_api::{DevWorkloadApi, RegistrationFile};

/// Subcommands of `argocd-agent-dev spiffe`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Serve the development Workload API until Ctrl-C (or SIGTERM).
    ///
    /// Prints a comment line, one `unix://` endpoint per socket, then `ready`.
    Serve(ServeArgs),
}

/// Flags of `argocd-agent-dev spiffe serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Directory holding the dev CAs (`<dir>/<trust-domain>/`); created if missing, reused
    /// if present.
    #[arg(long)]
    pub dir: PathBuf,
    /// Trust domain of the main dev CA (may come from the registration file instead).
    #[arg(long)]
    pub trust_domain: Option<String>,
    /// Registration file (YAML): sockets and/or uids mapped to SPIFFE IDs.
    #[arg(long)]
    pub registrations: Option<PathBuf>,
    /// Serve SPIFFE_ID to every caller of the socket at PATH (repeatable): `PATH=SPIFFE_ID`.
    #[arg(long = "socket", value_name = "PATH=SPIFFE_ID")]
    pub sockets: Vec<String>,
    /// Also serve the bundle of this federated trust domain (repeatable).
    #[arg(long = "federate-with", value_name = "TRUST_DOMAIN")]
    pub federate_with: Vec<String>,
    /// Re-issue all X.509-SVIDs at this interval (e.g. `30s`, `10m`, `1h`; `0` disables).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub rotate_every: Duration,
    /// Lifetime of X.509-SVIDs.
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    pub svid_ttl: Duration,
    /// Lifetime of JWT-SVIDs.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub jwt_ttl: Duration,
}

/// Why a duration flag is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing given.
    #[error("empty duration")]
    Empty,
    /// A unit other than `s`, `m`, `h`, `d`.
    #[error("invalid duration {input:?}: unknown unit {unit:?}")]
    Unit {
        /// The flag's value.
        input: String,
        /// The unit found.
        unit: char,
    },
    /// A unit without a number before it.
    #[error("invalid duration {input:?}: number expected before {unit:?}")]
    NoNumber {
        /// The flag's value.
        input: String,
        /// The unit found.
        unit: char,
    },
    /// A number without a unit after it.
    #[error("invalid duration {input:?}: missing unit after {digits}")]
    NoUnit {
        /// The flag's value.
        input: String,
        /// The trailing number.
        digits: String,
    },
}

/// Parses `90s`, `10m`, `2h`, `1d`, `1h30m` or a bare number of seconds.
fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0u64;
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => {
                return Err(DurationError::Unit {
                    input: input.to_owned(),
                    unit: c,
                });
            }
        };
        let n: u64 = digits.parse().map_err(|_| DurationError::NoNumber {
            input: input.to_owned(),
            unit: c,
        })?;
        total = total.saturating_add(n.saturating_mul(unit));
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(DurationError::NoUnit {
            input: input.to_owned(),
            digits,
        });
    }
    Ok(Duration::from_secs(total))
}

/// Why a `--socket` flag is refused.
#[derive(Debug, thiserror::Error)]
pub enum SocketFlagError {
    /// No `=` between the path and the ID.
    #[error("--socket {0:?}: expected PATH=SPIFFE_ID")]
    Shape(String),
    /// The ID is no SPIFFE ID.
    #[error("--socket {arg:?}: {reason}")]
    Id {
        /// The flag's value.
        arg: String,
        /// Why the ID is refused.
        reason: argocd_agent_identity::id::IdError,
    },
}

fn parse_socket(arg: &str) -> Result<(PathBuf, SpiffeId), SocketFlagError> {
    let (path, id) = arg
        .split_once('=')
        .ok_or_else(|| SocketFlagError::Shape(arg.to_owned()))?;
    let id = SpiffeId::parse(id).map_err(|reason| SocketFlagError::Id {
        arg: arg.to_owned(),
        reason,
    })?;
    Ok((PathBuf::from(path), id))
}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> crate::CmdResult {
    let file = match &args.registrations {
        Some(path) => Some(RegistrationFile::load(path)?),
        None => None,
    };
    let trust_domain = match (
        &args.trust_domain,
        file.as_ref().and_then(|f| f.trust_domain.clone()),
    ) {
        (Some(td), _) => TrustDomain::new(td)?,
        (None, Some(td)) => td,
        (None, None) => {
            return Err(
                "--trust-domain is required (or trustDomain in the registration file)".into(),
            );
        }
    };
    let mut builder = DevWorkloadApi::builder(&args.dir, trust_domain.clone())
        .svid_ttl(args.svid_ttl)
        .jwt_ttl(args.jwt_ttl)
        .rotate_every((!args.rotate_every.is_zero()).then_some(args.rotate_every));
    if let Some(file) = file {
        builder = builder.registrations(file);
    }
    for arg in &args.sockets {
        let (path, id) = parse_socket(arg)?;
        builder = builder.socket(path, id);
    }
    for td in &args.federate_with {
        builder = builder.federate_with(TrustDomain::new(td)?);
    }
    let handle = builder.serve().await?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "# development Workload API, trust domain {} (CA in {})",
        trust_domain.as_str(),
        args.dir.join(trust_domain.as_str()).display()
    )?;
    for socket in handle.sockets() {
        writeln!(out, "{}", handle.endpoint(socket))?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    handle.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_units_and_combinations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("10").is_ok());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5m3").is_err());
    }

    #[test]
    fn socket_flag_needs_path_and_valid_id() {
        let (path, id) = parse_socket("/tmp/a.sock=spiffe://example.org/a").unwrap();
        assert_eq!(path, PathBuf::from("/tmp/a.sock"));
        assert_eq!(id.as_str(), "spiffe://example.org/a");
        assert!(parse_socket("/tmp/a.sock").is_err());
        assert!(parse_socket("/tmp/a.sock=http://x").is_err());
    }
}
