//! A real single node on top of the control plane: containerd (runc, a CNI bridge),
//! kube-controller-manager, kube-scheduler and a kubelet. The root-only set-up (the
//! bridge, the DNAT rule, the configs, mounts and network namespaces) is hack/node.sh;
//! the daemons are started and stopped here like the control plane's.

use super::daemons::{self, free_port, wait_until};
use super::plane::Plane;
use super::state::{KUBERNETES_SERVICE_IP, NODE_NAME, RunState};
use crate::cmd::{self, Result};
use crate::tools::env_nonempty;
use std::path::Path;
use std::process::{Command, Stdio};

/// The node's daemons, in start order.
pub const DAEMONS: [&str; 4] = [
    "containerd",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
];

/// The bridge the node's pods sit on (`COCOON_NODE_BRIDGE`, `COCOON_NODE_IP`).
#[derive(Clone, Debug)]
pub struct Net {
    pub bridge: String,
    /// The bridge's own address; pods get the rest of its /24.
    pub ip: String,
}

impl Net {
    pub fn from_env() -> Self {
        Self {
            bridge: env_nonempty("COCOON_NODE_BRIDGE").unwrap_or_else(|| "cocoon0".to_owned()),
            ip: env_nonempty("COCOON_NODE_IP").unwrap_or_else(|| "10.77.0.1".to_owned()),
        }
    }
}

/// `hack/node.sh STEP` with what it needs in its environment.
fn node_sh(dir: &Path, net: &Net, step: &str) -> Result<Command> {
    let mut c = Command::new("bash");
    c.arg(cmd::repo_root()?.join("hack/node.sh"))
        .arg(step)
        .env("STATE_DIR", dir)
        .env("NODE_BRIDGE", &net.bridge)
        .env("NODE_IP", &net.ip)
        .env("KUBERNETES_SERVICE_IP", KUBERNETES_SERVICE_IP);
    Ok(c)
}

fn net(plane: &Plane) -> Result<&Net> {
    match &plane.net {
        Some(net) => Ok(net),
        None => cmd::fail("not a real node"),
    }
}

/// Root and the node's packages, before anything else happens.
pub fn preflight(dir: &Path, net: &Net) -> Result<()> {
    cmd::run(&mut node_sh(dir, net, "preflight")?)
}

/// The bridge and the DNAT of the `kubernetes` Service to the apiserver.
pub fn network_up(plane: &Plane, api_port: u16) -> Result<()> {
    cmd::run(node_sh(&plane.dir, net(plane)?, "network-up")?.env("API_PORT", api_port.to_string()))
}

pub fn sock(dir: &Path) -> std::path::PathBuf {
    dir.join("containerd/containerd.sock")
}

fn containerd_up(dir: &Path) -> bool {
    Command::new("ctr")
        .arg("--address")
        .arg(sock(dir))
        .args(["--namespace", "k8s.io", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the node reports Ready.
pub fn ready(plane: &Plane) -> bool {
    cmd::output(
        Command::new(plane.bin_dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(plane.kubeconfig())
            .args([
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]),
    )
    .is_ok_and(|s| s.trim() == "True")
}

pub fn start(plane: &Plane, run: &RunState, taken: &mut Vec<u16>) -> Result<()> {
    let dir = &plane.dir;
    let net = net(plane)?;
    let kubelet_port = free_port(taken)?;
    let healthz_port = free_port(taken)?;
    cmd::run(
        node_sh(dir, net, "configs")?
            .env("REGISTRY", &run.registry)
            .env("KUBELET_PORT", kubelet_port.to_string())
            .env("KUBELET_HEALTHZ_PORT", healthz_port.to_string()),
    )?;
    let see = |name: &str| format!("(see {}/{name}.log)", dir.display());
    daemons::start(
        dir,
        "containerd",
        Path::new("containerd"),
        &[
            "--config".to_owned(),
            dir.join("containerd/config.toml").display().to_string(),
        ],
    )?;
    if !wait_until(30, "containerd", || containerd_up(dir)) {
        return cmd::fail(format!("containerd not up after 30s {}", see("containerd")));
    }
    let kc = plane.kubeconfig().display().to_string();
    let pki = plane.pki().display().to_string();
    let kubeconfigs = [
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--leader-elect=false".to_owned(),
    ];
    let mut kcm = kubeconfigs.to_vec();
    kcm.extend([
        format!("--secure-port={}", free_port(taken)?),
        "--use-service-account-credentials=true".to_owned(),
        format!("--service-account-private-key-file={pki}/sa.key"),
        format!("--root-ca-file={pki}/ca.crt"),
        format!("--cluster-signing-cert-file={pki}/ca.crt"),
        format!("--cluster-signing-key-file={pki}/ca.key"),
    ]);
    let bin = |name: &str| plane.bin_dir.join(name);
    daemons::start(
        dir,
        "kube-controller-manager",
        &bin("kube-controller-manager"),
        &kcm,
    )?;
    let mut scheduler = kubeconfigs.to_vec();
    scheduler.push(format!("--secure-port={}", free_port(taken)?));
    daemons::start(dir, "kube-scheduler", &bin("kube-scheduler"), &scheduler)?;
    let d = dir.display();
    daemons::start(
        dir,
        "kubelet",
        &bin("kubelet"),
        &[
            format!("--config={d}/kubelet/config.yaml"),
            format!("--kubeconfig={kc}"),
            format!("--root-dir={d}/kubelet/root"),
            format!("--cert-dir={d}/kubelet/pki"),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={}", net.ip),
        ],
    )?;
    if !wait_until(120, &format!("node {NODE_NAME} Ready"), || ready(plane)) {
        return cmd::fail(format!(
            "node {NODE_NAME} not Ready after 120s (see {d}/kubelet.log, {d}/containerd.log)"
        ));
    }
    let sa = "/api/v1/namespaces/default/serviceaccounts/default";
    if !wait_until(60, "default ServiceAccount", || {
        plane.api_get(run.api_port, sa).is_some()
    }) {
        return cmd::fail(format!(
            "no default ServiceAccount after 60s {}",
            see("kube-controller-manager")
        ));
    }
    Ok(())
}

/// Containers outlive containerd (their shims keep running): they are killed first, the
/// daemons stopped, then what the kubelet mounted and the network go, so nothing of the
/// node stays behind.
pub fn stop(dir: &Path, net: &Net) -> Result<()> {
    if daemons::pid(dir, "containerd").is_some() {
        cmd::run(&mut node_sh(dir, net, "drain")?)?;
    }
    for name in DAEMONS.iter().rev() {
        daemons::stop(dir, name);
    }
    cmd::run(&mut node_sh(dir, net, "clean")?)
}
