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

/// The repository's root (charts/, hack/, tests/data/).
pub fn repo_root() -> PathBuf {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR"));
    kit.parent()
        .map_or_else(|| kit.join(".."), Path::to_path_buf)
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
