//! The registry's catalog (`GET /v2/_catalog`): which snapshot repositories exist below
//! the base. Only the orphan audit (`kubectl cocoon orphans`) reads it; the controller
//! never lists the registry.

use super::client::{RegistryClient, error_outcome};
use super::deadline::Deadline;
use super::error::RegistryError;
use super::names::{RegistryBase, SNAPSHOT_TAG, validate_component};
use super::request::{Session, unexpected};
use reqwest::{Method, StatusCode, Url};
use std::collections::{BTreeSet, HashSet};

/// Repositories asked for per page. Distribution serves up to 1000; newer versions
/// refuse a larger `n`, so this stays well below.
const CATALOG_PAGE_SIZE: usize = 100;
/// Upper bound on pages (a million repositories), so a registry whose pages never end
/// cannot loop us forever.
const MAX_CATALOG_PAGES: usize = 10_000;
const OP: &str = "catalog";

#[derive(serde::Deserialize)]
struct CatalogPage {
    #[serde(default)]
    repositories: Option<Vec<String>>,
}

impl RegistryClient {
    /// The VMs whose repository `<base>/<vm>` the catalog lists, sorted, each once.
    /// Whether `<vm>:hibernate` exists is not checked here (see
    /// [`Self::snapshot_digest`]). Repositories outside the base's prefix, or more than
    /// one component below it, cannot hold a snapshot and are left out.
    ///
    /// Every page is read once, with its own `timeout`; the pages share one token (scope
    /// `registry:catalog:*`). A registry without a catalog (many hosted ones) gives an
    /// error that says so.
    pub async fn catalog_vms(&self) -> Result<Vec<String>, RegistryError> {
        let base = &self.inner.base;
        let mut vms = BTreeSet::new();
        // Every repository read, so a page that repeats earlier ones is not progress.
        let mut seen = HashSet::new();
        let mut session = Session::with_scope("registry:catalog:*".to_string());
        let mut url = self.catalog_url()?;
        for _ in 0..MAX_CATALOG_PAGES {
            let deadline = Deadline::new(self.inner.timeout, None);
            let page = self.catalog_page(&url, &mut session, &deadline).await;
            self.inner.metrics.registry_call(
                OP,
                match &page {
                    Ok(_) => "ok",
                    Err(e) => error_outcome(e),
                },
            );
            let (repositories, link) = page?;
            let page_len = repositories.len();
            let last = repositories.last().cloned();
            let mut new = 0;
            for repository in repositories {
                if let Some(vm) = vm_of(base, &repository) {
                    vms.insert(vm.to_string());
                }
                if seen.insert(repository) {
                    new += 1;
                }
            }
            match next_page(&url, link.as_deref(), page_len, new, last.as_deref())? {
                Some(next) => url = next,
                None => return Ok(vms.into_iter().collect()),
            }
        }
        Err(RegistryError::Protocol {
            operation: OP,
            message: format!("the catalog did not end within {MAX_CATALOG_PAGES} pages"),
        })
    }

    /// Where a VM's snapshot lives, as users write it: `host[:port]/<prefix>/<vm>:hibernate`.
    pub fn snapshot_location(&self, vm: &str) -> Result<String, RegistryError> {
        let base = &self.inner.base;
        Ok(format!(
            "{}/{}:{SNAPSHOT_TAG}",
            base.registry,
            base.repository(vm)?
        ))
    }

    fn catalog_url(&self) -> Result<Url, RegistryError> {
        let raw = format!(
            "{}://{}/v2/_catalog?n={CATALOG_PAGE_SIZE}",
            self.inner.scheme, self.inner.base.registry
        );
        Url::parse(&raw).map_err(|e| RegistryError::InvalidConfig(format!("bad URL {raw}: {e}")))
    }

    /// One page: its repositories and its `Link` header.
    async fn catalog_page(
        &self,
        url: &Url,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<(Vec<String>, Option<String>), RegistryError> {
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
            return Err(RegistryError::Server {
                operation: OP,
                status: 404,
                message: "this registry does not offer its catalog (GET /v2/_catalog); \
                          the orphan audit needs it"
                    .into(),
            });
        }
        if !answer.status.is_success() {
            return Err(unexpected(&answer, OP));
        }
        let page: CatalogPage =
            serde_json::from_str(&answer.body).map_err(|e| RegistryError::Protocol {
                operation: OP,
                message: format!("the catalog is not JSON: {e}"),
            })?;
        Ok((page.repositories.unwrap_or_default(), answer.link))
    }
}

/// The VM a repository holds snapshots of: the one path component below the prefix.
fn vm_of<'a>(base: &RegistryBase, repository: &'a str) -> Option<&'a str> {
    let vm = match &base.prefix {
        Some(prefix) => repository
            .strip_prefix(prefix.as_str())?
            .strip_prefix('/')?,
        None => repository,
    };
    validate_component(vm).ok().map(|()| vm)
}

/// Where the catalog goes on after a page, if anywhere (the same rules as the tag list):
/// - a `Link: <…>; rel="next"` is followed, on the same origin only, never to the same page;
/// - without one, a page shorter or longer than asked for is the last;
/// - a page of exactly `n` without `Link` may have more behind it: the next is asked for
///   with `last`, unless this page brought nothing new.
fn next_page(
    current: &Url,
    link: Option<&str>,
    page_len: usize,
    new: usize,
    last: Option<&str>,
) -> Result<Option<Url>, RegistryError> {
    let listing = super::lookup::Listing {
        operation: OP,
        what: "catalog",
        page_size: CATALOG_PAGE_SIZE,
    };
    listing.next_page(current, link, page_len, new, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn only_one_component_below_the_prefix_is_a_snapshot_repository() {
        let base = RegistryBase::parse("reg:5000/snap/team").unwrap();
        assert_eq!(vm_of(&base, "snap/team/vm-1"), Some("vm-1"));
        assert_eq!(vm_of(&base, "snap/team/a/b"), None, "nested deeper");
        assert_eq!(vm_of(&base, "snap/team"), None, "the prefix itself");
        assert_eq!(vm_of(&base, "snap/teamx/vm"), None, "a sibling prefix");
        assert_eq!(vm_of(&base, "other/vm"), None);
        let bare = RegistryBase::parse("reg:5000").unwrap();
        assert_eq!(vm_of(&bare, "vm-1"), Some("vm-1"));
        assert_eq!(vm_of(&bare, "snap/vm-1"), None);
        assert_eq!(vm_of(&bare, "Bad"), None);
    }

    #[test]
    fn catalog_pages_end_without_an_extra_request() {
        let first = url("http://r:5000/v2/_catalog?n=100");
        assert_eq!(next_page(&first, None, 3, 3, Some("c")).unwrap(), None);
        assert_eq!(next_page(&first, None, 0, 0, None).unwrap(), None);
        assert_eq!(next_page(&first, None, 250, 250, Some("z")).unwrap(), None);
        let next = next_page(&first, None, 100, 100, Some("r099"))
            .unwrap()
            .unwrap();
        assert_eq!(next.as_str(), "http://r:5000/v2/_catalog?n=100&last=r099");
        assert_eq!(next_page(&next, None, 100, 0, Some("r099")).unwrap(), None);
        let linked = next_page(
            &first,
            Some(r#"</v2/_catalog?last=r1&n=100>; rel="next""#),
            100,
            100,
            Some("r1"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(linked.as_str(), "http://r:5000/v2/_catalog?last=r1&n=100");
        assert!(
            next_page(
                &first,
                Some(r#"<http://evil/v2/_catalog>; rel="next""#),
                100,
                100,
                None
            )
            .is_err()
        );
        assert!(
            next_page(
                &first,
                Some(r#"</v2/_catalog?n=100>; rel="next""#),
                100,
                100,
                None
            )
            .is_err()
        );
    }
}
