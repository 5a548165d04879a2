//! The end-to-end test binary: the real product against the shared local control plane
//! (`cargo xtask cluster-up`, or the env file named by `COCOON_CLUSTER_ENV`) and a real
//! registry. One module per area; every test works in namespaces of its own, so the
//! tests share the process and its thread pool. A test whose product watches every
//! namespace, or whose load would starve the others' timeouts, goes to `tests/e2e_alone`.

mod admission;
mod cache;
mod events;
mod harness_smoke;
mod idle;
mod idle_status;
mod leader;
mod lifecycle;
mod partition;
mod plugin;
mod proxy;
mod registry_stall;
mod safety;
mod schedule;
mod selector;
mod status;
