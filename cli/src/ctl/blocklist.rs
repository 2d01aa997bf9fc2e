//! `argocd-agentctl blocklist`: edits the hub's `argocd-agent-blocklist` ConfigMap, which
//! the principal watches live (docs/reliability.md, "Revocation by identity").

use argocd_agent_identity::text::quoted;
use argocd_agent_principal::blocklist::{
    CONFIGMAP, FINGERPRINTS, IDS, PREFIXES, entries, normalize_fingerprint,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::ctl::HubArgs;

/// Why the flags name no blocklist entry. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// More or fewer than one of the entry flags.
    #[error("exactly one of --id, --prefix, --fingerprint is required")]
    NotOne,
    /// None of the entry flags.
    #[error("one of --id, --prefix, --fingerprint is required")]
    None,
    /// `--id` is not a SPIFFE ID.
    #[error("--id {}: {cause}", quoted(.id))]
    Id {
        /// The value.
        id: String,
        /// Why.
        cause: argocd_agent_identity::id::IdError,
    },
    /// `--prefix` without the scheme.
    #[error("--prefix {}: must start with spiffe://", quoted(.0))]
    Prefix(String),
    /// `--fingerprint` is not a SHA-256 in hex.
    #[error("--fingerprint: expected 32 bytes of hex (SHA-256)")]
    Fingerprint,
}

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
    /// Edit through the principal's admin API (at --principal-admin-address, or
    /// --principal-address with this workload's SVID) instead of the hub's Kubernetes API:
    /// what a tenant's operator uses; it may block exact IDs of its tenant's agents only.
    /// Implied by --principal-address.
    #[arg(long)]
    pub(crate) admin_api: bool,
    #[command(flatten)]
    pub(crate) admin: crate::ctl::agent::AdminConn,
}

/// Adds (`add`) or removes an entry through the principal's admin API; returns whether the
/// list changed.
async fn edit_via_principal(
    a: &EntryArgs,
    key: &str,
    entry: &str,
    add: bool,
) -> Result<bool, crate::BoxError> {
    let mut request = argocd_agent_proto::admin::BlockRequest::default();
    match key {
        IDS => request.id = entry.to_owned(),
        PREFIXES => request.prefix = entry.to_owned(),
        _ => request.fingerprint = entry.to_owned(),
    }
    let mut client = crate::ctl::agent::connect(&a.admin).await?;
    let what = if add { "blocking" } else { "unblocking" };
    let answer = if add {
        client.block_identity(request).await
    } else {
        client.unblock_identity(request).await
    };
    Ok(answer
        .map_err(|s| crate::ctl::agent::status(&format!("{what} {entry}"), s))?
        .into_inner()
        .changed)
}

impl EntryArgs {
    /// Whether the edit goes through the principal's admin API.
    fn via_principal(&self) -> bool {
        self.admin_api || self.admin.over_mtls()
    }

    /// Adds or removes the entry where the flags say; returns the key, entry and whether
    /// the list changed.
    async fn apply(&self, add: bool) -> Result<(&'static str, String, bool), crate::BoxError> {
        let (key, entry) = self.entry()?;
        let changed = if self.via_principal() {
            edit_via_principal(self, key, &entry, add).await?
        } else {
            edit(&store(&self.hub).await?, key, &entry, add).await?
        };
        Ok((key, entry, changed))
    }
    /// The data key and normalized entry.
    fn entry(&self) -> Result<(&'static str, String), EntryError> {
        let given = [&self.id, &self.prefix, &self.fingerprint]
            .iter()
            .filter(|o| o.is_some())
            .count();
        if given != 1 {
            return Err(EntryError::NotOne);
        }
        match (&self.id, &self.prefix, &self.fingerprint) {
            (Some(id), _, _) => {
                argocd_agent_identity::SpiffeId::parse(id).map_err(|cause| EntryError::Id {
                    id: id.clone(),
                    cause,
                })?;
                Ok((IDS, id.clone()))
            }
            (_, Some(p), _) if p.starts_with("spiffe://") => Ok((PREFIXES, p.clone())),
            (_, Some(p), _) => Err(EntryError::Prefix(p.clone())),
            (_, _, Some(f)) => {
                let f = normalize_fingerprint(f);
                if f.len() != 64 || !f.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(EntryError::Fingerprint);
                }
                Ok((FINGERPRINTS, f))
            }
            _ => Err(EntryError::None),
        }
    }
}

async fn api(h: &HubArgs) -> Result<Api<ConfigMap>, crate::ctl::error::HubClientError> {
    Ok(Api::namespaced(h.client().await?, &h.namespace))
}

/// The hub's ConfigMaps in the Argo CD namespace, as the principal edits them.
async fn store(
    h: &HubArgs,
) -> Result<argocd_agent_principal::blocklist::BlocklistStore, crate::ctl::error::HubClientError> {
    let configmaps = argocd_agent_kubernetes::Resources::new(
        h.client().await?,
        argocd_agent_kubernetes::Kind::ConfigMap,
    );
    Ok(argocd_agent_principal::blocklist::BlocklistStore {
        configmaps: std::sync::Arc::new(configmaps),
        namespace: h.namespace.clone(),
    })
}

/// Adds (`add`) or removes an entry in the ConfigMap; returns whether the list changed.
async fn edit(
    store: &argocd_agent_principal::blocklist::BlocklistStore,
    key: &str,
    entry: &str,
    add: bool,
) -> Result<bool, crate::BoxError> {
    Ok(argocd_agent_principal::blocklist::edit(store, key, entry, add).await?)
}

/// Runs a `blocklist` subcommand.
pub async fn run(command: Command) -> crate::CmdResult {
    match command {
        Command::Add(a) => {
            let (key, entry, changed) = a.apply(true).await?;
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
            let (key, entry, changed) = a.apply(false).await?;
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
