//! End-to-end tests of what the apiserver decides from the chart, on the real
//! kube-apiserver: the VM-identity ValidatingAdmissionPolicy (S3), the webhook's
//! matchConditions, which keep recovery by hand possible while the product is stopped
//! (V7), and the chart's RBAC as the identity the product runs under (P5). Every test
//! works in a fresh namespace, and every cluster-wide object it installs is scoped to
//! that namespace.

use testkit::cluster;
use testkit::product;

use cocoon_hibernation::api::annotations::{VM_ID, VM_NAME};
use cocoon_hibernation::api::{CocoonHibernation, Desire};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use product::{Product, ProductOptions, eventually};
use serde_json::{Value, json};
use std::time::Duration;

/// Bound for anything that waits on propagation (policies, webhook configurations, RBAC).
const LONG: Duration = Duration::from_secs(60);
const FINALIZER: &str = "cocoonhibernation.cocoonset.cocoonstack.io/finalizer";

/// vk-cocoon's identity, allowed by user name.
const VK: &str = "system:serviceaccount:vk:vk-cocoon";
const VK_GROUPS: &[&str] = &["system:serviceaccounts", "system:serviceaccounts:vk"];
/// The CocoonSet operator, allowed through its group.
const OPERATOR: &str = "cocoonset-operator";
const OPERATORS: &str = "cocoonset-operators";
/// A tenant who may create and patch pods, but is not listed.
const TENANT: &str = "tenant-a";

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

fn pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>(),
        },
        "spec": { "containers": [{ "name": "vm", "image": "cocoon/vm:test" }] },
    }))
    .expect("valid pod")
}

/// The message of an API error; panics when the request was admitted.
fn denied<T: std::fmt::Debug>(what: &str, res: Result<T, kube::Error>) -> String {
    match res {
        Err(kube::Error::Api(s)) => s.message,
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(v) => panic!("{what}: admitted, but must be denied: {v:?}"),
    }
}

fn admitted<T>(what: &str, res: Result<T, kube::Error>) -> T {
    res.unwrap_or_else(|e| panic!("{what}: denied, but must be admitted: {e}"))
}

fn annotate(key: &str, value: Option<&str>) -> Patch<Value> {
    Patch::Merge(json!({ "metadata": { "annotations": { key: value } } }))
}

/// S3: with the chart's policy installed for vk-cocoon (by user name) and the CocoonSet
/// operator (by group), a tenant who may create and patch pods is denied setting
/// `vm.cocoonstack.io/name` or `/id` on CREATE and adding, changing or removing them on
/// UPDATE (also through `pods/status`), with a message naming the annotation; the listed
/// identities are admitted; other pod changes stay allowed. On by default: the chart's
/// default values are refused, naming `vmIdentityPolicy`; only `enabled=false` drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s3_only_listed_identities_may_set_or_change_vm_name_and_id() {
    let cluster = cluster::cluster();
    let admin = cluster.client().await;
    let ns = cluster.fresh_namespace(&admin, "s3").await;

    // The chart's defaults name no writer: refused, saying which value to set.
    let out = product::helm_template_output(cluster, &ns, "cocoon-system", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("vmIdentityPolicy (S3) is on by default"),
        "S3: default values must fail naming vmIdentityPolicy ({}): {err}",
        out.status
    );
    assert!(
        err.contains("vmIdentityPolicy.allowedUsernames")
            && err.contains("vmIdentityPolicy.allowedGroups"),
        "S3: the message says which values to set: {err}"
    );
    // Only turning it off on purpose installs without it.
    let off = product::helm_template(
        cluster,
        &ns,
        "cocoon-system",
        &[
            "--set",
            "tls.mode=cert-manager",
            "--set",
            "vmIdentityPolicy.enabled=false",
        ],
    );
    assert!(
        !off.iter().any(|d| d["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))),
        "S3: no policy with vmIdentityPolicy.enabled=false"
    );

    // Everyone here may create, patch and update pods (and their status) in the namespace.
    let subject = |kind: &str, name: &str| json!({ "kind": kind, "name": name, "apiGroup": "rbac.authorization.k8s.io" });
    let rbac = [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "pod-writer", "namespace": ns },
            "rules": [
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch", "update"] },
                { "apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "pod-writers", "namespace": ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-writer" },
            "subjects": [subject("User", TENANT), subject("User", VK), subject("Group", OPERATORS)],
        }),
    ];
    product::apply_docs(&admin, &rbac).await;
    for (user, groups) in [
        (TENANT, &[][..]),
        (VK, VK_GROUPS),
        (OPERATOR, &[OPERATORS][..]),
    ] {
        product::wait_allowed(&admin, user, groups, "patch", "pods", None, Some(&ns)).await;
    }
    let tenant: Api<Pod> = Api::namespaced(cluster.client_as(TENANT, &[]).await, &ns);
    let vk: Api<Pod> = Api::namespaced(cluster.client_as(VK, VK_GROUPS).await, &ns);
    let operator: Api<Pod> = Api::namespaced(cluster.client_as(OPERATOR, &[OPERATORS]).await, &ns);

    // Before the policy the tenant may name a VM: a later denial is the policy's doing.
    admitted(
        "tenant sets vm name before the policy",
        tenant
            .create(&dry_run(), &pod("early", &[(VM_NAME, "vm-of-b")]))
            .await,
    );

    // The chart's policy, scoped to this namespace so parallel tests are undisturbed.
    let values = json!({
        "allowedUsernames": [VK],
        "allowedGroups": [OPERATORS],
        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
    });
    let docs = product::helm_template(
        cluster,
        &ns,
        "cocoon-system",
        &[
            "--set",
            "tls.mode=cert-manager",
            "--set",
            &format!("fullnameOverride={ns}"),
            "--set-json",
            &format!("vmIdentityPolicy={values}"),
            "--show-only",
            "templates/vmidentitypolicy.yaml",
        ],
    );
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    assert_eq!(docs[1]["spec"]["validationActions"], json!(["Deny"]));
    product::apply_docs(&admin, &docs).await;

    // A policy takes a moment to reach the admission chain: poll with a dry run.
    let msg = eventually("the policy denies the tenant", LONG, || async {
        match tenant
            .create(&dry_run(), &pod("web-0", &[(VM_NAME, "vm-of-b")]))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("vmIdentityPolicy") => Some(s),
            _ => None,
        }
    })
    .await;
    assert_eq!(msg.code, 403, "S3: Forbidden: {msg:?}");
    assert!(
        msg.message.contains(VM_NAME) && msg.message.contains(TENANT),
        "S3: the message names the annotation and the requester: {}",
        msg.message
    );

    // CREATE: the tenant may not set either annotation, but may create plain pods.
    let m = denied(
        "tenant creates a pod with a VM id",
        tenant
            .create(&PostParams::default(), &pod("web-1", &[(VM_ID, "id-of-b")]))
            .await,
    );
    assert!(m.contains(VM_ID), "S3 names {VM_ID}: {m}");
    admitted(
        "tenant creates a plain pod",
        tenant
            .create(&PostParams::default(), &pod("plain", &[("team", "a")]))
            .await,
    );

    // The listed identities may: vk-cocoon by user name, the operator by group.
    admitted(
        "vk-cocoon creates a named VM pod",
        vk.create(
            &PostParams::default(),
            &pod("vm-0", &[(VM_NAME, "vm-a-0"), (VM_ID, "id-a-0")]),
        )
        .await,
    );
    let pp = PatchParams::default();
    admitted(
        "vk-cocoon changes the VM id",
        vk.patch("vm-0", &pp, &annotate(VM_ID, Some("id-a-1")))
            .await,
    );
    admitted(
        "the operator (by group) names the plain pod's VM",
        operator
            .patch("plain", &pp, &annotate(VM_NAME, Some("vm-a-plain")))
            .await,
    );

    // UPDATE: the tenant may not add, change or remove either annotation...
    for (what, key, value) in [
        ("tenant adds a VM id", VM_ID, Some("id-of-b")),
        ("tenant changes the VM name", VM_NAME, Some("vm-of-b")),
        ("tenant removes the VM name", VM_NAME, None),
    ] {
        let target = if key == VM_ID { "plain" } else { "vm-0" };
        let m = denied(what, tenant.patch(target, &pp, &annotate(key, value)).await);
        assert!(m.contains(key), "S3 {what}: names {key}: {m}");
    }
    // ...not even through the status subresource, which can carry metadata changes...
    let m = denied(
        "tenant changes the VM name through pods/status",
        tenant
            .patch_status("vm-0", &pp, &annotate(VM_NAME, Some("vm-of-b")))
            .await,
    );
    assert!(m.contains(VM_NAME), "S3 pods/status: {m}");
    // ...but every other change to a named pod stays theirs to make.
    admitted(
        "tenant changes another annotation on a named pod",
        tenant
            .patch("vm-0", &pp, &annotate("team", Some("b")))
            .await,
    );
    let vm0 = vk.get("vm-0").await.expect("get vm-0");
    let ann = vm0.metadata.annotations.unwrap_or_default();
    assert_eq!(ann.get(VM_NAME).map(String::as_str), Some("vm-a-0"));
    assert_eq!(ann.get(VM_ID).map(String::as_str), Some("id-a-1"));

    // Cluster-scoped: remove them (they only ever matched this namespace).
    let vap = format!("{ns}-vm-identity");
    for d in [
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
    ] {
        let out = cluster.kubectl(&["delete", d, &vap, "--ignore-not-found"]);
        assert!(out.status.success(), "delete {d} {vap}: {out:?}");
    }
}

/// S3, the squatting scenario, with the policy as a default install renders it: the whole
/// chart rendered with only the writers named (vk-cocoon by user name, the CocoonSet
/// operator by group; the binding scoped to this namespace so parallel tests are left
/// alone). Tenant B, who may create and patch pods, cannot point a pod at tenant A's VM,
/// neither by creating a pod that names it nor by renaming a pod of its own, and so no
/// CocoonHibernation of B can reach A's snapshot; vk-cocoon's identity is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s3_default_install_refuses_a_tenant_squatting_another_vm() {
    const TENANT_B: &str = "tenant-b";
    const VM_OF_A: &str = "vm-of-a";
    let cluster = cluster::cluster();
    let admin = cluster.client().await;
    let ns = cluster.fresh_namespace(&admin, "s3-squat").await;

    // The whole chart, as installed: the policy is part of the default product.
    let writers = json!({
        "allowedUsernames": [VK],
        "allowedGroups": [OPERATORS],
        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
    });
    let rendered = product::helm_template(
        cluster,
        &ns,
        "cocoon-system",
        &[
            "--set",
            &format!("fullnameOverride={ns}"),
            "--set-json",
            &format!("vmIdentityPolicy={writers}"),
        ],
    );
    assert!(
        rendered.iter().any(|d| d["kind"] == "Deployment"),
        "the whole product was rendered"
    );
    let policy: Vec<Value> = rendered
        .into_iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
        })
        .collect();
    assert_eq!(policy.len(), 2, "S3: a policy and its binding: {policy:?}");
    let binding = policy
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("S3: the binding is rendered");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));

    // Both tenants and vk-cocoon may create and patch pods here.
    let subject = |kind: &str, name: &str| json!({ "kind": kind, "name": name, "apiGroup": "rbac.authorization.k8s.io" });
    let rbac = [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "pod-writer", "namespace": ns },
            "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch"] }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "pod-writers", "namespace": ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-writer" },
            "subjects": [subject("User", TENANT), subject("User", TENANT_B), subject("User", VK)],
        }),
    ];
    product::apply_docs(&admin, &rbac).await;
    for (user, groups) in [(TENANT, &[][..]), (TENANT_B, &[][..]), (VK, VK_GROUPS)] {
        product::wait_allowed(&admin, user, groups, "patch", "pods", None, Some(&ns)).await;
    }
    let tenant_b: Api<Pod> = Api::namespaced(cluster.client_as(TENANT_B, &[]).await, &ns);
    let vk: Api<Pod> = Api::namespaced(cluster.client_as(VK, VK_GROUPS).await, &ns);
    let squat = pod("squat", &[(VM_NAME, VM_OF_A)]);

    // Without the policy the squat goes through: a later denial is the policy's doing.
    admitted(
        "tenant B names tenant A's VM before the policy",
        tenant_b.create(&dry_run(), &squat).await,
    );
    product::apply_docs(&admin, &policy).await;

    // vk-cocoon runs tenant A's VM.
    admitted(
        "vk-cocoon creates tenant A's VM pod",
        vk.create(
            &PostParams::default(),
            &pod("a-0", &[(VM_NAME, VM_OF_A), (VM_ID, "id-of-a")]),
        )
        .await,
    );

    // A policy takes a moment to reach the admission chain: poll with a dry run.
    eventually("the policy is in effect", LONG, || async {
        match tenant_b.create(&dry_run(), &squat).await {
            Err(kube::Error::Api(s)) if s.message.contains("vmIdentityPolicy") => Some(()),
            _ => None,
        }
    })
    .await;
    // Tenant B creating a pod that names A's VM: refused.
    let status = match tenant_b.create(&PostParams::default(), &squat).await {
        Err(kube::Error::Api(s)) => s,
        other => panic!("S3: tenant B's pod naming tenant A's VM must be refused: {other:?}"),
    };
    assert_eq!(status.code, 403, "S3: Forbidden: {status:?}");
    assert!(
        status.message.contains("vmIdentityPolicy")
            && status.message.contains(VM_NAME)
            && status.message.contains(TENANT_B),
        "S3: the message names the policy, the annotation and the requester: {}",
        status.message
    );
    let m = denied(
        "tenant B creates a pod with A's VM id",
        tenant_b
            .create(
                &PostParams::default(),
                &pod("squat-id", &[(VM_ID, "id-of-a")]),
            )
            .await,
    );
    assert!(m.contains(VM_ID), "S3 names {VM_ID}: {m}");

    // Renaming a pod of its own to A's VM: refused too.
    admitted(
        "tenant B creates a plain pod",
        tenant_b
            .create(&PostParams::default(), &pod("b-0", &[]))
            .await,
    );
    let pp = PatchParams::default();
    for (key, value) in [(VM_NAME, VM_OF_A), (VM_ID, "id-of-a")] {
        let m = denied(
            "tenant B points its pod at A's VM",
            tenant_b
                .patch("b-0", &pp, &annotate(key, Some(value)))
                .await,
        );
        assert!(m.contains(key), "S3 names {key}: {m}");
    }

    // vk-cocoon's identity is admitted: it names B's VM on B's pod.
    admitted(
        "vk-cocoon names tenant B's VM",
        vk.patch("b-0", &pp, &annotate(VM_NAME, Some("vm-of-b")))
            .await,
    );
    let vm_name = |p: Pod| p.metadata.annotations.and_then(|a| a.get(VM_NAME).cloned());
    assert_eq!(
        vm_name(vk.get("b-0").await.expect("get b-0")).as_deref(),
        Some("vm-of-b")
    );
    assert_eq!(
        vm_name(vk.get("a-0").await.expect("get a-0")).as_deref(),
        Some(VM_OF_A)
    );
    assert!(
        vk.get_opt("squat").await.expect("get squat").is_none(),
        "S3: no squatting pod exists"
    );

    // Cluster-scoped: remove them (they only ever matched this namespace).
    let vap = format!("{ns}-vm-identity");
    for d in [
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
    ] {
        let out = cluster.kubectl(&["delete", d, &vap, "--ignore-not-found"]);
        assert!(out.status.success(), "delete {d} {vap}: {out:?}");
    }
}

fn has_finalizer(cr: &CocoonHibernation) -> bool {
    cr.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// V7: with the product stopped and its webhook (chart matchConditions, failurePolicy
/// Fail) still installed, a CREATE is refused (fail closed), while flipping a desire,
/// writing status, deleting a CR and removing its finalizer by hand all succeed. The
/// same configuration without matchConditions would block the desire flip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_v7_stopped_product_blocks_creates_but_not_recovery_by_hand() {
    let cluster = cluster::cluster();
    let admin = cluster.client().await;
    product::ensure_crd(&admin).await;
    let ns = cluster.fresh_namespace(&admin, "v7").await;
    let mut product = Product::start(cluster, &ProductOptions::new(&ns, &cluster.registry)).await;
    let vwc_name = product::install_webhook(
        &admin,
        cluster,
        &ns,
        product.webhook_port,
        "cocoonset.cocoonstack.io",
    )
    .await;
    let crs: Api<CocoonHibernation> = Api::namespaced(admin.clone(), &ns);

    // The webhook answers CREATEs (a dry run still calls it).
    eventually("the webhook answering CREATEs", LONG, || async {
        let res = crs
            .create(
                &dry_run(),
                &product::new_cr("not-web-0", "web-0", Desire::Hibernate),
            )
            .await;
        match res {
            Err(kube::Error::Api(s)) if s.message.contains("must equal spec.podRef.name") => {
                Some(())
            }
            _ => None,
        }
    })
    .await;
    for name in ["web-0", "web-1"] {
        product::create_cr(&crs, name, name, Desire::Hibernate).await;
        eventually(&format!("{name} gets its finalizer"), LONG, || async {
            has_finalizer(&crs.get(name).await.ok()?).then_some(())
        })
        .await;
    }

    product.kill9();

    // Fail closed: a CREATE still needs the (now unreachable) webhook.
    let m = denied(
        "CREATE with the product stopped",
        crs.create(
            &dry_run(),
            &product::new_cr("web-2", "web-2", Desire::Hibernate),
        )
        .await,
    );
    assert!(m.contains("failed calling webhook"), "V7 fail closed: {m}");

    // Recovery by hand never waits for the webhook.
    let pp = PatchParams::default();
    let flip = |d: Desire| Patch::Merge(json!({ "spec": { "desire": d } }));
    admitted(
        "flip a desire",
        crs.patch("web-0", &pp, &flip(Desire::Wake)).await,
    );
    let written = admitted(
        "write status",
        crs.patch_status(
            "web-0",
            &pp,
            &Patch::Merge(json!({ "status": { "vmName": "vm-set-by-hand" } })),
        )
        .await,
    );
    assert_eq!(
        written.status.and_then(|s| s.vm_name).as_deref(),
        Some("vm-set-by-hand")
    );
    admitted(
        "delete a CR",
        crs.delete("web-0", &DeleteParams::default()).await,
    );
    let remove_finalizers: Patch<Value> = Patch::Json(
        serde_json::from_value(json!([{ "op": "remove", "path": "/metadata/finalizers" }]))
            .expect("JSON patch"),
    );
    admitted(
        "remove the finalizer",
        crs.patch("web-0", &pp, &remove_finalizers).await,
    );
    product::wait_gone(&crs, "web-0", LONG).await;

    // The subject: the same configuration without matchConditions sends the flip to the
    // stopped webhook, which blocks it.
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let mut copy = serde_json::to_value(vwcs.get(&vwc_name).await.expect("get webhook"))
        .expect("webhook as JSON");
    let copy_name = format!("{vwc_name}-unconditional");
    copy["metadata"] = json!({ "name": copy_name });
    let conditions = copy["webhooks"][0]
        .as_object_mut()
        .expect("one webhook")
        .remove("matchConditions");
    assert!(
        conditions.is_some(),
        "the installed webhook has matchConditions"
    );
    vwcs.patch(
        &copy_name,
        &PatchParams::apply("cocoon-e2e").force(),
        &Patch::Apply(&copy),
    )
    .await
    .expect("install the copy without matchConditions");
    let mut desire = Desire::Wake;
    let m = eventually("the flip blocked without matchConditions", LONG, || {
        desire = if desire == Desire::Wake {
            Desire::Hibernate
        } else {
            Desire::Wake
        };
        let patch = flip(desire);
        let crs = crs.clone();
        async move {
            match crs.patch("web-1", &PatchParams::default(), &patch).await {
                Err(kube::Error::Api(s)) => Some(s.message),
                Ok(_) => None,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
    })
    .await;
    assert!(m.contains("failed calling webhook"), "V7 subject: {m}");

    for name in [&copy_name, &vwc_name] {
        vwcs.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete webhook {name}: {e}"));
    }
}

/// P5: the e2e product runs as the chart's ServiceAccount under the chart's RBAC, not as
/// admin: its finalizer patch is audited under that user, and what the chart does not
/// grant (deleting pods or CRs, reading Secrets, a Lease outside a bound namespace) is
/// refused to that identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_p5_product_runs_as_the_chart_service_account() {
    let cluster = cluster::cluster();
    let admin = cluster.client().await;
    product::ensure_crd(&admin).await;
    let ns = cluster.fresh_namespace(&admin, "p5").await;
    let mark = cluster.audit_mark();
    let _product = Product::start(cluster, &ProductOptions::new(&ns, &cluster.registry)).await;
    let crs: Api<CocoonHibernation> = Api::namespaced(admin.clone(), &ns);
    product::create_cr(&crs, "web-0", "web-0", Desire::Hibernate).await;
    eventually("web-0 gets its finalizer", LONG, || async {
        has_finalizer(&crs.get("web-0").await.ok()?).then_some(())
    })
    .await;

    let identity = product::product_identity(cluster).await;
    let writers: Vec<String> = cluster
        .audit_events_since(mark)
        .into_iter()
        .filter(|e| {
            e["objectRef"]["namespace"] == ns.as_str()
                && e["objectRef"]["resource"] == "cocoonhibernations"
                && e["verb"] == "patch"
        })
        .filter_map(|e| e["user"]["username"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !writers.is_empty() && writers.iter().all(|u| *u == identity.username),
        "P5: the product patches as {}, got {writers:?}",
        identity.username
    );

    let groups: Vec<&str> = identity.groups.iter().map(String::as_str).collect();
    let sa = cluster.client_as(&identity.username, &groups).await;
    let forbidden = |what: &str, res: Result<(), kube::Error>| match res {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("P5: {what} must be forbidden to the product, got {other:?}"),
    };
    let sa_crs: Api<CocoonHibernation> = Api::namespaced(sa.clone(), &ns);
    forbidden(
        "deleting a CR",
        sa_crs
            .delete("web-0", &DeleteParams::default())
            .await
            .map(|_| ()),
    );
    let sa_pods: Api<Pod> = Api::namespaced(sa.clone(), &ns);
    forbidden(
        "deleting pods",
        sa_pods
            .delete_collection(&DeleteParams::default(), &Default::default())
            .await
            .map(|_| ()),
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(sa.clone(), &ns);
    forbidden(
        "listing Secrets",
        secrets.list(&Default::default()).await.map(|_| ()),
    );
    // Leases are read and written in every namespace (the activity records, I2, I3), but
    // never deleted: not an activity record, not another component's election.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(sa, &ns);
    forbidden(
        "deleting a Lease",
        leases
            .delete("cocoon-hibernation", &DeleteParams::default())
            .await
            .map(|_| ()),
    );
}
