//! Entry points for the fuzz targets in `fuzz/`: the parsers of registry answers, which
//! are private to this module. Not part of the product's API.

use super::error::{RegistryError, excerpt as cut, from_envelope};
use super::http::{Deleted, interpret_delete, next_link as link, token_from_body};

/// The realm and service of a `WWW-Authenticate` value's Bearer challenge.
pub fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    super::http::bearer_challenge(header)
}

/// A token server's answer body.
pub fn token_body(body: &str) -> Result<String, RegistryError> {
    token_from_body(body)
}

/// An OCI error body as the probe reads it: `Some(None)` means "not found".
pub fn oci_error_body(body: &[u8]) -> Option<Option<RegistryError>> {
    Some(from_envelope(&serde_json::from_slice(body).ok()?, "probe"))
}

/// A manifest DELETE answer: `Ok(true)` gone (or absent), `Ok(false)` "not this way".
pub fn delete_answer(status: u16, body: &str) -> Result<bool, RegistryError> {
    interpret_delete(status, body, "delete").map(|d| !matches!(d, Deleted::Unsupported { .. }))
}

/// The `rel="next"` target of a `Link` header.
pub fn next_link(header: &str) -> Option<String> {
    link(header)
}

/// The shortened registry text that error messages carry.
pub fn excerpt(text: &str) -> String {
    cut(text)
}
