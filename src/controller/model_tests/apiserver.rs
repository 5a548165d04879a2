//! An in-memory apiserver for the model test: one CR (with its status subresource) and its
//! pod, serving the calls a pass makes the way kube-apiserver answers them: a JSON Patch
//! whose `test` op fails is 422, a merge patch at another resourceVersion is 409, every
//! write that changes something bumps the resourceVersion, and a deleting CR whose last
//! finalizer goes is gone. Any other request is recorded as a harness failure.

use crate::leader::Fence;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::sync::Arc;

const CR_PATH: &str = "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations/web-0";
const STATUS_PATH: &str =
    "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations/web-0/status";
const POD_PATH: &str = "/api/v1/namespaces/ns/pods/web-0";
/// G1's fresh list: every namespace, metadata only.
const PODS_PATH: &str = "/api/v1/pods";
const JSON_PATCH: &str = "application/json-patch+json";
const MERGE_PATCH: &str = "application/merge-patch+json";

/// What the apiserver holds, and the fence it closes after a set number of requests.
pub(super) struct Store {
    pub cr: Option<Value>,
    pub pod: Value,
    /// G1: a pod of another name the operator created for the same VM.
    pub replacement: Option<Value>,
    rv: u64,
    fence: Fence,
    /// Requests (events aside) since the pass began, and at which one the fence closes.
    requests: usize,
    cut_at: Option<usize>,
    /// The user flips the desire right after this request of the pass (None: no race).
    pub flip_after: Option<usize>,
    pub unexpected: Vec<String>,
}

impl Store {
    pub fn new(pod: Value, fence: Fence) -> Self {
        let mut store = Store {
            cr: None,
            pod,
            replacement: None,
            rv: 1,
            fence,
            requests: 0,
            cut_at: None,
            flip_after: None,
            unexpected: Vec::new(),
        };
        let pod = store.pod.clone();
        store.pod = store.stamp(pod);
        store
    }

    /// S1: the fence closes while the pass's `n`th request is in flight (None: it does not).
    pub fn cut_fence_at(&mut self, n: Option<usize>) {
        self.requests = 0;
        self.cut_at = n;
    }

    /// A new resourceVersion on `doc`, as on every write that changed something.
    pub fn stamp(&mut self, mut doc: Value) -> Value {
        self.rv += 1;
        doc["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        doc
    }

    fn handle(
        &mut self,
        method: &Method,
        path: &str,
        ct: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        if path.contains("/events") {
            return (StatusCode::OK, json!({}));
        }
        self.requests += 1;
        if self.cut_at == Some(self.requests) {
            self.fence.close();
        }
        let answer = self.answer(method, path, ct, body);
        if self.flip_after == Some(self.requests) {
            self.flip_desire();
        }
        answer
    }

    /// A user's `spec.desire` flip: a new generation and resourceVersion.
    pub fn flip_desire(&mut self) {
        let Some(mut cr) = self.cr.clone() else {
            return;
        };
        let desire = if cr["spec"]["desire"] == "Wake" {
            "Hibernate"
        } else {
            "Wake"
        };
        cr["spec"]["desire"] = json!(desire);
        let generation = cr["metadata"]["generation"].as_i64().unwrap_or(1);
        cr["metadata"]["generation"] = json!(generation + 1);
        self.cr = Some(self.stamp(cr));
    }

    fn answer(
        &mut self,
        method: &Method,
        path: &str,
        ct: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        match (method, path) {
            (&Method::GET, CR_PATH) => match &self.cr {
                Some(cr) => (StatusCode::OK, cr.clone()),
                None => failure(StatusCode::NOT_FOUND, "NotFound"),
            },
            (&Method::PATCH, CR_PATH) if ct == JSON_PATCH => self.patch_cr(body),
            (&Method::PATCH, STATUS_PATH) if ct == MERGE_PATCH => self.patch_status(body),
            (&Method::GET, POD_PATH) => (StatusCode::OK, self.pod.clone()),
            (&Method::PATCH, POD_PATH) if ct == JSON_PATCH => {
                match self.json_patched(&self.pod.clone(), body) {
                    Ok(pod) => {
                        self.pod = pod;
                        (StatusCode::OK, self.pod.clone())
                    }
                    Err(e) => e,
                }
            }
            (&Method::GET, PODS_PATH) => (StatusCode::OK, self.pod_list()),
            _ => {
                self.unexpected.push(format!("{method} {path} ({ct})"));
                failure(StatusCode::NOT_FOUND, "NotFound")
            }
        }
    }

    fn patch_cr(&mut self, body: Value) -> (StatusCode, Value) {
        let Some(cr) = self.cr.clone() else {
            return failure(StatusCode::NOT_FOUND, "NotFound");
        };
        let next = match self.json_patched(&cr, body) {
            Ok(next) => next,
            Err(e) => return e,
        };
        let finalizers = next["metadata"]["finalizers"]
            .as_array()
            .map_or(0, Vec::len);
        let deleting = !next["metadata"]["deletionTimestamp"].is_null();
        self.cr = (!deleting || finalizers > 0).then(|| next.clone());
        (StatusCode::OK, next)
    }

    fn patch_status(&mut self, body: Value) -> (StatusCode, Value) {
        let Some(cr) = self.cr.clone() else {
            return failure(StatusCode::NOT_FOUND, "NotFound");
        };
        let precondition = &body["metadata"]["resourceVersion"];
        if !precondition.is_null() && *precondition != cr["metadata"]["resourceVersion"] {
            return failure(StatusCode::CONFLICT, "Conflict");
        }
        let mut next = cr.clone();
        json_patch::merge(&mut next["status"], &body["status"]);
        let next = self.changed(&cr, next);
        self.cr = Some(next.clone());
        (StatusCode::OK, next)
    }

    /// `doc` with the JSON Patch in `body` applied; a failed `test` op is a 422.
    fn json_patched(&mut self, doc: &Value, body: Value) -> Result<Value, (StatusCode, Value)> {
        let invalid = |_| failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid");
        let patch: json_patch::Patch = serde_json::from_value(body).map_err(|e| {
            self.unexpected.push(format!("not a JSON Patch: {e}"));
            failure(StatusCode::BAD_REQUEST, "BadRequest")
        })?;
        let mut next = doc.clone();
        json_patch::patch(&mut next, &patch).map_err(invalid)?;
        Ok(self.changed(doc, next))
    }

    /// A write that changed nothing keeps the resourceVersion, as the apiserver's does.
    fn changed(&mut self, old: &Value, next: Value) -> Value {
        if *old == next { next } else { self.stamp(next) }
    }

    fn pod_list(&self) -> Value {
        let items: Vec<Value> = [Some(&self.pod), self.replacement.as_ref()]
            .into_iter()
            .flatten()
            .map(|pod| {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": pod["metadata"]})
            })
            .collect();
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {}, "items": items})
    }
}

fn failure(code: StatusCode, reason: &str) -> (StatusCode, Value) {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "code": code.as_u16(), "reason": reason, "message": "model apiserver"});
    (code, status)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client whose every request `store` answers.
pub(super) fn client(store: Arc<Mutex<Store>>) -> kube::Client {
    let service = tower::service_fn(move |req: Request<Body>| {
        let store = store.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = http_body_util::BodyExt::collect(body).await?.to_bytes();
            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let ct = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let (code, answer) = store
                .lock()
                .handle(&parts.method, parts.uri.path(), ct, json);
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&answer)?))?;
            Ok::<_, BoxError>(response)
        }
    });
    kube::Client::new(service, "default")
}
