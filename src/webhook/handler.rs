//! `POST /validate-cocoonhibernation`: decode an AdmissionReview, validate, answer (V5).

use super::validate::{self, ClaimView, Operation};
use crate::api::CocoonHibernation;
use crate::metrics::Metrics;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

const API_VERSION: &str = "admission.k8s.io/v1";

/// Answer to one HTTP request: a review response, or a 4xx for input that is not one.
#[derive(Debug, PartialEq)]
pub enum Reply {
    Review {
        uid: String,
        allowed: bool,
        message: Option<String>,
    },
    BadRequest(String),
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Review {
                uid,
                allowed,
                message,
            } => {
                let mut response = json!({ "uid": uid, "allowed": allowed });
                if let Some(message) = message {
                    response["status"] =
                        json!({ "code": 403, "reason": "Forbidden", "message": message });
                }
                Json(json!({ "apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response }))
                    .into_response()
            }
            Reply::BadRequest(message) => {
                (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
            }
        }
    }
}

/// The whole decision for one request body; synchronous so tests need no server.
pub fn review(body: &[u8], view: &impl ClaimView, metrics: &Metrics) -> Reply {
    let mut op = "unknown";
    let reply = review_inner(body, view, &mut op);
    let result = match &reply {
        Reply::Review { allowed: true, .. } => "allowed",
        Reply::Review {
            allowed: false,
            message: Some(m),
            ..
        } if m == validate::UNSYNCED => "unsynced",
        Reply::Review { allowed: false, .. } => "denied",
        Reply::BadRequest(_) => "invalid",
    };
    metrics.admission(op, result);
    reply
}

/// `op` receives the request's operation, for the metric, once it is known.
fn review_inner(body: &[u8], view: &impl ClaimView, op_label: &mut &'static str) -> Reply {
    let doc: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::BadRequest(format!("request body is not JSON: {e}")),
    };
    let api_version = doc.get("apiVersion").and_then(Value::as_str);
    let kind = doc.get("kind").and_then(Value::as_str);
    if api_version != Some(API_VERSION) || kind != Some("AdmissionReview") {
        return Reply::BadRequest(format!(
            "expected apiVersion {API_VERSION} kind AdmissionReview, got {} {}",
            api_version.unwrap_or("<none>"),
            kind.unwrap_or("<none>")
        ));
    }
    let Some(request) = doc.get("request").filter(|r| r.is_object()) else {
        return Reply::BadRequest("AdmissionReview has no request".into());
    };
    let uid = match request.get("uid").and_then(Value::as_str) {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => return Reply::BadRequest("AdmissionReview request has no uid".into()),
    };
    let deny = |message: String| Reply::Review {
        uid: uid.clone(),
        allowed: false,
        message: Some(message),
    };
    let Some(op) = request
        .get("operation")
        .and_then(Value::as_str)
        .and_then(Operation::parse)
    else {
        return deny("request.operation must be CREATE, UPDATE, DELETE or CONNECT".into());
    };
    *op_label = op.as_str();
    let kind = request
        .pointer("/kind/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "CocoonHibernation" {
        return deny(format!(
            "this webhook validates CocoonHibernation, not {kind:?}"
        ));
    }
    let namespace = request
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let object = match decode(request.get("object")) {
        Ok(o) => o,
        Err(e) => {
            return deny(format!(
                "object does not decode as a CocoonHibernation: {e}"
            ));
        }
    };
    let old = match decode(request.get("oldObject")) {
        Ok(o) => o,
        Err(e) => {
            return deny(format!(
                "oldObject does not decode as a CocoonHibernation: {e}"
            ));
        }
    };
    match validate::validate(op, namespace, object.as_ref(), old.as_ref(), view) {
        Ok(()) => Reply::Review {
            uid,
            allowed: true,
            message: None,
        },
        Err(d) => deny(d.0),
    }
}

fn decode(raw: Option<&Value>) -> Result<Option<CocoonHibernation>, serde_json::Error> {
    match raw {
        None | Some(Value::Null) => Ok(None),
        Some(v) => CocoonHibernation::deserialize(v).map(Some),
    }
}
