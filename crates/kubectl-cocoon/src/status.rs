//! `status`: CocoonHibernations as a table, with what each waits for and since when;
//! where an idle policy is in scope, each selected pod's last activity, busy mark and
//! when it would sleep (I6, `idle.rs`).

use super::cli::{Output, StatusArgs};
use super::connect::Connection;
use super::error::PluginError;
use super::idle::{self, Columns};
use super::resources;
use super::table::{age, render};
use super::terminal::{say, table_layout};
use super::view::CrView;
use cocoon_api::activity::ACTIVITY_FOR;
use cocoon_api::idle::CocoonIdlePolicy;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use std::collections::HashMap;

pub async fn run(conn: &Connection, args: &StatusArgs) -> Result<(), PluginError> {
    let (api, scope) = if args.all_namespaces {
        (
            resources::all_crs(&conn.client),
            "any namespace".to_string(),
        )
    } else {
        (
            resources::crs(&conn.client, &conn.namespace),
            format!("namespace {}", conn.namespace),
        )
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::api(format!("listing CocoonHibernations in {scope}"), e))?;
    let mut crs: Vec<CrView> = list.items.iter().map(resources::view).collect();
    if let Some(pod) = &args.pod {
        crs.retain(|cr| &cr.name == pod || &cr.pod == pod);
        if crs.is_empty() {
            return Err(PluginError::Refused(format!(
                "no CocoonHibernation for pod {pod} in {scope}; create one with `kubectl cocoon hibernate {pod}`"
            )));
        }
    }
    if crs.is_empty() {
        say(&format!("No CocoonHibernations found in {scope}."));
        return Ok(());
    }
    crs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let wide = args.output == Some(Output::Wide);
    let now = Timestamp::now();
    let idle = idle_columns(conn, args.all_namespaces, &crs, now).await?;
    let (header, rows) = table(&crs, now, args.all_namespaces, wide, idle.as_ref());
    say(render(&header, &rows, table_layout()).trim_end());
    Ok(())
}

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// I6: the idle columns, when an idle policy is in scope (`None`: no policy, or a server
/// without the CocoonIdlePolicy API). Pods are read as metadata only.
async fn idle_columns(
    conn: &Connection,
    all_namespaces: bool,
    crs: &[CrView],
    now: Timestamp,
) -> Result<Option<HashMap<String, Columns>>, PluginError> {
    let ns = (!all_namespaces).then_some(conn.namespace.as_str());
    let policies = match api::<CocoonIdlePolicy>(&conn.client, ns)
        .list(&ListParams::default())
        .await
    {
        Ok(list) if list.items.is_empty() => return Ok(None),
        Ok(list) => list.items,
        // An install older than the idle policy has no such API.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
        Err(e) => return Err(PluginError::api("listing CocoonIdlePolicies", e)),
    };
    let pods = api::<Pod>(&conn.client, ns)
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| PluginError::api("listing pods", e))?
        .items;
    let leases = api::<Lease>(&conn.client, ns)
        .list(&ListParams::default().labels(ACTIVITY_FOR))
        .await
        .map_err(|e| PluginError::api("listing activity Leases", e))?
        .items;
    let fetched = idle::Fetched {
        policies,
        pods,
        leases,
    };
    Ok(Some(idle::columns(crs, &fetched, now)))
}

/// The table's header and rows (pure). With `idle`, the idle columns before the message.
pub fn table(
    crs: &[CrView],
    now: Timestamp,
    all_namespaces: bool,
    wide: bool,
    idle: Option<&HashMap<String, Columns>>,
) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let mut header = Vec::new();
    if all_namespaces {
        header.push("NAMESPACE");
    }
    header.extend(["NAME", "POD", "DESIRE", "PHASE", "REASON", "AGE", "VM"]);
    if wide {
        header.extend(["DIGEST", "ATTEMPTS", "LAST FAILURE"]);
    }
    if idle.is_some() {
        header.extend(["LAST ACTIVITY", "BUSY", "SLEEPS"]);
    }
    header.push("MESSAGE");
    let rows = crs
        .iter()
        .map(|cr| {
            let mut row = Vec::new();
            if all_namespaces {
                row.push(cr.namespace.clone());
            }
            row.extend([
                cr.name.clone(),
                cr.pod.clone(),
                cr.desire.clone(),
                cr.phase.clone().unwrap_or_default(),
                cr.reason().to_string(),
                age(cr.since(), now),
                cr.vm_name.clone().unwrap_or_default(),
            ]);
            if wide {
                row.push(cr.digest.as_deref().map(short_digest).unwrap_or_default());
                row.push(cr.attempts.map(|a| a.to_string()).unwrap_or_default());
                row.push(
                    cr.last_failure
                        .as_ref()
                        .map(|f| format!("{} {} ago", f.reason, age(f.time, now)))
                        .unwrap_or_default(),
                );
            }
            if let Some(idle) = idle {
                row.extend(idle.get(&cr.key()).cloned().unwrap_or_default());
            }
            let message = if cr.deleting {
                format!("being deleted; {}", cr.message())
            } else {
                cr.message().to_string()
            };
            row.push(message);
            row
        })
        .collect();
    (header, rows)
}

/// `sha256:` and the first 12 hex digits, as docker shows image IDs.
fn short_digest(digest: &str) -> String {
    match digest.split_once(':') {
        Some((algorithm, hex)) => {
            format!("{algorithm}:{}", hex.chars().take(12).collect::<String>())
        }
        None => digest.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cr(name: &str, phase: &str, progressing: Option<(&str, &str)>) -> CrView {
        let mut conditions = vec![
            json!({"type": "Ready", "status": "False", "reason": "Pending",
            "message": "waiting for vk-cocoon to hibernate vm vm-a",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        ];
        if let Some((reason, message)) = progressing {
            conditions.push(
                json!({"type": "Progressing", "status": "True", "reason": reason,
                "message": message, "lastTransitionTime": "2026-01-01T00:01:00Z"}),
            );
        }
        CrView::from_json(&json!({
            "metadata": {"namespace": "shop", "name": name, "creationTimestamp": "2025-12-31T00:00:00Z"},
            "spec": {"podRef": {"name": name}, "desire": "Hibernate"},
            "status": {"phase": phase, "vmName": "vm-a", "attempts": 2,
                       "snapshot": {"digest": "sha256:0123456789abcdef0123"},
                       "conditions": conditions}
        }))
    }

    #[test]
    fn rows_show_reason_age_and_message() {
        let now: Timestamp = "2026-01-01T00:03:00Z".parse().unwrap();
        let crs = [
            cr(
                "web-0",
                "Hibernating",
                Some(("RegistryUnavailable", "probe failed: HTTP 503")),
            ),
            cr("web-1", "Hibernating", None),
        ];
        let (header, rows) = table(&crs, now, false, false, None);
        assert_eq!(
            header,
            [
                "NAME", "POD", "DESIRE", "PHASE", "REASON", "AGE", "VM", "MESSAGE"
            ]
        );
        assert_eq!(
            rows[0],
            [
                "web-0",
                "web-0",
                "Hibernate",
                "Hibernating",
                "RegistryUnavailable",
                "2m",
                "vm-a",
                "probe failed: HTTP 503"
            ]
        );
        assert_eq!(
            rows[1][4], "Pending",
            "the Ready reason without a Progressing one"
        );
        assert_eq!(rows[1][5], "3m");
        assert_eq!(rows[1][7], "waiting for vk-cocoon to hibernate vm vm-a");
    }

    #[test]
    fn all_namespaces_and_wide_add_columns() {
        let now: Timestamp = "2026-01-01T00:03:00Z".parse().unwrap();
        let (header, rows) = table(&[cr("a", "Hibernated", None)], now, true, true, None);
        assert_eq!(header[0], "NAMESPACE");
        assert_eq!(rows[0][0], "shop");
        let at = |name| header.iter().position(|h| *h == name).unwrap();
        assert_eq!(rows[0][at("DIGEST")], "sha256:0123456789ab");
        assert_eq!(rows[0][at("ATTEMPTS")], "2");
        assert_eq!(*header.last().unwrap(), "MESSAGE");
    }

    /// SPEC I6: with an idle policy in scope, the idle columns come before the message;
    /// a pod no policy selects has them empty.
    #[test]
    fn i6_idle_columns_before_the_message() {
        let now: Timestamp = "2026-01-01T00:03:00Z".parse().unwrap();
        let idle = HashMap::from([(
            "shop/web-0".to_string(),
            ["2m ago".to_string(), String::new(), "in 28m".to_string()],
        )]);
        let crs = [cr("web-0", "Active", None), cr("web-1", "Active", None)];
        let (header, rows) = table(&crs, now, false, false, Some(&idle));
        let at = |name| header.iter().position(|h| *h == name).unwrap();
        assert_eq!(at("SLEEPS") + 1, at("MESSAGE"));
        assert_eq!(rows[0][at("LAST ACTIVITY")], "2m ago");
        assert_eq!(rows[0][at("SLEEPS")], "in 28m");
        assert_eq!(rows[1][at("SLEEPS")], "");
        assert_eq!(rows[1].len(), header.len());
    }
}
