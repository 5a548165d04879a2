//! Maps oci-client errors to our errors; "not found" is an answer, not an error.

use super::error::{RegistryError, describe_chain, excerpt};
use oci_client::errors::{OciDistributionError, OciEnvelope, OciErrorCode};
use std::time::Duration;

/// What an oci-client failure means for us.
pub(crate) enum Failure {
    /// 404 / MANIFEST_UNKNOWN / NAME_UNKNOWN: the thing is not there.
    NotFound,
    Error(RegistryError),
}

/// `timeout` is the operation's budget, reported when reqwest's own timeout fired first.
pub(crate) fn classify(
    err: OciDistributionError,
    operation: &'static str,
    timeout: Duration,
) -> Failure {
    match err {
        OciDistributionError::RegistryError { envelope, .. } => {
            classify_envelope(&envelope, operation)
        }
        OciDistributionError::ImageManifestNotFoundError(_) => Failure::NotFound,
        OciDistributionError::ServerError { code, message, .. } => match code {
            404 => Failure::NotFound,
            401 | 403 => Failure::Error(RegistryError::Unauthorized {
                operation,
                status: code,
                message: excerpt(&message),
            }),
            _ => Failure::Error(RegistryError::Server {
                operation,
                status: code,
                message: excerpt(&message),
            }),
        },
        OciDistributionError::UnauthorizedError { .. } => {
            Failure::Error(RegistryError::Unauthorized {
                operation,
                status: 401,
                message: "credentials missing or refused".into(),
            })
        }
        OciDistributionError::AuthenticationFailure(reason) => {
            Failure::Error(RegistryError::Unauthorized {
                operation,
                status: 401,
                message: format!("token request refused: {}", excerpt(&reason)),
            })
        }
        OciDistributionError::RequestError(e) if e.is_timeout() => {
            Failure::Error(RegistryError::Timeout {
                operation,
                after: timeout,
            })
        }
        OciDistributionError::RequestError(e) => Failure::Error(RegistryError::Transport {
            operation,
            message: describe_chain(&e),
        }),
        OciDistributionError::IoError(e) => Failure::Error(RegistryError::Transport {
            operation,
            message: describe_chain(&e),
        }),
        other => Failure::Error(RegistryError::Protocol {
            operation,
            message: describe_chain(&other),
        }),
    }
}

pub(super) fn classify_envelope(envelope: &OciEnvelope, operation: &'static str) -> Failure {
    let has = |code: OciErrorCode| envelope.errors.iter().any(|e| e.code == code);
    if has(OciErrorCode::ManifestUnknown)
        || has(OciErrorCode::NameUnknown)
        || has(OciErrorCode::NotFound)
    {
        return Failure::NotFound;
    }
    if has(OciErrorCode::Unauthorized) || has(OciErrorCode::Denied) {
        let status = if has(OciErrorCode::Denied) { 403 } else { 401 };
        return Failure::Error(RegistryError::Unauthorized {
            operation,
            status,
            message: excerpt(&envelope.to_string()),
        });
    }
    // Throttling is an answer to retry later (S5), like an HTTP 429.
    if has(OciErrorCode::Toomanyrequests) {
        return Failure::Error(RegistryError::Server {
            operation,
            status: 429,
            message: excerpt(&envelope.to_string()),
        });
    }
    Failure::Error(RegistryError::Rejected {
        operation,
        message: excerpt(&envelope.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);

    fn envelope(code: &str) -> OciDistributionError {
        let envelope = serde_json::from_value(serde_json::json!({
            "errors": [{ "code": code, "message": "m" }]
        }))
        .unwrap();
        OciDistributionError::RegistryError {
            envelope,
            url: "u".into(),
        }
    }

    fn server(code: u16) -> OciDistributionError {
        OciDistributionError::ServerError {
            code,
            url: "u".into(),
            message: "body".into(),
        }
    }

    #[test]
    fn h3_not_found_answers_are_absent() {
        for err in [
            envelope("MANIFEST_UNKNOWN"),
            envelope("NAME_UNKNOWN"),
            envelope("NOT_FOUND"),
            server(404),
        ] {
            assert!(matches!(classify(err, "probe", T), Failure::NotFound));
        }
    }

    #[test]
    fn h4_auth_server_and_other_failures_are_errors() {
        let error = |err| match classify(err, "probe", T) {
            Failure::Error(e) => e,
            Failure::NotFound => panic!("not an error"),
        };
        assert!(matches!(
            error(OciDistributionError::UnauthorizedError { url: "u".into() }),
            RegistryError::Unauthorized { status: 401, .. }
        ));
        assert!(matches!(
            error(envelope("DENIED")),
            RegistryError::Unauthorized { status: 403, .. }
        ));
        assert!(matches!(
            error(server(403)),
            RegistryError::Unauthorized { status: 403, .. }
        ));
        assert!(matches!(
            error(server(503)),
            RegistryError::Server { status: 503, .. }
        ));
        assert!(matches!(
            error(envelope("NAME_INVALID")),
            RegistryError::Rejected { .. }
        ));
        // S5: throttling is transient, as a 429 is.
        let throttled = error(envelope("TOOMANYREQUESTS"));
        assert!(
            matches!(throttled, RegistryError::Server { status: 429, .. }),
            "{throttled:?}"
        );
        assert!(!throttled.is_permanent());
        let io = error(OciDistributionError::IoError(std::io::Error::other(
            "reset",
        )));
        assert!(matches!(io, RegistryError::Transport { .. }), "{io:?}");
        assert!(matches!(
            error(OciDistributionError::RegistryNoDigestError),
            RegistryError::Protocol { .. }
        ));
    }
}
