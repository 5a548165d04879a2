//! Raw requests of a delete (manifest HEAD, `tags/list`, manifest DELETE) over reqwest,
//! authorized by the operation's own [`Session`].
//!
//! oci-client is not used here: it has no DELETE, its token exchange asks only for
//! pull/push scopes, and before every request it cannot authorize from its token cache it
//! sends a `GET /v2/` ping, which on an anonymous registry doubles each call.

use super::challenge::{BearerChallenge, bearer_challenge};
use super::client::{RegistryClient, error_outcome};
use super::config::RegistryAuth;
use super::deadline::Deadline;
use super::error::{RegistryError, answer_detail, describe_chain};
use reqwest::{Method, StatusCode, Url, header};

/// What one registry operation (a delete) carries from request to request: the token
/// the registry asked for, fetched at most once per operation, with the scope of the
/// whole operation (`pull,delete` on the snapshot repository).
pub(super) struct Session {
    /// The token scope asked for (Docker token auth).
    scope: String,
    token: Option<String>,
}

impl Session {
    pub fn new(repository: &str) -> Self {
        Self::with_scope(format!("repository:{repository}:pull,delete"))
    }

    /// A session whose token carries another scope (the catalog's `registry:catalog:*`).
    pub fn with_scope(scope: String) -> Self {
        Self { scope, token: None }
    }
}

/// The parts of an answer the delete path reads.
pub(super) struct Answer {
    pub status: StatusCode,
    /// `Docker-Content-Digest`.
    pub digest: Option<String>,
    /// `Link` (pagination of `tags/list`).
    pub link: Option<String>,
    pub body: String,
    challenge: Option<BearerChallenge>,
}

impl RegistryClient {
    /// Sends one request with the session's token, or the configured credentials while
    /// there is none. A 401 carrying a Bearer challenge gets a token (the session's first
    /// and only one) and the request is sent once more; a 401 after that is the answer.
    pub(super) async fn request(
        &self,
        method: Method,
        url: &Url,
        accept: Option<&str>,
        operation: &'static str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<Answer, RegistryError> {
        let token = session.token.clone();
        let mut answer = self
            .retry_transport(operation, || {
                self.send(&method, url, accept, token.as_deref(), operation, deadline)
            })
            .await?;
        if answer.status == StatusCode::UNAUTHORIZED
            && session.token.is_none()
            && let Some(challenge) = answer.challenge.take()
        {
            let token = self
                .fetch_token(&challenge, &session.scope, deadline)
                .await?;
            answer = self
                .retry_transport(operation, || {
                    self.send(&method, url, accept, Some(&token), operation, deadline)
                })
                .await?;
            session.token = Some(token);
        }
        Ok(answer)
    }

    /// `https://<registry>/v2/<repository>/<rest>`.
    pub(super) fn v2_url(
        &self,
        registry: &str,
        repository: &str,
        rest: &str,
    ) -> Result<Url, RegistryError> {
        let raw = format!("{}://{registry}/v2/{repository}/{rest}", self.inner.scheme);
        Url::parse(&raw).map_err(|e| RegistryError::InvalidConfig(format!("bad URL {raw}: {e}")))
    }

    async fn send(
        &self,
        method: &Method,
        url: &Url,
        accept: Option<&str>,
        token: Option<&str>,
        operation: &'static str,
        deadline: &Deadline,
    ) -> Result<Answer, RegistryError> {
        let inner = &self.inner;
        let request = inner.http.request(method.clone(), url.clone());
        let request = match accept {
            Some(accept) => request.header(header::ACCEPT, accept),
            None => request,
        };
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
                let headers = response.headers();
                let text = |name| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(|v| v.trim().to_string())
                };
                let digest = text("docker-content-digest");
                let link = text("link");
                let challenge = headers
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(bearer_challenge);
                let body = response.text().await?;
                Ok::<_, reqwest::Error>(Answer {
                    status,
                    digest,
                    link,
                    body,
                    challenge,
                })
            })
            .await?
            .map_err(|e| transport(operation, &e, deadline.budget()))
    }

    /// GET <realm>?service=..&scope=<scope> (a delete's is
    /// `repository:<repo>:pull,delete`), with the basic credentials if any. Counted as a
    /// `token` call.
    async fn fetch_token(
        &self,
        challenge: &BearerChallenge,
        scope: &str,
        deadline: &Deadline,
    ) -> Result<String, RegistryError> {
        const OP: &str = "token";
        let result = self.fetch_token_inner(challenge, scope, deadline).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => error_outcome(e),
        };
        self.inner.metrics.registry_call(OP, outcome);
        result
    }

    async fn fetch_token_inner(
        &self,
        challenge: &BearerChallenge,
        scope: &str,
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
            query.append_pair("scope", scope);
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
            return Err(match status.as_u16() {
                code @ (401 | 403) => RegistryError::Unauthorized {
                    operation: OP,
                    status: code,
                    message: format!("token request refused: {}", answer_detail(status, &body)),
                },
                code => RegistryError::Server {
                    operation: OP,
                    status: code,
                    message: format!("token request failed: {}", answer_detail(status, &body)),
                },
            });
        }
        token_from_body(&body)
    }
}

/// The error for an answer the caller has no use for: credentials refused (401/403),
/// throttling (429, or an OCI TOOMANYREQUESTS under any status), anything else by status.
pub(super) fn unexpected(answer: &Answer, operation: &'static str) -> RegistryError {
    let message = answer_detail(answer.status, &answer.body);
    match answer.status.as_u16() {
        code @ (401 | 403) => RegistryError::Unauthorized {
            operation,
            status: code,
            message,
        },
        _ if answer.body.contains("TOOMANYREQUESTS") => RegistryError::Server {
            operation,
            status: 429,
            message,
        },
        code => RegistryError::Server {
            operation,
            status: code,
            message,
        },
    }
}

/// Token servers answer `token` (Docker) or `access_token` (OAuth2), sometimes both.
pub(super) fn token_from_body(body: &str) -> Result<String, RegistryError> {
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

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            digest: None,
            link: None,
            body: body.to_string(),
            challenge: None,
        }
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

    /// S5: refusals are permanent, throttling and outages transient.
    #[test]
    fn s5_unexpected_answers_map_to_errors() {
        let e = unexpected(&answer(403, "denied"), "resolve");
        assert!(matches!(e, RegistryError::Unauthorized { status: 403, .. }));
        assert!(e.is_permanent());
        let e = unexpected(
            &answer(400, r#"{"errors":[{"code":"TOOMANYREQUESTS"}]}"#),
            "list_tags",
        );
        assert!(matches!(e, RegistryError::Server { status: 429, .. }));
        assert!(!e.is_permanent());
        let e = unexpected(&answer(503, ""), "resolve");
        assert!(!e.is_permanent());
        let e = unexpected(&answer(400, r#"{"errors":[{"code":"NAME_INVALID"}]}"#), "x");
        assert!(e.is_permanent());
    }
}
