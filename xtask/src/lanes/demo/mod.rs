//! `cargo xtask demo` (`make demo`): a local control plane, the server, the vk-cocoon
//! simulator, a demo pod and its CocoonHibernation; hibernates and wakes it, printing each
//! phase with a timestamp, and leaves everything running. `cargo xtask demo --node`
//! (`make demo NODE=1`): the same on a real node with the image and the Helm chart.
//! `cargo xtask demo-down` stops either. Safe to run again at any time, before or after
//! `demo-down`.
//!
//! Ports are picked free on loopback unless given: COCOON_DEMO_WEBHOOK_PORT (the webhook,
//! HTTPS), COCOON_DEMO_ADMIN_PORT (/metrics, /readyz). State, logs and the webhook
//! certificate: COCOON_DEMO_DIR, default ~/.cache/cocoon-hibernation/demo.

mod daemon;
mod kube;
mod node;

use crate::cmd::{self, Error, Result, fail, repo_root};
use crate::lanes::control_plane::{self, Env, Up, append};
use crate::lanes::{cache_home, cargo, catch_interrupts, interrupted, target_dir, utc_hms, var};
use daemon::Daemons;
use kube::{Kube, NS, POD};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = "cocoon-hibernation"; // also the executables' names
const SIMULATOR: &str = "vk_cocoon_simulator";

/// `HH:MM:SS  message`: the demo's own lines.
pub fn say(line: &str) {
    println!("{}  {line}", utc_hms());
}

fn demo_dir() -> Result<PathBuf> {
    let dir = var("COCOON_DEMO_DIR").map_or(cache_home()?.join("demo"), PathBuf::from);
    std::fs::create_dir_all(&dir).map_err(|e| Error(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

pub fn main(on_node: bool) -> Result<()> {
    catch_interrupts();
    let dir = demo_dir()?;
    if on_node { node::up(&dir) } else { up(&dir) }
}

/// Starts `what`'s control plane (its log in the demo dir); its environment.
fn cluster_up(dir: &Path, what: &str, plane: Up<'_>) -> Result<Env> {
    let log = dir.join("cluster-up.log");
    std::fs::File::create(&log).map_err(|e| Error(format!("{}: {e}", log.display())))?;
    let env_file = control_plane::up(&Up {
        log: Some(append(&log)?),
        ..plane
    });
    match env_file {
        Ok(env_file) => Env::read(&env_file),
        Err(e) => {
            eprint!("{}", std::fs::read_to_string(&log).unwrap_or_default());
            fail(format!("{what} did not start: {e}"))
        }
    }
}

fn up(dir: &Path) -> Result<()> {
    let daemons = Daemons {
        dir: dir.to_path_buf(),
    };
    let cluster_dir = dir.join("cluster");
    let target = target_dir()?;
    say("1/6  building the server and the vk-cocoon simulator (cached after the first run)");
    let mut build = cargo()?;
    cmd::run(build.args(["build", "--quiet", "--bin", SERVER, "--example", SIMULATOR]))?;
    let bin = target.join("debug").join(SERVER);
    let sim = target.join("debug/examples").join(SIMULATOR);

    say(
        "2/6  starting a local control plane: etcd, kube-apiserver, an OCI registry (first run: builds them, ~7 min)",
    );
    let env = cluster_up(
        dir,
        "the control plane",
        Up {
            dir: Some(&cluster_dir),
            ..Up::default()
        },
    )?;
    say(&format!(
        "     kube-apiserver {} at {}, registry at {}",
        env.get("COCOON_K8S_VERSION")?,
        env.get("COCOON_APISERVER_URL")?,
        env.get("COCOON_REGISTRY")?
    ));
    let registry = env.get("COCOON_REGISTRY")?.to_string();
    let ca_cert = PathBuf::from(env.get("COCOON_CA_CERT")?);
    let kube = Kube::new(env)?;
    let crd = cmd::output(Command::new(&bin).arg("crd"))?;
    kube.apply(&crd, &["--server-side"])?;
    let crd_name = "crd/cocoonhibernations.cocoonset.cocoonstack.io";
    kube.run(
        &[
            "wait",
            "--for",
            "condition=Established",
            crd_name,
            "--timeout=30s",
        ],
        "",
    )?;

    say("3/6  webhook serving certificate for 127.0.0.1, signed by the cluster's CA");
    webhook_certificate(dir, &ca_cert)?;

    daemons.stop(SIMULATOR);
    daemons.stop(SERVER);
    let webhook_port = daemon::port("COCOON_DEMO_WEBHOOK_PORT", &[])?;
    let admin_port = daemon::port("COCOON_DEMO_ADMIN_PORT", &[webhook_port])?;
    if webhook_port == admin_port {
        return fail("the webhook and admin ports must differ");
    }
    let ports = format!("WEBHOOK_PORT={webhook_port} ADMIN_PORT={admin_port}\n");
    std::fs::write(dir.join("ports"), ports).map_err(|e| Error(format!("ports file: {e}")))?;
    say(&format!(
        "4/6  starting the server (webhook https://127.0.0.1:{webhook_port}, metrics http://127.0.0.1:{admin_port}/metrics)"
    ));
    let tls = |ext: &str| {
        dir.join(format!("tls.{ext}"))
            .to_string_lossy()
            .into_owned()
    };
    let server_args = [
        "run".to_string(),
        "--webhook-addr".into(),
        format!("127.0.0.1:{webhook_port}"),
        "--admin-addr".into(),
        format!("127.0.0.1:{admin_port}"),
        "--tls-cert-file".into(),
        tls("crt"),
        "--tls-key-file".into(),
        tls("key"),
        "--registry-base".into(),
        registry.clone(),
        "--registry-plain-http".into(),
        "--leader-election=true".into(),
        "--lease-namespace".into(),
        "default".into(),
        "--identity".into(),
        "cocoon-hibernation-demo".into(),
    ];
    daemons.start(SERVER, &kube.env, &bin, &server_args)?;
    let sim_args = [
        "--registry",
        &registry,
        "--hibernate-delay-ms",
        "2000",
        "--wake-delay-ms",
        "2000",
    ];
    daemons.start(SIMULATOR, &kube.env, &sim, &sim_args.map(String::from))?;
    let alive = || both_alive(&daemons);
    wait_ready(&daemons, admin_port, &alive)?;
    say(&format!(
        "     server pid {} ready; simulator pid {}",
        daemons.pid(SERVER).unwrap_or_default(),
        daemons.pid(SIMULATOR).unwrap_or_default()
    ));

    kube.apply(
        &webhook_config(webhook_port, &ca_cert)?,
        &["--server-side", "--force-conflicts"],
    )?;
    say(&format!(
        "5/6  creating pod {NS}/{POD} (a VM-backed pod, as vk-cocoon would run it)"
    ));
    kube.fresh_pod(None)?;
    say("6/6  hibernating it (CocoonHibernation desire: Hibernate), then waking it (desire: Wake)");
    let server_log = daemons.log(SERVER);
    kube.round_trip(&alive, &server_log.display().to_string())?;

    let mut pid_files = daemon::pid_files(std::slice::from_ref(&cluster_dir));
    pid_files.extend([daemons.pid_file(SERVER), daemons.pid_file(SIMULATOR)]);
    let (procs, rss_mb) = daemon::running(&pid_files);
    let kubeconfig = kube.env.get("KUBECONFIG")?;
    let kubectl = kube.kubectl.display();
    let d = dir.display();
    println!(
        "
The demo is up and keeps running until you stop it (about {rss_mb} MB of memory, on loopback):
  {procs}
Try it yourself:
  export KUBECONFIG={kubeconfig}
  alias kubectl={kubectl}
  kubectl -n {NS} patch ch {POD} --type merge -p '{{\"spec\":{{\"desire\":\"Hibernate\"}}}}'
  kubectl -n {NS} get ch -w
  curl -s http://127.0.0.1:{admin_port}/metrics | grep ^cocoon_hibernation
Logs: {d}/{SERVER}.log, {d}/{SIMULATOR}.log
Stop everything with: make demo-down"
    );
    Ok(())
}

/// Kept while it still chains to this cluster's CA (`make demo` again without
/// `make demo-down`); issued again otherwise (certs/certs.sh).
fn webhook_certificate(dir: &Path, ca_cert: &Path) -> Result<()> {
    let certs = repo_root()?.join("certs/certs.sh");
    let ca_dir = ca_cert.parent().unwrap_or(Path::new("."));
    let (reader, writer) = std::io::pipe().map_err(|e| Error(format!("pipe: {e}")))?;
    let mut ensure = Command::new("bash");
    ensure
        .arg(&certs)
        .arg("ensure")
        .arg("--ca")
        .arg(ca_dir)
        .arg("--out")
        .arg(dir.join("tls"))
        .args([
            "--cn",
            "cocoon-hibernation-demo",
            "--ip",
            "127.0.0.1",
            "--dns",
            "localhost",
            "--days",
            "30",
        ])
        .stdout(
            writer
                .try_clone()
                .map_err(|e| Error(format!("pipe: {e}")))?,
        )
        .stderr(writer);
    let mut child = ensure
        .spawn()
        .map_err(|e| Error(format!("could not start certs/certs.sh: {e}")))?;
    drop(ensure);
    let mut text = String::new();
    let _ = (&reader).read_to_string(&mut text);
    for line in text.lines() {
        println!("     {line}");
    }
    let ok = child.wait().is_ok_and(|s| s.success());
    if !ok {
        return fail("certs/certs.sh ensure failed");
    }
    let mut check = Command::new("bash");
    check
        .arg(&certs)
        .arg("check")
        .arg("--ca")
        .arg(ca_dir)
        .arg("--cert")
        .arg(dir.join("tls.crt"))
        .args(["--ip", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd::run(&mut check).or_else(|_| {
        fail(format!(
            "the webhook certificate {} does not chain to {}",
            dir.join("tls.crt").display(),
            ca_cert.display()
        ))
    })
}

/// Fails with the end of its log when the server or the simulator has exited.
fn both_alive(daemons: &Daemons) -> Result<()> {
    for name in [SERVER, SIMULATOR] {
        if daemons.pid(name).is_none() {
            let log = daemons.log(name);
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("---- last lines of {}:", log.display());
            for line in &lines[lines.len().saturating_sub(20)..] {
                eprintln!("{line}");
            }
            return fail(format!("{name} exited; see {}", log.display()));
        }
    }
    Ok(())
}

/// Ready means: our own server process is alive, and it answers /readyz on its port. A
/// server that cannot bind its port exits, so another program there cannot fool this;
/// with `ss`, the port is checked to be the server's own.
fn wait_ready(daemons: &Daemons, admin_port: u16, alive: &dyn Fn() -> Result<()>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(admin_port) {
        alive()?;
        if interrupted() {
            return fail("interrupted");
        }
        if Instant::now() > deadline {
            return fail(format!(
                "the server (pid {}) is not ready after 60s; see {}",
                daemons.pid(SERVER).unwrap_or_default(),
                daemons.log(SERVER).display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    alive()?;
    let pid = daemons.pid(SERVER).unwrap_or_default();
    let filter = format!("sport = :{admin_port}");
    let listening = cmd::output(Command::new("ss").args(["-Hltnp", &filter]));
    if listening.is_ok_and(|l| !l.contains(&format!("pid={pid},"))) {
        return fail(format!(
            "127.0.0.1:{admin_port} is not served by our server (pid {pid})"
        ));
    }
    Ok(())
}

/// GET /readyz answers 200.
fn ready(port: u16) -> bool {
    let addr = (Ipv4Addr::LOCALHOST, port).into();
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    let request = "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    conn.write_all(request.as_bytes()).is_ok()
        && conn.read_exact(&mut head).is_ok()
        && head.ends_with(b" 200")
}

fn webhook_config(port: u16, ca_cert: &Path) -> Result<String> {
    let ca_b64 = cmd::output(Command::new("base64").arg("-w0").arg(ca_cert))?;
    Ok(format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: cocoon-hibernation-demo
webhooks:
  - name: validate.cocoonhibernation.cocoonstack.io
    admissionReviewVersions: [\"v1\"]
    sideEffects: None
    failurePolicy: Fail
    matchPolicy: Equivalent
    timeoutSeconds: 5
    clientConfig:
      url: https://127.0.0.1:{port}/validate-cocoonhibernation
      caBundle: {ca_b64}
    namespaceSelector:
      matchExpressions:
        - {{ key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system] }}
    rules:
      - apiGroups: [cocoonset.cocoonstack.io]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [cocoonhibernations]
"
    ))
}

/// `cargo xtask demo-down` (`make demo-down`): stops what either demo started; the logs stay.
pub fn down() -> Result<()> {
    let dir = demo_dir()?;
    let daemons = Daemons { dir: dir.clone() };
    let cluster_dir = dir.join("cluster");
    let node_dir = dir.join("node-cluster");
    let pid_files = daemon::pid_files(&[dir.clone(), cluster_dir.clone(), node_dir.clone()]);
    let (procs, _) = daemon::running(&pid_files);
    daemons.stop(SIMULATOR);
    daemons.stop(SERVER);
    if cluster_dir.is_dir() {
        control_plane::down(Some(&cluster_dir), false)?;
    }
    // `make demo NODE=1` shares this directory and this command.
    if node_dir.is_dir() {
        control_plane::down(Some(&node_dir), true)?;
    }
    // The webhook certificate goes with the cluster's CA that signed it; the next
    // `make demo` issues a new one.
    for f in ["ports", "tls.crt", "tls.key"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let d = dir.display();
    if procs == "nothing" {
        say(&format!(
            "nothing of the demo was running (logs kept in {d})"
        ));
    } else {
        say(&format!(
            "demo stopped: {procs}; nothing of it runs now (logs kept in {d})"
        ));
    }
    Ok(())
}
