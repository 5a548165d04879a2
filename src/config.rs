//! Command line and environment configuration (P3). Parsing and validation only; no I/O.

use crate::cache::list_mode::ListChoice;
use crate::cache::pod_wire::PodWatchEncoding;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::flags::parse_duration;
pub use crate::registry::RegistryArgs;

#[derive(Parser, Debug)]
#[command(
    name = "cocoon-hibernation",
    version,
    about = "Hibernates and wakes VM-backed pods"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print both CRDs, CocoonHibernation and CocoonHibernationSchedule, as one YAML stream.
    Crd,
    /// Run the webhook, controller and metrics server (the default).
    Run(Box<ServerArgs>),
    /// Run the wake proxy (Q1): HTTP and TCP in front of idle policies' VM pods.
    Proxy(Box<ProxyArgs>),
    /// Print the bounds of the duration flags the chart checks (its
    /// files/value-limits.yaml); with --samples, the sample values `cargo xtask chart-check`
    /// renders the chart with.
    #[command(hide = true)]
    ValueLimits {
        #[arg(long)]
        samples: bool,
    },
}

impl Cli {
    /// The server settings, whether given before or after `run`.
    pub fn server_args(self) -> ServerArgs {
        match self.command {
            Some(Command::Run(args)) => *args,
            _ => self.server,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Plain-HTTP address for /healthz, /readyz and /metrics.
    #[arg(long, env = "COCOON_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "COCOON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, in tracing's EnvFilter syntax.
    #[arg(long, env = "COCOON_LOG", default_value = "info")]
    pub log_filter: String,
    /// Timeout of every apiserver request except watches (connect, read, write), so a
    /// dead connection cannot hold a reconcile pass or a lease renewal.
    #[arg(long, env = "COCOON_APISERVER_TIMEOUT", value_parser = parse_duration, default_value = "15s")]
    pub apiserver_timeout: Duration,
    /// S8: /healthz fails, and this replica stops leading, when an informer has shown no
    /// progress (no event, bookmark, or watch or list reply) for this long. The apiserver
    /// sends a bookmark about once a minute, and each informer watch is asked to end after
    /// a third of this (at most 290 s, kube's default), so a healthy idle informer shows
    /// progress several times within the limit.
    #[arg(long, env = "COCOON_INFORMER_STALL_LIMIT", value_parser = parse_duration, default_value = "5m")]
    pub informer_stall_limit: Duration,
    /// Testing only, hidden: shifts the schedules' and idle policies' clock (K2, I3) by a
    /// signed duration such as `90m` or `-2h`, so an e2e reaches a boundary or an idle
    /// instant without waiting for it.
    #[arg(long, env = "COCOON_SCHEDULE_CLOCK_OFFSET", value_parser = crate::schedule::parse_offset, default_value = "0s", hide = true)]
    pub schedule_clock_offset: jiff::SignedDuration,
    /// S10: this install's name in the registry's owner marker, `<namespace>/<release>`
    /// (the chart sets it). Without it the base is not marked, and the orphan audit
    /// refuses to delete on it.
    #[arg(long, env = "COCOON_INSTALL_NAME")]
    pub install_name: Option<String>,
    /// How long SIGTERM waits for in-flight admission requests.
    #[arg(long, env = "COCOON_SHUTDOWN_GRACE", value_parser = parse_duration, default_value = "20s")]
    pub shutdown_grace: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct WebhookArgs {
    /// HTTPS address of the admission webhook.
    #[arg(long, env = "COCOON_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,
    /// Serving certificate (PEM); re-read when it changes.
    #[arg(
        long,
        env = "COCOON_TLS_CERT_FILE",
        default_value = "/etc/cocoon-hibernation/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,
    /// Serving key (PEM); re-read when it changes.
    #[arg(
        long,
        env = "COCOON_TLS_KEY_FILE",
        default_value = "/etc/cocoon-hibernation/tls/tls.key"
    )]
    pub tls_key_file: PathBuf,
    /// How often the certificate files are checked for changes.
    #[arg(long, env = "COCOON_TLS_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "5s")]
    pub tls_reload_interval: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Reconcile workers.
    #[arg(long, env = "COCOON_CONCURRENCY", default_value_t = 4)]
    pub concurrency: i64,
    /// Budget for a hibernate, from entering Hibernating.
    #[arg(long, env = "COCOON_HIBERNATE_TIMEOUT", value_parser = parse_duration, default_value = "3m")]
    pub hibernate_timeout: Duration,
    /// Budget for a wake, from entering Waking.
    #[arg(long, env = "COCOON_WAKE_TIMEOUT", value_parser = parse_duration, default_value = "5m")]
    pub wake_timeout: Duration,
    /// First wait after the registry refuses a tag delete for good; it doubles up
    /// to ten times this.
    #[arg(long, env = "COCOON_REFUSED_DELETE_BACKOFF", value_parser = parse_duration, default_value = "1m")]
    pub refused_delete_backoff: Duration,
    /// Only watch this namespace; all namespaces when empty.
    #[arg(long, env = "COCOON_WATCH_NAMESPACE", default_value = "")]
    pub watch_namespace: String,
    /// Label selector narrowing the pods cached; empty caches all pods.
    #[arg(long, env = "COCOON_POD_SELECTOR", default_value = "")]
    pub pod_selector: String,
    /// How the caches list: `auto` streams (WatchList) where the apiserver answers a
    /// probe with a streamed list, else lists in pages; `stream` and `pages` force one.
    #[arg(long, env = "COCOON_INITIAL_LIST", value_enum, default_value_t = ListChoice::Auto)]
    pub initial_list: ListChoice,
    /// How pod watches travel: `protobuf` (a fraction of the apiserver's JSON cost on a
    /// large list; falls back to JSON for good if a reply cannot be read) or `json`.
    #[arg(long, env = "COCOON_POD_WATCH_ENCODING", value_enum, default_value_t = PodWatchEncoding::Protobuf)]
    pub pod_watch_encoding: PodWatchEncoding,
}

#[derive(Args, Debug, Clone)]
pub struct ElectionArgs {
    /// Elect one reconciling replica through a Lease. Off runs the controller always.
    #[arg(long, env = "COCOON_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    #[arg(long, env = "COCOON_LEASE_NAME", default_value = "cocoon-hibernation")]
    pub lease_name: String,
    /// Namespace of the Lease; defaults to the pod's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease; required with election on (S8), and unique
    /// per replica: the chart passes the pod name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a holder's record stays valid for the others (whole seconds). The leader
    /// renews, and followers poll, every min(duration/5, 2s); the leader stops acting
    /// max(duration/5, 1s) before its last renewal could expire.
    #[arg(long, env = "COCOON_LEASE_DURATION", value_parser = parse_duration, default_value = "15s")]
    pub lease_duration: Duration,
    /// Testing only, hidden (S11): lead with a lower safety epoch than this build's, to
    /// play an older build. A higher one is refused: it would lock the newer builds out.
    #[arg(long, env = "COCOON_PRETEND_SAFETY_EPOCH", hide = true)]
    pub pretend_safety_epoch: Option<u64>,
}

/// The wake proxy's settings (`cocoon-hibernation proxy`).
#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Address of the HTTP listener (HTTP/1.1 and HTTP/2 without TLS).
    #[arg(long, env = "COCOON_PROXY_HTTP_ADDR", default_value = "0.0.0.0:8000")]
    pub http_addr: SocketAddr,
    /// TCP listeners, comma-separated; a connection is routed by the port it came in on
    /// (an idle policy's `tcp[].listenPort`).
    #[arg(
        long = "tcp-addr",
        env = "COCOON_PROXY_TCP_ADDRS",
        value_delimiter = ','
    )]
    pub tcp_addrs: Vec<SocketAddr>,
    /// Namespaces served, comma-separated; all when empty (Q5).
    #[arg(long, env = "COCOON_PROXY_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Plain-HTTP address for /healthz, /readyz and /metrics.
    #[arg(long, env = "COCOON_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Who the activity reports name as their holder (the chart passes the pod name).
    #[arg(long, env = "POD_NAME", default_value = "cocoon-wake-proxy")]
    pub identity: String,
    #[arg(long, env = "COCOON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[arg(long, env = "COCOON_LOG", default_value = "info")]
    pub log_filter: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl ServerArgs {
    /// S10: the release part of this install's identity, if it has one.
    pub fn install_name(&self) -> Option<String> {
        let name = self.install_name.as_deref().map(str::trim);
        name.filter(|n| !n.is_empty()).map(str::to_string)
    }
}

impl ElectionArgs {
    /// The elector's own settings, from these flags.
    pub fn lease(&self) -> crate::leader::LeaseSettings {
        crate::leader::LeaseSettings {
            name: self.lease_name.clone(),
            namespace: self.lease_namespace.clone(),
            duration: self.lease_duration,
            safety_epoch: self
                .pretend_safety_epoch
                .unwrap_or(crate::leader::decide::SAFETY_EPOCH),
        }
    }
}

/// The value one bounded flag was given.
#[derive(Clone, Copy, Debug)]
enum Given {
    Integer(i64),
    Duration(Duration),
}

/// P3: the bounds of one number or duration flag, and the chart value that sets it. One
/// table for the binary's check (`validate`) and the chart's: the values schema's
/// minimum/maximum and the duration bounds in the chart's files/value-limits.yaml are
/// checked against it (tests/unit/chart_values.rs), that file is this table printed
/// (`cocoon-hibernation value-limits`), and `cargo xtask chart-check` renders the chart with
/// every sample value below, expecting exactly the binary's refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub flag: &'static str,
    pub bound: Bound,
    /// The chart value that sets the flag, and in what form.
    pub value: ChartValue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Integer { min: i64, max: i64 },
    Duration { min: Duration, max: Duration },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChartValue {
    /// No chart value; `extraEnv` can still set the variable.
    None,
    /// An integer value, passed as it is.
    Integer(&'static str),
    /// A duration string in the chart's form, [`crate::flags::CHART_DURATION_PATTERN`].
    Duration(&'static str),
    /// Whole seconds, passed as `<n>s`.
    Seconds(&'static str),
}

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// The maxima keep every deadline well inside what a timer can add to now without
/// overflowing, and name what larger values would only be typos for.
pub const LIMITS: &[Limit] = &[
    Limit {
        flag: "--concurrency",
        bound: Bound::Integer {
            min: 1,
            max: 65_535,
        },
        value: ChartValue::Integer("controller.concurrency"),
    },
    Limit {
        flag: "--hibernate-timeout",
        bound: Bound::Duration { min: MS, max: DAY },
        value: ChartValue::Duration("controller.hibernateTimeout"),
    },
    Limit {
        flag: "--wake-timeout",
        bound: Bound::Duration { min: MS, max: DAY },
        value: ChartValue::Duration("controller.wakeTimeout"),
    },
    Limit {
        flag: "--refused-delete-backoff",
        bound: Bound::Duration { min: MS, max: DAY },
        value: ChartValue::None,
    },
    Limit {
        flag: "--apiserver-timeout",
        bound: Bound::Duration { min: MS, max: HOUR },
        value: ChartValue::None,
    },
    Limit {
        flag: "--registry-timeout",
        bound: Bound::Duration { min: MS, max: HOUR },
        value: ChartValue::Duration("registry.timeout"),
    },
    // S8: a limit below 3s would end a healthy watch's first reply.
    Limit {
        flag: "--informer-stall-limit",
        bound: Bound::Duration {
            min: Duration::from_secs(3),
            max: DAY,
        },
        value: ChartValue::Duration("controller.informerStallLimit"),
    },
    // The Lease carries whole seconds; renewals run every duration/5, at least 1s apart.
    Limit {
        flag: "--lease-duration",
        bound: Bound::Duration {
            min: Duration::from_secs(2),
            max: HOUR,
        },
        value: ChartValue::Duration("leaderElection.leaseDuration"),
    },
    // A zero period would be a busy loop (tokio refuses it outright).
    Limit {
        flag: "--tls-reload-interval",
        bound: Bound::Duration { min: MS, max: HOUR },
        value: ChartValue::Duration("webhook.tlsReloadInterval"),
    },
    Limit {
        flag: "--shutdown-grace",
        bound: Bound::Duration {
            min: Duration::ZERO,
            max: HOUR,
        },
        value: ChartValue::Seconds("shutdownGraceSeconds"),
    },
];

impl Limit {
    fn check(&self, given: Given) -> Result<(), ConfigError> {
        let flag = self.flag;
        let inside = match (self.bound, given) {
            (Bound::Integer { min, max }, Given::Integer(v)) => (min..=max).contains(&v),
            (Bound::Duration { min, max }, Given::Duration(v)) => (min..=max).contains(&v),
            _ => false,
        };
        if inside {
            return Ok(());
        }
        Err(ConfigError(match self.bound {
            Bound::Integer { min, max } => format!("{flag} must be between {min} and {max}"),
            Bound::Duration { min, max } if min.is_zero() => {
                format!("{flag} must be at most {}", format_duration(max))
            }
            Bound::Duration { min, max } => format!(
                "{flag} must be between {} and {}",
                format_duration(min),
                format_duration(max)
            ),
        }))
    }

    /// Values in the chart value's form that the binary must refuse for this flag: just
    /// outside each bound, zero, and (durations) a number too large to read.
    pub fn refused_samples(&self) -> Vec<String> {
        match (self.bound, self.value) {
            (Bound::Integer { min, max }, _) => vec![(min - 1).to_string(), (max + 1).to_string()],
            (Bound::Duration { min, max }, ChartValue::Seconds(_)) => {
                let below = i128::from(min.as_secs()) - 1;
                vec![below.to_string(), (max.as_secs() + 1).to_string()]
            }
            (Bound::Duration { min, max }, _) => {
                let mut out = Vec::new();
                if !min.is_zero() {
                    out.push("0s".to_owned());
                    out.push("0".to_owned());
                }
                if min > MS {
                    out.push(format!("{}ms", min.as_millis() - 1));
                }
                out.push(format!("{}ms", max.as_millis() + 1));
                out.push(format!("{}s", max.as_secs() + 1));
                out.push("99999999999999999999999h".to_owned());
                out
            }
        }
    }

    /// Values in the chart value's form that the binary must accept: each bound, and
    /// `1h30m` (or `1m30s`) where it fits.
    pub fn accepted_samples(&self) -> Vec<String> {
        match (self.bound, self.value) {
            (Bound::Integer { min, max }, _) => vec![min.to_string(), max.to_string()],
            (Bound::Duration { min, max }, ChartValue::Seconds(_)) => {
                vec![min.as_secs().to_string(), max.as_secs().to_string()]
            }
            (Bound::Duration { min, max }, _) => {
                let mut out = vec![format_duration(min), format_duration(max)];
                for mixed in [Duration::from_secs(5400), Duration::from_secs(90)] {
                    if (min..=max).contains(&mixed) {
                        out.push(format_duration(mixed));
                        break;
                    }
                }
                out
            }
        }
    }

    /// A sample in the chart value's form, as the chart passes it to the flag.
    pub fn as_flag_value(&self, sample: &str) -> String {
        match self.value {
            ChartValue::Seconds(_) => format!("{sample}s"),
            _ => sample.to_owned(),
        }
    }
}

/// `cocoon-hibernation value-limits --samples`: one line per sample value of every flag
/// with a chart value, `<value>\t<integer|string>\t<refused|accepted>\t<sample>`, for
/// `cargo xtask chart-check`.
pub fn value_samples_tsv() -> String {
    let mut out = String::new();
    for limit in LIMITS {
        let (path, kind) = match limit.value {
            ChartValue::None => continue,
            ChartValue::Integer(p) | ChartValue::Seconds(p) => (p, "integer"),
            ChartValue::Duration(p) => (p, "string"),
        };
        for (verdict, samples) in [
            ("refused", limit.refused_samples()),
            ("accepted", limit.accepted_samples()),
        ] {
            for sample in samples {
                out.push_str(&format!("{path}\t{kind}\t{verdict}\t{sample}\n"));
            }
        }
    }
    out
}

/// A duration in the chart's form, in the largest units that fit exactly: `3s`, `24h`,
/// `1h30m`.
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

/// The chart's files/value-limits.yaml: the duration bounds of [`LIMITS`] that the
/// chart's templates check (a JSON schema cannot compare durations), exactly as
/// `cocoon-hibernation value-limits` prints it.
pub fn value_limits_yaml() -> String {
    let mut out = String::from(
        "# Generated by `cocoon-hibernation value-limits` from the binary's own flag bounds\n\
         # (src/config.rs, LIMITS); do not edit. templates/validate.yaml refuses a duration\n\
         # value outside its bounds, as the binary would.\n\
         durations:\n",
    );
    for limit in LIMITS {
        if let (ChartValue::Duration(path), Bound::Duration { min, max }) =
            (limit.value, limit.bound)
        {
            out.push_str(&format!(
                "  - value: {path}\n    flag: {}\n    min: {}\n    minMs: {}\n    max: {}\n    maxMs: {}\n",
                limit.flag,
                format_duration(min),
                min.as_millis(),
                format_duration(max),
                max.as_millis(),
            ));
        }
    }
    out
}

/// Settings checked at start-up; the error names the flag to fix (P3).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServerArgs {
    /// Every number and duration flag with its value, for the bounds of [`LIMITS`].
    fn bounded(&self) -> [(&'static str, Given); 10] {
        let c = &self.controller;
        [
            ("--concurrency", Given::Integer(c.concurrency)),
            ("--hibernate-timeout", Given::Duration(c.hibernate_timeout)),
            ("--wake-timeout", Given::Duration(c.wake_timeout)),
            (
                "--refused-delete-backoff",
                Given::Duration(c.refused_delete_backoff),
            ),
            (
                "--apiserver-timeout",
                Given::Duration(self.apiserver_timeout),
            ),
            (
                "--registry-timeout",
                Given::Duration(self.registry.registry_timeout),
            ),
            (
                "--informer-stall-limit",
                Given::Duration(self.informer_stall_limit),
            ),
            (
                "--lease-duration",
                Given::Duration(self.election.lease_duration),
            ),
            (
                "--tls-reload-interval",
                Given::Duration(self.webhook.tls_reload_interval),
            ),
            ("--shutdown-grace", Given::Duration(self.shutdown_grace)),
        ]
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: &str| Err(ConfigError(m.to_owned()));
        for (flag, given) in self.bounded() {
            let limit = LIMITS.iter().find(|l| l.flag == flag);
            if let Some(limit) = limit {
                limit.check(given)?;
            }
        }
        match self.registry.registry_base.as_deref().map(str::trim) {
            None | Some("") => return err("--registry-base (COCOON_REGISTRY_BASE) is required"),
            Some(base) if base.contains("://") => {
                return err(
                    "--registry-base takes host[:port][/prefix] without a scheme; use --registry-plain-http for http",
                );
            }
            Some(_) => {}
        }
        let r = &self.registry;
        let sources = [
            r.registry_username.is_some(),
            r.registry_docker_config.is_some(),
            r.registry_token_file.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            return err(
                "choose one of --registry-username, --registry-docker-config, --registry-token-file",
            );
        }
        if self.election.leader_election {
            // S8: a shared fallback (e.g. the pid, 1 in every container) would let two
            // replicas both believe they hold the Lease.
            if self
                .election
                .identity
                .as_deref()
                .is_none_or(|id| id.trim().is_empty())
            {
                return err(
                    "leader election needs this replica's own identity: set --identity or POD_NAME (or turn election off with --leader-election=false)",
                );
            }
            if self.election.lease_name.is_empty() || self.election.lease_namespace.is_empty() {
                return err("--lease-name and --lease-namespace must not be empty");
            }
            if self
                .election
                .pretend_safety_epoch
                .is_some_and(|e| e > crate::leader::decide::SAFETY_EPOCH)
            {
                return err("--pretend-safety-epoch may only lower this build's safety epoch");
            }
        }
        if self.webhook.webhook_addr == self.admin_addr {
            return err("--webhook-addr and --admin-addr must differ");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let mut all = vec!["cocoon-hibernation"];
        // An explicit identity, so POD_NAME in the test's environment cannot decide.
        if !args.iter().any(|a| a.starts_with("--identity")) {
            all.extend(["--identity", "replica-a"]);
        }
        if !args.iter().any(|a| a.starts_with("--registry-base")) {
            all.extend(["--registry-base", "127.0.0.1:5000/snap"]);
        }
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
    }

    #[test]
    fn defaults_are_the_spec_budgets() {
        let cli = parse(&[]).unwrap();
        assert_eq!(
            cli.server.controller.hibernate_timeout,
            Duration::from_secs(180)
        );
        assert_eq!(cli.server.controller.wake_timeout, Duration::from_secs(300));
        assert_eq!(cli.server.controller.concurrency, 4);
        assert_eq!(cli.server.apiserver_timeout, Duration::from_secs(15));
        assert_eq!(cli.server.validate(), Ok(()));
    }

    /// SPEC P3 C1: a clear error names the flag; below one worker is refused.
    #[rstest]
    #[case::c1_zero_workers(&["--concurrency", "0"], "--concurrency")]
    #[case::c1_negative_workers(&["--concurrency=-3"], "--concurrency")]
    #[case::zero_timeout(&["--hibernate-timeout", "0s"], "--hibernate-timeout")]
    #[case::s1_zero_apiserver_timeout(&["--apiserver-timeout", "0s"], "--apiserver-timeout")]
    #[case::scheme_in_base(&["--registry-base", "https://r.example/x"], "without a scheme")]
    #[case::same_ports(&["--webhook-addr", "0.0.0.0:8080"], "must differ")]
    #[case::two_credential_sources(&["--registry-username", "u", "--registry-token-file", "/t"], "choose one")]
    #[case::s8_election_without_an_identity(&["--identity", ""], "--identity or POD_NAME")]
    #[case::s8_election_with_a_blank_identity(&["--identity", "  "], "--identity or POD_NAME")]
    #[case::s8_stall_limit_too_short(&["--informer-stall-limit", "1s"], "--informer-stall-limit")]
    #[case::s11_pretend_epoch_above_the_builds(&["--pretend-safety-epoch", "4"], "--pretend-safety-epoch")]
    fn p3_bad_settings_are_refused_with_the_flag_named(
        #[case] args: &[&str],
        #[case] needle: &str,
    ) {
        let cli = parse(args).unwrap();
        let e = cli.server.validate().unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
    }

    /// SPEC P3: every bound of LIMITS is the binary's own: each sample the chart must
    /// refuse for a value (0s timeouts, a 1999ms lease, a too-short stall limit, numbers
    /// past the maximum or too large to read) is refused by the flag it sets, naming the
    /// flag, and each sample the chart accepts (the bounds, 1h30m) is accepted.
    #[test]
    fn p3_the_binary_enforces_every_limit_on_the_charts_samples() {
        let mut refused = 0;
        for limit in LIMITS {
            for sample in limit.refused_samples() {
                let arg = format!("{}={}", limit.flag, limit.as_flag_value(&sample));
                match parse(&[&arg]) {
                    Err(e) => assert!(e.to_string().contains(limit.flag), "{arg}: {e}"),
                    Ok(cli) => {
                        let e = cli.server.validate().expect_err(&arg);
                        assert!(e.0.contains(limit.flag), "{arg}: {e}");
                    }
                }
                refused += 1;
            }
            for sample in limit.accepted_samples() {
                let arg = format!("{}={}", limit.flag, limit.as_flag_value(&sample));
                let cli = parse(&[&arg]).unwrap_or_else(|e| panic!("{arg}: {e}"));
                assert_eq!(cli.server.validate(), Ok(()), "{arg}");
            }
        }
        assert!(refused >= 3 * LIMITS.len(), "{refused} refused samples");
        // The forms the chart passes and the binary reads the same.
        for (raw, secs) in [("0010s", 10), ("1s1000ms", 2), ("90", 90), ("1h30m", 5400)] {
            assert_eq!(parse_duration(raw), Ok(Duration::from_secs(secs)), "{raw}");
        }
    }

    /// SPEC P3: every bounded flag has its bound in LIMITS, and every entry names a flag.
    #[test]
    fn p3_limits_cover_every_bounded_flag() {
        let cli = parse(&[]).unwrap();
        let bounded: Vec<&str> = cli.server.bounded().iter().map(|(f, _)| *f).collect();
        let listed: Vec<&str> = LIMITS.iter().map(|l| l.flag).collect();
        assert_eq!(bounded, listed);
        let command = <Cli as clap::CommandFactory>::command();
        for flag in &listed {
            let long = flag.trim_start_matches("--");
            assert!(
                command.get_arguments().any(|a| a.get_long() == Some(long)),
                "{flag} is no flag"
            );
        }
        // A new duration flag (a default such as `5s`) needs its bounds here too.
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let default = arg.get_default_values().first();
            let default = default.map(|d| d.to_string_lossy().into_owned());
            let duration = default.is_some_and(|d| {
                d.chars().any(|c| c.is_ascii_alphabetic()) && parse_duration(&d).is_ok()
            });
            if let (true, Some(long)) = (duration, arg.get_long()) {
                let flag = format!("--{long}");
                assert!(
                    listed.contains(&flag.as_str()),
                    "{flag} has no LIMITS entry"
                );
            }
        }
    }

    #[rstest]
    #[case(Duration::from_millis(1), "1ms")]
    #[case(Duration::from_secs(3), "3s")]
    #[case(Duration::from_secs(5400), "1h30m")]
    #[case(Duration::from_secs(86_400), "24h")]
    #[case(Duration::from_millis(2999), "2s999ms")]
    fn durations_format_in_the_charts_form(#[case] d: Duration, #[case] text: &str) {
        assert_eq!(format_duration(d), text);
        assert_eq!(parse_duration(text), Ok(d));
    }

    /// SPEC S8: no identity of our own is refused only while election is on; with it off
    /// nothing needs one.
    #[test]
    fn s8_an_identity_is_required_only_with_election_on() {
        let unset = |extra: &[&str]| {
            let mut all = vec!["x", "--registry-base", "r:5000"];
            all.extend_from_slice(extra);
            let mut cli = Cli::try_parse_from(all).unwrap();
            // Whatever POD_NAME the test runs with: no identity at all.
            cli.server.election.identity = None;
            cli.server.validate()
        };
        let e = unset(&[]).unwrap_err();
        assert!(e.0.contains("--identity or POD_NAME"), "{e}");
        assert_eq!(unset(&["--leader-election=false"]), Ok(()));
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.server.informer_stall_limit, Duration::from_secs(300));
    }

    /// SPEC S11: the epoch a replica leads with is the build's, unless a test lowers it
    /// (hidden flag); it never goes above the build's.
    #[test]
    fn s11_safety_epoch_is_the_builds_unless_lowered() {
        let epoch = |args: &[&str]| parse(args).unwrap().server.election.lease().safety_epoch;
        assert_eq!(epoch(&[]), crate::leader::decide::SAFETY_EPOCH);
        assert_eq!(epoch(&["--pretend-safety-epoch", "2"]), 2);
        let cli = parse(&["--pretend-safety-epoch", "3"]).unwrap();
        assert_eq!(cli.server.validate(), Ok(()));
        let help = <Cli as clap::CommandFactory>::command()
            .render_help()
            .to_string();
        assert!(!help.contains("pretend"), "hidden from --help: {help}");
    }

    #[test]
    fn flags_work_before_and_after_run() {
        let after = Cli::try_parse_from([
            "x",
            "run",
            "--registry-base",
            "r:5000",
            "--concurrency",
            "7",
        ])
        .unwrap();
        assert_eq!(after.server_args().controller.concurrency, 7);
        let before =
            Cli::try_parse_from(["x", "--registry-base", "r:5000", "--concurrency", "6"]).unwrap();
        assert_eq!(before.server_args().controller.concurrency, 6);
    }

    /// SPEC P3.
    #[test]
    fn p3_missing_registry_base_is_refused() {
        let cli = Cli::try_parse_from(["cocoon-hibernation"]).unwrap();
        assert!(
            cli.server
                .validate()
                .unwrap_err()
                .0
                .contains("--registry-base")
        );
    }
}
