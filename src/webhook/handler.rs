//! `POST /validate-cocoonhibernation`: decode an AdmissionReview (kube's types), validate,
//! answer (V5).

use super::validate::{self, ClaimView, Denial, Operation};
use crate::api::CocoonHibernation;
use crate::metrics::Metrics;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::json;

const API_VERSION: &str = "admission.k8s.io/v1";

/// Answer to one HTTP request: a review response, or a 4xx for input that is not one.
#[derive(Debug)]
pub enum Reply {
    Review(Box<AdmissionResponse>),
    BadRequest(String),
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Review(response) => Json(response.into_review()).into_response(),
            Reply::BadRequest(message) => {
                (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
            }
        }
    }
}

/// The whole decision for one request body; synchronous so tests need no server.
/// Counted by operation (`unknown` when the body is not a review) and result
/// (`allowed`, `denied`, `unsynced` for the V3 denial, `invalid`).
pub fn review(body: &[u8], view: &impl ClaimView, metrics: &Metrics) -> Reply {
    let request = match decode_counted(body, metrics) {
        Ok(request) => request,
        Err(reply) => return reply,
    };
    let response = AdmissionResponse::from(&request);
    let (response, result) = match decide(&request, view) {
        Ok(()) => (response, "allowed"),
        Err(denial) => {
            let result = if denial.unsynced {
                "unsynced"
            } else {
                "denied"
            };
            let mut response = response.deny(denial.message);
            response.result.code = 403;
            response.result.reason = "Forbidden".into();
            (response, result)
        }
    };
    metrics.admission(operation_label(&request.operation), result);
    Reply::Review(Box::new(response))
}

fn operation_label(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// The request of an `admission.k8s.io/v1` AdmissionReview, or why the body is not one.
/// [`decode`], with a body that is no review counted (`unknown`, `invalid`) and answered 400.
pub(crate) fn decode_counted(
    body: &[u8],
    metrics: &Metrics,
) -> Result<AdmissionRequest<DynamicObject>, Reply> {
    decode(body).map_err(|message| {
        metrics.admission("unknown", "invalid");
        Reply::BadRequest(message)
    })
}

pub(crate) fn decode(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            format!("request body is not JSON: {e}")
        } else {
            format!("request body is not an AdmissionReview: {e}")
        }
    })?;
    if review.types.api_version != API_VERSION || review.types.kind != "AdmissionReview" {
        return Err(format!(
            "expected apiVersion {API_VERSION} kind AdmissionReview, got {:?} {:?}",
            review.types.api_version, review.types.kind
        ));
    }
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| "AdmissionReview has no request".to_string())?;
    if request.uid.is_empty() {
        return Err("AdmissionReview request has no uid".into());
    }
    Ok(request)
}

/// Denials for a review that is well-formed but not a CocoonHibernation we can read,
/// then the rules of `validate`.
fn decide(request: &AdmissionRequest<DynamicObject>, view: &impl ClaimView) -> Result<(), Denial> {
    if request.kind.kind != "CocoonHibernation" {
        return Err(format!(
            "this webhook validates CocoonHibernation, not {:?}",
            request.kind.kind
        )
        .into());
    }
    let typed = |object: &Option<DynamicObject>, what: &str| match object {
        None => Ok(None),
        Some(object) => object
            .clone()
            .try_parse::<CocoonHibernation>()
            .map(Some)
            .map_err(|e| {
                Denial::from(format!(
                    "{what} does not decode as a CocoonHibernation: {e}"
                ))
            }),
    };
    let object = typed(&request.object, "object")?;
    let old = typed(&request.old_object, "oldObject")?;
    validate::validate(
        request.operation.clone(),
        request.namespace.as_deref().unwrap_or_default(),
        object.as_ref(),
        old.as_ref(),
        view,
    )
}
