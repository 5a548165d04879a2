//! S10: the install the orphan audit runs against, read from the cluster, not trusted
//! from a flag. The chart writes a ConfigMap labelled [`INSTALL_LABEL`] that names the
//! install's registry base and release, the same values its server is given; the
//! registry's owner marker then says whether that base is this install's alone.

use super::error::PluginError;
use cocoon_oci::{InstallId, Marker, Ownership, ownership};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;

/// The label of the chart's install ConfigMap.
pub const INSTALL_LABEL: &str = "hibernation.cocoonstack.io/install";
const BASE_KEY: &str = "registryBase";
const RELEASE_KEY: &str = "release";

/// One install, as its ConfigMap says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Install {
    /// `namespace/name` of the ConfigMap.
    pub config_map: String,
    pub base: String,
    pub release: String,
}

impl Install {
    fn from_config_map(cm: &ConfigMap) -> Result<Self, PluginError> {
        let meta = &cm.metadata;
        let config_map = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let data = cm.data.clone().unwrap_or_default();
        let field = |key: &str| {
            let value = data.get(key).map(|v| v.trim()).unwrap_or_default();
            match value.is_empty() {
                true => Err(PluginError::Refused(format!(
                    "the install ConfigMap {config_map} has no {key}: reinstall the chart"
                ))),
                false => Ok(value.to_string()),
            }
        };
        Ok(Self {
            base: normalize(&field(BASE_KEY)?),
            release: field(RELEASE_KEY)?,
            config_map: config_map.clone(),
        })
    }
}

/// The install's ConfigMap: the one `wanted` names (`namespace/name`), else the only
/// one in the cluster.
pub async fn find(client: &kube::Client, wanted: Option<&str>) -> Result<Install, PluginError> {
    if let Some(wanted) = wanted {
        let Some((namespace, name)) = wanted.split_once('/') else {
            return Err(PluginError::Config(format!(
                "--install {wanted:?}: give the install ConfigMap as NAMESPACE/NAME"
            )));
        };
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cm = api
            .get(name)
            .await
            .map_err(|e| PluginError::api(format!("reading the install ConfigMap {wanted}"), e))?;
        let labelled = cm.metadata.labels.as_ref();
        if labelled.and_then(|l| l.get(INSTALL_LABEL)).is_none() {
            return Err(PluginError::Refused(format!(
                "ConfigMap {wanted} is not an install ConfigMap (no label {INSTALL_LABEL})"
            )));
        }
        return Install::from_config_map(&cm);
    }
    let api: Api<ConfigMap> = Api::all(client.clone());
    let found = api
        .list(&ListParams::default().labels(INSTALL_LABEL))
        .await
        .map_err(|e| PluginError::api("listing install ConfigMaps in every namespace", e))?;
    let installs = found
        .items
        .iter()
        .map(Install::from_config_map)
        .collect::<Result<Vec<_>, _>>()?;
    only_one(installs)
}

/// The one install found, else a refusal that says how to choose.
pub fn only_one(mut installs: Vec<Install>) -> Result<Install, PluginError> {
    match installs.len() {
        1 => Ok(installs.remove(0)),
        0 => Err(PluginError::Refused(format!(
            "no cocoon-hibernation install found (no ConfigMap labelled {INSTALL_LABEL}): \
             the audit reads the registry base from the install; install or upgrade the chart"
        ))),
        _ => {
            let names: Vec<&str> = installs.iter().map(|i| i.config_map.as_str()).collect();
            Err(PluginError::Config(format!(
                "{} installs found ({}): choose one with --install NAMESPACE/NAME",
                names.len(),
                names.join(", ")
            )))
        }
    }
}

/// `--registry-base`, when given, only checks: it must be the install's base.
pub fn check_base(flag: Option<&str>, install: &Install) -> Result<(), PluginError> {
    match flag.map(normalize) {
        Some(given) if given != install.base => Err(PluginError::Config(format!(
            "--registry-base {given} is not the base of install {} ({}); \
             the audit uses the install's base, the flag only checks it",
            install.release, install.base
        ))),
        _ => Ok(()),
    }
}

/// Why the audit must not delete on this base, if it must not.
pub fn refusal(ours: &InstallId, markers: &[Marker], base: &str) -> Option<String> {
    match ownership(ours, markers) {
        Ownership::Ours => None,
        Ownership::Unmarked => Some(format!(
            "{base} has no owner marker of {ours}: its server has not marked it (is it \
             running, with push rights on {base}/{}?), or it uses another base",
            cocoon_oci::OWNER_REPOSITORY
        )),
        Ownership::Shared { others } => Some(format!(
            "{base} is shared: besides {ours}, it holds the owner marker of {}; a tag no \
             CocoonHibernation of this cluster holds may be theirs. Give each install a \
             base of its own",
            cocoon_oci::describe_owners(&others)
        )),
    }
}

fn normalize(base: &str) -> String {
    base.trim().trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(config_map: &str, base: &str) -> Install {
        Install {
            config_map: config_map.into(),
            base: base.into(),
            release: "ops/cocoon".into(),
        }
    }

    fn id(cluster: &str, release: &str) -> InstallId {
        InstallId::new(cluster, release)
    }

    fn marker(of: &InstallId) -> Marker {
        of.marker()
    }

    /// S10: the base comes from the install; a flag that differs is refused, not used.
    #[test]
    fn s10_the_base_is_the_installs_and_a_flag_only_checks_it() {
        let one = install("ops/cocoon-install", "reg:5000/snap");
        assert_eq!(only_one(vec![one.clone()]).unwrap(), one);
        assert!(check_base(None, &one).is_ok());
        assert!(check_base(Some("reg:5000/snap/"), &one).is_ok());
        let err = check_base(Some("reg:5000/snapx"), &one).unwrap_err();
        assert!(err.to_string().contains("not the base of install"), "{err}");
        let err = only_one(vec![]).unwrap_err();
        assert!(
            err.to_string().contains("no cocoon-hibernation install"),
            "{err}"
        );
        let two = vec![one.clone(), install("dev/cocoon-install", "reg:5000/dev")];
        let err = only_one(two).unwrap_err();
        assert!(err.to_string().contains("--install"), "{err}");
    }

    /// S10: the audit deletes only on a base whose markers are ours alone, and says why
    /// otherwise, naming the other install.
    #[test]
    fn s10_a_shared_or_unmarked_base_is_refused_with_the_reason() {
        let ours = id("uid-a", "ops/cocoon");
        let theirs = id("uid-b", "shop/cocoon");
        assert_eq!(refusal(&ours, &[marker(&ours)], "reg/snap"), None);
        let why = refusal(&ours, &[marker(&ours), marker(&theirs)], "reg/snap").unwrap();
        assert!(why.contains("is shared") && why.contains("uid-b"), "{why}");
        let why = refusal(&ours, &[], "reg/snap").unwrap();
        assert!(why.contains("no owner marker"), "{why}");
    }
}
