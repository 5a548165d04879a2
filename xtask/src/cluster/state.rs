//! The files of a state dir that say what runs: `run.state` (ports and binaries of the
//! running cluster, read back to reuse it) and `env` (what callers source; written last,
//! so its presence means "up and healthy").

use std::path::{Path, PathBuf};

pub const NODE_NAME: &str = "cocoon-node";
/// The node the vk-cocoon simulator registers; VM pods are bound to it, never the kubelet.
pub const VIRTUAL_NODE: &str = "vk-cocoon";
/// The `kubernetes` Service's address (10.0.0.0/24 is the Service range).
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// Ports and binaries of a running cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunState {
    pub etcd_port: u16,
    pub etcd_peer_port: u16,
    pub api_port: u16,
    pub registry_port: u16,
    /// `host:port`
    pub registry: String,
    pub bin_dir: PathBuf,
    pub node: bool,
}

impl RunState {
    pub fn to_text(&self) -> String {
        format!(
            "ETCD_PORT={}\nETCD_PEER_PORT={}\nAPI_PORT={}\nREGISTRY_PORT={}\nREGISTRY={}\nRUN_BIN_DIR={}\nRUN_NODE={}\n",
            self.etcd_port,
            self.etcd_peer_port,
            self.api_port,
            self.registry_port,
            self.registry,
            self.bin_dir.display(),
            u8::from(self.node)
        )
    }

    pub fn parse(text: &str) -> Option<Self> {
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
        };
        Some(Self {
            etcd_port: get("ETCD_PORT")?.parse().ok()?,
            etcd_peer_port: get("ETCD_PEER_PORT")?.parse().ok()?,
            api_port: get("API_PORT")?.parse().ok()?,
            registry_port: get("REGISTRY_PORT")?.parse().ok()?,
            registry: get("REGISTRY")?.to_owned(),
            bin_dir: PathBuf::from(get("RUN_BIN_DIR")?),
            node: get("RUN_NODE")? == "1",
        })
    }
}

/// What the env file says.
pub struct Env<'a> {
    pub state_dir: &'a Path,
    pub api_host: &'a str,
    pub run: &'a RunState,
    pub k8s_version: &'a str,
    /// The node's IP when this is a real node.
    pub node_ip: Option<&'a str>,
}

/// The env file's `KEY=value` lines (source it: `set -a; . env; set +a`).
pub fn env_text(env: &Env) -> String {
    let dir = env.state_dir.display();
    let mut text = format!(
        "KUBECONFIG={dir}/kubeconfig\n\
         COCOON_APISERVER_URL=https://{}:{}\n\
         COCOON_CA_CERT={dir}/pki/ca.crt\n\
         COCOON_CA_KEY={dir}/pki/ca.key\n\
         COCOON_REGISTRY={}\n\
         COCOON_AUDIT_LOG={dir}/audit.log\n\
         COCOON_K8S_VERSION={}\n\
         COCOON_BIN_DIR={}\n\
         COCOON_STATE_DIR={dir}\n\
         COCOON_NODE={}\n",
        env.api_host,
        env.run.api_port,
        env.run.registry,
        env.k8s_version,
        env.run.bin_dir.display(),
        u8::from(env.node_ip.is_some()),
    );
    if let Some(ip) = env.node_ip {
        text.push_str(&format!(
            "COCOON_NODE_NAME={NODE_NAME}\nCOCOON_NODE_IP={ip}\nCOCOON_VIRTUAL_NODE={VIRTUAL_NODE}\n\
             COCOON_CONTAINERD_SOCK={dir}/containerd/containerd.sock\n"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunState {
        RunState {
            etcd_port: 21000,
            etcd_peer_port: 21001,
            api_port: 21002,
            registry_port: 21003,
            registry: "127.0.0.1:21003".to_owned(),
            bin_dir: PathBuf::from("/c/bin/k8s-v1.34.4-etcd-v3.6.16"),
            node: false,
        }
    }

    #[test]
    fn run_state_round_trips_and_a_partial_one_is_none() {
        let state = run();
        assert_eq!(RunState::parse(&state.to_text()), Some(state.clone()));
        let node = RunState {
            node: true,
            ..state
        };
        assert_eq!(RunState::parse(&node.to_text()), Some(node));
        assert_eq!(RunState::parse("ETCD_PORT=1\nAPI_PORT=2\n"), None);
        assert_eq!(
            RunState::parse(&run().to_text().replace("21002", "x")),
            None
        );
    }

    #[test]
    fn the_env_file_names_everything_and_a_node_adds_its_own() {
        let state = run();
        let text = env_text(&Env {
            state_dir: Path::new("/s"),
            api_host: "127.0.0.1",
            run: &state,
            k8s_version: "v1.34.4",
            node_ip: None,
        });
        assert_eq!(
            text,
            "KUBECONFIG=/s/kubeconfig\nCOCOON_APISERVER_URL=https://127.0.0.1:21002\n\
             COCOON_CA_CERT=/s/pki/ca.crt\nCOCOON_CA_KEY=/s/pki/ca.key\n\
             COCOON_REGISTRY=127.0.0.1:21003\nCOCOON_AUDIT_LOG=/s/audit.log\n\
             COCOON_K8S_VERSION=v1.34.4\nCOCOON_BIN_DIR=/c/bin/k8s-v1.34.4-etcd-v3.6.16\n\
             COCOON_STATE_DIR=/s\nCOCOON_NODE=0\n"
        );
        let node = env_text(&Env {
            state_dir: Path::new("/s"),
            api_host: "10.77.0.1",
            run: &state,
            k8s_version: "v1.34.4",
            node_ip: Some("10.77.0.1"),
        });
        assert!(node.contains("COCOON_NODE=1\nCOCOON_NODE_NAME=cocoon-node\nCOCOON_NODE_IP=10.77.0.1\nCOCOON_VIRTUAL_NODE=vk-cocoon\nCOCOON_CONTAINERD_SOCK=/s/containerd/containerd.sock\n"), "{node}");
    }
}
