//! Registry base ("host[:port][/prefix]") and OCI repository names.

use super::error::RegistryError;
use oci_client::Reference;

/// Tag that holds a VM's hibernation snapshot.
pub const SNAPSHOT_TAG: &str = "hibernate";

/// Distribution refuses repository names longer than this.
const MAX_REPOSITORY_LEN: usize = 255;

/// The parsed `RegistryConfig::base`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RegistryBase {
    /// "host[:port]" as it appears in URLs.
    pub registry: String,
    /// Repository path prefix without slashes at the ends, if any.
    pub prefix: Option<String>,
}

impl RegistryBase {
    pub fn parse(base: &str) -> Result<Self, RegistryError> {
        let invalid =
            |why: &str| RegistryError::InvalidConfig(format!("registry base {base:?}: {why}"));
        let trimmed = base.trim().trim_end_matches('/');
        if trimmed.contains("://") {
            return Err(invalid(
                "give host[:port][/path/prefix] without a scheme (plain_http selects http)",
            ));
        }
        let (host, prefix) = trimmed
            .split_once('/')
            .map_or((trimmed, None), |(h, p)| (h, Some(p)));
        // The URL parser checks the host and the port as reqwest will use them.
        if host.is_empty()
            || reqwest::Url::parse(&format!("http://{host}/")).is_err()
            || host.contains(['@', '?', '#'])
        {
            return Err(invalid(
                "the host is not host[:port] (a name, an IPv4 or a bracketed IPv6 address)",
            ));
        }
        for component in prefix.iter().flat_map(|p| p.split('/')) {
            validate_component(component)
                .map_err(|why| invalid(&format!("path component {component:?} {why}")))?;
        }
        Ok(Self {
            registry: host.to_string(),
            prefix: prefix.map(str::to_string),
        })
    }

    /// "<prefix>/<vm>", after checking `vm` is one valid path component.
    pub fn repository(&self, vm: &str) -> Result<String, RegistryError> {
        let invalid = |reason| RegistryError::InvalidVmName {
            name: vm.to_string(),
            reason,
        };
        validate_component(vm).map_err(invalid)?;
        let repository = match &self.prefix {
            Some(prefix) => format!("{prefix}/{vm}"),
            None => vm.to_string(),
        };
        if repository.len() > MAX_REPOSITORY_LEN {
            return Err(invalid("the repository name would exceed 255 characters"));
        }
        Ok(repository)
    }

    /// `<registry>/<prefix>/<vm>:hibernate`.
    pub fn snapshot(&self, vm: &str) -> Result<Reference, RegistryError> {
        let repository = self.repository(vm)?;
        Ok(Reference::with_tag(
            self.registry.clone(),
            repository,
            SNAPSHOT_TAG.into(),
        ))
    }

    /// The VM a repository holds snapshots of: the one path component below the prefix.
    pub fn vm_of<'a>(&self, repository: &'a str) -> Option<&'a str> {
        let vm = match &self.prefix {
            Some(prefix) => repository
                .strip_prefix(prefix.as_str())?
                .strip_prefix('/')?,
            None => repository,
        };
        validate_component(vm).ok().map(|()| vm)
    }
}

/// One OCI path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn validate_component(name: &str) -> Result<(), &'static str> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let separator = |s: &str| matches!(s, "." | "_" | "__") || s.bytes().all(|b| b == b'-');
    if name.is_empty() {
        Err("must not be empty")
    } else if !name
        .chars()
        .all(|c| alnum(c) || matches!(c, '.' | '_' | '-'))
    {
        Err("may only hold lowercase letters, digits, '.', '_' and '-'")
    } else if !name.starts_with(alnum) || !name.ends_with(alnum) {
        Err("must start and end with a lowercase letter or digit")
    } else if !name.split(alnum).all(separator) {
        Err("separators must be '.', '_', '__' or a run of '-'")
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_prefix() {
        let b = RegistryBase::parse("reg.example:5000/snap/team/").unwrap();
        assert_eq!(b.registry, "reg.example:5000");
        assert_eq!(b.prefix.as_deref(), Some("snap/team"));
        assert_eq!(b.repository("vm-1").unwrap(), "snap/team/vm-1");
        let b = RegistryBase::parse("127.0.0.1:5000").unwrap();
        assert_eq!(b.prefix, None);
        assert_eq!(b.repository("vm").unwrap(), "vm");
        assert!(RegistryBase::parse("[::1]:5000/x").is_ok());
    }

    #[test]
    fn rejects_bad_bases_with_clear_messages() {
        for bad in ["", "https://reg", "reg:port", "reg/Upper", "reg//x", "re g"] {
            let err = RegistryBase::parse(bad).unwrap_err();
            assert!(
                matches!(err, RegistryError::InvalidConfig(_)),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn vm_names_follow_the_oci_component_grammar() {
        for good in ["vm", "vm-1", "a.b", "a_b", "a__b", "a---b", "0"] {
            assert!(validate_component(good).is_ok(), "{good}");
        }
        for bad in [
            "", "VM", "-vm", "vm-", ".vm", "a..b", "a___b", "a._b", "a/b", "a b", "vm:tag", "ü",
        ] {
            assert!(validate_component(bad).is_err(), "{bad}");
        }
        let base = RegistryBase::parse("reg").unwrap();
        let err = base.repository("Bad/Name").unwrap_err();
        assert!(err.to_string().contains("invalid VM name"), "{err}");
        assert!(base.repository(&"a".repeat(300)).is_err());
    }

    #[test]
    fn only_one_component_below_the_prefix_is_a_snapshot_repository() {
        let base = RegistryBase::parse("reg:5000/snap/team").unwrap();
        assert_eq!(base.vm_of("snap/team/vm-1"), Some("vm-1"));
        assert_eq!(base.vm_of("snap/team/a/b"), None, "nested deeper");
        assert_eq!(base.vm_of("snap/team"), None, "the prefix itself");
        assert_eq!(base.vm_of("snap/teamx/vm"), None, "a sibling prefix");
        assert_eq!(base.vm_of("other/vm"), None);
        let bare = RegistryBase::parse("reg:5000").unwrap();
        assert_eq!(bare.vm_of("vm-1"), Some("vm-1"));
        assert_eq!(bare.vm_of("snap/vm-1"), None);
        assert_eq!(bare.vm_of("Bad"), None);
    }
}
