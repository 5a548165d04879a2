//! cluster-up: reuse a healthy control plane in the state dir, else clean it and start
//! etcd, kube-apiserver (RBAC, an audit log of API writes) and a registry (plain http,
//! deletes enabled), and, on a real node, the node's daemons; then write the env file.

use super::daemons::{self, free_port, wait_until};
use super::plane::{Plane, etcd_healthy, git_version, registry_healthy};
use super::state::{Env, KUBERNETES_SERVICE_IP, RunState, env_text};
use super::{UpOptions, node};
use crate::cmd::{self, Result};
use crate::tools::{self, log, write};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const TAG: &str = "cluster-up";
/// Subject CN of the CA; testkit/src/cluster.rs rebuilds the issuer name from it to sign
/// webhook serving certs, so both must agree byte for byte.
pub const CA_COMMON_NAME: &str = "cocoon-hibernation-test-ca";

/// What [`up_report`] did.
pub struct Up {
    pub env_file: PathBuf,
    /// A fresh cluster was started (else a running one was reused).
    pub started: bool,
}

pub fn up_report(opts: &UpOptions) -> Result<Up> {
    let started_at = Instant::now();
    let net = if opts.node {
        Some(node::Net::from_env())
    } else {
        None
    };
    let dir = super::plane::resolve_dir(opts.state_dir.as_deref(), opts.node)?;
    if let Some(net) = &net {
        node::preflight(&dir, net)?;
    }
    let missing: Vec<&str> = ["openssl", "curl", "setsid", "docker-registry"]
        .into_iter()
        .filter(|tool| !tools::on_path(tool))
        .collect();
    if !missing.is_empty() {
        return cmd::fail(format!(
            "missing: {}. Install with: apt-get install -y docker-registry openssl curl util-linux",
            missing.join(" ")
        ));
    }
    let _lock = Plane::lock(&dir)?;
    let bin_dir = tools::control_plane(opts.node).map_err(|e| {
        cmd::Error(format!(
            "building the control plane failed (it needs Go >= 1.24 on a cold cache): {e}"
        ))
    })?;
    let api_host = net
        .as_ref()
        .map_or_else(|| "127.0.0.1".to_owned(), |n| n.ip.clone());
    let plane = Plane {
        dir,
        net,
        api_host,
        bin_dir,
    };
    let env_file = plane.dir.join("env");

    if opts.restart_apiserver {
        let Some(run) = plane.running_and_healthy() else {
            return cmd::fail(format!(
                "no healthy cluster in {} whose kube-apiserver could be restarted",
                plane.dir.display()
            ));
        };
        daemons::stop(&plane.dir, "kube-apiserver");
        start_apiserver(&plane, &run)?;
        if !wait_until(90, "kube-apiserver", || {
            plane.apiserver_healthy(run.api_port)
        }) {
            return cmd::fail(format!(
                "kube-apiserver /healthz not ok 90s after its restart (see {}/kube-apiserver.log)",
                plane.dir.display()
            ));
        }
        log(
            TAG,
            format!(
                "kube-apiserver restarted in {}s",
                started_at.elapsed().as_secs()
            ),
        );
        return Ok(Up {
            env_file,
            started: false,
        });
    }

    let (run, started) = match plane.running_and_healthy() {
        Some(run) => {
            log(
                TAG,
                format!("reusing the running cluster in {}", plane.dir.display()),
            );
            (run, false)
        }
        None => {
            log(
                TAG,
                format!("starting a fresh cluster in {}", plane.dir.display()),
            );
            (start_all(&plane)?, true)
        }
    };

    let version = plane
        .api_get(run.api_port, "/version")
        .and_then(|body| git_version(&body).map(str::to_owned))
        .unwrap_or_default();
    if !version.starts_with("v1.") {
        return cmd::fail(format!(
            "kube-apiserver reports version '{version}'; rebuild it with version ldflags (cargo xtask control-plane)"
        ));
    }
    // Written last and atomically: its presence means "up and healthy".
    let tmp = plane.dir.join("env.tmp");
    write(
        &tmp,
        &env_text(&Env {
            state_dir: &plane.dir,
            api_host: &plane.api_host,
            run: &run,
            k8s_version: &version,
            node_ip: plane.net.as_ref().map(|n| n.ip.as_str()),
        }),
    )?;
    rename(&tmp, &env_file)?;
    summary(&plane, &run, &version, started_at);
    Ok(Up { env_file, started })
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| {
        cmd::Error(format!(
            "cannot move {} to {}: {e}",
            from.display(),
            to.display()
        ))
    })
}

fn summary(plane: &Plane, run: &RunState, version: &str, started_at: Instant) {
    let dir = plane.dir.display();
    let pid =
        |name| daemons::pid(&plane.dir, name).map_or_else(|| "?".to_owned(), |p| p.to_string());
    eprintln!(
        "[cluster-up] ready in {}s\n  \
         kube-apiserver  https://{}:{}  ({version}, pid {})\n  \
         etcd            http://127.0.0.1:{}  (pid {})\n  \
         registry        http://{}  (pid {}, data {dir}/registry-data)\n  \
         kubeconfig      {dir}/kubeconfig  (admin, system:masters)\n  \
         CA              {dir}/pki/ca.crt  key {dir}/pki/ca.key\n  \
         audit log       {dir}/audit.log  (create/update/patch/delete at Metadata level)\n  \
         logs            {dir}/{{etcd,kube-apiserver,registry}}.log\n  \
         kubectl         {}/kubectl\n  \
         env file        {dir}/env   (source it: set -a; . {dir}/env; set +a)",
        started_at.elapsed().as_secs(),
        plane.api_host,
        run.api_port,
        pid("kube-apiserver"),
        run.etcd_port,
        pid("etcd"),
        run.registry,
        pid("registry"),
        plane.bin_dir.display(),
    );
}

/// The certificates tool installs without cert-manager use too (certs/certs.sh).
fn certs(args: &[&str]) -> Result<Command> {
    let mut c = Command::new("bash");
    c.arg(cmd::repo_root()?.join("certs/certs.sh")).args(args);
    Ok(c)
}

/// The PKI, made once per state dir: one CA serves as apiserver serving CA, client CA and
/// the CA tests sign webhook serving certs with; tests may also mint client identities.
fn gen_pki(plane: &Plane) -> Result<()> {
    let pki = plane.pki();
    let _ = std::fs::remove_dir_all(&pki);
    tools::mkdir(&pki)?;
    let p = pki.to_string_lossy().into_owned();
    cmd::run(&mut certs(&["ca", "--dir", &p, "--cn", CA_COMMON_NAME])?)?;
    let mut sans = vec!["--dns", "localhost", "--ip", "127.0.0.1"];
    if let Some(net) = &plane.net {
        sans.extend([
            "--ip",
            net.ip.as_str(),
            "--ip",
            KUBERNETES_SERVICE_IP,
            "--dns",
            "kubernetes.default.svc",
        ]);
    }
    let apiserver = format!("{p}/apiserver");
    let mut issue = vec![
        "issue",
        "--ca",
        &p,
        "--out",
        &apiserver,
        "--cn",
        "kube-apiserver",
    ];
    issue.extend(sans);
    cmd::run(&mut certs(&issue)?)?;
    let admin = format!("{p}/admin");
    cmd::run(&mut certs(&[
        "issue",
        "--ca",
        &p,
        "--out",
        &admin,
        "--cn",
        "admin",
        "--org",
        "system:masters",
        "--client",
    ])?)?;
    // The service-account token signing key pair: a key, not a certificate. Made 0600
    // before openssl writes into it.
    let sa_key = pki.join("sa.key");
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&sa_key)
            .map_err(|e| cmd::Error(format!("cannot create {}: {e}", sa_key.display())))?;
    }
    cmd::output(
        Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
            ])
            .arg(&sa_key),
    )?;
    cmd::output(
        Command::new("openssl")
            .args(["pkey", "-in"])
            .arg(&sa_key)
            .args(["-pubout", "-out"])
            .arg(pki.join("sa.pub")),
    )?;
    log(TAG, format!("generated PKI in {}", pki.display()));
    Ok(())
}

/// Every file is there, and the apiserver and admin certificates still chain to the CA
/// with a week to spare (a PKI left half-made or expiring is made again).
fn pki_ok(plane: &Plane) -> bool {
    let pki = plane.pki();
    let p = pki.to_string_lossy().into_owned();
    let files = ["ca.key", "sa.key", "sa.pub", "admin.key", "apiserver.key"];
    let check = |cert: &str, ip: Option<&str>| {
        let cert = format!("{p}/{cert}");
        let mut args = vec!["check", "--ca", &p, "--cert", &cert];
        if let Some(ip) = ip {
            args.extend(["--ip", ip]);
        }
        certs(&args).is_ok_and(|mut c| cmd::output(&mut c).is_ok())
    };
    files.iter().all(|f| pki.join(f).is_file())
        && check("apiserver.crt", Some(&plane.api_host))
        && check("admin.crt", None)
}

pub fn kubeconfig_text(server: &str, ca: &[u8], cert: &[u8], key: &[u8]) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cocoon-local\n  cluster:\n    \
         server: {server}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    \
         client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: cocoon-local\n  \
         context:\n    cluster: cocoon-local\n    user: admin\n    namespace: default\n\
         current-context: cocoon-local\n",
        b64(ca),
        b64(cert),
        b64(key)
    )
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| cmd::Error(format!("cannot read {}: {e}", path.display())))
}

fn write_kubeconfig(plane: &Plane, api_port: u16) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let pki = plane.pki();
    let text = kubeconfig_text(
        &format!("https://{}:{api_port}", plane.api_host),
        &read(&pki.join("ca.crt"))?,
        &read(&pki.join("admin.crt"))?,
        &read(&pki.join("admin.key"))?,
    );
    let tmp = plane.dir.join("kubeconfig.tmp");
    write(&tmp, &text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| cmd::Error(format!("cannot chmod {}: {e}", tmp.display())))?;
    rename(&tmp, &plane.kubeconfig())
}

/// Tests count API writes from the audit log; reads would drown them, so they are not
/// logged. CR status writes keep their body (the status sent), so the benchmark can tell a
/// write that moves the phase from one that only changes a condition.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  verbs: ["update", "patch"]
  resources: [{group: "cocoonset.cocoonstack.io", resources: ["cocoonhibernations/status"]}]
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
"#;

/// On a real node the install suite reads who sent which DELETE, and when (S1's fence).
pub fn registry_config(dir: &Path, addr: &str, access_log: bool) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: {}\nstorage:\n  filesystem:\n    \
         rootdirectory: {}/registry-data\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  \
         secret: cocoon-local-not-a-secret\n",
        !access_log,
        dir.display()
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|&a| a.to_owned()).collect()
}

/// kube-apiserver on `run.api_port` over the etcd on `run.etcd_port`.
fn start_apiserver(plane: &Plane, run: &RunState) -> Result<()> {
    let pki = plane.pki().display().to_string();
    let dir = plane.dir.display();
    let (host, port) = (&plane.api_host, run.api_port);
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", run.etcd_port),
        format!("--bind-address={host}"),
        format!("--secure-port={port}"),
        format!("--advertise-address={host}"),
        format!("--tls-cert-file={pki}/apiserver.crt"),
        format!("--tls-private-key-file={pki}/apiserver.key"),
        format!("--client-ca-file={pki}/ca.crt"),
        "--authorization-mode=RBAC".to_owned(),
    ];
    // A bare apiserver has no controller-manager to make ServiceAccounts; a real node has,
    // and its kubelet mounts their tokens. It reaches webhook Services through their
    // endpoints (no kube-proxy) and kubelets by their InternalIP (no DNS).
    if plane.net.is_some() {
        args.extend([
            "--enable-aggregator-routing=true".to_owned(),
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            format!("--kubelet-client-certificate={pki}/admin.crt"),
            format!("--kubelet-client-key={pki}/admin.key"),
        ]);
    } else {
        args.push("--disable-admission-plugins=ServiceAccount".to_owned());
    }
    args.extend([
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        "--allow-privileged=true".to_owned(),
        format!("--service-account-issuer=https://127.0.0.1:{port}/"),
        format!("--service-account-key-file={pki}/sa.pub"),
        format!("--service-account-signing-key-file={pki}/sa.key"),
        format!("--audit-policy-file={dir}/audit-policy.yaml"),
        format!("--audit-log-path={dir}/audit.log"),
    ]);
    args.extend(strings(&[
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
        "--audit-log-maxsize=0",
        "--audit-log-maxbackup=0",
    ]));
    daemons::start(
        &plane.dir,
        "kube-apiserver",
        &plane.bin_dir.join("kube-apiserver"),
        &args,
    )
    .map(drop)
}

fn stop_all(plane: &Plane) {
    // Reverse start order: the apiserver goes before the etcd it writes to.
    for name in super::plane::DAEMONS.iter().rev() {
        daemons::stop(&plane.dir, name);
    }
}

fn start_all(plane: &Plane) -> Result<RunState> {
    if let Some(net) = &plane.net {
        node::stop(&plane.dir, net)?;
    }
    stop_all(plane);
    // Runtime state goes; the PKI stays unless it is incomplete.
    let dir = &plane.dir;
    for sub in ["etcd-data", "registry-data"] {
        let _ = std::fs::remove_dir_all(dir.join(sub));
    }
    for file in ["run.state", "env", "audit.log"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "log") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    if !pki_ok(plane) {
        gen_pki(plane)?;
    }
    let mut taken = Vec::new();
    let etcd_port = free_port(&mut taken)?;
    let etcd_peer_port = free_port(&mut taken)?;
    let api_port = free_port(&mut taken)?;
    let registry_port = free_port(&mut taken)?;
    let run = RunState {
        etcd_port,
        etcd_peer_port,
        api_port,
        registry_port,
        registry: format!("{}:{registry_port}", plane.api_host),
        bin_dir: plane.bin_dir.clone(),
        node: plane.net.is_some(),
    };
    // The apiserver and the registry bind the bridge's address on a real node.
    if plane.net.is_some() {
        node::network_up(plane, api_port)?;
    }
    let etcd = |flag: &str, port: u16| format!("--{flag}=http://127.0.0.1:{port}");
    daemons::start(
        dir,
        "etcd",
        &plane.bin_dir.join("etcd"),
        &[
            "--name=cocoon".to_owned(),
            format!("--data-dir={}/etcd-data", dir.display()),
            etcd("listen-client-urls", etcd_port),
            etcd("advertise-client-urls", etcd_port),
            etcd("listen-peer-urls", etcd_peer_port),
            etcd("initial-advertise-peer-urls", etcd_peer_port),
            format!("--initial-cluster=cocoon=http://127.0.0.1:{etcd_peer_port}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ],
    )?;
    write(&dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
    tools::mkdir(&dir.join("registry-data"))?;
    let registry_yml = dir.join("registry.yml");
    write(
        &registry_yml,
        &registry_config(dir, &run.registry, plane.net.is_some()),
    )?;
    daemons::start(
        dir,
        "registry",
        Path::new("docker-registry"),
        &["serve".to_owned(), registry_yml.display().to_string()],
    )?;
    let see = |name: &str| format!("(see {}/{name}.log)", dir.display());
    if !wait_until(30, "etcd", || etcd_healthy(etcd_port)) {
        return cmd::fail(format!("etcd not healthy after 30s {}", see("etcd")));
    }
    start_apiserver(plane, &run)?;
    if !wait_until(10, "registry", || registry_healthy(&run.registry)) {
        return cmd::fail(format!(
            "registry not healthy after 10s {}",
            see("registry")
        ));
    }
    if !wait_until(90, "kube-apiserver", || plane.apiserver_healthy(api_port)) {
        return cmd::fail(format!(
            "kube-apiserver /healthz not ok after 90s {}",
            see("kube-apiserver")
        ));
    }
    if !wait_until(30, "namespace default", || {
        plane.default_ns_exists(api_port)
    }) {
        return cmd::fail(format!(
            "namespace default missing after 30s {}",
            see("kube-apiserver")
        ));
    }
    write_kubeconfig(plane, api_port)?;
    if plane.net.is_some() {
        node::start(plane, &run, &mut taken)?;
    }
    write(&plane.run_state(), &run.to_text())?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_embeds_the_admin_identity() {
        let text = kubeconfig_text("https://127.0.0.1:1", b"ca", b"crt", b"key");
        assert!(
            text.contains(
                "    server: https://127.0.0.1:1\n    certificate-authority-data: Y2E=\n"
            )
        );
        assert!(text.contains("client-certificate-data: Y3J0\n    client-key-data: a2V5\n"));
        assert!(text.ends_with("current-context: cocoon-local\n"));
    }

    #[test]
    fn the_registry_logs_access_only_on_a_node() {
        let local = registry_config(Path::new("/s"), "127.0.0.1:5", false);
        assert!(local.contains("    disabled: true\n"));
        assert!(local.contains("rootdirectory: /s/registry-data\n"));
        assert!(local.contains("  addr: 127.0.0.1:5\n"));
        assert!(
            registry_config(Path::new("/s"), "10.77.0.1:5", true).contains("    disabled: false\n")
        );
    }
}
