//! Registry configuration and credentials. Debug output never shows a secret.

use super::error::RegistryError;
use base64::Engine as _;
use std::fmt;
use std::time::Duration;

pub struct RegistryConfig {
    /// "host[:port][/path/prefix]"; the snapshot repository is "<base>/<vm>", tag "hibernate".
    pub base: String,
    /// Plain http only when asked explicitly; https otherwise.
    pub plain_http: bool,
    pub auth: RegistryAuth,
    /// Extra PEM CA certificates trusted for https.
    pub extra_ca_pems: Vec<Vec<u8>>,
    /// Budget of one whole operation (C2): a probe, or a delete with its digest fallback
    /// (every request, token and tag page included). Per-request timeouts are the same.
    pub timeout: Duration,
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("base", &self.base)
            .field("plain_http", &self.plain_http)
            .field("auth", &self.auth)
            .field("extra_ca_pems", &self.extra_ca_pems.len())
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    Anonymous,
    Basic { username: String, password: String },
    Bearer { token: String },
}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryAuth::Anonymous => f.write_str("Anonymous"),
            RegistryAuth::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            RegistryAuth::Bearer { .. } => f
                .debug_struct("Bearer")
                .field("token", &"<redacted>")
                .finish(),
        }
    }
}

impl RegistryAuth {
    /// Credentials for `registry_host` from a docker config.json (`auths.<host>.auth` base64 "user:pass",
    /// or username/password fields, or `identitytoken`/`registrytoken` as bearer). Missing host = Anonymous.
    ///
    /// `registry_host` may be a bare host[:port] or a whole base ("host:port/prefix"); keys of
    /// `auths` may carry a scheme and a path ("https://host/v1/"), as `docker login` writes them.
    pub fn from_docker_config(
        json: &[u8],
        registry_host: &str,
    ) -> Result<RegistryAuth, RegistryError> {
        let doc: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| RegistryError::DockerConfig(format!("not valid JSON: {e}")))?;
        let wanted = normalize_host(registry_host);
        if wanted.is_empty() {
            return Err(RegistryError::DockerConfig("empty registry host".into()));
        }
        let Some(auths) = doc.get("auths") else {
            return Ok(RegistryAuth::Anonymous);
        };
        let auths = auths
            .as_object()
            .ok_or_else(|| RegistryError::DockerConfig("`auths` is not an object".into()))?;
        // An exact key wins over a normalized match ("https://host/v1/").
        let entry = auths.get(registry_host).or_else(|| {
            auths
                .iter()
                .find(|(key, _)| same_registry(&normalize_host(key), &wanted))
                .map(|(_, v)| v)
        });
        match entry {
            None => Ok(RegistryAuth::Anonymous),
            Some(entry) => auth_from_entry(entry, &wanted),
        }
    }

    /// The same credentials in oci-client's form.
    pub(crate) fn to_oci(&self) -> oci_client::secrets::RegistryAuth {
        match self {
            RegistryAuth::Anonymous => oci_client::secrets::RegistryAuth::Anonymous,
            RegistryAuth::Basic { username, password } => {
                oci_client::secrets::RegistryAuth::Basic(username.clone(), password.clone())
            }
            RegistryAuth::Bearer { token } => {
                oci_client::secrets::RegistryAuth::Bearer(token.clone())
            }
        }
    }
}

fn auth_from_entry(entry: &serde_json::Value, host: &str) -> Result<RegistryAuth, RegistryError> {
    let entry = entry
        .as_object()
        .ok_or_else(|| RegistryError::DockerConfig(format!("entry for {host} is not an object")))?;
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.trim().is_empty())
    };

    if let Some(encoded) = field("auth") {
        return decode_basic(encoded.trim(), host);
    }
    if let (Some(username), Some(password)) = (field("username"), field("password")) {
        return Ok(RegistryAuth::Basic {
            username: username.to_string(),
            password: password.to_string(),
        });
    }
    if let Some(token) = field("registrytoken").or_else(|| field("identitytoken")) {
        return Ok(RegistryAuth::Bearer {
            token: token.to_string(),
        });
    }
    // `docker login` with a credential store leaves an empty entry; failing loudly beats
    // silently going anonymous against a registry that needs credentials.
    Err(RegistryError::DockerConfig(format!(
        "entry for {host} has no usable credentials (auth, username/password, identitytoken, \
         registrytoken); credential helpers are not supported"
    )))
}

fn decode_basic(encoded: &str, host: &str) -> Result<RegistryAuth, RegistryError> {
    let engine_std = base64::engine::general_purpose::STANDARD;
    let engine_nopad = base64::engine::general_purpose::STANDARD_NO_PAD;
    let bytes = engine_std
        .decode(encoded)
        .or_else(|_| engine_nopad.decode(encoded))
        // The decode error would not leak the secret, but it adds nothing useful either.
        .map_err(|_| {
            RegistryError::DockerConfig(format!("`auth` for {host} is not valid base64"))
        })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| RegistryError::DockerConfig(format!("`auth` for {host} is not UTF-8")))?;
    match text.split_once(':') {
        Some((username, password)) if !username.is_empty() => Ok(RegistryAuth::Basic {
            username: username.to_string(),
            password: password.to_string(),
        }),
        _ => Err(RegistryError::DockerConfig(format!(
            "`auth` for {host} is not of the form base64(\"user:password\")"
        ))),
    }
}

/// "https://Host:5000/v1/" → "host:5000".
fn normalize_host(raw: &str) -> String {
    let raw = raw.trim();
    let without_scheme = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    let host = without_scheme.split('/').next().unwrap_or_default();
    host.to_ascii_lowercase()
}

fn same_registry(a: &str, b: &str) -> bool {
    // Docker Hub is stored under its legacy index name.
    let canonical = |h: &str| match h {
        "docker.io" | "registry-1.docker.io" | "index.docker.io" => "docker.io".to_string(),
        other => other.to_string(),
    };
    canonical(a) == canonical(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn docker_config_auth_field_gives_basic() {
        let json = format!(
            r#"{{"auths":{{"reg.example:5000":{{"auth":"{}"}}}}}}"#,
            b64("alice:s3:cret")
        );
        let auth = RegistryAuth::from_docker_config(json.as_bytes(), "reg.example:5000").unwrap();
        assert_eq!(
            auth,
            RegistryAuth::Basic {
                username: "alice".into(),
                password: "s3:cret".into()
            }
        );
    }

    #[test]
    fn docker_config_matches_scheme_and_path_keys_and_base_with_prefix() {
        let json = format!(
            r#"{{"auths":{{"https://Reg.Example:5000/v1/":{{"auth":"{}"}}}}}}"#,
            b64("a:b")
        );
        let auth =
            RegistryAuth::from_docker_config(json.as_bytes(), "reg.example:5000/snapshots/team")
                .unwrap();
        assert!(matches!(auth, RegistryAuth::Basic { ref username, .. } if username == "a"));
        // Docker Hub aliases.
        let json = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}}}}}}"#,
            b64("a:b")
        );
        let auth = RegistryAuth::from_docker_config(json.as_bytes(), "docker.io").unwrap();
        assert!(matches!(auth, RegistryAuth::Basic { .. }));
    }

    #[test]
    fn docker_config_username_password_and_tokens() {
        let json = br#"{"auths":{"r":{"username":"u","password":"p"}}}"#;
        assert_eq!(
            RegistryAuth::from_docker_config(json, "r").unwrap(),
            RegistryAuth::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
        let json = br#"{"auths":{"r":{"identitytoken":"tok"}}}"#;
        assert_eq!(
            RegistryAuth::from_docker_config(json, "r").unwrap(),
            RegistryAuth::Bearer {
                token: "tok".into()
            }
        );
        let json = br#"{"auths":{"r":{"registrytoken":"rt","identitytoken":"it"}}}"#;
        assert_eq!(
            RegistryAuth::from_docker_config(json, "r").unwrap(),
            RegistryAuth::Bearer { token: "rt".into() }
        );
    }

    #[test]
    fn docker_config_missing_host_is_anonymous() {
        let json = br#"{"auths":{"other":{"username":"u","password":"p"}}}"#;
        assert_eq!(
            RegistryAuth::from_docker_config(json, "r").unwrap(),
            RegistryAuth::Anonymous
        );
        assert_eq!(
            RegistryAuth::from_docker_config(b"{}", "r").unwrap(),
            RegistryAuth::Anonymous
        );
    }

    #[test]
    fn docker_config_errors_are_clear_and_do_not_leak() {
        let err = RegistryAuth::from_docker_config(b"not json", "r").unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        let json = br#"{"auths":{"r":{"auth":"!!!secret!!!"}}}"#;
        let err = RegistryAuth::from_docker_config(json, "r").unwrap_err();
        assert!(err.to_string().contains("base64"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let json = format!(r#"{{"auths":{{"r":{{"auth":"{}"}}}}}}"#, b64("nocolon"));
        let err = RegistryAuth::from_docker_config(json.as_bytes(), "r").unwrap_err();
        assert!(!err.to_string().contains("nocolon"), "{err}");
        let json = br#"{"auths":{"r":{}},"credsStore":"desktop"}"#;
        let err = RegistryAuth::from_docker_config(json, "r").unwrap_err();
        assert!(err.to_string().contains("credential helpers"), "{err}");
    }

    #[test]
    fn debug_redacts_secrets() {
        let basic = RegistryAuth::Basic {
            username: "alice".into(),
            password: "hunter2".into(),
        };
        let bearer = RegistryAuth::Bearer {
            token: "tok-abc".into(),
        };
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
