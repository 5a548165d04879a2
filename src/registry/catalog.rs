//! The registry's catalog (`GET /v2/_catalog`): which snapshot repositories exist below
//! the base. Only the orphan audit (`kubectl cocoon orphans`) reads it; the controller
//! never lists the registry.

use super::client::RegistryClient;
use super::error::RegistryError;
use std::collections::BTreeSet;

impl RegistryClient {
    /// The VMs whose repository `<base>/<vm>` the catalog lists, sorted, each once; whether
    /// `<vm>:hibernate` exists is not checked. Every page is read once, each within the
    /// timeout, on one token (scope `registry:catalog:*`).
    pub async fn catalog_vms(&self) -> Result<Vec<String>, RegistryError> {
        let inner = &self.inner;
        let mut session = inner
            .http
            .session("registry:catalog:*".into(), inner.timeout);
        let Some(repositories) = session.list("_catalog", "repositories", "catalog").await? else {
            let message = "this registry does not offer its catalog (GET /v2/_catalog); \
                           the orphan audit needs it";
            return Err(RegistryError::Server {
                operation: "catalog",
                status: 404,
                message: message.into(),
            });
        };
        let vms = repositories.iter().filter_map(|r| inner.base.vm_of(r));
        Ok(vms
            .map(str::to_string)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::registry::http::next_page;
    use reqwest::Url;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
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
