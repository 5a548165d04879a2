//! S10: the owner marker. Each install keeps one tag under its registry base,
//! `<base>/cocoon-hibernation/owner:<install tag>`, a tiny OCI artifact whose annotations
//! name the install (its cluster and release). A tag there that is not this install's
//! means the base is shared: the server reports it, and the orphan audit refuses to
//! delete. One tag per install, so two installs marking at once both see each other.

use super::client::RegistryClient;
use super::error::Result;
use super::{FAR, names::RegistryBase};
use oci_client::client::ImageLayer;
use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
use std::collections::BTreeMap;
use tokio::time::Instant;

/// The marker's repository below the base: two path components, so it is never a VM's
/// snapshot repository (those are one component below the base).
pub const OWNER_REPOSITORY: &str = "cocoon-hibernation/owner";
/// Markers read per check; more than this many installs on one base are not named one by one.
const READ_AT_MOST: usize = 10;
/// The OCI empty descriptor's content and type: the marker's config and only layer.
const EMPTY: &[u8] = b"{}";
const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
const ARTIFACT_TYPE: &str = "application/vnd.cocoonstack.hibernation.owner.v1";
const CLUSTER_KEY: &str = "hibernation.cocoonstack.io/cluster";
const RELEASE_KEY: &str = "hibernation.cocoonstack.io/release";

/// One install: its cluster (the uid of namespace kube-system) and its release
/// (`<namespace>/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallId {
    pub cluster: String,
    pub release: String,
}

impl std::fmt::Display for InstallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "release {} of cluster {}", self.release, self.cluster)
    }
}

impl InstallId {
    pub fn new(cluster: &str, release: &str) -> Self {
        InstallId {
            cluster: cluster.into(),
            release: release.into(),
        }
    }

    /// The marker this install writes.
    pub fn marker(&self) -> Marker {
        Marker {
            tag: self.tag(),
            install: Some(self.clone()),
        }
    }

    /// The install's marker tag: a digest of its identity, so it is a valid tag whatever
    /// the names, and the same on every replica and every start.
    pub fn tag(&self) -> String {
        let identity = format!("{}\n{}", self.cluster, self.release);
        let digest = sha256(identity.as_bytes());
        let hex = digest.trim_start_matches("sha256:");
        format!("install-{}", &hex[..hex.len().min(40)])
    }

    /// The marker manifest: the empty config and layer, the identity in annotations.
    fn manifest(&self) -> Vec<u8> {
        let empty = serde_json::json!({
            "mediaType": EMPTY_TYPE,
            "digest": sha256(EMPTY),
            "size": EMPTY.len(),
        });
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": empty,
            "layers": [empty],
            "annotations": {CLUSTER_KEY: self.cluster, RELEASE_KEY: self.release},
        });
        manifest.to_string().into_bytes()
    }

    /// The install a marker manifest names, if it names one.
    pub fn from_manifest(body: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Manifest {
            annotations: Option<BTreeMap<String, String>>,
        }
        let mut annotations = serde_json::from_str::<Manifest>(body).ok()?.annotations?;
        Some(Self {
            cluster: annotations.remove(CLUSTER_KEY)?,
            release: annotations.remove(RELEASE_KEY)?,
        })
    }
}

/// A marker found under the base: its tag, and the install it names when it could be read
/// (only the first few are read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub tag: String,
    pub install: Option<InstallId>,
}

/// Whom a base belongs to, as its markers say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Only this install's marker.
    Ours,
    /// No marker at all: no server of this install has used the base (yet), or the base
    /// is not the one it uses.
    Unmarked,
    /// Markers of other installs, whether or not this one's is there too.
    Shared { others: Vec<Marker> },
}

/// What `markers` say about a base that `ours` believes it owns.
pub fn ownership(ours: &InstallId, markers: &[Marker]) -> Ownership {
    let tag = ours.tag();
    let others: Vec<Marker> = markers.iter().filter(|m| m.tag != tag).cloned().collect();
    match (others.is_empty(), markers.len()) {
        (false, _) => Ownership::Shared { others },
        (true, 0) => Ownership::Unmarked,
        (true, _) => Ownership::Ours,
    }
}

/// The other installs, as their markers name them.
pub fn describe_owners(others: &[Marker]) -> String {
    let names: Vec<String> = others
        .iter()
        .map(|m| match &m.install {
            Some(install) => install.to_string(),
            None => format!("marker {}", m.tag),
        })
        .collect();
    names.join("; ")
}

impl RegistryClient {
    /// Every marker under the base; the installs of the first few that are not `ours`
    /// (whose install is known) are read from their manifests.
    pub async fn owner_markers(&self, ours: &InstallId) -> Result<Vec<Marker>> {
        let own_tag = ours.tag();
        let repository = self.owner_repository()?;
        let read = |deadline| async move {
            let scope = format!("repository:{repository}:pull");
            let mut s = self.http.session(scope, deadline);
            let tags = s
                .list(&format!("{repository}/tags/list"), "owner_tags")
                .await?;
            let mut markers = Vec::new();
            for tag in tags.unwrap_or_default() {
                let install = if tag == own_tag {
                    Some(ours.clone())
                } else if markers.len() < READ_AT_MOST {
                    let path = format!("{repository}/manifests/{tag}");
                    let body = s.get_manifest(&path, "owner_read").await?;
                    body.as_deref().and_then(InstallId::from_manifest)
                } else {
                    None
                };
                markers.push(Marker { tag, install });
            }
            Ok(markers)
        };
        self.within("owner_check", Instant::now() + FAR, read).await
    }

    /// Writes `ours`'s marker (idempotent: the same bytes under the same tag).
    pub async fn mark_owner(&self, ours: &InstallId) -> Result<()> {
        let repository = self.owner_repository()?;
        let write = |deadline| async move {
            let scope = format!("repository:{repository}:pull,push");
            let mut s = self.http.session(scope, deadline);
            s.ensure_blob(&repository, &sha256(EMPTY), EMPTY).await?;
            let path = format!("{repository}/manifests/{}", ours.tag());
            s.put_manifest(&path, OCI_IMAGE_MEDIA_TYPE, &ours.manifest())
                .await
        };
        self.within("owner_mark", Instant::now() + FAR, write).await
    }

    fn owner_repository(&self) -> Result<String> {
        let RegistryBase { prefix, .. } = &self.base;
        Ok(match prefix {
            Some(prefix) => format!("{prefix}/{OWNER_REPOSITORY}"),
            None => OWNER_REPOSITORY.to_string(),
        })
    }
}

/// `sha256:<hex>` of `data`, as the registry computes a digest.
fn sha256(data: &[u8]) -> String {
    ImageLayer::new(data.to_vec(), String::new(), None).sha256_digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cluster: &str, release: &str) -> InstallId {
        InstallId::new(cluster, release)
    }

    fn marker(of: &InstallId) -> Marker {
        of.marker()
    }

    /// S10: a base is ours only while every marker on it is ours; any other install's
    /// marker (another cluster, or another release of this cluster) makes it shared.
    #[test]
    fn s10_a_base_is_ours_only_with_our_marker_alone() {
        let ours = id("uid-a", "ops/cocoon");
        let other_cluster = id("uid-b", "ops/cocoon");
        let other_release = id("uid-a", "staging/cocoon");
        assert_eq!(ownership(&ours, &[marker(&ours)]), Ownership::Ours);
        assert_eq!(ownership(&ours, &[]), Ownership::Unmarked);
        for other in [&other_cluster, &other_release] {
            for markers in [vec![marker(other)], vec![marker(&ours), marker(other)]] {
                assert_eq!(
                    ownership(&ours, &markers),
                    Ownership::Shared {
                        others: vec![marker(other)]
                    },
                    "{other}"
                );
            }
        }
        let junk = Marker {
            tag: "latest".into(),
            install: None,
        };
        assert!(matches!(
            ownership(&ours, &[marker(&ours), junk]),
            Ownership::Shared { .. }
        ));
    }

    /// S10: the tag is stable, a valid OCI tag, and differs between installs; the
    /// manifest names the install it was written by.
    #[test]
    fn s10_the_marker_names_its_install() {
        let ours = id("0b3c-uid", "ops/cocoon-hibernation");
        assert_eq!(ours.tag(), ours.clone().tag());
        assert!(super::super::http::valid_tag(&ours.tag()), "{}", ours.tag());
        assert_ne!(ours.tag(), id("0b3c-uid", "ops/other").tag());
        assert_ne!(ours.tag(), id("other-uid", "ops/cocoon-hibernation").tag());
        let body = String::from_utf8(ours.manifest()).unwrap();
        assert_eq!(InstallId::from_manifest(&body), Some(ours));
        assert_eq!(InstallId::from_manifest("{}"), None);
        assert_eq!(InstallId::from_manifest("not json"), None);
    }
}
