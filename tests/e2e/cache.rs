//! The one informer cache on the real apiserver (SPEC V3, S4 support): readiness means
//! BOTH initial lists have arrived, and until then the webhook's rules fail closed.

use testkit::cluster;
use testkit::product;

use cocoon_hibernation::api::Desire;
use cocoon_hibernation::cache::{self, CacheScope};
use cocoon_hibernation::webhook::validate::{self, Operation};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use product::eventually;
use std::time::Duration;

/// A client that impersonates `user`, so RBAC decides what it may list.
async fn client_as(cluster: &cluster::Cluster, user: &str) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(&cluster.kubeconfig).expect("read kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).expect("kube client")
}

async fn grant(client: &kube::Client, ns: &str, user: &str, name: &str, rule: serde_json::Value) {
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "rules": [rule],
    }))
    .expect("role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .expect("binding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

/// V3 P1: with the CocoonHibernation list delivered but pods not listable, the cache is
/// not synced and a CREATE is denied by the real validation path; once pods can be
/// listed, the same CREATE is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_v3_cache_is_unsynced_until_both_lists_arrive() {
    let cluster = cluster::cluster();
    let admin = cluster.client().await;
    product::ensure_crd(&admin).await;
    let ns = cluster.fresh_namespace(&admin, "v3-cache").await;
    let user = format!("cache-reader-{ns}");
    grant(
        &admin,
        &ns,
        &user,
        "read-crs",
        serde_json::json!({
            "apiGroups": ["cocoonset.cocoonstack.io"],
            "resources": ["cocoonhibernations"],
            "verbs": ["get", "list", "watch"],
        }),
    )
    .await;
    let scope = CacheScope {
        namespace: ns.clone(),
        pod_selector: String::new(),
        list: Default::default(),
    };
    let (shared, driver) = cache::start(client_as(cluster, &user).await, &scope);
    let driver = tokio::spawn(driver);
    let cr = product::new_cr("web-0", "web-0", Desire::Hibernate);
    let create = |cache: &cache::SharedCache| {
        validate::validate(Operation::Create, &ns, Some(&cr), None, cache)
    };

    // The CR list can arrive; the pod list cannot. Give the watchers time to try.
    let crs_api: Api<cocoon_hibernation::api::CocoonHibernation> =
        Api::namespaced(client_as(cluster, &user).await, &ns);
    // The apiserver's RBAC authorizer reads bindings from its own informer, so a fresh
    // binding can be refused for a moment.
    eventually(
        "the CR list is allowed",
        Duration::from_secs(30),
        || async { crs_api.list(&Default::default()).await.ok().map(drop) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!shared.is_synced(), "V3: pods have not been listed");
    let denial = create(&shared).expect_err("V3: fails closed while unsynced");
    assert!(
        denial.unsynced && denial.message.contains("not synced"),
        "{denial:?}"
    );

    grant(
        &admin,
        &ns,
        &user,
        "read-pods",
        serde_json::json!({
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch"],
        }),
    )
    .await;
    eventually(
        "cache synced once pods can be listed",
        Duration::from_secs(60),
        || async { shared.is_synced().then_some(()) },
    )
    .await;
    assert_eq!(create(&shared), Ok(()));
    driver.abort();
}
