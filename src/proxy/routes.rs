//! The route table (Q1): idle policies' wake-on-request routes, in the namespaces the proxy
//! serves, as one table looked up per request. Pure: built from the policies, rebuilt
//! when one changes.

use crate::idle::spec::{CocoonIdlePolicySpec, WakeOnRequest};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Q2's defaults, when the policy says nothing.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_PENDING: u32 = 100;

/// The namespaces the proxy serves (Q5): all, or these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    All,
    Only(Vec<String>),
}

impl Namespaces {
    pub fn from_flag(list: &[String]) -> Self {
        let list: Vec<String> = list
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if list.is_empty() {
            Self::All
        } else {
            Self::Only(list)
        }
    }

    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(list) => list.iter().any(|n| n == namespace),
        }
    }
}

/// One policy's settings, shared by its routes.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    pub max_wait: Duration,
    pub max_pending: u32,
    pub probe_paths: Vec<String>,
}

/// Where one request or connection goes: a pod of a policy, on its port.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub pod: String,
    pub port: u16,
    pub policy: Arc<Policy>,
}

impl Target {
    pub fn namespace(&self) -> &str {
        &self.policy.namespace
    }
}

/// What an HTTP request's host and path lead to.
#[derive(Clone, Debug, PartialEq)]
pub enum HttpMatch {
    /// A probe path of the matched route (Q5): a fixed answer, no wake, no activity.
    Probe,
    Route(Target),
    NoRoute,
}

#[derive(Clone, Debug, PartialEq)]
enum Host {
    Exact(String),
    /// `{pod}` between these: the pod is the one DNS label in between.
    Pattern {
        prefix: String,
        suffix: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct HttpEntry {
    host: Host,
    path_prefix: String,
    /// The pod, for an exact host.
    pod: Option<String>,
    port: u16,
    policy: Arc<Policy>,
}

/// The table of every route of the served namespaces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTable {
    http: Vec<HttpEntry>,
    tcp: BTreeMap<u16, Target>,
    /// Routes left out, and why (duplicates, malformed hosts), for the log.
    pub skipped: Vec<String>,
}

/// One policy as the table reads it.
pub struct PolicyInput<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a CocoonIdlePolicySpec,
}

impl RouteTable {
    /// The routes of `policies` in `namespaces`. Policies are taken in (namespace, name)
    /// order, so when two claim the same TCP port or host and path, the same one wins on
    /// every replica; the other is listed in `skipped`.
    pub fn build(policies: &[PolicyInput<'_>], namespaces: &Namespaces) -> Self {
        let mut sorted: Vec<&PolicyInput<'_>> = policies
            .iter()
            .filter(|p| namespaces.allows(p.namespace))
            .collect();
        sorted.sort_by(|a, b| (a.namespace, a.name).cmp(&(b.namespace, b.name)));
        let mut table = Self::default();
        for p in sorted {
            let Some(wake) = p.spec.wake_on_request.as_ref() else {
                continue;
            };
            if p.spec.suspend {
                continue;
            }
            let policy = Arc::new(policy_of(p, wake));
            for r in &wake.http {
                table.add_http(r, &policy);
            }
            for r in &wake.tcp {
                let at = format!("{}/{}", p.namespace, p.name);
                if table.tcp.contains_key(&r.listen_port) {
                    let port = r.listen_port;
                    table
                        .skipped
                        .push(format!("{at}: TCP port {port} is taken"));
                    continue;
                }
                let target = Target {
                    pod: r.pod.clone(),
                    port: r.port,
                    policy: policy.clone(),
                };
                table.tcp.insert(r.listen_port, target);
            }
        }
        // Longest path prefix first; exact hosts before patterns; stable otherwise.
        table.http.sort_by_key(|e| {
            (
                std::cmp::Reverse(e.path_prefix.len()),
                matches!(e.host, Host::Pattern { .. }),
            )
        });
        table
    }

    fn add_http(&mut self, r: &crate::idle::spec::HttpRoute, policy: &Arc<Policy>) {
        let at = format!("{}/{}", policy.namespace, policy.name);
        let host = match parse_host(&r.host) {
            Ok(h) => h,
            Err(why) => {
                self.skipped.push(format!("{at}: host {:?}: {why}", r.host));
                return;
            }
        };
        if matches!(host, Host::Exact(_)) && r.pod.as_deref().is_none_or(str::is_empty) {
            self.skipped
                .push(format!("{at}: host {:?} names no pod", r.host));
            return;
        }
        let path_prefix = r.path_prefix.clone().unwrap_or_else(|| "/".to_owned());
        if self
            .http
            .iter()
            .any(|e| e.host == host && e.path_prefix == path_prefix)
        {
            self.skipped
                .push(format!("{at}: host {:?} {path_prefix} is taken", r.host));
            return;
        }
        self.http.push(HttpEntry {
            host,
            path_prefix,
            pod: r.pod.clone(),
            port: r.port,
            policy: policy.clone(),
        });
    }

    /// The route of an HTTP request: `host` as sent (a port is ignored, case too).
    pub fn http(&self, host: &str, path: &str) -> HttpMatch {
        let host = normalize_host(host);
        for e in &self.http {
            if !path.starts_with(e.path_prefix.as_str()) {
                continue;
            }
            let pod = match &e.host {
                Host::Exact(h) if *h == host => e.pod.clone(),
                Host::Exact(_) => None,
                Host::Pattern { prefix, suffix } => pod_in(&host, prefix, suffix),
            };
            let Some(pod) = pod else { continue };
            if e.policy.probe_paths.iter().any(|p| p == path) {
                return HttpMatch::Probe;
            }
            return HttpMatch::Route(Target {
                pod,
                port: e.port,
                policy: e.policy.clone(),
            });
        }
        HttpMatch::NoRoute
    }

    /// The route of a TCP connection accepted on `listen_port`.
    pub fn tcp(&self, listen_port: u16) -> Option<&Target> {
        self.tcp.get(&listen_port)
    }
}

fn policy_of(p: &PolicyInput<'_>, wake: &WakeOnRequest) -> Policy {
    let max_wait = wake
        .max_wait
        .as_deref()
        .and_then(|d| humantime::parse_duration(d).ok())
        .unwrap_or(DEFAULT_MAX_WAIT);
    Policy {
        namespace: p.namespace.to_owned(),
        name: p.name.to_owned(),
        selector: p.spec.selector.clone(),
        max_wait,
        max_pending: wake.max_pending.unwrap_or(DEFAULT_MAX_PENDING).max(1),
        probe_paths: wake.probe_paths.clone(),
    }
}

fn parse_host(raw: &str) -> Result<Host, &'static str> {
    let raw = raw.trim().to_ascii_lowercase();
    match raw.matches("{pod}").count() {
        0 => Ok(Host::Exact(raw)),
        1 => {
            let (prefix, suffix) = raw.split_once("{pod}").ok_or("no {pod}")?;
            Ok(Host::Pattern {
                prefix: prefix.to_owned(),
                suffix: suffix.to_owned(),
            })
        }
        _ => Err("more than one {pod}"),
    }
}

/// The host without a port, lower case.
fn normalize_host(host: &str) -> String {
    let host = host.trim();
    let bare = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(']') => h,
        Some((h, port)) if h.ends_with(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    bare.to_ascii_lowercase()
}

/// The pod named by `host` under a `{pod}` pattern: one non-empty DNS label.
fn pod_in(host: &str, prefix: &str, suffix: &str) -> Option<String> {
    let mid = host.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let label = !mid.is_empty()
        && mid.len() <= 63
        && mid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    label.then(|| mid.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idle::spec::{HttpRoute, TcpRoute};
    use rstest::rstest;

    fn spec(http: Vec<HttpRoute>, tcp: Vec<TcpRoute>) -> CocoonIdlePolicySpec {
        CocoonIdlePolicySpec {
            selector: Default::default(),
            idle_after: "10m".into(),
            min_awake: None,
            suspend: false,
            wake_on_request: Some(WakeOnRequest {
                http,
                tcp,
                max_wait: Some("5s".into()),
                max_pending: Some(3),
                probe_paths: vec!["/healthz".into()],
                wake_during_scheduled_sleep: false,
            }),
        }
    }

    fn http(host: &str, prefix: Option<&str>, pod: Option<&str>, port: u16) -> HttpRoute {
        HttpRoute {
            host: host.into(),
            path_prefix: prefix.map(Into::into),
            pod: pod.map(Into::into),
            port,
        }
    }

    fn table() -> RouteTable {
        let a = spec(
            vec![
                http("{pod}.dev.example.com", None, None, 8080),
                http("app.example.com", None, Some("web-0"), 80),
                http("app.example.com", Some("/api"), Some("api-0"), 9000),
            ],
            vec![TcpRoute {
                listen_port: 2222,
                pod: "web-0".into(),
                port: 22,
            }],
        );
        let b = spec(
            vec![http("other.example.com", None, Some("x"), 80)],
            vec![TcpRoute {
                listen_port: 2222,
                pod: "y".into(),
                port: 22,
            }],
        );
        let c = spec(
            vec![http("hidden.example.com", None, Some("z"), 80)],
            vec![],
        );
        RouteTable::build(
            &[
                PolicyInput {
                    namespace: "team-b",
                    name: "p",
                    spec: &b,
                },
                PolicyInput {
                    namespace: "team-a",
                    name: "p",
                    spec: &a,
                },
                PolicyInput {
                    namespace: "elsewhere",
                    name: "p",
                    spec: &c,
                },
            ],
            &Namespaces::from_flag(&["team-a".into(), "team-b".into()]),
        )
    }

    /// SPEC Q1: HTTP by host (a `{pod}` pattern or a named pod) and the longest path
    /// prefix; a port or upper case in the host changes nothing.
    #[rstest]
    #[case::q1_pattern_names_the_pod("web-3.dev.example.com", "/", Some(("team-a", "web-3", 8080)))]
    #[case::q1_host_port_ignored("WEB-3.dev.example.com:8443", "/x", Some(("team-a", "web-3", 8080)))]
    #[case::q1_pattern_needs_one_label("a.b.dev.example.com", "/", None)]
    #[case::q1_pattern_needs_a_pod(".dev.example.com", "/", None)]
    #[case::q1_exact_host("app.example.com", "/index.html", Some(("team-a", "web-0", 80)))]
    #[case::q1_longest_prefix_wins("app.example.com", "/api/v1", Some(("team-a", "api-0", 9000)))]
    #[case::q1_other_policy("other.example.com", "/", Some(("team-b", "x", 80)))]
    #[case::q5_namespace_not_served("hidden.example.com", "/", None)]
    #[case::q1_unknown_host("nobody.example.com", "/", None)]
    fn q1_http_routes(
        #[case] host: &str,
        #[case] path: &str,
        #[case] want: Option<(&str, &str, u16)>,
    ) {
        let got = match table().http(host, path) {
            HttpMatch::Route(t) => Some((t.namespace().to_owned(), t.pod, t.port)),
            HttpMatch::NoRoute => None,
            HttpMatch::Probe => panic!("not a probe"),
        };
        assert_eq!(
            got,
            want.map(|(n, p, port)| (n.to_owned(), p.to_owned(), port))
        );
    }

    /// SPEC Q5: a probe path of a matched route is a probe; the same path on an unknown
    /// host is no route, and a longer path is traffic.
    #[test]
    fn q5_probe_paths_are_answered_not_routed() {
        let t = table();
        assert_eq!(
            t.http("web-1.dev.example.com", "/healthz"),
            HttpMatch::Probe
        );
        assert_eq!(t.http("nobody.example.com", "/healthz"), HttpMatch::NoRoute);
        assert!(matches!(
            t.http("web-1.dev.example.com", "/healthz/deep"),
            HttpMatch::Route(_)
        ));
    }

    /// SPEC Q1: TCP by listening port; the first policy in (namespace, name) order keeps a
    /// port two claim, and the other is reported.
    #[test]
    fn q1_tcp_routes_by_listen_port_first_claim_wins() {
        let t = table();
        let r = t.tcp(2222).expect("route");
        assert_eq!(
            (r.namespace(), r.pod.as_str(), r.port),
            ("team-a", "web-0", 22)
        );
        assert!(t.tcp(2223).is_none());
        assert_eq!(t.skipped.len(), 1, "{:?}", t.skipped);
        assert!(t.skipped[0].contains("2222"));
    }

    /// SPEC Q2: the policy's maxWait and maxPending reach the target; defaults otherwise.
    #[test]
    fn q2_settings_and_defaults() {
        let t = table();
        let r = t.tcp(2222).expect("route");
        assert_eq!(r.policy.max_wait, Duration::from_secs(5));
        assert_eq!(r.policy.max_pending, 3);
        let mut s = spec(vec![], vec![]);
        if let Some(w) = s.wake_on_request.as_mut() {
            w.max_wait = None;
            w.max_pending = None;
            w.tcp.push(TcpRoute {
                listen_port: 1,
                pod: "a".into(),
                port: 1,
            });
        }
        let input = [PolicyInput {
            namespace: "n",
            name: "p",
            spec: &s,
        }];
        let t = RouteTable::build(&input, &Namespaces::All);
        let r = t.tcp(1).expect("route");
        assert_eq!(r.policy.max_wait, DEFAULT_MAX_WAIT);
        assert_eq!(r.policy.max_pending, DEFAULT_MAX_PENDING);
    }

    /// SPEC Q1: a suspended policy, or one without wake on request, routes nothing; an
    /// exact host without a pod is reported, not routed.
    #[test]
    fn q1_suspended_or_incomplete_routes_nothing() {
        let mut s = spec(vec![http("a.example.com", None, None, 80)], vec![]);
        let input = [PolicyInput {
            namespace: "n",
            name: "p",
            spec: &s,
        }];
        let t = RouteTable::build(&input, &Namespaces::All);
        assert_eq!(t.http("a.example.com", "/"), HttpMatch::NoRoute);
        assert_eq!(t.skipped.len(), 1);
        let mut suspended = spec(vec![http("b.example.com", None, Some("b"), 80)], vec![]);
        suspended.suspend = true;
        let input = [PolicyInput {
            namespace: "n",
            name: "p",
            spec: &suspended,
        }];
        assert_eq!(
            RouteTable::build(&input, &Namespaces::All),
            RouteTable::default()
        );
        s.wake_on_request = None;
        let input = [PolicyInput {
            namespace: "n",
            name: "p",
            spec: &s,
        }];
        assert_eq!(
            RouteTable::build(&input, &Namespaces::All),
            RouteTable::default()
        );
    }
}
