//! A real CNCF Distribution registry (Debian's `docker-registry`) for tests.
//!
//! It listens on 127.0.0.1 only, keeps its storage in a tempdir, can stop and start again
//! on the same port and storage (an outage), and can restart with deletes turned off or on
//! (a registry that refuses deletes, then recovers). A missing binary panics with the
//! install command: tests never skip silently.

use cocoon_hibernation::registry::{RegistryAuth, RegistryConfig};
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
use oci_client::secrets::RegistryAuth as OciAuth;
use oci_client::{Client, Reference};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
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

/// The crypto provider reqwest and rustls need in this process (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn registry_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("DOCKER_REGISTRY_BIN") {
        return PathBuf::from(path);
    }
    find_in_path("docker-registry").unwrap_or_else(|| {
        panic!(
            "the `docker-registry` binary (CNCF Distribution) is missing; the registry tests need \
             it: run `apt-get install docker-registry apache2-utils`"
        )
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// bcrypt htpasswd line from apache2-utils' `htpasswd -Bbn` (Distribution only takes bcrypt).
fn write_htpasswd(path: &Path, user: &str, password: &str) {
    let binary = find_in_path("htpasswd").unwrap_or_else(|| {
        panic!(
            "`htpasswd` is missing; the registry tests need it: run `apt-get install apache2-utils`"
        )
    });
    let output = Command::new(binary)
        .args(["-Bbn", user, password])
        .output()
        .expect("run htpasswd");
    assert!(
        output.status.success(),
        "htpasswd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(path, output.stdout).expect("write htpasswd");
}

/// Writes server.pem/server.key for 127.0.0.1 and localhost, signed by a fresh CA;
/// returns the CA's PEM.
fn write_tls_files(dir: &Path) -> String {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "registry test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let mut server_params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server params");
    server_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let server_cert = server_params
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    std::fs::write(dir.join("server.pem"), server_cert.pem()).expect("write server.pem");
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).expect("write server.key");
    ca_cert.pem()
}

fn tls_stream(
    tcp: TcpStream,
    ca_pem: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName};
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).ok()?)
        .ok()?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").ok()?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    Some(rustls::StreamOwned::new(connection, tcp))
}

/// Reads until the peer closes or errors; true when something came back.
fn read_some(stream: &mut impl Read, out: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return !out.is_empty(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return !out.is_empty(),
        }
    }
}

use crate::ports::free_port;

const ISSUER: &str = "registry-test-issuer";
const SERVICE: &str = "registry-test";

/// Signs ES256 JWTs the way Distribution's token auth verifies them: an `x5c` header
/// whose certificate chains to `rootcertbundle`.
struct TokenSigner {
    key: rcgen::KeyPair,
    x5c: String,
}

impl TokenSigner {
    /// A token granting every action of `scope` ("repository:<name>:<a,b>"), or none.
    fn token(&self, scope: &str) -> String {
        use base64::Engine as _;
        use rcgen::SigningKey as _;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let access: Vec<serde_json::Value> = scope
            .split(' ')
            .filter_map(|s| {
                let (kind, rest) = s.split_once(':')?;
                let (name, actions) = rest.rsplit_once(':')?;
                Some(serde_json::json!({
                    "type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()
                }))
            })
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let header = serde_json::json!({ "typ": "JWT", "alg": "ES256", "x5c": [self.x5c] });
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": "test", "aud": SERVICE,
            "exp": now + 300, "nbf": now - 60, "iat": now,
            "jti": format!("{now}-{}", access.len()), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            url.encode(header.to_string()),
            url.encode(claims.to_string())
        );
        let der = self.key.sign(signing_input.as_bytes()).expect("sign token");
        format!("{signing_input}.{}", url.encode(ecdsa_der_to_raw(&der)))
    }
}

/// JWS wants r||s (32 bytes each); ring signs ASN.1 `SEQUENCE { INTEGER r, INTEGER s }`.
fn ecdsa_der_to_raw(der: &[u8]) -> Vec<u8> {
    fn integer(der: &[u8], at: &mut usize) -> Vec<u8> {
        assert_eq!(der[*at], 0x02, "ASN.1 INTEGER expected");
        let len = der[*at + 1] as usize;
        let value = &der[*at + 2..*at + 2 + len];
        *at += 2 + len;
        let value: Vec<u8> = value.iter().copied().skip_while(|b| *b == 0).collect();
        let mut out = vec![0u8; 32 - value.len()];
        out.extend(value);
        out
    }
    assert_eq!(der[0], 0x30, "ASN.1 SEQUENCE expected");
    let mut at = 2;
    let mut raw = integer(der, &mut at);
    raw.extend(integer(der, &mut at));
    raw
}

/// A minimal Docker token server on a loopback thread: `GET /token?scope=..` with the
/// right basic credentials gets a JWT for that scope, anything else a 401.
struct TokenServer {
    port: u16,
    signer: Arc<TokenSigner>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    fn start(dir: &Path, credentials: (String, String)) -> Self {
        use base64::Engine as _;
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().expect("token key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("token params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "registry test token signer");
        let cert = params.self_signed(&key).expect("token certificate");
        std::fs::write(dir.join("token-ca.pem"), cert.pem()).expect("write token-ca.pem");
        let signer = Arc::new(TokenSigner {
            x5c: base64::engine::general_purpose::STANDARD.encode(cert.der()),
            key,
        });

        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind token server");
        let port = listener.local_addr().expect("token server address").port();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", credentials.0, credentials.1))
        );
        let thread = {
            let (signer, stop) = (signer.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = serve_token(stream, &signer, &expected);
                    }
                }
            })
        };
        Self {
            port,
            signer,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_token(
    mut stream: TcpStream,
    signer: &TokenSigner,
    expected_auth: &str,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 2048];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    let request = String::from_utf8_lossy(&request);
    let target = request.split(' ').nth(1).unwrap_or("/");
    let url = reqwest::Url::parse(&format!("http://token{target}")).expect("request target");
    let authorized = request.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("authorization") && value.trim() == expected_auth
        })
    });
    let (status, body) = if url.path() != "/token" {
        ("404 Not Found", "{}".to_string())
    } else if !authorized {
        (
            "401 Unauthorized",
            r#"{"details":"bad credentials"}"#.to_string(),
        )
    } else {
        let scopes: Vec<String> = url
            .query_pairs()
            .filter(|(k, _)| k == "scope")
            .map(|(_, v)| v.into_owned())
            .collect();
        let token = signer.token(&scopes.join(" "));
        (
            "200 OK",
            serde_json::json!({ "token": token, "access_token": token, "expires_in": 300 })
                .to_string(),
        )
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
