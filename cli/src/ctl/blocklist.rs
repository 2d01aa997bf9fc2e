//! `argocd-agentctl blocklist`: edits the hub's `argocd-agent-blocklist` ConfigMap, which
//! the principal watches live (docs/reliability.md, "Revocation by identity").

use argocd_agent_principal::blocklist::{
    CONFIGMAP, FINGERPRINTS, IDS, PREFIXES, entries, normalize_fingerprint,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::ctl::HubArgs;

/// Subcommands of `argocd-agentctl blocklist`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Denies an identity: its open session is closed and it cannot connect again.
    Add(EntryArgs),
    /// Allows an identity again.
    Remove(EntryArgs),
    /// Prints the list.
    List(HubArgs),
}

/// One entry.
#[derive(Debug, clap::Args)]
pub struct EntryArgs {
    /// An exact SPIFFE ID.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// A SPIFFE ID prefix (e.g. `spiffe://example.org/ns/retired/`).
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// The SHA-256 fingerprint of a client certificate (hex, `:` allowed).
    #[arg(long)]
    pub(crate) fingerprint: Option<String>,
    #[command(flatten)]
    pub(crate) hub: HubArgs,
}

impl EntryArgs {
    /// The data key and normalized entry.
    fn entry(&self) -> Result<(&'static str, String), String> {
        let given = [&self.id, &self.prefix, &self.fingerprint]
            .iter()
            .filter(|o| o.is_some())
            .count();
        if given != 1 {
            return Err("exactly one of --id, --prefix, --fingerprint is required".into());
        }
        match (&self.id, &self.prefix, &self.fingerprint) {
            (Some(id), _, _) => {
                argocd_agent_identity::SpiffeId::parse(id)
                    .map_err(|e| format!("--id {id:?}: {e}"))?;
                Ok((IDS, id.clone()))
            }
            (_, Some(p), _) if p.starts_with("spiffe://") => Ok((PREFIXES, p.clone())),
            (_, Some(p), _) => Err(format!("--prefix {p:?}: must start with spiffe://")),
            (_, _, Some(f)) => {
                let f = normalize_fingerprint(f);
                if f.len() != 64 || !f.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err("--fingerprint: expected 32 bytes of hex (SHA-256)".into());
                }
                Ok((FINGERPRINTS, f))
            }
            _ => Err("one of --id, --prefix, --fingerprint is required".into()),
        }
    }
}

async fn api(h: &HubArgs) -> Result<Api<ConfigMap>, String> {
    Ok(Api::namespaced(h.client().await?, &h.namespace))
}

/// Adds (`add`) or removes an entry; returns whether the list changed. Retries on conflict.
async fn edit(api: &Api<ConfigMap>, key: &str, entry: &str, add: bool) -> Result<bool, String> {
    for _ in 0..5 {
        let current = api
            .get_opt(CONFIGMAP)
            .await
            .map_err(|e| format!("reading {CONFIGMAP}: {e}"))?;
        let mut cm = current.clone().unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIGMAP.into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let data = cm.data.get_or_insert_with(Default::default);
        let mut lines: Vec<String> = entries(data.get(key).map_or("", String::as_str))
            .map(str::to_owned)
            .collect();
        let present = lines.iter().any(|l| l == entry);
        match (add, present) {
            (true, true) | (false, false) => return Ok(false),
            (true, false) => lines.push(entry.to_owned()),
            (false, true) => lines.retain(|l| l != entry),
        }
        data.insert(
            key.to_owned(),
            lines.iter().map(|l| format!("{l}\n")).collect(),
        );
        let written = match current {
            None => api.create(&PostParams::default(), &cm).await,
            Some(_) => api.replace(CONFIGMAP, &PostParams::default(), &cm).await,
        };
        match written {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(format!("writing {CONFIGMAP}: {e}")),
        }
    }
    Err(format!("{CONFIGMAP} kept changing; try again"))
}

/// Runs a `blocklist` subcommand.
pub async fn run(command: Command) -> crate::CmdResult {
    match command {
        Command::Add(a) => {
            let (key, entry) = a.entry()?;
            let changed = edit(&api(&a.hub).await?, key, &entry, true).await?;
            println!(
                "{}",
                if changed {
                    format!("added {key}: {entry}")
                } else {
                    format!("already listed ({key}): {entry}")
                }
            );
        }
        Command::Remove(a) => {
            let (key, entry) = a.entry()?;
            let changed = edit(&api(&a.hub).await?, key, &entry, false).await?;
            println!(
                "{}",
                if changed {
                    format!("removed {key}: {entry}")
                } else {
                    format!("not listed ({key}): {entry}")
                }
            );
        }
        Command::List(h) => {
            let cm = api(&h)
                .await?
                .get_opt(CONFIGMAP)
                .await
                .map_err(|e| e.to_string())?;
            let data = cm.and_then(|c| c.data).unwrap_or_default();
            for key in [IDS, PREFIXES, FINGERPRINTS] {
                for e in entries(data.get(key).map_or("", String::as_str)) {
                    println!("{key}\t{e}");
                }
            }
        }
    }
    Ok(())
}
