//! The admission of a policy kind (schedules K1/K9, idle policies I1/Q1): what the CRD
//! schema cannot check, denied with every reason at once. One body for every kind, so the
//! kinds differ only in their check.

use crate::metrics::Metrics;
use crate::webhook::handler::{Reply, decode_counted};
use kube::Resource;
use kube::core::admission::{AdmissionResponse, Operation};
use serde::de::DeserializeOwned;

/// The whole decision for one request body of kind `K`; `check` returns every reason the
/// object is refused for. Synchronous so tests need no server.
pub fn review<K>(body: &[u8], metrics: &Metrics, check: impl Fn(&K) -> Vec<String>) -> Reply
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let request = match decode_counted(body, metrics) {
        Ok(request) => request,
        Err(reply) => return reply,
    };
    let kind = K::kind(&());
    let response = AdmissionResponse::from(&request);
    let verdict = match (&request.operation, &request.object) {
        _ if request.kind.kind != kind => Err(format!(
            "this webhook validates {kind}, not {:?}",
            request.kind.kind
        )),
        (Operation::Create | Operation::Update, Some(object)) => object
            .clone()
            .try_parse::<K>()
            .map_err(|e| format!("object does not decode as a {kind}: {e}"))
            .and_then(|object| {
                let reasons = check(&object);
                if reasons.is_empty() {
                    Ok(())
                } else {
                    Err(reasons.join("; "))
                }
            }),
        (Operation::Create | Operation::Update, None) => {
            Err("CREATE or UPDATE request carries no object".into())
        }
        _ => Ok(()),
    };
    let op = match request.operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    };
    let response = match verdict {
        Ok(()) => {
            metrics.admission(op, "allowed");
            response
        }
        Err(message) => {
            metrics.admission(op, "denied");
            let mut response = response.deny(message);
            response.result.code = 403;
            response.result.reason = "Forbidden".into();
            response
        }
    };
    Reply::Review(Box::new(response))
}
