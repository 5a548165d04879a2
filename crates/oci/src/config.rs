//! Registry configuration and credentials. Debug output never shows a secret: oci-client's
//! [`RegistryAuth`] redacts the password and the token.

use super::error::RegistryError;
use oci_client::secrets::RegistryAuth;
use std::time::Duration;

#[derive(Debug)]
pub struct RegistryConfig {
    /// "host[:port][/path/prefix]"; the snapshot repository is "<base>/<vm>", tag "hibernate".
    pub base: String,
    /// Plain http only when asked explicitly; https otherwise.
    pub plain_http: bool,
    pub auth: RegistryAuth,
    /// Extra PEM CA certificates trusted for https.
    pub extra_ca_pems: Vec<Vec<u8>>,
    /// Budget of one whole operation (C2): a probe, or a delete with its digest fallback
    /// (every request, token and tag page included), or the orphan audit's catalog.
    pub timeout: Duration,
}

/// Credentials for `registry` (host[:port], or a whole base "host:port/prefix") from a
/// docker config.json, read by `docker_credential`: `auths` entries (`auth`,
/// username/password, `identitytoken` used as a bearer token), `credHelpers` and
/// `credsStore` (the `docker-credential-<name>` program is run). The keys tried are the
/// host as given and as `docker login` writes it (`https://host`, and
/// `https://index.docker.io/v1/` for Docker Hub). No entry for the host = Anonymous.
pub fn auth_from_docker_config(json: &[u8], registry: &str) -> Result<RegistryAuth, RegistryError> {
    use docker_credential::{CredentialRetrievalError as E, DockerCredential as C};
    let fail = |why| Err(RegistryError::InvalidConfig(why));
    let host = registry.trim().split('/').next().unwrap_or_default();
    let host = host.to_ascii_lowercase();
    if host.is_empty() {
        return fail("empty registry host".into());
    }
    // The crate says only "Unable to read config"; serde_json says where it broke.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(json) {
        return fail(format!("the docker config is not valid JSON: {e}"));
    }
    let hub = ["docker.io", "index.docker.io", "registry-1.docker.io"].contains(&host.as_str());
    let hub = hub.then(|| "https://index.docker.io/v1/".to_string());
    let keys = ["", "https://", "http://"].map(|scheme| format!("{scheme}{host}"));
    for key in keys.into_iter().chain(hub) {
        return match docker_credential::get_credential_from_reader(json, &key) {
            Ok(C::UsernamePassword(user, password)) => Ok(RegistryAuth::Basic(user, password)),
            Ok(C::IdentityToken(token)) => Ok(RegistryAuth::Bearer(token)),
            Err(E::NoCredentialConfigured) => continue,
            // The crate's messages carry no secret; a helper's stdout might: left out.
            Err(E::HelperFailure { helper, stderr, .. }) => fail(format!(
                "credential helper {helper} failed for {key}: {}",
                stderr.trim()
            )),
            Err(e) => fail(format!("docker config credentials for {key}: {e}")),
        };
    }
    Ok(RegistryAuth::Anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn docker_config_auth_field_gives_basic() {
        let json = format!(
            r#"{{"auths":{{"reg.example:5000":{{"auth":"{}"}}}}}}"#,
            b64("alice:s3:cret")
        );
        let auth = auth_from_docker_config(json.as_bytes(), "reg.example:5000").unwrap();
        assert_eq!(auth, RegistryAuth::Basic("alice".into(), "s3:cret".into()));
    }

    #[test]
    fn docker_config_matches_scheme_and_path_keys_and_base_with_prefix() {
        let json = format!(
            r#"{{"auths":{{"https://reg.example:5000":{{"auth":"{}"}}}}}}"#,
            b64("a:b")
        );
        let auth =
            auth_from_docker_config(json.as_bytes(), "reg.example:5000/snapshots/team").unwrap();
        assert!(matches!(auth, RegistryAuth::Basic(ref username, _) if username == "a"));
        // Docker Hub aliases.
        let json = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}}}}}}"#,
            b64("a:b")
        );
        let auth = auth_from_docker_config(json.as_bytes(), "docker.io").unwrap();
        assert!(matches!(auth, RegistryAuth::Basic(..)));
    }

    #[test]
    fn docker_config_username_password_and_tokens() {
        let json = br#"{"auths":{"r":{"username":"u","password":"p"}}}"#;
        assert_eq!(
            auth_from_docker_config(json, "r").unwrap(),
            RegistryAuth::Basic("u".into(), "p".into())
        );
        let json = br#"{"auths":{"r":{"identitytoken":"tok"}}}"#;
        assert_eq!(
            auth_from_docker_config(json, "r").unwrap(),
            RegistryAuth::Bearer("tok".into())
        );
    }

    /// Credential helpers are run: a missing one is a clear error, never anonymous.
    #[test]
    fn docker_config_credential_helpers_are_used() {
        let json = br#"{"credHelpers":{"r":"cocoon-test-missing"}}"#;
        let err = auth_from_docker_config(json, "r").unwrap_err();
        assert!(err.to_string().contains("credential helper"), "{err}");
        let json = br#"{"auths":{"other":{}},"credsStore":"cocoon-test-missing"}"#;
        assert!(auth_from_docker_config(json, "r").is_err());
    }

    #[test]
    fn docker_config_missing_host_is_anonymous() {
        let json = br#"{"auths":{"other":{"username":"u","password":"p"}}}"#;
        assert_eq!(
            auth_from_docker_config(json, "r").unwrap(),
            RegistryAuth::Anonymous
        );
        assert_eq!(
            auth_from_docker_config(b"{}", "r").unwrap(),
            RegistryAuth::Anonymous
        );
    }

    #[test]
    fn docker_config_errors_are_clear_and_do_not_leak() {
        let err = auth_from_docker_config(b"not json", "r").unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        let json = br#"{"auths":{"r":{"auth":"!!!secret!!!"}}}"#;
        let err = auth_from_docker_config(json, "r").unwrap_err();
        assert!(err.to_string().contains("decode"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let json = format!(r#"{{"auths":{{"r":{{"auth":"{}"}}}}}}"#, b64("nocolon"));
        let err = auth_from_docker_config(json.as_bytes(), "r").unwrap_err();
        assert!(!err.to_string().contains("nocolon"), "{err}");
    }

    #[test]
    fn debug_redacts_secrets() {
        let basic = RegistryAuth::Basic("alice".into(), "hunter2".into());
        let bearer = RegistryAuth::Bearer("tok-abc".into());
        let config = RegistryConfig {
            base: "reg:5000/p".into(),
            plain_http: false,
            auth: basic.clone(),
            extra_ca_pems: vec![b"-----BEGIN CERTIFICATE-----".to_vec()],
            timeout: Duration::from_secs(5),
        };
        let printed = format!("{basic:?} {bearer:?} {config:?} {config:#?}");
        assert!(printed.contains("alice"));
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(!printed.contains("tok-abc"), "{printed}");
        assert!(!printed.contains("BEGIN"), "{printed}");
        assert!(printed.contains("<redacted>"));
    }
}
