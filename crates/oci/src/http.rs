//! Every registry request, on one reqwest client. oci-client lacks manifest DELETE and a
//! token with the `pull,delete` scope (it asks for `pull` or `pull,push`), and sends
//! `GET /v2/` before every request on a registry without auth. An operation runs on one
//! [`Session`]: a probe's HEAD, or a delete's HEADs, `Link`-paged `tags/list` and
//! DELETE, on at most one token, each request sent only before the operation's
//! [`Deadline`].

use super::error::{Op, RegistryError, Result, answer_detail, error_codes};
use super::observer::Observer;
use oci_client::errors::OciErrorCode as Code;
use oci_client::manifest::{IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE};
use oci_client::manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::token_cache::RegistryToken;
use oci_spec::image::Digest;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, Url};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// Items asked for per page of a listing (Distribution refuses `n` above 1000).
const PAGE_SIZE: usize = 100;
/// Every manifest type a snapshot may be stored as, accepted by a HEAD: without them a
/// registry may answer with a converted manifest, whose digest is not the stored one.
const MANIFEST_TYPES: [&str; 4] = [
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// The registry as every request reaches it (built in `client.rs`).
#[derive(Clone, Debug)]
pub(super) struct Http {
    pub client: reqwest::Client,
    pub auth: RegistryAuth,
    pub observer: Observer,
    /// `<scheme>://<registry>/v2/`.
    pub root: String,
}

/// When an operation must have sent its last request (C2, S1), and the budget it had.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    pub operation: Op,
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    /// Refuses once `at` has come, by the clock read right now (S1, S7): in a process
    /// resumed after a pause (SIGSTOP), a timer may not have fired yet.
    pub fn check(&self) -> Result<()> {
        match Instant::now() < self.at {
            true => Ok(()),
            false => Err(self.expired()),
        }
    }

    pub fn expired(&self) -> RegistryError {
        let (operation, after) = (self.operation, self.budget);
        RegistryError::Timeout { operation, after }
    }
}

/// One operation's requests, and the token (at most one, for the whole operation's scope).
pub(super) struct Session<'a> {
    http: &'a Http,
    scope: String,
    token: Option<String>,
    deadline: Deadline,
}

/// An answer's status, headers and body.
type Answer = (u16, HeaderMap, String);

/// A listing page: `tags` (`tags/list`) or `repositories` (`_catalog`); Distribution
/// sends `null` for a repository without tags.
#[derive(serde::Deserialize)]
struct Page {
    #[serde(alias = "repositories")]
    tags: Option<Vec<String>>,
}

impl Http {
    pub fn session(&self, scope: String, deadline: Deadline) -> Session<'_> {
        Session {
            http: self,
            scope,
            token: None,
            deadline,
        }
    }

    /// Counts a call in `registry_calls_total`; `ok` names a success's outcome. A call
    /// refused for the deadline was never sent: the operation's timeout counts it.
    pub fn counted<T>(&self, op: Op, result: Result<T>, ok: fn(&T) -> &'static str) -> Result<T> {
        let outcome = match &result {
            Ok(value) => ok(value),
            Err(RegistryError::Timeout { .. }) => return result,
            Err(RegistryError::DeleteRefused { .. }) => "unsupported",
            Err(_) => "error",
        };
        self.observer.call(op, outcome);
        result
    }
}

impl Session<'_> {
    fn url(&self, path: &str) -> Result<Url> {
        let raw = format!("{}{path}", self.http.root);
        Url::parse(&raw).map_err(|e| RegistryError::InvalidConfig(format!("bad URL {raw}: {e}")))
    }

    /// One request, with the session's token, else the configured credentials. A 401 with
    /// a Bearer challenge gets the session its token and is sent again, and so is one that
    /// met a transport error (dead pooled connections; every request here is idempotent).
    /// Nothing is sent, a retry or a token fetch neither, once the deadline has come.
    async fn send(&mut self, method: Method, url: &Url, op: Op) -> Result<Answer> {
        self.send_with(method, url, op, None).await
    }

    /// [`Self::send`] with a body (its content type and bytes): a PUT is idempotent too.
    async fn send_with(
        &mut self,
        method: Method,
        url: &Url,
        op: Op,
        body: Option<(&str, &[u8])>,
    ) -> Result<Answer> {
        loop {
            tracing::trace!(operation = op, %method, "registry request");
            self.deadline.check()?;
            let answer = match self.try_send(&method, url, body).await {
                Err(_) => {
                    self.deadline.check()?;
                    self.try_send(&method, url, body).await
                }
                answer => answer,
            };
            let answer = answer.map_err(|e| RegistryError::transport(op, &e))?;
            let challenges = answer.1.get_all(WWW_AUTHENTICATE).iter();
            let challenge = challenges
                .filter_map(|v| v.to_str().ok())
                .find_map(bearer_challenge);
            match challenge {
                Some((realm, service)) if answer.0 == 401 && self.token.is_none() => {
                    let token = self.fetch_token(&realm, service.as_deref()).await;
                    self.token = Some(self.http.counted("token", token, |_| "ok")?);
                }
                _ => return Ok(answer),
            }
        }
    }

    async fn try_send(
        &self,
        method: &Method,
        url: &Url,
        body: Option<(&str, &[u8])>,
    ) -> reqwest::Result<Answer> {
        // A manifest GET must accept its type: Distribution refuses an OCI manifest to
        // a client that does not.
        let manifest = url.path().contains("/manifests/");
        let accept = match *method {
            Method::HEAD => MANIFEST_TYPES.join(", "),
            Method::GET if manifest => MANIFEST_TYPES.join(", "),
            Method::GET => "application/json".into(),
            _ => "*/*".into(),
        };
        let request = self.http.client.request(method.clone(), url.clone());
        let request = match (&self.token, &self.http.auth) {
            (Some(token), _) | (None, RegistryAuth::Bearer(token)) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, pass)) => request.basic_auth(user, Some(pass)),
            (None, RegistryAuth::Anonymous) => request,
        };
        let request = match body {
            Some((kind, bytes)) => request.header(CONTENT_TYPE, kind).body(bytes.to_vec()),
            None => request,
        };
        read(request.header(ACCEPT, accept)).await
    }

    /// GET `<realm>?service=…&scope=…`, with the basic credentials if any.
    async fn fetch_token(&self, realm: &str, service: Option<&str>) -> Result<String> {
        const OP: Op = "token";
        self.deadline.check()?;
        let realm_error = |why| RegistryError::protocol(OP, format!("token realm {realm:?} {why}"));
        let mut url = Url::parse(realm).map_err(|e| realm_error(format!("is not a URL: {e}")))?;
        if self.http.root.starts_with("https:") && url.scheme() != "https" {
            let why = "is not https; credentials are not sent in the clear";
            return Err(realm_error(why.into()));
        }
        url.query_pairs_mut()
            .extend_pairs(service.map(|s| ("service", s)))
            .append_pair("scope", &self.scope);
        let mut request = self.http.client.get(url);
        if let RegistryAuth::Basic(user, password) = &self.http.auth {
            request = request.basic_auth(user, Some(password));
        }
        let answer = read(request).await;
        match answer.map_err(|e| RegistryError::transport(OP, &e))? {
            (200, _, body) => token_from_body(&body),
            // A token server that is down or throttling has not refused the credentials.
            (status, _, body) => Err(RegistryError::from_status(OP, status, &body)),
        }
    }

    /// HEAD `<repository>/manifests/<reference>`: its digest, None on 404.
    pub async fn head_digest(&mut self, path: &str, op: Op) -> Result<Option<String>> {
        let answer = self.send(Method::HEAD, &self.url(path)?, op).await;
        let result = answer.and_then(|(status, headers, body)| {
            match (status, header(&headers, "docker-content-digest")) {
                (404, _) => Ok(None),
                (200, Some(digest)) if digest.parse::<Digest>().is_ok() => Ok(Some(digest)),
                (200, digest) => {
                    let message = format!("the manifest HEAD answered the digest {digest:?}");
                    Err(RegistryError::protocol(op, message))
                }
                (status, _) => Err(RegistryError::from_status(op, status, &body)),
            }
        });
        let outcome = |d: &Option<_>| if d.is_some() { "present" } else { "absent" };
        self.http.counted(op, result, outcome)
    }

    /// Every entry of the listing at `path`, each page read once; None when the first
    /// page is 404. Pages that never end run into the operation's deadline.
    pub async fn list(&mut self, path: &str, op: Op) -> Result<Option<BTreeSet<String>>> {
        let mut url = self.url(&format!("{path}?n={PAGE_SIZE}"))?;
        let mut items = BTreeSet::new();
        let unusable = |e| RegistryError::protocol(op, format!("the listing is unusable: {e}"));
        loop {
            let answer = self.send(Method::GET, &url, op).await;
            let page = answer.and_then(|(status, headers, body)| match status {
                404 => Ok(None),
                200 => {
                    let page: Page = serde_json::from_str(&body).map_err(unusable)?;
                    let link = header(&headers, "link");
                    Ok(Some((page.tags.unwrap_or_default(), link)))
                }
                status => Err(RegistryError::from_status(op, status, &body)),
            });
            let outcome = |p: &Option<_>| if p.is_some() { "ok" } else { "absent" };
            let page = self.http.counted(op, page, outcome);
            let Some((page, link)) = page? else {
                return Ok((!items.is_empty()).then_some(items));
            };
            let (len, last, before) = (page.len(), page.last().cloned(), items.len());
            items.extend(page);
            let new = items.len() - before;
            let next = next_page(&url, link.as_deref(), len, new, last.as_deref());
            match next.map_err(|message| RegistryError::protocol(op, message))? {
                Some(next) => url = next,
                None => return Ok(Some(items)),
            }
        }
    }

    /// DELETE `<repository>/manifests/<digest>`: true once deleted, false on 404.
    pub async fn delete(&mut self, path: &str, reference: &str, op: Op) -> Result<bool> {
        let answer = self.send(Method::DELETE, &self.url(path)?, op).await;
        let result =
            answer.and_then(|(status, _, body)| interpret_delete(status, &body, reference, op));
        self.http
            .counted(op, result, |&d| if d { "deleted" } else { "absent" })
    }
}

async fn read(request: RequestBuilder) -> reqwest::Result<Answer> {
    let response = request.send().await?;
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    Ok((status, headers, response.text().await?))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    Some(headers.get(name)?.to_str().ok()?.trim().to_string())
}

/// What a DELETE answer means: true deleted, false 404 (which the caller confirms). 405,
/// and 400 with the OCI error code DIGEST_INVALID or UNSUPPORTED, refuse deletes.
pub fn interpret_delete(status: u16, body: &str, reference: &str, op: Op) -> Result<bool> {
    let refusal = |code: &Code| matches!(code, Code::DigestInvalid | Code::Unsupported);
    let refused = status == 405 || (status == 400 && error_codes(body).iter().any(refusal));
    match status {
        200 | 202 | 204 => Ok(true),
        404 => Ok(false),
        _ if refused => Err(RegistryError::DeleteRefused {
            reference: reference.to_string(),
            status,
            message: answer_detail(status, body),
        }),
        _ => Err(RegistryError::from_status(op, status, body)),
    }
}

/// The realm and service of the first Bearer challenge in a `WWW-Authenticate` value.
pub fn bearer_challenge(value: &str) -> Option<(String, Option<String>)> {
    let challenge = http_auth::ChallengeParser::new(value)
        .filter_map(Result::ok)
        .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))?;
    let param = |name: &str| {
        let mut params = challenge.params.iter();
        let (_, value) = params.find(|(k, _)| k.eq_ignore_ascii_case(name))?;
        Some(value.to_unescaped())
    };
    Some((param("realm")?, param("service")))
}

/// Token servers answer `token` (Docker) or `access_token` (OAuth2); oci-client's type
/// reads either.
pub fn token_from_body(body: &str) -> Result<String> {
    let token = serde_json::from_str::<RegistryToken>(body).ok();
    let token = token
        .map(|t| t.token().to_string())
        .filter(|t| !t.is_empty());
    let message = "the token answer holds neither a `token` nor an `access_token`";
    token.ok_or_else(|| RegistryError::protocol("token", message))
}

/// Where a listing goes on after a page, if anywhere; never to the page it is on.
/// - `Link: <…>; rel="next"` (OCI pagination) is followed, on the same origin only;
/// - without it, a page of exactly `n` new entries may have more behind it: `last` asks
///   for them. A shorter page is the last, and so is a longer one (the registry ignored
///   `n` and sent everything).
pub(crate) fn next_page(
    current: &Url,
    link: Option<&str>,
    len: usize,
    new: usize,
    last: Option<&str>,
) -> Result<Option<Url>, String> {
    if let Some(target) = link.and_then(next_link) {
        return match current.join(&target) {
            Ok(next) if next.origin() == current.origin() && next != *current => Ok(Some(next)),
            Ok(_) => Err(format!("the Link {target:?} leaves the registry or loops")),
            Err(e) => Err(format!("unusable Link {target:?}: {e}")),
        };
    }
    let Some(last) = last.filter(|_| len == PAGE_SIZE && new > 0) else {
        return Ok(None);
    };
    let mut next = current.clone();
    let n = PAGE_SIZE.to_string();
    next.query_pairs_mut()
        .clear()
        .append_pair("n", &n)
        .append_pair("last", last);
    Ok(Some(next))
}

/// The target of the `rel="next"` link in a `Link` header (RFC 8288), if any.
pub fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|link| {
        let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
        let rels = params.split(';').filter_map(|param| {
            let (name, value) = param.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("rel")
                .then(|| value.trim().trim_matches('"'))
        });
        let mut rels = rels.flat_map(str::split_ascii_whitespace);
        rels.any(|rel| rel.eq_ignore_ascii_case("next"))
            .then(|| target.trim().to_string())
    })
}

/// An OCI tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`. oci-spec's reference parser would
/// take Unicode letters too (its `\w` is Unicode).
pub(super) fn valid_tag(tag: &str) -> bool {
    let first = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let other = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    tag.len() <= 128 && tag.starts_with(first) && tag.bytes().all(other)
}

mod push;

#[cfg(test)]
mod tests;
