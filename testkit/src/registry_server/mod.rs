//! A real CNCF Distribution registry (Debian's `docker-registry`) for tests.
//!
//! It listens on 127.0.0.1 only, keeps its storage in a tempdir, can stop and start again
//! on the same port and storage (an outage), and can restart with deletes turned off or on
//! (a registry that refuses deletes, then recovers). A missing binary panics with the
//! install command: tests never skip silently.

mod files;
mod token;

pub use files::install_crypto_provider;
use files::{read_some, registry_binary, tls_stream, write_htpasswd, write_tls_files};
use token::{ISSUER, SERVICE, TokenServer};

use crate::ports::free_port;
use cocoon_hibernation::registry::{RegistryAuth, RegistryConfig};
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
use oci_client::secrets::RegistryAuth as OciAuth;
use oci_client::{Client, Reference};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// How the registry is set up. `Default`: deletes enabled, no auth, plain http.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// `storage.delete.enabled`.
    pub delete_enabled: bool,
    /// The user and password the registry accepts: htpasswd basic auth, or with
    /// `token_auth` the credentials the token server wants.
    pub basic_auth: Option<(String, String)>,
    /// Docker token auth: the registry answers `401 Bearer realm=…` and a test token
    /// server (checking `basic_auth`) hands out signed JWTs for any requested scope.
    pub token_auth: bool,
    /// Serve https with a certificate signed by a fresh test CA (see `ca_pem`).
    pub tls: bool,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            delete_enabled: true,
            basic_auth: None,
            token_auth: false,
            tls: false,
        }
    }
}

impl RegistryOptions {
    pub fn with_basic_auth(mut self, user: &str, password: &str) -> Self {
        self.basic_auth = Some((user.to_string(), password.to_string()));
        self
    }

    /// Token auth (Bearer challenge + token server) with these credentials.
    pub fn with_token_auth(mut self, user: &str, password: &str) -> Self {
        self.basic_auth = Some((user.to_string(), password.to_string()));
        self.token_auth = true;
        self
    }

    pub fn with_delete(mut self, enabled: bool) -> Self {
        self.delete_enabled = enabled;
        self
    }

    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }
}

/// A running (or stopped) `docker-registry serve`. Killed on drop.
pub struct RegistryServer {
    dir: tempfile::TempDir,
    port: u16,
    options: RegistryOptions,
    child: Option<Child>,
    ca_pem: Option<String>,
    token_server: Option<TokenServer>,
    // Built once per run of the process: a restart leaves dead pooled connections behind.
    oci: OnceLock<Client>,
    http: OnceLock<reqwest::Client>,
}

impl RegistryServer {
    /// Starts a registry with default options.
    pub fn launch_default() -> Self {
        Self::launch(RegistryOptions::default())
    }

    /// Starts a registry on a free loopback port and waits until `GET /v2/` answers.
    pub fn launch(options: RegistryOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("registry-test-")
            .tempdir()
            .expect("create registry tempdir");
        std::fs::create_dir_all(dir.path().join("storage")).expect("create storage dir");
        let token_server = match (&options.basic_auth, options.token_auth) {
            (Some(creds), true) => Some(TokenServer::start(dir.path(), creds.clone())),
            (None, true) => panic!("token auth needs credentials: use with_token_auth"),
            (Some((user, password)), false) => {
                write_htpasswd(&dir.path().join("htpasswd"), user, password);
                None
            }
            (None, false) => None,
        };
        let ca_pem = options.tls.then(|| write_tls_files(dir.path()));
        let mut server = Self {
            dir,
            port: 0,
            options,
            child: None,
            ca_pem,
            token_server,
            oci: OnceLock::new(),
            http: OnceLock::new(),
        };
        // The free port is found by binding and releasing it; another process could grab it
        // in between, so a failed first start retries on a new port.
        let mut last_failure = String::new();
        for _ in 0..3 {
            server.port = free_port();
            match server.try_start() {
                Ok(()) => return server,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("docker-registry did not start: {last_failure}");
    }

    /// Starts again on the same port and storage (after `stop`).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "registry already running");
        if let Err(failure) = self.try_start() {
            panic!(
                "docker-registry did not restart on port {}: {failure}",
                self.port
            );
        }
    }

    /// Kills the registry; the port then refuses connections until `start`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.oci = OnceLock::new();
        self.http = OnceLock::new();
    }

    pub fn restart(&mut self) {
        self.stop();
        self.start();
    }

    /// Restarts with `storage.delete.enabled` set to `enabled`, same port and storage.
    pub fn restart_with_delete(&mut self, enabled: bool) {
        self.stop();
        self.options.delete_enabled = enabled;
        self.start();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// "127.0.0.1:<port>": the registry part of a reference and of `RegistryConfig::base`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn scheme(&self) -> &'static str {
        if self.options.tls { "https" } else { "http" }
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    pub fn credentials(&self) -> Option<(String, String)> {
        self.options.basic_auth.clone()
    }

    /// PEM of the CA that signed the https certificate (TLS registries only).
    pub fn ca_pem(&self) -> Option<Vec<u8>> {
        self.ca_pem.as_ref().map(|p| p.as_bytes().to_vec())
    }

    /// The registry's own log (stdout and stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// A client config for this registry: its credentials, its CA, a 5 s timeout.
    pub fn registry_config(&self) -> RegistryConfig {
        RegistryConfig {
            base: self.host(),
            plain_http: !self.options.tls,
            auth: match &self.options.basic_auth {
                Some((username, password)) => {
                    RegistryAuth::Basic(username.clone(), password.clone())
                }
                None => RegistryAuth::Anonymous,
            },
            extra_ca_pems: self.ca_pem().into_iter().collect(),
            timeout: Duration::from_secs(5),
        }
    }

    /// A docker config.json holding this registry's credentials, as `docker login` writes it.
    pub fn docker_config_json(&self) -> Vec<u8> {
        use base64::Engine as _;
        let auths = match &self.options.basic_auth {
            Some((user, password)) => {
                let auth =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                let mut auths = serde_json::Map::new();
                auths.insert(self.host(), serde_json::json!({ "auth": auth }));
                serde_json::Value::Object(auths)
            }
            None => serde_json::json!({}),
        };
        serde_json::to_vec(&serde_json::json!({ "auths": auths })).expect("serialize config")
    }

    /// Pushes a tiny OCI image (one layer naming `repo:tag`, so digests differ between tags)
    /// to `repo:tag`; returns its manifest digest.
    pub async fn push_artifact(&self, repo: &str, tag: &str) -> String {
        self.push_artifact_with(repo, tag, "").await
    }

    /// Like [`Self::push_artifact`], with `note` in the layer: a different `note` gives a
    /// different digest for the same `repo:tag` (a fresh push of a new snapshot).
    pub async fn push_artifact_with(&self, repo: &str, tag: &str, note: &str) -> String {
        let client = self.oci_client();
        let layer =
            ImageLayer::oci_v1(format!("snapshot of {repo}:{tag}{note}").into_bytes(), None);
        let config = Config::oci_v1(b"{}".to_vec(), None);
        client
            .push(
                &self.reference(repo, tag),
                &[layer],
                config,
                &self.oci_auth(),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("push {repo}:{tag}: {e}\nregistry log:\n{}", self.log()));
        self.digest_of(repo, tag)
            .await
            .unwrap_or_else(|| panic!("{repo}:{tag} not found right after its push"))
    }

    /// Points `new_tag` at the manifest `existing_tag` points at; returns the shared digest.
    pub async fn add_tag(&self, repo: &str, existing_tag: &str, new_tag: &str) -> String {
        let client = self.oci_client();
        let (manifest, _) = client
            .pull_manifest_raw(
                &self.reference(repo, existing_tag),
                &self.oci_auth(),
                &[OCI_IMAGE_MEDIA_TYPE],
            )
            .await
            .unwrap_or_else(|e| panic!("pull {repo}:{existing_tag}: {e}"));
        client
            .push_manifest_raw(
                &self.reference(repo, new_tag),
                manifest,
                http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
            )
            .await
            .unwrap_or_else(|e| panic!("tag {repo}:{new_tag}: {e}"));
        self.digest_of(repo, new_tag)
            .await
            .unwrap_or_else(|| panic!("{repo}:{new_tag} not found right after tagging"))
    }

    /// The manifest digest of `repo:tag` by a plain HEAD, independent of the client under
    /// test; None on 404. Panics on any other answer.
    pub async fn digest_of(&self, repo: &str, tag: &str) -> Option<String> {
        let url = format!(
            "{}://{}/v2/{repo}/manifests/{tag}",
            self.scheme(),
            self.host()
        );
        let mut request = self
            .http_client()
            .head(&url)
            .header("Accept", MANIFEST_ACCEPT);
        if let Some(tokens) = &self.token_server {
            request = request.bearer_auth(tokens.signer.token(&format!("repository:{repo}:pull")));
        } else if let Some((user, password)) = &self.options.basic_auth {
            request = request.basic_auth(user, Some(password));
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("HEAD {url}: {e}"));
        match response.status().as_u16() {
            200 => Some(
                response
                    .headers()
                    .get("Docker-Content-Digest")
                    .expect("Docker-Content-Digest header")
                    .to_str()
                    .expect("ASCII digest")
                    .to_string(),
            ),
            404 => None,
            other => panic!("HEAD {url}: unexpected status {other}"),
        }
    }

    fn reference(&self, repo: &str, tag: &str) -> Reference {
        Reference::with_tag(self.host(), repo.to_string(), tag.to_string())
    }

    fn oci_auth(&self) -> OciAuth {
        match &self.options.basic_auth {
            Some((user, password)) => OciAuth::Basic(user.clone(), password.clone()),
            None => OciAuth::Anonymous,
        }
    }

    fn oci_client(&self) -> &Client {
        self.oci.get_or_init(|| self.build_oci_client())
    }

    fn build_oci_client(&self) -> Client {
        install_crypto_provider();
        let config = ClientConfig {
            protocol: if self.options.tls {
                ClientProtocol::Https
            } else {
                ClientProtocol::Http
            },
            extra_root_certificates: self
                .ca_pem()
                .into_iter()
                .map(|data| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data,
                })
                .collect(),
            ..ClientConfig::default()
        };
        Client::try_from(config).expect("build oci client")
    }

    fn http_client(&self) -> &reqwest::Client {
        self.http.get_or_init(|| self.build_http_client())
    }

    fn build_http_client(&self) -> reqwest::Client {
        install_crypto_provider();
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(10));
        if let Some(pem) = self.ca_pem() {
            builder = builder
                .tls_certs_merge([reqwest::Certificate::from_pem(&pem).expect("test CA PEM")]);
        }
        builder.build().expect("build http client")
    }

    fn try_start(&mut self) -> Result<(), String> {
        let config_path = self.dir.path().join("config.yml");
        std::fs::write(&config_path, self.config_yaml()).map_err(|e| e.to_string())?;
        let log_path = self.dir.path().join("registry.log");
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(registry_binary());
        command
            .arg("serve")
            .arg(&config_path)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // REGISTRY_* variables override the config file; keep the test's own settings.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("REGISTRY_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", registry_binary().display()))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status}; log:\n{}", self.log()));
            }
            if self.answers_v2() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "GET /v2/ did not answer within {READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True once `GET /v2/` gets an HTTP answer (200, or 401 with auth on).
    fn answers_v2(&self) -> bool {
        let Ok(tcp) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)) else {
            return false;
        };
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.host()
        );
        let mut answer = Vec::new();
        let ok = match &self.ca_pem {
            None => {
                let mut tcp = tcp;
                tcp.write_all(request.as_bytes()).is_ok() && tcp.read_to_end(&mut answer).is_ok()
            }
            Some(ca) => {
                let Some(mut tls) = tls_stream(tcp, ca) else {
                    return false;
                };
                tls.write_all(request.as_bytes()).is_ok() && read_some(&mut tls, &mut answer)
            }
        };
        ok && answer.starts_with(b"HTTP/1.1 ")
    }

    fn config_yaml(&self) -> String {
        let dir = self.dir.path();
        let mut yaml = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: {delete}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: registry-test-secret\n",
            storage = dir.join("storage").display(),
            delete = self.options.delete_enabled,
            port = self.port,
        );
        if self.options.tls {
            yaml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("server.pem").display(),
                dir.join("server.key").display()
            ));
        }
        if let Some(tokens) = &self.token_server {
            yaml.push_str(&format!(
                "auth:\n  token:\n    realm: http://127.0.0.1:{}/token\n    service: {SERVICE}\n    \
                 issuer: {ISSUER}\n    rootcertbundle: {}\n",
                tokens.port,
                dir.join("token-ca.pem").display()
            ));
        } else if self.options.basic_auth.is_some() {
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: registry-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
        }
        yaml
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        self.stop();
    }
}
