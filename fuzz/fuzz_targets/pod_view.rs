//! A4: any pod (as JSON) reads into a PodView without panicking, the cache's PodSlice
//! reads the same view, and the view's derived answers agree with the annotations they
//! come from.
#![no_main]

use cocoon_api::annotations::{self, PodView};
use cocoon_api::pod::PodSlice;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The raw annotation parser on its own.
    if let Ok(text) = std::str::from_utf8(data) {
        let n = annotations::parse_generation(Some(text));
        if n != 0 {
            assert_eq!(text.trim().parse::<i64>().ok(), Some(n));
        }
    }
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let view = PodView::of(&pod);
    // The cache decodes pods straight into a PodSlice: it must read the same view.
    if let Ok(slice) = serde_json::from_slice::<PodSlice>(data) {
        assert_eq!(PodView::from_pod(&slice), view);
    }
    let ann = pod.metadata.annotations.clone().unwrap_or_default();
    let get = |k: &str| ann.get(k).map(String::as_str);
    assert_eq!(
        view.hibernate_requested,
        get(annotations::HIBERNATE) == Some("true")
    );
    assert!(view.vm_name.as_deref().is_none_or(|v| !v.is_empty()));
    assert!(view.vm_id.as_deref().is_none_or(|v| !v.is_empty()));
    if view.lifecycle_hibernated_for_round() {
        assert_eq!(
            get(annotations::LIFECYCLE_STATE),
            Some(annotations::STATE_HIBERNATED)
        );
        assert!(view.observed_generation >= view.cocoonset_generation);
    }
    if view.woken() {
        // W2: never woken while vk reports a hibernate in progress or done.
        assert!(view.container_running && view.vm_id.is_some());
        assert!(!matches!(
            get(annotations::LIFECYCLE_STATE),
            Some("hibernated" | "hibernating")
        ));
    }
    // The patches are built for any pod, and the set patch applies to the pod it saw.
    let set = annotations::set_hibernate_patch(&pod.metadata);
    let _ = annotations::clear_hibernate_patch(&pod.metadata);
    let mut doc = serde_json::to_value(&pod).expect("a pod serializes");
    if json_patch_applies(&mut doc, &set) {
        assert_eq!(
            doc["metadata"]["annotations"][annotations::HIBERNATE],
            "true"
        );
    }
});

fn json_patch_applies(doc: &mut serde_json::Value, patch: &json_patch::Patch) -> bool {
    json_patch::patch(doc, &patch.0).is_ok()
}
