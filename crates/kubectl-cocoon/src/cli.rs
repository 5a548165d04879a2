//! The command line of `kubectl cocoon`. Parsing only; no I/O.

use clap::{Args, Parser, Subcommand, ValueEnum};
use cocoon_api::flags::parse_duration;
use cocoon_oci::RegistryArgs;
use std::path::PathBuf;
use std::time::Duration;

const ABOUT: &str =
    "Hibernate and wake VM-backed pods, see why one is stuck, and find orphaned snapshots";

const LONG_ABOUT: &str = "\
Hibernate and wake VM-backed pods through cocoon-hibernation, see why one is stuck, and
find orphaned snapshots.

A CocoonHibernation (short name `ch`) asks cocoon-hibernation to hibernate or wake one
pod's VM. This plugin creates it (named after the pod), changes its desire, waits for
the result and shows its status. kubectl runs it as `kubectl cocoon` once `kubectl-cocoon`
is on your PATH: `make plugin`, `kubectl krew install`, or a copy of
/usr/local/bin/kubectl-cocoon from the cocoon-hibernation image (docs/install.md).

It uses your kubeconfig like kubectl: --kubeconfig or $KUBECONFIG, the current context
or --context, and the context's namespace unless -n is given.";

const AFTER_HELP: &str = "\
Examples:
  kubectl cocoon hibernate web-0 --wait       # hibernate pod web-0, wait for Hibernated
  kubectl cocoon wake web-0 --wait -n shop    # wake it again, in namespace shop
  kubectl cocoon status -A                    # every CocoonHibernation, with reasons
  kubectl cocoon orphans                      # snapshot tags no CocoonHibernation holds

Exit status: 0 done; 1 failed (the CocoonHibernation went Failed, or a call failed);
2 bad usage or settings; 3 --wait timed out.";

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-cocoon",
    bin_name = "kubectl cocoon",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the cluster is, as kubectl finds it.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeArgs {
    /// Path to the kubeconfig file [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: the current context].
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace [default: the context's namespace, else `default`].
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hibernate a pod's VM: create its CocoonHibernation, or set desire Hibernate.
    #[command(long_about = "\
Hibernate a pod's VM: create the CocoonHibernation named after the pod with desire
Hibernate, or set the desire of the existing one to Hibernate. vk-cocoon then snapshots
the VM into the registry and stops it; the phase goes Hibernating, then Hibernated.

With --wait, shows the phase and what it waits for as they change, and exits 0 once the
CocoonHibernation is Hibernated and Ready, 1 if it goes Failed (with the reason), 3 on
--timeout.")]
    Hibernate(ChangeArgs),
    /// Wake a pod's VM: create its CocoonHibernation, or set desire Wake.
    #[command(long_about = "\
Wake a pod's VM: set the desire of the pod's CocoonHibernation to Wake (or create one
with desire Wake). vk-cocoon then restores the VM from its snapshot; the phase goes
Waking, then Active, and the snapshot tag is deleted from the registry.

With --wait, shows the phase and what it waits for as they change, and exits 0 once the
CocoonHibernation is Active and Ready, 1 if it goes Failed (with the reason), 3 on
--timeout.")]
    Wake(ChangeArgs),
    /// Show CocoonHibernations: phase, what they wait for, and since when.
    #[command(long_about = "\
Show CocoonHibernations in a table: the pod, the desire, the phase, the reason (what a
transition waits for, or why it failed), how long it has been in that state, the VM and
the latest message. Give POD to show only that pod's.")]
    Status(StatusArgs),
    /// List `:hibernate` snapshot tags that no CocoonHibernation holds; optionally delete them.
    #[command(long_about = "\
List the `<vm>:hibernate` snapshot tags in the registry that no CocoonHibernation holds:
no CocoonHibernation in any namespace has that VM in status.vmName or targets a pod that
names that VM. It reads the registry's catalog, so it needs a registry that offers one
(GET /v2/_catalog) and credentials allowed to read it.

The registry base is read from the install (the ConfigMap its chart writes, found by its
label; --install names it when there are several), never taken from a flag: a
--registry-base given must match it. The other registry settings (credentials, CA,
plain HTTP) are the server's flags or COCOON_REGISTRY_* variables. A base belongs to one
install: when it holds another install's owner marker (another cluster or release uses
it), or none of this install's, the audit lists but deletes nothing.

Nothing is deleted unless --delete is given. Then each tag is checked again just before
its delete (no CocoonHibernation appeared, the tag was not pushed again), and a tag
whose VM is still named by a pod is kept: it may be that VM's only copy. The delete is
the server's own: it deletes the manifest digest the audit saw, never by tag, and never
when another tag shares that manifest.")]
    Orphans(OrphansArgs),
    /// Show CocoonHibernationSchedules: when each pod they drive next sleeps and wakes.
    #[command(long_about = "\
Show the CocoonHibernationSchedules (short name `chs`) of the namespace, or the one named,
and for each pod a schedule drives: its desire and phase, when it next hibernates and
next wakes by the calendar, and whether a manual override holds it (K5).")]
    Schedule(ScheduleArgs),
    /// Keep a pod awake: mark it busy for a while on its activity Lease (idle policies).
    #[command(long_about = "\
Mark a pod busy until --for from now on its activity Lease (cocoon-activity-POD), and
report activity now: no CocoonIdlePolicy hibernates it before that time plus its
idleAfter. Creates the Lease when no idle policy has made it yet.")]
    Keepalive(KeepaliveArgs),
}

#[derive(Args, Debug, Clone)]
pub struct KeepaliveArgs {
    /// The pod to keep awake.
    pub pod: String,
    /// How long it counts as busy, e.g. 90m, 2h.
    #[arg(long = "for", value_parser = parse_duration, value_name = "DURATION")]
    pub r#for: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct ScheduleArgs {
    /// Only this schedule.
    pub name: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ChangeArgs {
    /// The pod whose VM to hibernate or wake (the CocoonHibernation has its name).
    pub pod: String,
    /// Wait for the result, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 90s, 10m.
    #[arg(long, value_parser = parse_duration, default_value = "10m", value_name = "DURATION", requires = "wait")]
    pub timeout: Duration,
    /// A manual override of a schedule (K5) that ends at this time: an RFC 3339 instant
    /// (`2026-06-12T18:00:00Z`) or a duration from now (`2h`). Without it, the override
    /// lasts until the schedule's next boundary.
    #[arg(long, value_parser = parse_until, value_name = "TIME")]
    pub until: Option<jiff::Timestamp>,
}

/// `--until`: an instant, or a duration from now.
fn parse_until(raw: &str) -> Result<jiff::Timestamp, String> {
    if let Ok(at) = raw.parse::<jiff::Timestamp>() {
        return Ok(at);
    }
    let d = parse_duration(raw).map_err(|_| {
        format!("{raw:?} is neither an RFC 3339 time (2026-06-12T18:00:00Z) nor a duration (2h)")
    })?;
    let d = jiff::SignedDuration::try_from(d).map_err(|e| e.to_string())?;
    jiff::Timestamp::now()
        .checked_add(d)
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Only the CocoonHibernation of this pod.
    pub pod: Option<String>,
    /// List CocoonHibernations in every namespace.
    #[arg(short = 'A', long, conflicts_with = "pod")]
    pub all_namespaces: bool,
    /// `wide` adds the snapshot digest and the attempt count.
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<Output>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Wide,
}

#[derive(Args, Debug, Clone)]
pub struct OrphansArgs {
    /// Delete the orphaned tags (asks for confirmation on a terminal).
    #[arg(long)]
    pub delete: bool,
    /// With --delete: do not ask. Needed when stdin is not a terminal.
    #[arg(long, short = 'y', requires = "delete")]
    pub yes: bool,
    /// The install to audit: its ConfigMap (labelled hibernation.cocoonstack.io/install),
    /// as NAMESPACE/NAME. Needed only when the cluster has more than one install.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub install: Option<String>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-cocoon").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn kubectl_style_flags_go_anywhere() {
        let cli = parse(&[
            "hibernate",
            "web-0",
            "-n",
            "shop",
            "--context",
            "dev",
            "--wait",
        ])
        .unwrap();
        assert_eq!(cli.kube.namespace.as_deref(), Some("shop"));
        assert_eq!(cli.kube.context.as_deref(), Some("dev"));
        let Command::Hibernate(args) = cli.command else {
            panic!("not hibernate")
        };
        assert!(args.wait);
        assert_eq!(args.timeout, Duration::from_secs(600));
        let cli = parse(&[
            "--kubeconfig",
            "/k",
            "wake",
            "w",
            "--wait",
            "--timeout",
            "90s",
        ])
        .unwrap();
        assert_eq!(cli.kube.kubeconfig, Some(PathBuf::from("/k")));
        assert!(
            matches!(cli.command, Command::Wake(ChangeArgs { timeout, .. }) if timeout == Duration::from_secs(90))
        );
    }

    #[test]
    fn refusals_are_clear() {
        assert!(parse(&["hibernate"]).is_err(), "a pod is required");
        assert!(parse(&["status", "web-0", "-A"]).is_err());
        assert!(
            parse(&["orphans", "--yes"]).is_err(),
            "--yes only with --delete"
        );
        assert!(parse(&["wake", "w", "--timeout", "soon"]).is_err());
        assert!(
            parse(&["wake", "w", "--timeout", "5s"]).is_err(),
            "--timeout only with --wait"
        );
        assert!(parse(&["status", "-o", "wide"]).is_ok());
        assert!(parse(&["wake", "w", "--until", "whenever"]).is_err());
    }

    /// K5: `wake --until` takes an instant or a duration from now.
    #[test]
    fn k5_wake_until_reads_an_instant_or_a_duration() {
        let cli = parse(&["wake", "w", "--until", "2030-01-07T18:00:00Z"]).unwrap();
        let Command::Wake(args) = cli.command else {
            panic!("not wake")
        };
        assert_eq!(args.until, Some("2030-01-07T18:00:00Z".parse().unwrap()));
        let cli = parse(&["wake", "w", "--until", "2h"]).unwrap();
        let Command::Wake(args) = cli.command else {
            panic!("not wake")
        };
        let left = args.until.unwrap().duration_since(jiff::Timestamp::now());
        assert!(left > jiff::SignedDuration::from_mins(110), "{left}");
        assert!(matches!(
            parse(&["schedule", "office"]).unwrap().command,
            Command::Schedule(ScheduleArgs { name: Some(_) })
        ));
    }
}
