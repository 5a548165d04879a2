//! The registry's flags (`--registry-*`, `COCOON_REGISTRY_*`), shared by the server and
//! the plugin, and the client config they name.

use super::{RegistryAuth, RegistryConfig, RegistryError, auth_from_docker_config};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Clone, Debug)]
pub struct RegistryArgs {
    /// Registry and path prefix holding snapshots: host[:port][/prefix]. Repository = <base>/<vm>.
    #[arg(long, env = "COCOON_REGISTRY_BASE")]
    pub registry_base: Option<String>,
    /// Talk plain HTTP to the registry. Only for local development.
    #[arg(long, env = "COCOON_REGISTRY_PLAIN_HTTP", default_value_t = false)]
    pub registry_plain_http: bool,
    /// Docker config.json holding credentials for the registry host.
    #[arg(long, env = "COCOON_REGISTRY_DOCKER_CONFIG")]
    pub registry_docker_config: Option<PathBuf>,
    /// Basic-auth user; the password comes from the environment variable
    /// COCOON_REGISTRY_PASSWORD only (a flag would show it in `ps` and the pod spec).
    #[arg(long, env = "COCOON_REGISTRY_USERNAME")]
    pub registry_username: Option<String>,
    /// File holding a bearer token.
    #[arg(long, env = "COCOON_REGISTRY_TOKEN_FILE")]
    pub registry_token_file: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted for the registry; repeatable.
    #[arg(long, env = "COCOON_REGISTRY_CA_FILE", value_delimiter = ',')]
    pub registry_ca_file: Vec<PathBuf>,
    /// Budget of one whole registry operation: a probe, a delete, or the orphan audit's catalog.
    #[arg(long, env = "COCOON_REGISTRY_TIMEOUT", value_parser = cocoon_api::flags::parse_duration, default_value = "10s")]
    pub registry_timeout: Duration,
}

/// P3: the basic-auth password's only source. No flag carries a secret: a flag's value
/// shows in `ps`, in the pod spec and in shell history.
pub const PASSWORD_ENV: &str = "COCOON_REGISTRY_PASSWORD";

impl RegistryArgs {
    /// The client config these flags name; reads the credential files and the password
    /// variable (P3). An error names the flag whose file could not be read.
    pub fn config(&self) -> Result<RegistryConfig, RegistryError> {
        self.config_with_password(std::env::var(PASSWORD_ENV).ok())
    }

    /// `config()` with the password given, so tests need not change the environment.
    pub fn config_with_password(
        &self,
        password: Option<String>,
    ) -> Result<RegistryConfig, RegistryError> {
        let args = self;
        if password.is_some() && args.registry_username.is_none() {
            return Err(RegistryError::InvalidConfig(format!(
                "{PASSWORD_ENV} is set but --registry-username is not"
            )));
        }
        let base = args
            .registry_base
            .clone()
            .unwrap_or_default()
            .trim()
            .trim_end_matches('/')
            .to_owned();
        let host = base.split('/').next().unwrap_or_default().to_owned();
        let auth = if let Some(user) = &args.registry_username {
            RegistryAuth::Basic(user.clone(), password.unwrap_or_default())
        } else if let Some(path) = &args.registry_docker_config {
            let raw = read("--registry-docker-config", path)?;
            auth_from_docker_config(&raw, &host)?
        } else if let Some(path) = &args.registry_token_file {
            let raw = read("--registry-token-file", path)?;
            let token = String::from_utf8(raw).map_err(|_| {
                RegistryError::InvalidConfig(format!(
                    "reading --registry-token-file {}: not UTF-8 text",
                    path.display()
                ))
            })?;
            RegistryAuth::Bearer(token.trim().to_owned())
        } else {
            RegistryAuth::Anonymous
        };
        let extra_ca_pems = args
            .registry_ca_file
            .iter()
            .map(|path| read("--registry-ca-file", path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RegistryConfig {
            base,
            plain_http: args.registry_plain_http,
            auth,
            extra_ca_pems,
            timeout: args.registry_timeout,
        })
    }
}

/// A credential file, or an error naming the flag that named it (P3).
fn read(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, RegistryError> {
    std::fs::read(path).map_err(|e| {
        RegistryError::InvalidConfig(format!("reading {flag} {}: {e}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        registry: RegistryArgs,
    }

    fn args(extra: &[&str]) -> RegistryArgs {
        let mut all = vec!["x", "--registry-base", "reg.example:5000/snapshots/"];
        all.extend_from_slice(extra);
        Flags::try_parse_from(all).unwrap().registry
    }

    /// SPEC P3: credentials come from the docker config for the base's host.
    #[test]
    fn p3_docker_config_file_gives_the_registry_host_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "alice:pw" in base64
        std::fs::write(
            &path,
            r#"{"auths":{"reg.example:5000":{"auth":"YWxpY2U6cHc="}}}"#,
        )
        .unwrap();
        let cfg = args(&["--registry-docker-config", path.to_str().unwrap()])
            .config()
            .unwrap();
        assert_eq!(cfg.base, "reg.example:5000/snapshots");
        assert!(matches!(cfg.auth, RegistryAuth::Basic(ref username, _) if username == "alice"));
    }

    /// SPEC P3: the password comes from COCOON_REGISTRY_PASSWORD, never a flag; set
    /// without a user it is an error, not silently unused.
    #[test]
    fn p3_password_comes_only_from_the_environment() {
        let mut all = vec!["x", "--registry-base", "r:5000"];
        all.extend(["--registry-username", "u", "--registry-password", "pw"]);
        let e = Flags::try_parse_from(all).err().unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        let pw = Some("s3cr3t-pw".to_owned());
        let cfg = args(&["--registry-username", "u"])
            .config_with_password(pw.clone())
            .unwrap();
        assert!(
            matches!(cfg.auth, RegistryAuth::Basic(ref u, ref p) if u == "u" && p == "s3cr3t-pw")
        );
        let err = args(&[]).config_with_password(pw).unwrap_err();
        assert!(err.to_string().contains(PASSWORD_ENV), "{err}");
        let printed = format!("{:?}", args(&["--registry-username", "u"]));
        assert!(!printed.contains("s3cr3t-pw"), "{printed}");
    }

    /// SPEC P3: an unreadable file is a clear error naming the flag, not a panic.
    #[test]
    fn p3_unreadable_credential_files_name_their_flag() {
        for flag in [
            "--registry-docker-config",
            "--registry-token-file",
            "--registry-ca-file",
        ] {
            let err = args(&[flag, "/nonexistent/file"]).config().unwrap_err();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }
}
