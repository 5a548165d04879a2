//! `cargo xtask demo --node` (`make demo NODE=1`): the product the way users run it. A
//! real single-node cluster (kubelet, containerd, CNI), the image from `make image`
//! installed with the Helm chart (two replicas, one leading), the vk-cocoon simulator on
//! its virtual node, and pod demo/web-0 hibernated and woken through its
//! CocoonHibernation. Leaves everything running; `demo-down` stops it. Needs root.

use super::daemon::{self, Daemons};
use super::kube::{Kube, NS, POD};
use super::{SIMULATOR, cluster_up, say};
use crate::cmd::{self, Error, Result, fail, repo_root};
use crate::lanes::control_plane::Up;
use crate::lanes::{cargo, scripts, target_dir};
use std::path::Path;
use std::process::Command;

const RELEASE: &str = "cocoon-hibernation";
const RELEASE_NS: &str = "cocoon-system";

pub fn up(dir: &Path) -> Result<()> {
    let daemons = Daemons {
        dir: dir.to_path_buf(),
    };
    let node_dir = dir.join("node-cluster");
    let chart = repo_root()?.join("charts/cocoon-hibernation");
    say("1/6  building the vk-cocoon simulator and the helm tooling (cached after the first run)");
    cmd::run(cargo()?.args(["build", "--quiet", "--example", SIMULATOR]))?;
    let tools_log = dir.join("install-tools.log");
    std::fs::File::create(&tools_log)
        .map_err(|e| Error(format!("{}: {e}", tools_log.display())))?;
    let helm = scripts::install_tools(Some(&tools_log))
        .inspect_err(|_| {
            eprint!(
                "{}",
                std::fs::read_to_string(&tools_log).unwrap_or_default()
            )
        })?
        .join("helm");

    say(
        "2/6  starting a real node: etcd, kube-apiserver, controller-manager, scheduler, kubelet, containerd, a registry",
    );
    let env = cluster_up(
        dir,
        "the node cluster",
        Up {
            dir: Some(&node_dir),
            node: true,
            ..Up::default()
        },
    )?;
    let registry = env.get("COCOON_REGISTRY")?.to_string();
    let virtual_node = env.get("COCOON_VIRTUAL_NODE")?.to_string();
    say(&format!(
        "     kube-apiserver {} at {}, node {}, registry {registry}",
        env.get("COCOON_K8S_VERSION")?,
        env.get("COCOON_APISERVER_URL")?,
        env.get("COCOON_NODE_NAME")?
    ));
    let bridge = env
        .get("COCOON_NODE_BRIDGE")
        .unwrap_or("cocoon0")
        .to_string();
    let kube = Kube::new(env)?;

    say("3/6  make image: the product image, pushed to that registry (first run: a release build)");
    let image_log = dir.join("image.log");
    std::fs::File::create(&image_log)
        .map_err(|e| Error(format!("{}: {e}", image_log.display())))?;
    let image = scripts::push_image(&registry, Some(&image_log)).inspect_err(|_| {
        eprint!(
            "{}",
            std::fs::read_to_string(&image_log).unwrap_or_default()
        )
    })?;
    say(&format!("     {}", image.line));

    say(&format!(
        "4/6  helm install {RELEASE} (two replicas; waits until they are Ready)"
    ));
    let helm_log = dir.join("helm.log");
    let mut install = Command::new(&helm);
    kube.env.apply(&mut install);
    install
        .args(["upgrade", "--install", RELEASE])
        .arg(&chart)
        .args(["-n", RELEASE_NS, "--create-namespace"])
        .args(["--set", &format!("image.repository={}", image.repo)])
        .args(["--set", &format!("image.digest={}", image.digest)])
        .args(["--set", &format!("registry.base={registry}")])
        .args(["--set", "registry.plainHTTP=true"])
        .args(["--set", "vmIdentityPolicy.allowedUsernames={admin}"])
        .args(["--wait", "--timeout", "180s"]);
    let log = std::fs::File::create(&helm_log)
        .map_err(|e| Error(format!("{}: {e}", helm_log.display())))?;
    let log_err = log
        .try_clone()
        .map_err(|e| Error(format!("{}: {e}", helm_log.display())))?;
    if let Err(e) = cmd::run(install.stdout(log).stderr(log_err)) {
        let text = std::fs::read_to_string(&helm_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!(
            "{}\n{e}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        );
        if let Ok(pods) = kube.run(&["-n", RELEASE_NS, "get", "pods"], "") {
            eprint!("{pods}");
        }
        return fail("helm install failed");
    }
    for line in kube
        .run(&["-n", RELEASE_NS, "get", "pods", "-o", "wide"], "")?
        .lines()
    {
        println!("     {line}");
    }

    say(&format!(
        "5/6  starting the vk-cocoon simulator (virtual node {virtual_node}) and pod {NS}/{POD} on it"
    ));
    daemons.stop(SIMULATOR);
    let sim = target_dir()?.join("debug/examples").join(SIMULATOR);
    let args = [
        "--registry",
        &registry,
        "--virtual-node",
        &virtual_node,
        "--hibernate-delay-ms",
        "2000",
        "--wake-delay-ms",
        "2000",
    ];
    daemons.start(SIMULATOR, &kube.env, &sim, &args.map(String::from))?;
    kube.fresh_pod(Some(&virtual_node))?;

    let sim_log = daemons.log(SIMULATOR);
    let alive = || match daemons.pid(SIMULATOR) {
        Some(_) => Ok(()),
        None => fail(format!("the simulator exited; see {}", sim_log.display())),
    };
    say("6/6  hibernating it (desire: Hibernate), then waking it (desire: Wake)");
    let kubectl = kube.kubectl.display().to_string();
    kube.round_trip(
        &alive,
        &format!("{kubectl} -n {RELEASE_NS} logs deploy/{RELEASE}"),
    )?;

    let mut pid_files = daemon::pid_files(std::slice::from_ref(&node_dir));
    pid_files.push(daemons.pid_file(SIMULATOR));
    let (procs, rss_mb) = daemon::running(&pid_files);
    let kubeconfig = kube.env.get("KUBECONFIG")?;
    let (n, h, c) = (node_dir.display(), helm.display(), chart.display());
    println!(
        "
The demo runs on a real node and keeps running until you stop it (about {rss_mb} MB of
memory plus the pods; the bridge {bridge} and one NAT rule on this host, see hack/README.md):
  {procs}
Try it yourself:
  export KUBECONFIG={kubeconfig}
  alias kubectl={kubectl}
  kubectl -n {RELEASE_NS} get pods,lease                  # two replicas; the Lease names the leader
  kubectl -n {RELEASE_NS} logs deploy/{RELEASE}
  kubectl -n {NS} patch ch {POD} --type merge -p '{{\"spec\":{{\"desire\":\"Hibernate\"}}}}'
  kubectl -n {NS} get ch -w
  {h} -n {RELEASE_NS} upgrade {RELEASE} {c} --reuse-values --set podAnnotations.rolled=$(date +%s) --wait
Logs: {n}/*.log, {}
Stop everything with: make demo-down",
        sim_log.display()
    );
    Ok(())
}
