//! The apiserver client, found the way kubectl finds it: --kubeconfig, else $KUBECONFIG
//! (a list of files, merged), else ~/.kube/config, else the in-cluster service account;
//! --context picks a context, -n a namespace (default: the context's).

use super::cli::KubeArgs;
use super::error::PluginError;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

const USER_AGENT: &str = concat!(
    "cocoon-hibernation/",
    env!("CARGO_PKG_VERSION"),
    " (kubectl-cocoon)"
);

/// A client and the namespace commands act in.
pub struct Connection {
    pub client: kube::Client,
    pub namespace: String,
    /// The apiserver's URL, for messages.
    pub server: String,
}

pub async fn connect(args: &KubeArgs) -> Result<Connection, PluginError> {
    let mut config = load_config(args).await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| PluginError::Config(format!("cannot build the Kubernetes client: {e}")))?;
    Ok(Connection {
        client,
        namespace,
        server,
    })
}

async fn load_config(args: &KubeArgs) -> Result<Config, PluginError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        cluster: None,
        user: None,
    };
    if let Some(path) = &args.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
            PluginError::Config(format!("reading kubeconfig {}: {e}", path.display()))
        })?;
        return Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| PluginError::Config(format!("kubeconfig {}: {e}", path.display())));
    }
    if in_cluster_only(args) {
        return Config::incluster().map_err(|e| {
            PluginError::Config(format!(
                "no kubeconfig found ($KUBECONFIG unset, no ~/.kube/config) and the in-cluster config failed: {e}"
            ))
        });
    }
    Config::from_kubeconfig(&options).await.map_err(|e| {
        let source = match std::env::var_os("KUBECONFIG") {
            Some(v) => format!("$KUBECONFIG ({})", v.to_string_lossy()),
            None => "~/.kube/config".to_string(),
        };
        PluginError::Config(format!("kubeconfig from {source}: {e}"))
    })
}

/// No kubeconfig anywhere, no context asked for, and running in a pod.
fn in_cluster_only(args: &KubeArgs) -> bool {
    let no_env = std::env::var_os("KUBECONFIG").is_none_or(|v| v.is_empty());
    let no_default = std::env::home_dir()
        .map(|h| h.join(".kube").join("config"))
        .is_none_or(|p| !p.exists());
    args.context.is_none()
        && no_env
        && no_default
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}
