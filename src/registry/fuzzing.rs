//! Entry points for the fuzz targets in `fuzz/` (issue 9): the parsers of registry
//! answers, which are private to this module. Not part of the product's API.

use super::error::RegistryError;
use super::oci_errors::{Failure, classify_envelope};
use oci_client::errors::OciEnvelope;
use reqwest::StatusCode;

/// One challenge: its scheme and parameters.
pub type Challenge = (String, Vec<(String, String)>);

/// A `WWW-Authenticate` header: every challenge, and the Bearer realm a token would be
/// fetched from.
pub fn www_authenticate(header: &str) -> (Vec<Challenge>, Option<String>) {
    let all = super::challenge::parse(header)
        .into_iter()
        .map(|c| (c.scheme, c.params))
        .collect();
    let bearer = super::challenge::bearer_challenge(header).map(|b| b.realm);
    (all, bearer)
}

/// A token server's answer body.
pub fn token_body(body: &str) -> Result<String, RegistryError> {
    super::request::token_from_body(body)
}

/// An OCI error body as the probe sees it: `None` when it means "not found".
pub fn oci_error_body(body: &[u8]) -> Option<Option<RegistryError>> {
    let envelope: OciEnvelope = serde_json::from_slice(body).ok()?;
    Some(match classify_envelope(&envelope, "probe") {
        Failure::NotFound => None,
        Failure::Error(e) => Some(e),
    })
}

/// A manifest DELETE answer: `Ok(true)` gone (or absent), `Ok(false)` "not this way".
pub fn delete_answer(status: u16, body: &str) -> Option<Result<bool, RegistryError>> {
    let status = StatusCode::from_u16(status).ok()?;
    Some(
        super::delete::interpret_delete(status, body, "delete")
            .map(|raw| !matches!(raw, super::delete::RawDelete::Unsupported { .. })),
    )
}

/// The `rel="next"` target of a `tags/list` `Link` header.
pub fn next_link(header: &str) -> Option<String> {
    super::lookup::next_link(header)
}

/// The shortened registry text that error messages carry.
pub fn excerpt(text: &str) -> String {
    super::error::excerpt(text)
}
