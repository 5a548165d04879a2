//! `kubectl cocoon`, the kubectl plugin (binary `kubectl-cocoon`): hibernate and wake
//! pods through their CocoonHibernation, wait with progress, show status with reasons
//! and ages, and audit the registry for orphaned snapshot tags.
//!
//! Each file has one job: `cli` (flags), `connect` (kubeconfig), `resources` and `view`
//! (reading CRs leniently), `change` (create or flip a desire), `wait_verdict` (when a wait
//! is over, pure), `wait` (the watch), `terminal` (the wait line, say, warn), `status`, `idle` (its
//! idle columns) and `table` (the status table), `audit` (orphan decisions, pure), `claims` (who holds
//! which VM), `install` (the install audited, and whether its base is its own), `confirm`, `orphans` (the audit command), `schedule` (schedules' next boundaries),
//! `error` (messages, exit codes).
//!
//! It links the API (cocoon-api), the pure calendar (cocoon-core) and the OCI client
//! (cocoon-oci), never the operator or its metrics.
#![forbid(unsafe_code)]

mod audit;
mod change;
mod claims;
mod cli;
mod confirm;
mod connect;
mod error;
mod idle;
mod install;
mod keepalive;
mod orphans;
mod resources;
mod schedule;
mod status;
mod table;
mod terminal;
mod view;
mod wait;
mod wait_verdict;

pub use cli::Cli;
pub use error::{PluginError, exit};
pub use terminal::quiet_reports;

use cli::Command;
use wait_verdict::Want;

/// Runs one command line.
pub async fn run(cli: Cli) -> Result<(), PluginError> {
    let conn = connect::connect(&cli.kube).await?;
    let result = match &cli.command {
        Command::Hibernate(args) => change::run(&conn, Want::Hibernate, args).await,
        Command::Wake(args) => change::run(&conn, Want::Wake, args).await,
        Command::Status(args) => status::run(&conn, args).await,
        Command::Orphans(args) => orphans::run(&conn, args).await,
        Command::Schedule(args) => schedule::run(&conn, args).await,
        Command::Keepalive(args) => keepalive::run(&conn, args).await,
    };
    result.map_err(|e| e.at_server(&conn.server))
}
