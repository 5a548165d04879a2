//! `kubectl cocoon schedule`: for each pod a schedule drives, when it next sleeps and
//! wakes (K8), and whether an override holds it (K5).

use super::cli::ScheduleArgs;
use super::connect::Connection;
use super::error::PluginError;
use super::resources;
use super::table::{age, render};
use super::terminal::{say, table_layout};
use cocoon_api::schedule::CocoonHibernationSchedule;
use cocoon_api::schedule::{OVERRIDE_UNTIL, SCHEDULE_DESIRE, SCHEDULE_LABEL};
use cocoon_core::schedule::spec;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};

pub async fn run(conn: &Connection, args: &ScheduleArgs) -> Result<(), PluginError> {
    let ns = &conn.namespace;
    let api: Api<CocoonHibernationSchedule> = Api::namespaced(conn.client.clone(), ns);
    let schedules = match &args.name {
        Some(name) => vec![
            api.get(name)
                .await
                .map_err(|e| PluginError::api(format!("reading schedule {ns}/{name}"), e))?,
        ],
        None => {
            api.list(&ListParams::default())
                .await
                .map_err(|e| PluginError::api(format!("listing schedules in {ns}"), e))?
                .items
        }
    };
    if schedules.is_empty() {
        say(&format!("No CocoonHibernationSchedules in namespace {ns}."));
        return Ok(());
    }
    let crs = resources::crs(&conn.client, ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::api(format!("listing CocoonHibernations in {ns}"), e))?
        .items;
    let now = Timestamp::now();
    let mut rows = Vec::new();
    for s in &schedules {
        rows.extend(rows_of(s, &crs, now));
    }
    print!(
        "{}",
        render(
            &[
                "SCHEDULE", "POD", "DESIRE", "PHASE", "SLEEPS", "WAKES", "NOTE"
            ],
            &rows,
            table_layout()
        )
    );
    Ok(())
}

/// One row per CR the schedule drives (by its label); pure, for tests.
pub fn rows_of(
    s: &CocoonHibernationSchedule,
    crs: &[DynamicObject],
    now: Timestamp,
) -> Vec<Vec<String>> {
    let name = s.name_any();
    let (sleeps, wakes, note) = match spec::calendar(&s.spec) {
        Ok(cal) => {
            let (sleep, wake) = cal.next_sleep_and_wake(now);
            (when(sleep, now), when(wake, now), String::new())
        }
        Err(e) => ("-".into(), "-".into(), format!("invalid: {}", e.join("; "))),
    };
    let mut mine: Vec<&DynamicObject> = crs
        .iter()
        .filter(|cr| cr.labels().get(SCHEDULE_LABEL) == Some(&name))
        .collect();
    mine.sort_by_key(|cr| cr.name_any());
    if mine.is_empty() {
        return vec![vec![
            name,
            "<none>".into(),
            String::new(),
            String::new(),
            sleeps,
            wakes,
            note,
        ]];
    }
    mine.iter()
        .map(|cr| {
            let view = resources::view(cr);
            let written = cr.annotations().get(SCHEDULE_DESIRE);
            let until = cr
                .annotations()
                .get(OVERRIDE_UNTIL)
                .and_then(|u| u.parse::<Timestamp>().ok())
                .filter(|u| *u > now);
            let note = match (until, written) {
                _ if s.spec.suspend => "suspended".to_owned(),
                (Some(u), _) => format!("override until {u}"),
                (None, Some(w)) if *w != view.desire => {
                    "override until the next boundary".to_owned()
                }
                _ => note.clone(),
            };
            vec![
                name.clone(),
                view.pod.clone(),
                view.desire.clone(),
                view.phase.clone().unwrap_or_default(),
                sleeps.clone(),
                wakes.clone(),
                note,
            ]
        })
        .collect()
}

/// `in 3h (2026-06-12T18:00:00Z)`, or `never`.
fn when(at: Option<Timestamp>, now: Timestamp) -> String {
    match at {
        Some(at) => format!("in {} ({at})", age(Some(now), at)),
        None => "never".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cr(name: &str, desire: &str, written: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
            "metadata": { "name": name, "namespace": "ns",
                "labels": { SCHEDULE_LABEL: "office" },
                "annotations": { SCHEDULE_DESIRE: written } },
            "spec": { "podRef": { "name": name }, "desire": desire },
            "status": { "phase": "Active" },
        }))
        .unwrap()
    }

    /// K8 K5: each driven pod with its next sleep and wake; an override is named.
    #[test]
    fn k8_rows_show_next_sleep_wake_and_overrides() {
        let s: CocoonHibernationSchedule = serde_json::from_value(json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1alpha1",
            "kind": "CocoonHibernationSchedule",
            "metadata": { "name": "office", "namespace": "ns" },
            "spec": { "selector": {}, "timeZone": "UTC",
                      "awake": [{ "from": "09:00", "to": "17:00" }] },
        }))
        .unwrap();
        let now: Timestamp = "2026-06-10T12:00:00Z".parse().unwrap();
        let rows = rows_of(
            &s,
            &[
                cr("web-1", "Wake", "Hibernate"),
                cr("web-0", "Wake", "Wake"),
            ],
            now,
        );
        assert_eq!(rows[0][1], "web-0");
        assert_eq!(rows[0][4], "in 5h (2026-06-10T17:00:00Z)");
        assert_eq!(rows[0][5], "in 21h (2026-06-11T09:00:00Z)");
        assert_eq!(rows[0][6], "");
        assert_eq!(rows[1][6], "override until the next boundary");
    }
}
