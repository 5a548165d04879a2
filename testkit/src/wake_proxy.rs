//! The wake proxy (`cocoon-hibernation proxy`, issue 37) as the e2e tests and the bench run
//! it: the real binary, under a Role granting only what Q8 allows, and the idle policies'
//! CRD it reads.

use crate::cluster;
use crate::env::{Env, Setup, setup};
use crate::product::{self, eventually, free_port};
use cocoon_hibernation::api::{Desire, Phase};
use cocoon_hibernation::idle::CocoonIdlePolicy;
use cocoon_hibernation::idle::spec::{CocoonIdlePolicySpec, HttpRoute, TcpRoute, WakeOnRequest};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The host suffix of the tests' `{pod}` routes.
pub const DOMAIN: &str = "proxy.test";
/// The simulated VMs' HTTP port, and their TCP echo's.
pub const HTTP_PORT: u16 = 8080;
pub const ECHO_PORT: u16 = 2222;

/// The wake proxy process; killed on drop.
pub struct WakeProxy {
    child: Child,
    pub http: u16,
    pub admin: u16,
    log: tempfile::NamedTempFile,
    /// The identity it runs as (and reports activity as).
    pub user: String,
}

impl Drop for WakeProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl WakeProxy {
    /// Starts `cocoon-hibernation proxy` for the env's namespace, listening for TCP on
    /// `tcp`, as a user holding only the Q8 Role.
    pub async fn start_on(env: &Env, tcp: u16) -> Self {
        let cluster = cluster::cluster();
        let user = format!("wake-proxy-{}", env.ns);
        grant_q8(&env.client, &env.ns, &user).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, cluster.kubeconfig_for(&user, &[])).unwrap();
        let (http, admin) = (free_port(), free_port());
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(product::bin())
            .args([
                "proxy".to_owned(),
                format!("--http-addr=127.0.0.1:{http}"),
                format!("--tcp-addr=127.0.0.1:{tcp}"),
                format!("--admin-addr=127.0.0.1:{admin}"),
                format!("--namespaces={}", env.ns),
                format!("--identity={user}"),
                "--log-filter=info,cocoon_hibernation=debug".to_owned(),
            ])
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", product::bin().display()));
        // The kubeconfig is read at start; the directory may go once it is up.
        let mut me = Self {
            child,
            http,
            admin,
            log,
            user,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("wake proxy exited with {status}:\n{}", me.log_text());
            }
            if get(&format!("http://127.0.0.1:{}/readyz", me.admin))
                .await
                .is_some_and(|(s, _)| s == 200)
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "wake proxy not ready:\n{}",
                me.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(dir);
        me
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        let _ = self.log.reopen().map(|mut f| f.read_to_string(&mut s));
        s
    }

    pub async fn metrics(&self) -> String {
        get(&format!("http://127.0.0.1:{}/metrics", self.admin))
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// An HTTP/1.1 request for `pod`'s route: (status, body, the proxy's answer header).
    pub async fn request(&self, pod: &str, path: &str) -> (u16, String, Option<String>) {
        let resp = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}{path}", self.http))
            .header("host", format!("{pod}.{DOMAIN}"))
            .body("hello")
            .timeout(Duration::from_secs(90))
            .send()
            .await
            .unwrap_or_else(|e| panic!("request through the proxy: {e}"));
        let status = resp.status().as_u16();
        let answer = resp
            .headers()
            .get("x-cocoon-wake-proxy")
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        (status, resp.text().await.unwrap_or_default(), answer)
    }
}

pub async fn get(url: &str) -> Option<(u16, String)> {
    let resp = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// Q8: pods, CRs and idle policies read; CR desires and Leases written; nothing else.
pub async fn grant_q8(client: &kube::Client, ns: &str, user: &str) {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let role = Role {
        metadata: ObjectMeta {
            name: Some("wake-proxy".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            rule("", &["pods"], &["get", "list", "watch"]),
            rule(
                "cocoonset.cocoonstack.io",
                &["cocoonhibernations"],
                &["get", "list", "watch", "patch"],
            ),
            rule(
                "cocoonset.cocoonstack.io",
                &["cocoonidlepolicies"],
                &["get", "list", "watch"],
            ),
            rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "patch"],
            ),
        ]),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("wake-proxy".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "wake-proxy".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.to_owned(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The idle policies' CRD, applied as `ensure_crd` applies the others.
pub async fn ensure_policy_crd(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = CocoonIdlePolicy::crd();
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("cocoon-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the idle policy CRD");
    eventually(
        "idle policy CRD established",
        Duration::from_secs(30),
        || async {
            let crd = api.get(&name).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// A world: the product, the simulator serving, the policy with an HTTP route by
/// `{pod}` and a TCP route to `tcp_pod`, and the proxy.
pub async fn world(prefix: &str, max_wait: &str, tcp_pod: &str, tcp_port: u16) -> Env {
    let env = setup(prefix, Setup::default()).await;
    env.sim.knobs.set_serve(Some((HTTP_PORT, ECHO_PORT)));
    ensure_policy_crd(&env.client).await;
    let policy = CocoonIdlePolicy::new(
        "idle",
        CocoonIdlePolicySpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "vm".into())])),
                ..LabelSelector::default()
            },
            idle_after: "1h".into(),
            min_awake: None,
            suspend: false,
            wake_on_request: Some(WakeOnRequest {
                http: vec![HttpRoute {
                    host: format!("{{pod}}.{DOMAIN}"),
                    path_prefix: None,
                    pod: None,
                    port: HTTP_PORT,
                }],
                tcp: vec![TcpRoute {
                    listen_port: tcp_port,
                    pod: tcp_pod.to_owned(),
                    port: ECHO_PORT,
                }],
                max_wait: Some(max_wait.to_owned()),
                max_pending: Some(100),
                probe_paths: vec!["/healthz".into()],
                wake_during_scheduled_sleep: false,
            }),
        },
    );
    Api::<CocoonIdlePolicy>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    env
}

/// A selected VM pod, serving, then hibernated through its CR. Returns the address its VM
/// served on before. The CR is made before the pod is selected, so it is a person's: the
/// policy leaves it alone (I4) instead of racing this create with its own.
pub async fn hibernated_pod(env: &Env, pod: &str, wake_timeout: Option<&str>) -> String {
    let ip = serving_pod(env, pod, wake_timeout).await;
    hibernate(env, pod).await;
    ip
}

/// A person asks `pod`'s CR to hibernate, and it is `Hibernated`.
pub async fn hibernate(env: &Env, pod: &str) {
    let patch = serde_json::json!({ "spec": { "desire": "Hibernate" } });
    env.crs
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    product::wait_phase(
        &env.crs,
        pod,
        Phase::Hibernated,
        crate::env::LONG,
        &mut vec![],
    )
    .await;
}

/// A VM pod the world's policy selects, awake and serving, with a person's CR (`Wake`)
/// made before the pod is selected, so the policy never makes one of its own (I4): its
/// address.
pub async fn serving_pod(env: &Env, pod: &str, wake_timeout: Option<&str>) -> String {
    env.pod(pod).await;
    let mut cr = product::new_cr(pod, pod, Desire::Wake);
    cr.spec.wake_timeout = wake_timeout.map(str::to_owned);
    env.crs.create(&PostParams::default(), &cr).await.unwrap();
    select_and_serve(env, pod).await
}

/// Labels `pod` for the world's policy and waits for its address.
async fn select_and_serve(env: &Env, pod: &str) -> String {
    let patch = serde_json::json!({ "metadata": { "labels": { "app": "vm" } } });
    env.pods
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(&format!("{pod} serving"), crate::env::LONG, || async {
        let p = env.pods.get(pod).await.ok()?;
        p.status?.pod_ip
    })
    .await
}
