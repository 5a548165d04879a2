//! The end-to-end test binary: the real product against the shared local control plane
//! (`hack/cluster-up.sh`, or the env file named by `COCOON_CLUSTER_ENV`) and a real
//! registry. One module per area; every test works in namespaces of its own, so the
//! tests share the process and its thread pool. A test whose product watches every
//! namespace does not belong here (`tests/e2e_cluster_wide.rs`).

mod admission;
mod bench_short;
mod cache;
mod harness_smoke;
mod leader;
mod lifecycle;
mod partition;
mod plugin;
mod registry_stall;
mod safety;
mod status;
