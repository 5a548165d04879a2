//! Manifest DELETE over plain reqwest: oci-client has no delete call, and its token
//! exchange only asks for pull/push scopes.

use super::challenge::{BearerChallenge, bearer_challenge};
use super::client::{RegistryClient, error_outcome};
use super::config::RegistryAuth;
use super::deadline::Deadline;
use super::error::{RegistryError, describe_chain, excerpt};
use reqwest::{StatusCode, Url, header};
use tracing::debug;

/// A delete-scoped token, reused for the second DELETE of one `delete_snapshot`.
#[derive(Default)]
pub(super) struct DeleteSession {
    token: Option<String>,
}

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

struct Answer {
    status: StatusCode,
    challenge: Option<BearerChallenge>,
    body: String,
}

impl RegistryClient {
    /// DELETE /v2/<repository>/manifests/<reference> on `registry` (host[:port]), with a
    /// delete-scoped token when the registry asks for one; all within `deadline`.
    pub(super) async fn delete_manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        operation: &'static str,
        session: &mut DeleteSession,
        deadline: &Deadline,
    ) -> Result<RawDelete, RegistryError> {
        let result = self
            .delete_manifest_inner(
                registry, repository, reference, operation, session, deadline,
            )
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

    async fn delete_manifest_inner(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        operation: &'static str,
        session: &mut DeleteSession,
        deadline: &Deadline,
    ) -> Result<RawDelete, RegistryError> {
        let inner = &self.inner;
        let url = format!(
            "{}://{registry}/v2/{repository}/manifests/{reference}",
            inner.scheme
        );
        let mut answer = self
            .retry_transport(operation, || {
                self.send_delete(&url, operation, session.token.as_deref(), deadline)
            })
            .await?;
        if answer.status == StatusCode::UNAUTHORIZED
            && let Some(challenge) = answer.challenge.take()
        {
            let token = self
                .fetch_delete_token(&challenge, repository, deadline)
                .await?;
            answer = self
                .retry_transport(operation, || {
                    self.send_delete(&url, operation, Some(&token), deadline)
                })
                .await?;
            session.token = Some(token);
        }
        interpret_delete(answer.status, &answer.body, operation)
    }

    async fn send_delete(
        &self,
        url: &str,
        operation: &'static str,
        token: Option<&str>,
        deadline: &Deadline,
    ) -> Result<Answer, RegistryError> {
        let inner = &self.inner;
        let request = inner.http.delete(url);
        let request = match (token, &inner.auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic { username, password }) => {
                request.basic_auth(username, Some(password))
            }
            (None, RegistryAuth::Bearer { token }) => request.bearer_auth(token),
            (None, RegistryAuth::Anonymous) => request,
        };
        deadline
            .run(operation, async {
                let response = request.send().await?;
                let status = response.status();
                let challenge = response
                    .headers()
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(bearer_challenge);
                let body = response.text().await?;
                Ok::<_, reqwest::Error>(Answer {
                    status,
                    challenge,
                    body,
                })
            })
            .await?
            .map_err(|e| transport(operation, &e, deadline.budget()))
    }

    /// GET <realm>?service=..&scope=repository:<repo>:delete, with the basic credentials if any.
    async fn fetch_delete_token(
        &self,
        challenge: &BearerChallenge,
        repository: &str,
        deadline: &Deadline,
    ) -> Result<String, RegistryError> {
        const OP: &str = "token";
        let result = self
            .fetch_delete_token_inner(challenge, repository, deadline)
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => error_outcome(e),
        };
        self.inner.metrics.registry_call(OP, outcome);
        result
    }

    async fn fetch_delete_token_inner(
        &self,
        challenge: &BearerChallenge,
        repository: &str,
        deadline: &Deadline,
    ) -> Result<String, RegistryError> {
        const OP: &str = "token";
        let inner = &self.inner;
        let mut url = Url::parse(&challenge.realm).map_err(|e| RegistryError::Protocol {
            operation: OP,
            message: format!("token realm {:?} is not a URL: {e}", challenge.realm),
        })?;
        if inner.scheme == "https" && url.scheme() != "https" {
            return Err(RegistryError::Protocol {
                operation: OP,
                message: format!(
                    "token realm {:?} is not https; credentials are not sent in the clear",
                    challenge.realm
                ),
            });
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = &challenge.service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", &format!("repository:{repository}:delete"));
        }
        let (status, body) = self
            .retry_transport(OP, || async {
                let request = inner.http.get(url.clone());
                let request = match &inner.auth {
                    RegistryAuth::Basic { username, password } => {
                        request.basic_auth(username, Some(password))
                    }
                    _ => request,
                };
                deadline
                    .run(OP, async {
                        let response = request.send().await?;
                        let status = response.status();
                        Ok::<_, reqwest::Error>((status, response.text().await?))
                    })
                    .await?
                    .map_err(|e| transport(OP, &e, deadline.budget()))
            })
            .await?;
        if !status.is_success() {
            // A token server that is down or throttling has not refused our credentials.
            let message = format!("token request failed: {}", excerpt(&body));
            return Err(match status.as_u16() {
                code @ (401 | 403) => RegistryError::Unauthorized {
                    operation: OP,
                    status: code,
                    message: format!("token request refused: {}", excerpt(&body)),
                },
                code => RegistryError::Server {
                    operation: OP,
                    status: code,
                    message,
                },
            });
        }
        token_from_body(&body)
    }
}

/// What a DELETE status means. 404 is "already gone"; 405 (delete disabled) and
/// Distribution 2.x's 400 DIGEST_INVALID for a tag mean "not this way".
fn interpret_delete(
    status: StatusCode,
    body: &str,
    operation: &'static str,
) -> Result<RawDelete, RegistryError> {
    let message = excerpt(body);
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

/// Token servers answer `token` (Docker) or `access_token` (OAuth2), sometimes both.
fn token_from_body(body: &str) -> Result<String, RegistryError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| RegistryError::Protocol {
            operation: "token",
            message: format!("token answer is not JSON: {e}"),
        })?;
    ["token", "access_token"]
        .iter()
        .find_map(|k| value.get(k).and_then(serde_json::Value::as_str))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| RegistryError::Protocol {
            operation: "token",
            message: "token answer holds neither `token` nor `access_token`".into(),
        })
}

fn transport(
    operation: &'static str,
    err: &reqwest::Error,
    after: std::time::Duration,
) -> RegistryError {
    if err.is_timeout() {
        RegistryError::Timeout { operation, after }
    } else {
        RegistryError::Transport {
            operation,
            message: describe_chain(err),
        }
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

    #[test]
    fn token_answers_in_docker_and_oauth_shapes() {
        assert_eq!(
            token_from_body(r#"{"token":"a","access_token":"b"}"#).unwrap(),
            "a"
        );
        assert_eq!(token_from_body(r#"{"access_token":"b"}"#).unwrap(), "b");
        let err = token_from_body(r#"{"token":""}"#).unwrap_err();
        assert!(err.to_string().contains("neither"), "{err}");
        assert!(token_from_body("<html>").is_err());
    }
}
