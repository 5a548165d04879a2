//! `kubectl cocoon keepalive POD --for 2h` (I2): marks the pod busy until then on its
//! activity Lease, and reports activity now, so no idle policy puts it to sleep meanwhile.

use super::cli::KeepaliveArgs;
use super::connect::Connection;
use super::error::PluginError;
use super::terminal::say;
use cocoon_api::activity::{ACTIVITY_FOR, BUSY_UNTIL, lease_name, report_patch};
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
}
