//! vk-cocoon simulator for demos: plays the virtual kubelet against a real apiserver
//! (KUBECONFIG from the environment) and a real plain-http OCI registry.
//!
//! cargo run --example vk_cocoon_simulator -- --registry 127.0.0.1:5000 [--namespace demo]

use testkit::{virtual_node, vk_sim};

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Simulates vk-cocoon: hibernates and wakes VM-backed pods")]
struct Args {
    /// Only pods in this namespace (all namespaces if absent).
    #[arg(long)]
    namespace: Option<String>,
    /// OCI registry host:port (plain http) that receives `<vm>:hibernate`.
    #[arg(long, env = "COCOON_REGISTRY")]
    registry: String,
    /// Time a hibernation takes before the snapshot is pushed.
    #[arg(long, default_value_t = 2000)]
    hibernate_delay_ms: u64,
    /// Time a wake takes before the new VMID is written.
    #[arg(long, default_value_t = 2000)]
    wake_delay_ms: u64,
    /// Write `lifecycle-state=hibernating` before pushing, as vk-cocoon does.
    #[arg(long)]
    hibernating_first: bool,
    /// Share (0..=1) of wakes that delete the tag they restored from, as vk-cocoon may.
    #[arg(long, default_value_t = 0.0)]
    wake_drops_tag: f64,
    /// Register this Node and keep it Ready (as vk-cocoon does), for clusters with a real
    /// scheduler and controller-manager; bind VM pods to it with `spec.nodeName`.
    #[arg(long)]
    virtual_node: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Before any TLS client exists: kube and reqwest are built without a default provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        Duration::from_millis(args.hibernate_delay_ms),
        Duration::from_millis(args.wake_delay_ms),
    ));
    knobs.set_hibernating_first(args.hibernating_first);
    knobs.set_wake_drops_tag(args.wake_drops_tag);
    let _node = match &args.virtual_node {
        Some(name) => Some(virtual_node::register(client.clone(), name).await?),
        None => None,
    };
    let _sim = vk_sim::spawn(client, args.namespace.clone(), args.registry.clone(), knobs);
    tracing::info!(
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        registry = %args.registry,
        "vk-cocoon simulator running; Ctrl-C to stop"
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}
