//! The kubectl plugin (`kubectl-cocoon`) end to end: the real plugin binary against the
//! real control plane, with the real server (webhook included), the vk-cocoon simulator
//! and a real registry, and once through the real `kubectl` to prove plugin discovery.
//!
//! Every test keeps its snapshots under its own registry prefix (`<registry>/<ns>`), so
//! the orphan audit, which reads the whole catalog, sees and deletes only this test's
//! tags even while other tests share the registry.

use testkit::cluster;
use testkit::env;
use testkit::product;
use testkit::registry_server;
use testkit::vk_sim;

use cocoon_hibernation::api::cluster::cluster_id;
use cocoon_hibernation::api::{Desire, Phase};
use cocoon_hibernation::registry::{
    InstallId, RegistryAuth, RegistryClient, RegistryConfig, RegistryError,
};
use env::{Env, LONG, Setup, setup, tag_exists};
use product::{eventually, wait_phase};
use registry_server::{RegistryOptions, RegistryServer, install_crypto_provider};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The plugin binary: another package's, which the test kit builds on first use.
fn plugin_bin() -> &'static str {
    testkit::plugin_bin()
}
/// No plugin run in these tests takes this long; one that does is stuck.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The registry settings a user may have in the environment would leak into a run.
const REGISTRY_ENV: [&str; 8] = [
    "COCOON_REGISTRY_BASE",
    "COCOON_REGISTRY_PLAIN_HTTP",
    "COCOON_REGISTRY_DOCKER_CONFIG",
    "COCOON_REGISTRY_USERNAME",
    "COCOON_REGISTRY_PASSWORD",
    "COCOON_REGISTRY_TOKEN_FILE",
    "COCOON_REGISTRY_CA_FILE",
    "COCOON_REGISTRY_TIMEOUT",
];

pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `command` (stdin closed, so never a terminal) to its end, off the async runtime.
async fn run(command: Command) -> Run {
    run_with(command, &[]).await
}

/// [`run`] with these environment variables, set after the registry ones are cleared.
async fn run_with(command: Command, vars: &[(&str, &str)]) -> Run {
    run_full(command, vars, None).await
}

/// [`run_with`], with `input` written to stdin (instead of a closed stdin).
async fn run_full(mut command: Command, vars: &[(&str, &str)], input: Option<&str>) -> Run {
    let bin = plugin_bin();
    assert!(
        Path::new(bin).exists(),
        "the plugin binary is missing at {bin}"
    );
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = input.map(str::to_string);
    for var in REGISTRY_ENV {
        command.env_remove(var);
    }
    command.envs(vars.iter().copied());
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {:?}: {e} (`script` comes from util-linux)",
                command.get_program()
            )
        });
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write as _;
            stdin
                .write_all(text.as_bytes())
                .expect("write the plugin's stdin");
        }
        // The output is read while the plugin runs: a table larger than the pipe's buffer
        // would otherwise block it until the limit. A watchdog kills it at the limit.
        let pid = child.id();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let late = finished.recv_timeout(RUN_LIMIT).is_err();
            if late {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            late
        });
        let out = child.wait_with_output().expect("collect the plugin");
        let _ = done.send(());
        if watchdog.join().unwrap_or(true) {
            panic!(
                "the plugin ran longer than {RUN_LIMIT:?}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .expect("plugin runner")
}

/// `kubectl-cocoon ARGS --kubeconfig <cluster> -n <ns>`, KUBECONFIG unset.
pub(crate) async fn plugin(env: &Env, args: &[&str]) -> Run {
    let mut command = Command::new(plugin_bin());
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster::cluster().kubeconfig)
        .args(["-n", &env.ns])
        .env_remove("KUBECONFIG");
    run(command).await
}

/// A setup whose server and simulator keep snapshots under `<registry>/<prefix>`, a
/// prefix of this test's own; returns it with the env (whose `registry` is that base).
async fn setup_with_prefix(name: &str, mut s: Setup) -> (Env, String) {
    let prefix = format!("{name}-{:08x}", cluster::random_u64() & 0xffff_ffff);
    s.registry = Some(format!("{}/{prefix}", cluster::cluster().registry));
    (setup(name, s).await, prefix)
}

/// A client of the server's own kind on `base` (plain http, anonymous), for the tests'
/// look at the owner markers.
fn registry_client(base: &str) -> RegistryClient {
    install_crypto_provider();
    let config = RegistryConfig {
        base: base.to_string(),
        plain_http: true,
        auth: RegistryAuth::Anonymous,
        extra_ca_pems: vec![],
        timeout: Duration::from_secs(5),
    };
    RegistryClient::new(config).expect("registry client")
}

/// Applies the chart's install ConfigMap (S10) of release `release` in the test
/// namespace, naming `base`; returns its `namespace/name`, as `--install` takes it.
async fn install_config_map(env: &Env, release: &str, base: &str) -> String {
    let set = format!("registry.base={base}");
    let only = ["--show-only", "templates/install.yaml"];
    let args = [&["--set", set.as_str()][..], &only[..]].concat();
    let docs = product::helm_template(cluster::cluster(), release, &env.ns, &args);
    assert_eq!(docs.len(), 1, "one install ConfigMap: {docs:?}");
    product::apply_docs(&env.client, &docs).await;
    let name = docs[0]["metadata"]["name"].as_str().expect("its name");
    format!("{}/{name}", env.ns)
}

/// Plays the chart's install for this test's server (S10): its install ConfigMap for
/// release `release` on the server's base, the server restarted under that release's name
/// (as the chart runs it), and its owner marker written. Returns `--install`'s value, the
/// install's identity and a registry client on the base.
async fn use_install(env: &mut Env, release: &str) -> (String, InstallId, RegistryClient) {
    let install = install_config_map(env, release, &env.registry).await;
    let name = format!("{}/{release}", env.ns);
    env.product
        .restart_with(&format!("--install-name={name}"))
        .await;
    let ours = InstallId {
        cluster: cluster_id(&env.client).await.expect("kube-system's uid"),
        release: name,
    };
    let registry = registry_client(&env.registry);
    eventually("the server's owner marker", LONG, || async {
        let markers = registry.owner_markers(&ours).await.ok()?;
        markers.iter().any(|m| m.tag == ours.tag()).then_some(())
    })
    .await;
    (install, ours, registry)
}

/// A3 H3 W2 (through the plugin): `hibernate --wait` creates the CR named after the pod,
/// shows each phase as it comes and exits 0 at Hibernated; `status` shows it with its
/// reason, age and VM; `wake --wait`, run by the real kubectl as a plugin found on PATH
/// through $KUBECONFIG, exits 0 at Active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_plugin_hibernate_and_wake_with_wait_and_status() {
    let env = setup(
        "plugin-round",
        Setup {
            hibernate_delay: Duration::from_secs(2),
            wake_delay: Duration::from_secs(2),
            ..Setup::default()
        },
    )
    .await;
    env.pod("web-0").await;
    let vm = env.vm("web-0");

    let out = plugin(&env, &["hibernate", "web-0", "--wait", "--timeout", "60s"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "cocoonhibernation/web-0 created in namespace {}",
            env.ns
        )),
        "{out}"
    );
    // Not a terminal: one plain line per change, the transition included.
    assert!(
        out.stdout
            .lines()
            .any(|l| l.contains("  web-0  Hibernating")),
        "{out}"
    );
    assert!(
        out.stdout.contains("cocoonhibernation/web-0 is Hibernated"),
        "{out}"
    );
    let cr = env.crs.get("web-0").await.expect("the CR exists");
    assert_eq!(cr.spec.pod_ref.name, "web-0");
    assert_eq!(cr.spec.desire, Desire::Hibernate);
    assert_eq!(product::phase(&cr), Some(Phase::Hibernated));

    let out = plugin(&env, &["status"]).await;
    assert_eq!(out.code, 0, "{out}");
    let mut lines = out.stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "POD", "DESIRE", "PHASE", "REASON", "AGE", "VM", "MESSAGE"
        ],
        "{out}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        ["web-0", "web-0", "Hibernate", "Hibernated"],
        "{out}"
    );
    assert!(
        !row[4].is_empty() && row[5].ends_with('s'),
        "reason and age: {out}"
    );
    assert_eq!(row[6], vm, "{out}");

    let out = plugin(&env, &["status", "-A"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.starts_with("NAMESPACE"), "{out}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(&env.ns) && l.contains("Hibernated")),
        "{out}"
    );
    let out = plugin(&env, &["status", "no-such-pod"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr
            .contains("no CocoonHibernation for pod no-such-pod"),
        "{out}"
    );

    // Discovery: kubectl runs `kubectl-cocoon` from PATH, a plain copy of the binary.
    let cluster = cluster::cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(plugin_bin(), dir.path().join("kubectl-cocoon")).expect("install the plugin");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = cluster.bin_dir.join("kubectl");
    let mut list = Command::new(&kubectl);
    list.args(["plugin", "list"]).env("PATH", &path);
    let out = run(list).await;
    assert!(
        out.stdout
            .contains(&format!("{}/kubectl-cocoon", dir.path().display())),
        "kubectl plugin list: {out}"
    );
    let mut wake = Command::new(&kubectl);
    wake.args(["cocoon", "wake", "web-0", "--wait", "-n", &env.ns])
        .env("PATH", &path)
        .env("KUBECONFIG", &cluster.kubeconfig);
    let out = run(wake).await;
    assert_eq!(out.code, 0, "kubectl cocoon wake: {out}");
    assert!(
        out.stdout.contains("desire set to Wake (was Hibernate)"),
        "{out}"
    );
    assert!(
        out.stdout.lines().any(|l| l.contains("  web-0  Waking")),
        "{out}"
    );
    assert!(
        out.stdout.contains("cocoonhibernation/web-0 is Active"),
        "{out}"
    );
    let cr = env.crs.get("web-0").await.expect("the CR exists");
    assert_eq!(product::phase(&cr), Some(Phase::Active));
    assert_eq!(cr.spec.desire, Desire::Wake);

    // The same desire again changes nothing and is done at once.
    let out = plugin(&env, &["wake", "web-0", "--wait"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains("unchanged: desire is already Wake"),
        "{out}"
    );
    let out = plugin(&env, &["status", "web-0", "-o", "wide"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains("DIGEST") && out.stdout.contains("Active"),
        "{out}"
    );
}

/// F1 H5 (through the plugin): `--wait` exits 3 when its own timeout comes first (shown
/// on a terminal as one line redrawn in place), and 1 with the reason and message when
/// the CR goes Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_plugin_wait_ends_nonzero_on_timeout_and_on_failed() {
    let env = setup(
        "plugin-failed",
        Setup {
            hibernate_timeout: "5s",
            ..Setup::default()
        },
    )
    .await;
    env.pod("w-0").await;
    env.sim.knobs.set_never_complete(true);

    // On a terminal (a pty from `script`), one line redrawn in place.
    let kubeconfig = cluster::cluster().kubeconfig.display().to_string();
    let line = [
        plugin_bin(),
        "hibernate",
        "w-0",
        "--wait",
        "--timeout",
        "1s",
        "-n",
        &env.ns,
        "--kubeconfig",
        &kubeconfig,
    ]
    .map(|a| format!("'{a}'"))
    .join(" ");
    let mut script = Command::new("script");
    script
        .args(["-qefc", &line, "/dev/null"])
        .env_remove("KUBECONFIG");
    let out = run(script).await;
    assert_eq!(out.code, 3, "{out}");
    assert!(out.stdout.contains("\r\x1b[2Kw-0: Hibernating"), "{out}");
    assert!(
        out.stdout.contains(&format!(
            "timed out after 1s waiting for {}/w-0 to be Hibernated",
            env.ns
        )),
        "{out}"
    );

    let out = plugin(&env, &["hibernate", "w-0", "--wait", "--timeout", "60s"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stdout
            .contains("unchanged: desire is already Hibernate"),
        "{out}"
    );
    assert!(
        out.stderr.contains(&format!("{}/w-0 failed", env.ns)),
        "{out}"
    );
    assert!(
        out.stderr.contains("within 5s"),
        "the timeout is named: {out}"
    );
    assert!(
        out.stdout.lines().any(|l| l.contains("  w-0  Failed")),
        "{out}"
    );
}

/// G1 S2 (the orphan audit): a tag with no CR is listed; tags held by a CR, through its
/// status or through its pod in another namespace, are not; a tag whose VM a pod still
/// names is listed but kept; a repository outside the prefix is never looked at.
/// `--delete` without a terminal or `--yes` deletes nothing; `--delete --yes` deletes
/// only the orphan.
/// S10: on a base that holds this install's owner marker alone, the audit reads the base
/// from the install and works as before; a `--registry-base` that matches is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_g1_s2_s10_plugin_orphans_lists_and_deletes_only_the_orphan() {
    let (mut env, prefix) = setup_with_prefix("plugin-orphans", Setup::default()).await;
    let (install, _, _) = use_install(&mut env, "cocoon").await;
    let cluster = cluster::cluster();
    let registry_base = env.registry.clone();
    let push = |vm: String| {
        let base = registry_base.clone();
        async move {
            vk_sim::push_snapshot(&base, &vm, "staged")
                .await
                .unwrap_or_else(|e| panic!("push {vm}: {e}"));
        }
    };
    let has = |vm: String| {
        let prefix = prefix.clone();
        async move {
            tag_exists(&cluster.registry, &format!("{prefix}/{vm}"))
                .await
                .expect("registry reachable")
        }
    };

    // Held by a CR's status.vmName: a real hibernate.
    env.pod("held-0").await;
    let held = env.vm("held-0");
    product::create_cr(&env.crs, "held-0", "held-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "held-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert!(has(held.clone()).await);

    // Held through its pod: a CR in a namespace no server watches, so it has no status.
    let other = cluster
        .fresh_namespace(&env.client, "plugin-orphans-other")
        .await;
    let pending = format!("vm-{}-pending", env.ns);
    vk_sim::create_vm_pod(&env.client, &other, "p", &pending)
        .await
        .expect("create pod p");
    let other_crs = kube::Api::namespaced(env.client.clone(), &other);
    product::create_cr(&other_crs, "p", "p", Desire::Hibernate).await;
    push(pending.clone()).await;

    // Named by a pod, no CR: maybe the VM's only copy.
    let lone = format!("vm-{}-lone", env.ns);
    vk_sim::create_vm_pod(&env.client, &other, "lone", &lone)
        .await
        .expect("create pod lone");
    push(lone.clone()).await;

    // Nobody's.
    let orphan = format!("vm-{}-orphan", env.ns);
    push(orphan.clone()).await;
    // A sibling prefix (`<prefix>x`) is outside the base.
    let outside = format!("vm-{}-outside", env.ns);
    vk_sim::push_snapshot(
        &format!("{}/{prefix}x", cluster.registry),
        &outside,
        "outside",
    )
    .await
    .expect("push outside the prefix");

    let registry_flags = ["--install", install.as_str(), "--registry-plain-http"];
    let orphans = |extra: &'static [&'static str]| -> Vec<&str> {
        let mut args = vec!["orphans"];
        args.extend(registry_flags);
        args.extend(extra);
        args
    };
    let out = plugin(&env, &orphans(&[])).await;
    assert_eq!(out.code, 0, "{out}");
    let listed = |out: &Run, vm: &str| out.stdout.lines().any(|l| l.starts_with(&format!("{vm} ")));
    assert!(listed(&out, &orphan), "{out}");
    assert!(listed(&out, &lone), "{out}");
    assert!(out.stdout.contains("kept: pod"), "{out}");
    for vm in [&held, &pending, &outside] {
        assert!(!listed(&out, vm), "{vm} must not be listed: {out}");
    }
    assert!(out.stdout.contains("Nothing deleted"), "{out}");
    assert!(has(orphan.clone()).await);

    // No terminal to confirm on, no --yes: nothing happens.
    let out = plugin(&env, &orphans(&["--delete"])).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("stdin is not a terminal"), "{out}");
    assert!(has(orphan.clone()).await, "deleted without confirmation");

    // On a terminal it asks; anything but `yes` deletes nothing.
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let mut line = vec![
        plugin_bin(),
        "orphans",
        "--delete",
        "--kubeconfig",
        &kubeconfig,
    ];
    line.extend(registry_flags);
    let line = line
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = Command::new("script");
    script.args(["-qefc", &line, "/dev/null"]);
    let out = run_full(script, &[], Some("no\n")).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stdout.contains("Type yes to delete"), "{out}");
    assert!(
        out.stdout.contains("not confirmed; nothing deleted"),
        "{out}"
    );
    assert!(has(orphan.clone()).await, "deleted without a yes");

    // The registry settings come from the environment, as for the server; a base given
    // there only checks the install's.
    let mut command = Command::new(plugin_bin());
    command
        .args(["orphans", "--delete", "--yes", "--install", &install])
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig);
    let out = run_with(
        command,
        &[
            ("COCOON_REGISTRY_BASE", registry_base.as_str()),
            ("COCOON_REGISTRY_PLAIN_HTTP", "true"),
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout
            .contains(&format!("deleted {registry_base}/{orphan}:hibernate")),
        "{out}"
    );
    assert!(!has(orphan.clone()).await, "the orphan is deleted");
    for vm in [&held, &pending, &lone] {
        assert!(has(vm.clone()).await, "{vm} must be kept: {out}");
    }
    assert!(
        tag_exists(&cluster.registry, &format!("{prefix}x/{outside}"))
            .await
            .expect("registry reachable"),
        "outside the prefix"
    );

    let out = plugin(&env, &orphans(&[])).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(!listed(&out, &orphan) && listed(&out, &lone), "{out}");
}

/// The catalog the audit reads, through the server's own registry client: only
/// repositories one component below the prefix count; credentials work as for the
/// server's other calls, token auth included (a token for `registry:catalog:*`), and
/// refused ones are an error, never an empty (all clear) answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_catalog_lists_snapshot_repositories_with_basic_and_token_auth() {
    install_crypto_provider();
    for options in [
        RegistryOptions::default().with_basic_auth("audit", "s3cret"),
        RegistryOptions::default().with_token_auth("audit", "s3cret"),
    ] {
        let server = RegistryServer::launch(options.clone());
        for (repo, tag) in [
            ("snap/vm-a", "hibernate"),
            ("snap/vm-b", "latest"),
            ("snapx/vm-c", "hibernate"),
            ("snap/deep/vm-d", "hibernate"),
            ("vm-e", "hibernate"),
        ] {
            server.push_artifact(repo, tag).await;
        }
        let mut config = server.registry_config();
        config.base = format!("{}/snap", server.host());
        let client = RegistryClient::new(config).expect("client");
        let vms = client
            .catalog_vms()
            .await
            .unwrap_or_else(|e| panic!("{options:?}: {e}\nregistry log:\n{}", server.log()));
        assert_eq!(vms, ["vm-a", "vm-b"], "{options:?}");
        assert_eq!(
            client.snapshot_location("vm-a").unwrap(),
            format!("{}/snap/vm-a:hibernate", server.host())
        );

        let mut config = server.registry_config();
        config.auth = RegistryAuth::Basic("audit".into(), "wrong".into());
        let client = RegistryClient::new(config).expect("client");
        let err = client.catalog_vms().await.expect_err("refused credentials");
        assert!(
            matches!(err, RegistryError::Unauthorized { .. }),
            "{options:?}: {err}"
        );
    }
}

/// S10: on a registry base that another install also uses (another cluster's owner
/// marker is there), `orphans --delete --yes` deletes nothing, not even a tag no CR or
/// pod of this cluster names, and says why, naming that install; listing still works,
/// with the warning. A base without this install's marker (the install's server never
/// used it) is refused too, and so is a `--registry-base` other than the install's. The
/// server, checking its base at start-up, reports the shared base (log and metric).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_orphans_delete_refuses_a_base_another_install_marked() {
    let (mut env, prefix) = setup_with_prefix("plugin-s10", Setup::default()).await;
    let cluster = cluster::cluster();
    let (install, _, registry) = use_install(&mut env, "cocoon").await;
    let has = |repository: String| async move {
        tag_exists(&cluster.registry, &repository)
            .await
            .expect("registry reachable")
    };

    // Another cluster's install on the same base, and its snapshot.
    let another = InstallId {
        cluster: "0f1e2d3c-another-cluster".into(),
        release: "shop/cocoon-hibernation".into(),
    };
    registry.mark_owner(&another).await.expect("their marker");
    let theirs = format!("vm-{}-theirs", env.ns);
    vk_sim::push_snapshot(&env.registry, &theirs, "another cluster")
        .await
        .expect("push their snapshot");

    let out = plugin(
        &env,
        &[
            "orphans",
            "--delete",
            "--yes",
            "--install",
            &install,
            "--registry-plain-http",
        ],
    )
    .await;
    assert_eq!(out.code, 1, "{out}");
    for words in [
        "is shared",
        "0f1e2d3c-another-cluster",
        "shop/cocoon-hibernation",
        "Nothing deleted",
    ] {
        assert!(out.stderr.contains(words), "{words:?} missing: {out}");
    }
    assert!(!out.stdout.contains("deleted "), "{out}");
    assert!(
        has(format!("{prefix}/{theirs}")).await,
        "their snapshot was deleted: {out}"
    );

    let out = plugin(
        &env,
        &["orphans", "--install", &install, "--registry-plain-http"],
    )
    .await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stderr.contains("warning: ") && out.stderr.contains("is shared"),
        "{out}"
    );
    assert!(out.stdout.contains(&theirs), "{out}");

    // A mistyped base: refused before the registry is touched.
    let wrong = format!("{}x", env.registry);
    let out = plugin(
        &env,
        &[
            "orphans",
            "--delete",
            "--yes",
            "--install",
            &install,
            "--registry-base",
            &wrong,
            "--registry-plain-http",
        ],
    )
    .await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("is not the base of install"), "{out}");

    // An install whose base holds no marker of it: its server never used that base.
    let unmarked_base = format!("{}-unmarked", env.registry);
    let unmarked = install_config_map(&env, "unmarked", &unmarked_base).await;
    let stray = format!("vm-{}-stray", env.ns);
    vk_sim::push_snapshot(&unmarked_base, &stray, "no marker")
        .await
        .expect("push a stray snapshot");
    let out = plugin(
        &env,
        &[
            "orphans",
            "--delete",
            "--yes",
            "--install",
            &unmarked,
            "--registry-plain-http",
        ],
    )
    .await;
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("no owner marker"), "{out}");
    assert!(has(format!("{prefix}-unmarked/{stray}")).await, "{out}");
    assert!(has(format!("{prefix}/{theirs}")).await, "{out}");

    // The server sees the other marker when it checks its base (at start-up).
    env.product.restart().await;
    let product = &env.product;
    eventually("registry_base_shared = 1", LONG, || async {
        (product.metric("cocoon_hibernation_registry_base_shared") == 1.0).then_some(())
    })
    .await;
    assert!(
        product.log_text().contains("shared with another install"),
        "{}",
        product.log_text()
    );
}
