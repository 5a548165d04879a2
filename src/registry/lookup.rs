//! The reads of a delete: a manifest's digest (HEAD) and a repository's tags
//! (`tags/list`, every page read once), over the operation's [`Session`].

use super::client::{RegistryClient, error_outcome};
use super::deadline::Deadline;
use super::error::RegistryError;
use super::oci_errors::{Failure, classify};
use super::request::{Session, unexpected};
use oci_client::Reference;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use reqwest::{Method, StatusCode, Url};
use std::collections::HashSet;
use tracing::debug;

/// Tags asked for per `tags/list` page.
pub(super) const TAG_PAGE_SIZE: usize = 100;
/// Upper bound on pages, so a registry whose pages never end cannot loop us forever.
const MAX_TAG_PAGES: usize = 100;

/// Every manifest type a snapshot may be stored as. Without them a registry may answer
/// with a converted manifest, whose digest is not the stored one.
fn manifest_accept() -> String {
    [
        OCI_IMAGE_MEDIA_TYPE,
        OCI_IMAGE_INDEX_MEDIA_TYPE,
        IMAGE_MANIFEST_MEDIA_TYPE,
        IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    ]
    .join(", ")
}

#[derive(serde::Deserialize)]
struct TagPage {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

impl RegistryClient {
    /// HEAD /v2/<repository>/manifests/<tag>: the `Docker-Content-Digest` it answers with,
    /// None on 404. One call, counted under `operation`.
    pub(super) async fn head_digest(
        &self,
        registry: &str,
        repository: &str,
        tag: &str,
        operation: &'static str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<Option<String>, RegistryError> {
        let result = self
            .head_digest_inner(registry, repository, tag, operation, session, deadline)
            .await;
        let outcome = match &result {
            Ok(Some(_)) => "present",
            Ok(None) => "absent",
            Err(e) => error_outcome(e),
        };
        self.inner.metrics.registry_call(operation, outcome);
        debug!(
            repository,
            tag, operation, outcome, "registry manifest HEAD"
        );
        result
    }

    async fn head_digest_inner(
        &self,
        registry: &str,
        repository: &str,
        tag: &str,
        operation: &'static str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<Option<String>, RegistryError> {
        let url = self.v2_url(registry, repository, &format!("manifests/{tag}"))?;
        let accept = manifest_accept();
        let answer = self
            .request(
                Method::HEAD,
                &url,
                Some(&accept),
                operation,
                session,
                deadline,
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !answer.status.is_success() {
            return Err(unexpected(&answer, operation));
        }
        let digest = match answer.digest {
            Some(digest) => digest,
            // The header is a SHOULD of the spec: oci-client then GETs the manifest and
            // hashes it (its own requests and token; rare).
            None => {
                let reference = Reference::with_tag(
                    registry.to_string(),
                    repository.to_string(),
                    tag.to_string(),
                );
                let inner = &self.inner;
                match deadline
                    .run(
                        operation,
                        inner.oci.fetch_manifest_digest(&reference, &inner.oci_auth),
                    )
                    .await?
                {
                    Ok(digest) => digest,
                    Err(e) => match classify(e, operation, deadline.budget()) {
                        Failure::NotFound => return Ok(None),
                        Failure::Error(e) => return Err(e),
                    },
                }
            }
        };
        // It goes into the DELETE's URL: nothing but a well-formed digest.
        if !valid_digest(&digest) {
            return Err(RegistryError::Protocol {
                operation,
                message: format!("the registry answered a malformed digest {digest:?}"),
            });
        }
        Ok(Some(digest))
    }

    /// Every tag of the repository, each page read once (one call per page, counted as
    /// `list_tags`); empty when the repository does not exist.
    pub(super) async fn list_tags(
        &self,
        registry: &str,
        repository: &str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<Vec<String>, RegistryError> {
        const OP: &str = "list_tags";
        let mut tags: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        let mut url = self.v2_url(
            registry,
            repository,
            &format!("tags/list?n={TAG_PAGE_SIZE}"),
        )?;
        for _ in 0..MAX_TAG_PAGES {
            let page = match self.tag_page(&url, session, deadline).await {
                Ok(page) => page,
                Err(e) => {
                    self.inner.metrics.registry_call(OP, error_outcome(&e));
                    return Err(e);
                }
            };
            let Some((page, link)) = page else {
                // The repository does not exist (or vanished meanwhile): no tags.
                self.inner.metrics.registry_call(OP, "absent");
                return Ok(tags);
            };
            self.inner.metrics.registry_call(OP, "ok");
            // Each tag goes into a HEAD's URL, and a tag that cannot be looked up leaves
            // the digest unproven: a malformed one ends the delete.
            if let Some(bad) = page.iter().find(|t| !valid_tag(t)) {
                return Err(RegistryError::Protocol {
                    operation: OP,
                    message: format!("the tag list holds a malformed tag {bad:?}"),
                });
            }
            let page_len = page.len();
            let last = page.last().cloned();
            let mut new = 0;
            for tag in page {
                if seen.insert(tag.clone()) {
                    tags.push(tag);
                    new += 1;
                }
            }
            match next_page(&url, link.as_deref(), page_len, new, last.as_deref())? {
                Some(next) => url = next,
                None => return Ok(tags),
            }
        }
        Err(RegistryError::Protocol {
            operation: OP,
            message: format!("the tag list did not end within {MAX_TAG_PAGES} pages"),
        })
    }

    /// One page: its tags and its `Link` header; None on 404.
    async fn tag_page(
        &self,
        url: &Url,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<Option<(Vec<String>, Option<String>)>, RegistryError> {
        const OP: &str = "list_tags";
        let answer = self
            .request(
                Method::GET,
                url,
                Some("application/json"),
                OP,
                session,
                deadline,
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !answer.status.is_success() {
            return Err(unexpected(&answer, OP));
        }
        let page: TagPage =
            serde_json::from_str(&answer.body).map_err(|e| RegistryError::Protocol {
                operation: OP,
                message: format!("the tag list is not JSON: {e}"),
            })?;
        Ok(Some((page.tags.unwrap_or_default(), answer.link)))
    }
}

/// Where the tag list goes on after a page, if anywhere. A page is never asked for twice
/// in a row, and the common answers end the listing without another request:
/// - a `Link: <…>; rel="next"` (OCI pagination) is followed, on the same origin only;
/// - without one, a page shorter than asked for is the last (OCI: no `Link`, no more),
///   and so is a longer one (the registry ignores `n` and sent everything, as
///   Distribution 2.x does);
/// - a page of exactly `n` tags without `Link` may have more behind it: the next page
///   is asked for with `last`, unless this page brought nothing new.
fn next_page(
    current: &Url,
    link: Option<&str>,
    page_len: usize,
    new: usize,
    last: Option<&str>,
) -> Result<Option<Url>, RegistryError> {
    let listing = Listing {
        operation: "list_tags",
        what: "tag list",
        page_size: TAG_PAGE_SIZE,
    };
    listing.next_page(current, link, page_len, new, last)
}

/// A paginated registry listing (tags, the catalog), for [`Listing::next_page`].
pub(super) struct Listing {
    pub operation: &'static str,
    /// Names the listing in error messages.
    pub what: &'static str,
    /// The `n` each page asks for.
    pub page_size: usize,
}

impl Listing {
    /// Where the listing goes on after a page, if anywhere (see [`next_page`]).
    pub(super) fn next_page(
        &self,
        current: &Url,
        link: Option<&str>,
        page_len: usize,
        new: usize,
        last: Option<&str>,
    ) -> Result<Option<Url>, RegistryError> {
        let (operation, what) = (self.operation, self.what);
        if let Some(target) = link.and_then(next_link) {
            let next = current.join(&target).map_err(|e| RegistryError::Protocol {
                operation,
                message: format!("unusable {what} Link {target:?}: {e}"),
            })?;
            if next.origin() != current.origin() {
                return Err(RegistryError::Protocol {
                    operation,
                    message: format!("the {what} Link leaves the registry: {target:?}"),
                });
            }
            if next == *current {
                return Err(RegistryError::Protocol {
                    operation,
                    message: format!("the {what} Link points at the same page"),
                });
            }
            return Ok(Some(next));
        }
        match last {
            Some(last) if page_len == self.page_size && new > 0 => {
                let mut next = current.clone();
                next.set_query(None);
                next.query_pairs_mut()
                    .append_pair("n", &self.page_size.to_string())
                    .append_pair("last", last);
                Ok(Some(next))
            }
            _ => Ok(None),
        }
    }
}

/// The target of the `rel="next"` link in a `Link` header (RFC 8288), if any.
pub(super) fn next_link(header: &str) -> Option<String> {
    let mut rest = header;
    loop {
        let open = rest.find('<')?;
        let close = open + rest[open..].find('>')?;
        let target = &rest[open + 1..close];
        rest = &rest[close + 1..];
        // The link's parameters run up to the next link.
        let params = rest.split('<').next().unwrap_or_default();
        let is_next = params.split(';').any(|param| {
            param.split_once('=').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("rel")
                    && value
                        .trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|rel| rel.eq_ignore_ascii_case("next"))
            })
        });
        if is_next {
            return Some(target.trim().to_string());
        }
    }
}

/// An OCI tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    tag.len() <= 128
        && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// An OCI digest: `algorithm:encoded`, algorithm `[a-z0-9]+([+._-][a-z0-9]+)*`, encoded
/// `[a-zA-Z0-9=_-]+`.
pub(super) fn valid_digest(digest: &str) -> bool {
    let Some((algorithm, encoded)) = digest.split_once(':') else {
        return false;
    };
    let component = |c: &str| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    !encoded.is_empty()
        && encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'_' | b'-'))
        && algorithm.split(['+', '.', '_', '-']).all(component)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn link_headers_name_the_next_page() {
        assert_eq!(
            next_link(r#"</v2/vm/tags/list?n=100&last=t099>; rel="next""#).as_deref(),
            Some("/v2/vm/tags/list?n=100&last=t099")
        );
        assert_eq!(
            next_link(r#"<https://a/prev>; rel=prev, <https://a/next>; rel=next"#).as_deref(),
            Some("https://a/next")
        );
        assert_eq!(
            next_link(r#"<x>; title="a, b"; REL="first next""#).as_deref(),
            Some("x")
        );
        assert_eq!(next_link(r#"</x>; rel="prev""#), None);
        assert_eq!(next_link(""), None);
        assert_eq!(next_link("<unterminated"), None);
    }

    /// G1/S5: the listing ends only when the registry says so or cannot have more; each
    /// page is asked for once.
    #[test]
    fn g1_tag_pages_end_without_an_extra_request() {
        let first = url("http://r:5000/v2/vm/tags/list?n=100");
        // The usual answer: one short page, no Link.
        assert_eq!(
            next_page(&first, None, 1, 1, Some("hibernate")).unwrap(),
            None
        );
        // Distribution 2.x ignores `n` and sends everything.
        assert_eq!(next_page(&first, None, 131, 131, Some("t9")).unwrap(), None);
        // An empty repository.
        assert_eq!(next_page(&first, None, 0, 0, None).unwrap(), None);
        // Exactly a full page without Link: ask on, once.
        let next = next_page(&first, None, 100, 100, Some("t099"))
            .unwrap()
            .unwrap();
        assert_eq!(
            next.as_str(),
            "http://r:5000/v2/vm/tags/list?n=100&last=t099"
        );
        // ... and a full page that brought nothing new ends it.
        assert_eq!(next_page(&next, None, 100, 0, Some("t099")).unwrap(), None);
        // Link is followed, relative or absolute on the same origin.
        let linked = next_page(
            &first,
            Some(r#"</v2/vm/tags/list?last=t1&n=100>; rel="next""#),
            100,
            100,
            Some("t1"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            linked.as_str(),
            "http://r:5000/v2/vm/tags/list?last=t1&n=100"
        );
        // Never to another host, never the same page again.
        assert!(
            next_page(
                &first,
                Some(r#"<http://evil/v2/vm/tags/list>; rel="next""#),
                100,
                100,
                None
            )
            .is_err()
        );
        assert!(
            next_page(
                &first,
                Some(r#"</v2/vm/tags/list?n=100>; rel="next""#),
                100,
                100,
                None
            )
            .is_err()
        );
    }

    #[test]
    fn tags_are_checked_before_they_reach_a_url() {
        for good in ["hibernate", "t000", "_x", "v1.2-rc_3", &"a".repeat(128)] {
            assert!(valid_tag(good), "{good}");
        }
        for bad in [
            "",
            ".x",
            "-x",
            "a/b",
            "../x",
            "a?b",
            "a#b",
            "a b",
            &"a".repeat(129),
        ] {
            assert!(!valid_tag(bad), "{bad}");
        }
    }

    #[test]
    fn digests_are_checked_before_they_reach_a_url() {
        assert!(valid_digest(
            "sha256:a66f6444bae425ddb05bd47d1ed7576fcd89634f9c92e131b38dfd2372bbeba1"
        ));
        assert!(valid_digest("sha512+b64u:abc-_="));
        for bad in [
            "",
            "sha256",
            "sha256:",
            ":abc",
            "sha256:../../x",
            "SHA256:ab",
            "sha256:a/b",
            "sha256:a?b",
        ] {
            assert!(!valid_digest(bad), "{bad}");
        }
    }
}
