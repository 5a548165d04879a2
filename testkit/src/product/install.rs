//! The CRD and the test webhook configuration, installed and waited for.

use super::chart::chart_match_conditions;
use super::crs::eventually;
use crate::cluster::Cluster;
use base64::Engine;
use cocoon_hibernation::api::CocoonHibernation;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use serde_json::{Value, json};
use std::time::Duration;

/// Installs both CRDs (CocoonHibernation with its CEL rule, and the schedules' of K1) by
/// server-side apply and waits until they are Established.
pub async fn ensure_crd(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        CocoonHibernation::crd(),
        cocoon_hibernation::schedule::CocoonHibernationSchedule::crd(),
        cocoon_hibernation::idle::CocoonIdlePolicy::crd(),
    ] {
        let name = crd.metadata.name.clone().expect("crd name");
        api.patch(
            &name,
            &PatchParams::apply("cocoon-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        eventually("CRD established", Duration::from_secs(30), || async {
            let crd = api.get(&name).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
}

/// A ValidatingWebhookConfiguration for one namespace, pointing at `port` on loopback,
/// with the chart's `matchConditions` (V7).
pub async fn install_webhook(
    client: &kube::Client,
    cluster: &Cluster,
    namespace: &str,
    port: u16,
    group: &str,
) -> String {
    let name = format!(
        "cocoon-e2e-{namespace}-{}",
        group.split('.').next().unwrap_or("g")
    );
    let ca = base64::engine::general_purpose::STANDARD.encode(&cluster.ca_cert_pem);
    let hook = |name: &str, path: &str, version: &str, resource: &str, conditions: Value| {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5,
            "clientConfig": { "url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": namespace } },
            "matchConditions": conditions,
            "rules": [{
                "apiGroups": [group],
                "apiVersions": [version],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
                "scope": "Namespaced",
            }],
        })
    };
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": name },
        "webhooks": [
            // V7: the chart's own conditions, so the two cannot drift.
            hook(
                "validate.cocoonhibernation.cocoonstack.io",
                "/validate-cocoonhibernation",
                "v1",
                "cocoonhibernations",
                chart_match_conditions(cluster),
            ),
            // K1: schedules, as the chart's second webhook.
            hook(
                "validate.cocoonhibernationschedule.cocoonstack.io",
                "/validate-cocoonhibernationschedule",
                "v1alpha1",
                "cocoonhibernationschedules",
                json!([{
                    "name": "create-or-spec-change",
                    "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
                }]),
            ),
            // I1: idle policies, as the chart's third webhook.
            hook(
                "validate.cocoonidlepolicy.cocoonstack.io",
                "/validate-cocoonidlepolicy",
                "v1alpha1",
                "cocoonidlepolicies",
                json!([{
                    "name": "create-or-spec-change",
                    "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
                }]),
            ),
        ],
    }))
    .expect("valid webhook configuration");
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("cocoon-e2e").force(),
        &Patch::Apply(&vwc),
    )
    .await
    .expect("apply webhook configuration");
    wait_webhook_in_effect(client, namespace, group).await;
    name
}

/// Waits until the apiserver sends CREATEs of `group`'s CocoonHibernations in `namespace`
/// to a webhook: a dry-run CREATE (no side effects) is answered by a webhook, or fails
/// calling it, instead of being admitted. A configuration takes a moment to reach the
/// admission chain; until then requests pass unchecked, and an update that is a no-op by
/// then is never sent (matchConditions).
pub async fn wait_webhook_in_effect(client: &kube::Client, namespace: &str, group: &str) {
    use kube::core::{ApiResource, DynamicObject};
    let ar = ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "CocoonHibernation".into(),
        plural: "cocoonhibernations".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    // Named unlike its pod: V1 denies it, so it is never admitted once the webhook is asked.
    let probe: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "CocoonHibernation",
        "metadata": { "name": "cocoon-e2e-webhook-probe" },
        "spec": { "podRef": { "name": "cocoon-e2e-webhook-probe-pod" }, "desire": "Wake" },
    }))
    .expect("probe CR");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        &format!("the webhook configuration in effect for {group} in {namespace}"),
        Duration::from_secs(60),
        || async {
            match api.create(&dry_run, &probe).await {
                Err(kube::Error::Api(s))
                    if s.message.contains("admission webhook")
                        || s.message.contains("failed calling webhook") =>
                {
                    Some(())
                }
                _ => None,
            }
        },
    )
    .await;
}
