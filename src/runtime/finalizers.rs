//! The JSON patches that add and remove a controller's finalizer (R1, G2, K4), for every
//! kind: each `test`s what it read first, so a concurrent change to the list, or an
//! object recreated under the same name, makes the patch fail (422) and the pass read
//! again, instead of clobbering another writer's finalizer.
//!
//! Not kube-runtime's `finalizer` helper: see `controller/finalizer.rs` for why.

use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation, TestOperation};
use jsonptr::PointerBuf;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

fn finalizers_pointer() -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "finalizers"])
}

fn test(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path, value })
}

/// Appends `finalizer` to the list as `meta` shows it; without a list, creates one on the
/// version `meta` was read at.
pub fn add(meta: &ObjectMeta, finalizer: &str) -> Patch {
    let ops = match &meta.finalizers {
        Some(list) => vec![
            test(finalizers_pointer(), json!(list)),
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
                value: Value::String(finalizer.to_owned()),
            }),
        ],
        None => {
            let version = meta.resource_version.iter().map(|rv| {
                test(
                    PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                    Value::String(rv.clone()),
                )
            });
            version
                .chain([PatchOperation::Add(AddOperation {
                    path: finalizers_pointer(),
                    value: json!([finalizer]),
                })])
                .collect()
        }
    };
    Patch(ops)
}

/// Removes `finalizer`, keeping any others, only if the object (uid) and its list are
/// what `meta` shows.
pub fn remove(meta: &ObjectMeta, finalizer: &str) -> Patch {
    let current = meta.finalizers.clone().unwrap_or_default();
    let kept: Vec<&String> = current.iter().filter(|f| *f != finalizer).collect();
    let uid = meta.uid.iter().map(|uid| {
        test(
            PointerBuf::from_tokens(["metadata", "uid"]),
            Value::String(uid.clone()),
        )
    });
    Patch(
        uid.chain([
            test(finalizers_pointer(), json!(current)),
            PatchOperation::Replace(ReplaceOperation {
                path: finalizers_pointer(),
                value: json!(kept),
            }),
        ])
        .collect(),
    )
}

/// `patch`, applied only to the version of the object `meta` was read at: for a removal
/// that rests on all the pass read (a schedule releases its CRs by the spec it saw).
pub fn at_version(meta: &ObjectMeta, patch: Patch) -> Patch {
    let version = meta.resource_version.iter().map(|rv| {
        test(
            PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            Value::String(rv.clone()),
        )
    });
    Patch(version.chain(patch.0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CocoonHibernation, CocoonHibernationSpec, Desire, FINALIZER, PodRef};
    use crate::schedule::controller::FINALIZER as SCHEDULE_FINALIZER;
    use crate::schedule::{CocoonHibernationSchedule, CocoonHibernationScheduleSpec};

    const OURS: &str = "example.com/ours";

    fn meta(finalizers: Option<&[&str]>) -> ObjectMeta {
        ObjectMeta {
            name: Some("o".into()),
            uid: Some("uid-1".into()),
            resource_version: Some("5".into()),
            finalizers: finalizers.map(|f| f.iter().map(|s| (*s).to_owned()).collect()),
            ..ObjectMeta::default()
        }
    }

    /// Applies `patch` to an object whose metadata is `on`; None if a `test` failed.
    fn apply(patch: &Patch, on: &ObjectMeta) -> Option<Value> {
        let mut doc = json!({ "metadata": on });
        json_patch::patch(&mut doc, &patch.0).ok()?;
        Some(doc["metadata"]["finalizers"].clone())
    }

    /// SPEC R1 K4: adding appends ours and keeps the others; it fails, rather than
    /// clobber, when the list or (with no list) the object changed since it was read.
    #[rstest::rstest]
    #[case::r1_appends(Some(&["other"][..]), None, Some(json!(["other", OURS])))]
    #[case::r1_creates_the_list(None, None, Some(json!([OURS])))]
    #[case::r1_list_changed(Some(&["other"][..]), Some(meta(Some(&["x", "y"]))), None)]
    #[case::r1_object_changed(None, Some(ObjectMeta { resource_version: Some("6".into()), ..meta(None) }), None)]
    fn r1_k4_add_keeps_others_and_never_clobbers(
        #[case] read: Option<&[&str]>,
        #[case] now: Option<ObjectMeta>,
        #[case] want: Option<Value>,
    ) {
        let seen = meta(read);
        let patch = add(&seen, OURS);
        assert_eq!(apply(&patch, now.as_ref().unwrap_or(&seen)), want);
    }

    /// SPEC G2 K4: removing keeps the others; it fails when the list changed or the name
    /// now holds another object (a CR or schedule recreated keeps its own finalizer).
    #[rstest::rstest]
    #[case::g2_keeps_others(&["a", OURS, "b"], None, Some(json!(["a", "b"])))]
    #[case::g2_last_one(&[OURS], None, Some(json!([])))]
    #[case::g2_list_changed(&["a", OURS], Some(meta(Some(&["a", OURS, "c"]))), None)]
    #[case::g2_recreated(&[OURS], Some(ObjectMeta { uid: Some("uid-2".into()), ..meta(Some(&[OURS])) }), None)]
    fn g2_k4_remove_keeps_others_and_only_from_the_same_object(
        #[case] read: &[&str],
        #[case] now: Option<ObjectMeta>,
        #[case] want: Option<Value>,
    ) {
        let seen = meta(Some(read));
        let patch = remove(&seen, OURS);
        assert_eq!(apply(&patch, now.as_ref().unwrap_or(&seen)), want);
    }

    /// SPEC K4: a schedule's finalizer goes only from the version whose spec the pass
    /// released its CRs by; any change since (its onDelete) makes the pass run again.
    #[rstest::rstest]
    #[case::k4_same_version(None, Some(json!([])))]
    #[case::k4_spec_changed(Some(ObjectMeta { resource_version: Some("6".into()), ..meta(Some(&[OURS])) }), None)]
    fn k4_removal_at_the_version_read(
        #[case] now: Option<ObjectMeta>,
        #[case] want: Option<Value>,
    ) {
        let seen = meta(Some(&[OURS]));
        let patch = at_version(&seen, remove(&seen, OURS));
        assert_eq!(apply(&patch, now.as_ref().unwrap_or(&seen)), want);
    }

    /// SPEC R1 K4: both controllers' finalizers go through the same patches, on their own
    /// objects serialized as the apiserver holds them.
    #[test]
    fn r1_k4_both_kinds_add_and_remove_their_finalizer() {
        let mut cr = CocoonHibernation::new(
            "p",
            CocoonHibernationSpec {
                pod_ref: PodRef { name: "p".into() },
                desire: Desire::Hibernate,
                hibernate_timeout: None,
                wake_timeout: None,
            },
        );
        cr.metadata = meta(Some(&["other"]));
        let mut s = CocoonHibernationSchedule::new(
            "s",
            CocoonHibernationScheduleSpec::always_asleep(Default::default()),
        );
        s.metadata = meta(None);
        for (mut doc, meta, finalizer) in [
            (serde_json::to_value(&cr).unwrap(), &cr.metadata, FINALIZER),
            (
                serde_json::to_value(&s).unwrap(),
                &s.metadata,
                SCHEDULE_FINALIZER,
            ),
        ] {
            json_patch::patch(&mut doc, &add(meta, finalizer).0).unwrap();
            let list = doc["metadata"]["finalizers"].as_array().unwrap().clone();
            assert_eq!(list.last(), Some(&json!(finalizer)));
            let added: ObjectMeta = serde_json::from_value(doc["metadata"].clone()).unwrap();
            json_patch::patch(&mut doc, &remove(&added, finalizer).0).unwrap();
            assert!(
                !doc["metadata"]["finalizers"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(finalizer))
            );
        }
    }
}
