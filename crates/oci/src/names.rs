//! Registry base ("host[:port][/prefix]") and OCI repository names.

use super::error::RegistryError;
use oci_client::Reference;

/// Tag that holds a VM's hibernation snapshot.
pub const SNAPSHOT_TAG: &str = "hibernate";

/// Distribution refuses repository names longer than this.
const MAX_REPOSITORY_LEN: usize = 255;

/// Why a name is not an OCI path component (see [`valid_component`]).
const NOT_A_COMPONENT: &str =
    "is not lowercase letters and digits joined by '.', '_', '__' or a run of '-'";

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
        let trimmed = base.trim().trim_end_matches('/');
        let (host, prefix) = trimmed.split_once('/').unzip();
        let host = host.unwrap_or(trimmed);
        let mut components = prefix.iter().flat_map(|p| p.split('/'));
        // The URL parser checks the host and the port as reqwest will use them.
        let url = reqwest::Url::parse(&format!("http://{host}/"));
        let why = if trimmed.contains("://") {
            "give host[:port][/path/prefix] without a scheme (plain_http selects http)".into()
        } else if url.is_err() || host.contains(['@', '?', '#']) {
            "the host is not host[:port] (a name, an IPv4 or a bracketed IPv6 address)".into()
        } else if let Some(bad) = components.find(|c| !valid_component(c)) {
            format!("path component {bad:?} {NOT_A_COMPONENT}")
        } else {
            let (registry, prefix) = (host.to_string(), prefix.map(str::to_string));
            return Ok(Self { registry, prefix });
        };
        let message = format!("registry base {base:?}: {why}");
        Err(RegistryError::InvalidConfig(message))
    }

    /// `<registry>/<prefix>/<vm>:hibernate`, after checking `vm` is one path component.
    pub fn snapshot(&self, vm: &str) -> Result<Reference, RegistryError> {
        let repository = match &self.prefix {
            Some(prefix) => format!("{prefix}/{vm}"),
            None => vm.to_string(),
        };
        let reason = if !valid_component(vm) {
            NOT_A_COMPONENT
        } else if repository.len() > MAX_REPOSITORY_LEN {
            "the repository name would exceed 255 characters"
        } else {
            let tag = SNAPSHOT_TAG.to_string();
            return Ok(Reference::with_tag(self.registry.clone(), repository, tag));
        };
        let name = vm.to_string();
        Err(RegistryError::InvalidVmName { name, reason })
    }

    /// The VM a repository holds snapshots of: the one path component below the prefix.
    pub fn vm_of<'a>(&self, repository: &'a str) -> Option<&'a str> {
        let vm = match &self.prefix {
            Some(prefix) => repository.strip_prefix(&format!("{prefix}/"))?,
            None => repository,
        };
        valid_component(vm).then_some(vm)
    }
}

/// One OCI path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn valid_component(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let separator = |s: &str| matches!(s, "." | "_" | "__") || s.bytes().all(|b| b == b'-');
    name.starts_with(alnum) && name.ends_with(alnum) && name.split(alnum).all(separator)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_prefix() {
        let b = RegistryBase::parse("reg.example:5000/snap/team/").unwrap();
        assert_eq!(b.registry, "reg.example:5000");
        assert_eq!(b.prefix.as_deref(), Some("snap/team"));
        assert_eq!(b.snapshot("vm-1").unwrap().repository(), "snap/team/vm-1");
        let b = RegistryBase::parse("127.0.0.1:5000").unwrap();
        assert_eq!(b.prefix, None);
        assert_eq!(b.snapshot("vm").unwrap().repository(), "vm");
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
            assert!(valid_component(good), "{good}");
        }
        for bad in [
            "", "VM", "-vm", "vm-", ".vm", "a..b", "a___b", "a._b", "a/b", "a b", "vm:tag", "ü",
        ] {
            assert!(!valid_component(bad), "{bad}");
        }
        let base = RegistryBase::parse("reg").unwrap();
        let err = base.snapshot("Bad/Name").unwrap_err();
        assert!(err.to_string().contains("invalid VM name"), "{err}");
        assert!(base.snapshot(&"a".repeat(300)).is_err());
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
