//! The registry's catalog (`GET /v2/_catalog`): which snapshot repositories exist below
//! the base. Only the orphan audit (`kubectl cocoon orphans`) reads it; the controller
//! never lists the registry.

use super::client::RegistryClient;
use super::error::RegistryError;
use super::http::PAGE_SIZE;
use super::names::{RegistryBase, validate_component};

impl RegistryClient {
    /// The VMs whose repository `<base>/<vm>` the catalog lists, sorted, each once; whether
    /// `<vm>:hibernate` exists is not checked. Every page is read once, each within the
    /// timeout, on one token (scope `registry:catalog:*`).
    pub async fn catalog_vms(&self) -> Result<Vec<String>, RegistryError> {
        const OP: &str = "catalog";
        let mut session = self.session("registry:catalog:*".into(), self.timeout());
        let first = self.url(&format!("_catalog?n={PAGE_SIZE}"))?;
        let Some(repositories) = session.list(first, "repositories", OP).await? else {
            let message = "this registry does not offer its catalog (GET /v2/_catalog); \
                           the orphan audit needs it";
            let message = message.into();
            return Err(RegistryError::Server {
                operation: OP,
                status: 404,
                message,
            });
        };
        let mut vms: Vec<String> = repositories
            .iter()
            .filter_map(|r| vm_of(self.base(), r))
            .map(str::to_string)
            .collect();
        vms.sort();
        vms.dedup();
        Ok(vms)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::http::next_page;
    use reqwest::Url;

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
