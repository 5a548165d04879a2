//! The test kit: what the root crate's tests, the benches, the soak and the demo's vk
//! simulator share. One crate, built once, instead of the same sources compiled into
//! every test binary.
//!
//! The test binaries (`tests/unit`, `tests/e2e`, ...) are listed, with what runs each, in
//! one place: docs/architecture.md, "The test binaries". `tests/e2e_alone`'s tests each
//! hold `alone()` of that binary first.
//!
//! A new test file is a module of one of them: add `mod my_area;` to its `main.rs` and
//! start the file with `use testkit::{cluster, env, product, vk_sim};` (what it needs).
//! From a `#[path]`-era file: `mod x;` includes become `use testkit::x;`,
//! `product::BIN` is [`product::bin()`], `include_str!("data/..")` is `"../data/.."`.
//! All tests of a binary share one process: state that must not leak between tests lives
//! in the test (namespaces from [`cluster::Cluster::fresh_namespace`], ports from
//! [`ports::free_port`]), never in environment variables set at run time.
//!
//! Modules:
//! - [`cluster`]: the shared control plane ([`cluster::cluster()`]), admin and
//!   per-identity clients, certificates signed by its CA, the audit log;
//! - [`product`]: runs the real `cocoon-hibernation` binary ([`product::Product`],
//!   [`product::ProductOptions`]) under the chart's RBAC, installs the CRD and webhook,
//!   polling helpers ([`product::eventually`]);
//! - [`env`]: one e2e test's world in one call ([`env::setup`]): namespace, product and
//!   simulator;
//! - [`vk_sim`]: the vk-cocoon simulator (also `examples/vk_cocoon_simulator.rs`), and
//!   [`virtual_node`]: the Node it registers on a cluster with a real scheduler;
//! - [`registry_server`]: a private `docker-registry` process (auth, TLS, delete switch);
//! - proxies between the product and the world: [`tcp_proxy`] (cut, hold),
//!   [`tls_proxy`] and [`api_tap`] (the apiserver, request by request), [`slow_proxy`]
//!   (a registry that stalls);
//! - [`wake_proxy`]: the wake proxy binary under its Q8 Role, and the idle policies' CRD;
//! - [`lease_log`]: every Lease holder change, for the leader tests;
//! - [`ports`]: loopback ports unique within the process;
//! - [`bench`]: the system benchmark (`make bench`, its short run in the e2e binary) with
//!   its world, load generator, audit counts and report (also the soak's report).
#![forbid(unsafe_code)]

/// The harness (`cargo xtask`): the soak starts and stops its control plane through it.
pub use xtask;

pub mod api_tap;
pub mod bench;
pub mod cluster;
pub mod env;
pub mod lease_log;
pub mod ports;
pub mod product;
pub mod registry_server;
pub mod slow_proxy;
pub mod tcp_proxy;
pub mod tls_proxy;
pub mod virtual_node;
pub mod vk_sim;
pub mod wake_proxy;

use std::path::{Path, PathBuf};

/// The repository's root (charts/, hack/, tests/data/), found at run time. One target
/// dir serves every checkout (the Makefile's cache), and cargo does not rebuild a test
/// that moved, so `env!("CARGO_MANIFEST_DIR")` may name another checkout, or one gone.
/// Cargo sets the variable when it runs a test; the harness runs binaries from the root.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::current_dir().ok())
        .find_map(|start| workspace_of(&start))
        .unwrap_or_else(|| {
            let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
            kit.parent()
                .map_or_else(|| kit.join(".."), Path::to_path_buf)
        })
}

/// The workspace `dir` is in: the nearest ancestor with a lock file and this kit.
fn workspace_of(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join("Cargo.lock").is_file() && d.join("testkit/Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// A binary of the root crate that cargo built for the running test, bench or soak.
/// `CARGO_BIN_EXE_<name>` exists only when compiling the root crate's own test targets,
/// so it is found the way cargo lays it out: `<target>/<profile>/<name>`, beside the
/// `deps/` (tests, benches) or `examples/` directory the running executable is in.
pub fn cargo_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current exe: {e}"));
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// The kubectl plugin (crates/kubectl-cocoon), built for the running test. It is another
/// package's binary, which cargo builds for the root crate's tests only when asked (no
/// `CARGO_BIN_EXE_` names it), so the first call asks the cargo running the tests, in the
/// same target directory, and returns the executable cargo reports. It names the running
/// test target too (`--test e2e`): the same selection resolves the same features, so
/// every dependency is reused and only the plugin is built (`-p kubectl-cocoon` alone
/// would resolve fewer features and rebuild the dependency tree). A failed build fails
/// the test.
pub fn plugin_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(build_plugin)
}

fn build_plugin() -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(&cargo);
    command.args(["build", "--locked", "--bin", "kubectl-cocoon"]);
    if let Some(test) = running_test_target() {
        command.args(["--test", &test]);
    }
    // What cargo set for this test's own package: build scripts that watch these (ring's
    // does) would rerun, and the next outer build would rerun them back.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_for_us = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR";
        if set_for_us {
            command.env_remove(key.as_ref());
        }
    }
    let out = command
        .arg("--message-format=json-render-diagnostics")
        .current_dir(repo_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {cargo:?} build --bin kubectl-cocoon: {e}"));
    assert!(
        out.status.success(),
        "cargo build --bin kubectl-cocoon failed ({})",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "kubectl-cocoon")
        .find_map(|m| m["executable"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("cargo build --bin kubectl-cocoon reported no executable"))
}

/// The test target running now, from its executable's name (`<target>-<hash>` in `deps/`).
fn running_test_target() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let stem = exe.file_stem()?.to_str()?;
    let (name, hash) = stem.rsplit_once('-')?;
    (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| name.to_owned())
}
