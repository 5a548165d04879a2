//! Manifest DELETE: oci-client has no delete call (see `request.rs`).

use super::client::{RegistryClient, error_outcome};
use super::deadline::Deadline;
use super::error::{RegistryError, answer_detail};
use super::request::Session;
use reqwest::{Method, StatusCode};
use tracing::debug;

/// How the registry answered one manifest DELETE.
pub(super) enum RawDelete {
    Deleted,
    NotFound,
    /// The registry will not delete this way (405, or Distribution's 400 DIGEST_INVALID
    /// for a tag).
    Unsupported {
        status: u16,
        message: String,
    },
}

impl RegistryClient {
    /// DELETE /v2/<repository>/manifests/<reference> on `registry` (host[:port]), with the
    /// session's token when the registry asks for one; within `deadline`.
    pub(super) async fn delete_manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        operation: &'static str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<RawDelete, RegistryError> {
        let result = async {
            let url = self.v2_url(registry, repository, &format!("manifests/{reference}"))?;
            let answer = self
                .request(Method::DELETE, &url, None, operation, session, deadline)
                .await?;
            interpret_delete(answer.status, &answer.body, operation)
        }
        .await;
        let outcome = match &result {
            Ok(RawDelete::Deleted) => "deleted",
            Ok(RawDelete::NotFound) => "absent",
            Ok(RawDelete::Unsupported { .. }) => "unsupported",
            Err(e) => error_outcome(e),
        };
        self.inner.metrics.registry_call(operation, outcome);
        debug!(
            repository,
            reference, operation, outcome, "registry manifest delete"
        );
        result
    }
}

/// What a DELETE status means. 404 is "already gone"; 405 (delete disabled) and
/// Distribution 2.x's 400 DIGEST_INVALID for a tag mean "not this way".
pub(super) fn interpret_delete(
    status: StatusCode,
    body: &str,
    operation: &'static str,
) -> Result<RawDelete, RegistryError> {
    let message = answer_detail(status, body);
    match status.as_u16() {
        200 | 202 | 204 => Ok(RawDelete::Deleted),
        404 => Ok(RawDelete::NotFound),
        405 => Ok(RawDelete::Unsupported {
            status: 405,
            message,
        }),
        400 if body.contains("DIGEST_INVALID") || body.contains("UNSUPPORTED") => {
            Ok(RawDelete::Unsupported {
                status: 400,
                message,
            })
        }
        code @ (401 | 403) => Err(RegistryError::Unauthorized {
            operation,
            status: code,
            message,
        }),
        code => Err(RegistryError::Server {
            operation,
            status: code,
            message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpret(status: u16, body: &str) -> Result<RawDelete, RegistryError> {
        interpret_delete(StatusCode::from_u16(status).unwrap(), body, "delete")
    }

    #[test]
    fn w3_delete_statuses_map_to_outcomes_and_errors() {
        assert!(matches!(interpret(202, ""), Ok(RawDelete::Deleted)));
        assert!(matches!(interpret(200, ""), Ok(RawDelete::Deleted)));
        assert!(matches!(
            interpret(404, "MANIFEST_UNKNOWN"),
            Ok(RawDelete::NotFound)
        ));
        let distribution = r#"{"errors":[{"code":"DIGEST_INVALID","message":"provided digest did not match uploaded content"}]}"#;
        assert!(matches!(
            interpret(400, distribution),
            Ok(RawDelete::Unsupported { status: 400, .. })
        ));
        assert!(matches!(
            interpret(405, r#"{"errors":[{"code":"UNSUPPORTED"}]}"#),
            Ok(RawDelete::Unsupported { status: 405, .. })
        ));
        assert!(matches!(
            interpret(400, r#"{"errors":[{"code":"NAME_INVALID"}]}"#),
            Err(RegistryError::Server { status: 400, .. })
        ));
        assert!(matches!(
            interpret(403, "denied"),
            Err(RegistryError::Unauthorized { status: 403, .. })
        ));
        assert!(matches!(
            interpret(503, "down"),
            Err(RegistryError::Server { status: 503, .. })
        ));
    }
}
