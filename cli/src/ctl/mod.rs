//! `argocd-agentctl` subcommands, one module each.

pub mod agent;
pub mod blocklist;
pub mod error;
pub mod identity;
pub mod mesh;
pub mod onboard;
pub mod replicas;
pub mod tenant;
pub mod validate;

/// Where the hub's Kubernetes API is, for commands that read or edit hub objects.
#[derive(Debug, clap::Args)]
pub struct HubArgs {
    /// Argo CD's namespace on the hub (where the principal runs).
    #[arg(long, short = 'n', default_value = "argocd")]
    pub namespace: String,
    /// Kubeconfig of the hub (default: KUBECONFIG, in-cluster, ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Context in the hub kubeconfig.
    #[arg(long)]
    pub kube_context: Option<String>,
}

impl HubArgs {
    /// A client of the hub's API.
    pub async fn client(&self) -> Result<kube::Client, error::HubClientError> {
        let opts = argocd_agent_kubernetes::ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.kube_context.clone(),
            ..Default::default()
        };
        argocd_agent_kubernetes::client(&opts)
            .await
            .map_err(error::HubClientError)
    }
}
