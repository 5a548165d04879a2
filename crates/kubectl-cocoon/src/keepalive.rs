//! `kubectl cocoon keepalive POD --for 2h` (I2): marks the pod busy until then on its
//! activity Lease, and reports activity now, so no idle policy puts it to sleep meanwhile.
//! Coalesced as every reporter is (I2): a run within 10 s of the plugin's last report,
//! whose busy mark already reaches within 10 s of the one asked for, writes nothing (it
//! reads the Lease first; a read costs the apiserver no write).

use super::cli::KeepaliveArgs;
use super::connect::Connection;
use super::error::PluginError;
use super::terminal::say;
use cocoon_api::activity::{ACTIVITY_FOR, BUSY_UNTIL, COALESCE, lease_name, report_patch};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Who the plugin reports as.
const HOLDER: &str = "kubectl-cocoon";

/// The patch: a report now plus the busy mark.
pub fn keepalive_patch(now: Timestamp, until: Timestamp) -> Value {
    let mut patch = report_patch(now, HOLDER);
    patch["metadata"] = json!({ "annotations": { BUSY_UNTIL: until.to_string() } });
    patch
}

/// I2: whether this run has to write, given the Lease as it is (pure).
pub fn needed(lease: Option<&Lease>, now: Timestamp, until: Timestamp) -> bool {
    let Some(lease) = lease else {
        return true;
    };
    let spec = lease.spec.as_ref();
    let ours = spec.and_then(|s| s.holder_identity.as_deref()) == Some(HOLDER);
    let window = SignedDuration::try_from(COALESCE).unwrap_or(SignedDuration::ZERO);
    let recent = spec
        .and_then(|s| s.renew_time.as_ref())
        .is_some_and(|t| now.duration_since(t.0) < window && t.0 <= now);
    let busy = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BUSY_UNTIL))
        .and_then(|b| b.parse::<Timestamp>().ok());
    let covers = busy.is_some_and(|b| until.duration_since(b).abs() < window);
    !(ours && recent && covers)
}

pub async fn run(conn: &Connection, args: &KeepaliveArgs) -> Result<(), PluginError> {
    let ns = &conn.namespace;
    let name = lease_name(&args.pod).ok_or_else(|| {
        PluginError::Config(format!(
            "pod name {:?} is too long for an activity Lease",
            args.pod
        ))
    })?;
    let now = Timestamp::now();
    let span =
        SignedDuration::try_from(args.r#for).map_err(|e| PluginError::Config(e.to_string()))?;
    let until = now
        .checked_add(span)
        .map_err(|e| PluginError::Config(format!("--for: {e}")))?;
    let api: Api<Lease> = Api::namespaced(conn.client.clone(), ns);
    let current = api
        .get_opt(&name)
        .await
        .map_err(|e| PluginError::api(format!("reading Lease {ns}/{name}"), e))?;
    if !needed(current.as_ref(), now, until) {
        say(&format!(
            "{ns}/{}: already busy until about {until}; reported less than {}s ago (Lease {name})",
            args.pod,
            COALESCE.as_secs()
        ));
        return Ok(());
    }
    let patch = keepalive_patch(now, until);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        // No Lease yet (no idle policy selected the pod so far): make it.
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let mut lease: Lease = serde_json::from_value(patch)
                .map_err(|e| PluginError::Config(format!("building the Lease: {e}")))?;
            lease.metadata.name = Some(name.clone());
            let label = if args.pod.len() <= 63 {
                args.pod.as_str()
            } else {
                ""
            };
            lease.metadata.labels = Some([(ACTIVITY_FOR.to_owned(), label.to_owned())].into());
            api.create(&PostParams::default(), &lease)
                .await
                .map_err(|e| PluginError::api(format!("creating Lease {ns}/{name}"), e))?;
        }
        Err(e) => return Err(PluginError::api(format!("updating Lease {ns}/{name}"), e)),
    }
    say(&format!(
        "{ns}/{}: busy until {until} (Lease {name})",
        args.pod
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC I2: keepalive reports activity now and marks the pod busy until then, in one
    /// write.
    #[test]
    fn i2_keepalive_reports_and_marks_busy() {
        let now: Timestamp = "2026-06-10T12:00:00Z".parse().unwrap();
        let until: Timestamp = "2026-06-10T14:00:00Z".parse().unwrap();
        let p = keepalive_patch(now, until);
        assert_eq!(
            p["metadata"]["annotations"][BUSY_UNTIL],
            "2026-06-10T14:00:00Z"
        );
        assert_eq!(p["spec"]["renewTime"], "2026-06-10T12:00:00.000000Z");
        assert_eq!(p["spec"]["holderIdentity"], HOLDER);
    }

    /// SPEC I2: keepalive is coalesced like every reporter: within 10 s of its own last
    /// report, with a busy mark reaching within 10 s of the one asked for, no write; any
    /// other reporter's write, an older report, another mark or no Lease: a write.
    #[test]
    fn i2_keepalive_coalesces_its_own_reports() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let lease = |holder: &str, renew: &str, busy: &str| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "cocoon-activity-a", "annotations": {BUSY_UNTIL: busy}},
                "spec": {"holderIdentity": holder, "renewTime": renew},
            }))
            .unwrap()
        };
        let now = t("2026-06-10T12:00:05Z");
        let until = t("2026-06-10T14:00:05Z");
        let ours = lease(
            HOLDER,
            "2026-06-10T12:00:00.000000Z",
            "2026-06-10T14:00:00Z",
        );
        assert!(!needed(Some(&ours), now, until), "a second run 5 s later");
        assert!(needed(None, now, until), "no Lease yet");
        let old = lease(
            HOLDER,
            "2026-06-10T11:59:50.000000Z",
            "2026-06-10T14:00:00Z",
        );
        assert!(needed(Some(&old), now, until), "our last report 15 s ago");
        let theirs = lease(
            "wake-proxy",
            "2026-06-10T12:00:00.000000Z",
            "2026-06-10T14:00:00Z",
        );
        assert!(
            needed(Some(&theirs), now, until),
            "another reporter's write"
        );
        assert!(
            needed(Some(&ours), now, t("2026-06-10T16:00:05Z")),
            "a longer busy mark"
        );
        assert!(
            needed(Some(&ours), now, t("2026-06-10T12:30:05Z")),
            "a shorter busy mark"
        );
    }
}
