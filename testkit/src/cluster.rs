//! Test support: the local control plane started by `cargo xtask cluster-up`.
//!
//! The first call to
//! [`cluster()`] in a test process either reads the env file named by
//! `COCOON_CLUSTER_ENV` or starts the control plane in-process with
//! [`xtask::cluster::up`] (which takes a file lock, so test binaries starting at once
//! share one cluster) and reads `$STATE_DIR/env`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

/// Subject CN of the CA that cluster-up generates. [`Cluster::serving_cert`] rebuilds the
/// issuer name from it, so both must agree byte for byte.
const CA_COMMON_NAME: &str = xtask::cluster::CA_COMMON_NAME;

/// Everything a test needs to reach the local control plane.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub apiserver_url: String,
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    /// `host:port` of the plain-http OCI registry.
    pub registry: String,
    pub audit_log: PathBuf,
    /// The apiserver's `gitVersion`, e.g. `v1.34.4`.
    pub k8s_version: String,
    /// Holds `kubectl`, `kube-apiserver` and `etcd`.
    pub bin_dir: PathBuf,
    /// The control plane's state directory (kubeconfig, PKI, logs); shared by every test
    /// process and worktree using this cluster.
    pub state_dir: PathBuf,
}

/// A point in the audit log: events written after it are counted by
/// [`Cluster::count_audit_writes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditMark(u64);

/// The shared cluster, started on first use. Panics (never skips) when it cannot start.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let env_file = match std::env::var_os("COCOON_CLUSTER_ENV") {
            Some(path) => PathBuf::from(path),
            None => run_cluster_up(),
        };
        Cluster::from_env_file(&env_file)
    })
}

/// Starts (or reuses) the control plane and says, past libtest's output capture, that it
/// stays up after the tests and how to stop it: nothing else would tell the user.
fn run_cluster_up() -> PathBuf {
    let up = xtask::cluster::up_report(&xtask::cluster::UpOptions::default()).unwrap_or_else(|e| {
        panic!(
            "cargo xtask cluster-up failed: {e}. It needs: Go >= 1.26 (first build of \
             kube-apiserver/etcd, or set KUBEBUILDER_ASSETS to a dir with kube-apiserver, etcd, \
             kubectl) and the Debian packages `bash hack/prereqs.sh demo` installs or names."
        )
    });
    let state_dir = up
        .env_file
        .parent()
        .unwrap_or(&up.env_file)
        .display()
        .to_string();
    let how = if up.started {
        "started a"
    } else {
        "reused the running"
    };
    let _ = writeln!(
        std::io::stderr(),
        "testkit: COCOON_CLUSTER_ENV is unset, so this test {how} local control plane in \
         {state_dir} (etcd, kube-apiserver, a registry; about 500 MB). It keeps running for \
         the next test run; stop it with: cargo xtask cluster-down {state_dir}"
    );
    up.env_file
}

/// Parses `KEY=value` lines; quotes around a value are stripped.
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            (k.trim().to_owned(), v.to_owned())
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A random u64 without a `rand` dependency: std's hasher keys are random per instance.
pub fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Cluster {
    pub fn from_env_file(path: &Path) -> Self {
        let env = parse_env(&read(path));
        let get = |key: &str| -> String {
            env.get(key)
                .cloned()
                .unwrap_or_else(|| panic!("{} has no {key}", path.display()))
        };
        Self {
            kubeconfig: get("KUBECONFIG").into(),
            apiserver_url: get("COCOON_APISERVER_URL"),
            ca_cert_pem: read(Path::new(&get("COCOON_CA_CERT"))),
            ca_key_pem: read(Path::new(&get("COCOON_CA_KEY"))),
            registry: get("COCOON_REGISTRY"),
            audit_log: get("COCOON_AUDIT_LOG").into(),
            k8s_version: get("COCOON_K8S_VERSION"),
            bin_dir: get("COCOON_BIN_DIR").into(),
            state_dir: env.get("COCOON_STATE_DIR").map_or_else(
                || {
                    let kubeconfig = PathBuf::from(get("KUBECONFIG"));
                    kubeconfig
                        .parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_default()
                },
                PathBuf::from,
            ),
        }
    }

    /// `http://127.0.0.1:<port>` of etcd (its v3 JSON gateway), from `run.state`.
    pub fn etcd_url(&self) -> String {
        let state = parse_env(&read(&self.state_dir.join("run.state")));
        let port = state
            .get("ETCD_PORT")
            .unwrap_or_else(|| panic!("{}/run.state has no ETCD_PORT", self.state_dir.display()));
        format!("http://127.0.0.1:{port}")
    }

    /// A client acting as the admin user (system:masters).
    pub async fn client(&self) -> kube::Client {
        // kube's rustls needs a process-wide provider; an error only means one is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig to client config");
        kube::Client::try_from(config).expect("kube client")
    }

    /// The cluster CA as an rcgen issuer.
    fn issuer(&self) -> rcgen::Issuer<'static, rcgen::KeyPair> {
        use rcgen::{
            CertificateParams, DistinguishedName, DnType, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).expect("parse CA key");
        // rcgen parses CA certs only with its x509-parser feature, so the issuer is rebuilt
        // from the known subject (UTF8String CN, as openssl's utf8only mask writes it).
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = DistinguishedName::new();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, CA_COMMON_NAME);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        Issuer::new(ca_params, ca_key)
    }

    /// A leaf serving certificate for `sans` (DNS names or IPs), signed by the cluster CA:
    /// put [`Cluster::ca_cert_pem`] in a webhook's `caBundle`. Returns (cert PEM, key PEM).
    pub fn serving_cert(&self, sans: &[&str]) -> (String, String) {
        use rcgen::{
            CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
            KeyUsagePurpose,
        };
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(sans).expect("valid SANs");
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "cocoon-hibernation-test-webhook");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("generate leaf key");
        let cert = params
            .signed_by(&key, &self.issuer())
            .expect("sign leaf cert");
        (cert.pem(), key.serialize_pem())
    }

    /// A client certificate signed by the cluster CA, which the apiserver also trusts for
    /// clients (`--client-ca-file`): it authenticates as user `user` (CN) in `groups` (O).
    /// At most two groups (rcgen keeps one value per attribute type; the second O is
    /// written under its OID). Returns (cert PEM, key PEM).
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> (String, String) {
        use rcgen::{
            CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
            KeyUsagePurpose,
        };
        assert!(
            groups.len() <= 2,
            "client_cert supports at most two groups, got {groups:?}"
        );
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        if let Some(g) = groups.first() {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        if let Some(g) = groups.get(1) {
            // id-at-organizationName (2.5.4.10) again, as a second O attribute.
            params
                .distinguished_name
                .push(DnType::CustomDnType(vec![2, 5, 4, 10]), *g);
        }
        params.distinguished_name.push(DnType::CommonName, user);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("generate client key");
        let cert = params
            .signed_by(&key, &self.issuer())
            .expect("sign client cert");
        (cert.pem(), key.serialize_pem())
    }

    /// A kubeconfig (YAML text) for this cluster that authenticates as `user` in `groups`
    /// with a fresh client certificate (see [`Cluster::client_cert`]).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> String {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let (cert, key) = self.client_cert(user, groups);
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "cocoon-local", "cluster": {
                "server": self.apiserver_url,
                "certificate-authority-data": b64(&self.ca_cert_pem),
            }}],
            "users": [{ "name": user, "user": {
                "client-certificate-data": b64(&cert),
                "client-key-data": b64(&key),
            }}],
            "contexts": [{ "name": "cocoon-local", "context": {
                "cluster": "cocoon-local", "user": user, "namespace": "default",
            }}],
            "current-context": "cocoon-local",
        });
        // JSON is YAML: any kubeconfig reader takes it.
        serde_json::to_string_pretty(&doc).expect("kubeconfig JSON")
    }

    /// A client that authenticates as `user` in `groups` (not admin): what it may do is
    /// what RBAC grants that identity.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig: Kubeconfig = serde_json::from_str(&self.kubeconfig_for(user, groups))
            .expect("parse generated kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig to client config");
        kube::Client::try_from(config).expect("kube client")
    }

    /// Creates a uniquely named namespace and returns its name. Tests never delete
    /// namespaces: without a controller-manager, deletion never finishes.
    pub async fn fresh_namespace(&self, client: &kube::Client, prefix: &str) -> String {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let prefix = prefix.trim_matches('-');
        let prefix = if prefix.is_empty() { "test" } else { prefix };
        let name = format!("{prefix}-{:012x}", random_u64() & 0xffff_ffff_ffff);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        name
    }

    /// Runs `kubectl` against this cluster; check `.status` yourself.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.bin_dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// The current end of the audit log.
    pub fn audit_mark(&self) -> AuditMark {
        AuditMark(std::fs::metadata(&self.audit_log).map_or(0, |m| m.len()))
    }

    /// Audit events after `since` (one JSON object per complete line). The policy logs
    /// only create/update/patch/delete/deletecollection, once per request.
    pub fn audit_events_since(&self, since: AuditMark) -> Vec<serde_json::Value> {
        let mut file = std::fs::File::open(&self.audit_log)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.audit_log.display()));
        file.seek(SeekFrom::Start(since.0)).expect("seek audit log");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("read audit log");
        // A line still being written has no newline yet: leave it for the next read.
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Counts API writes (create/update/patch/delete/deletecollection) logged after `since`
    /// that match `filter`. The apiserver's own lease renewals land here too: filter on
    /// namespace, resource or user (see [`audit_in_namespace`]).
    pub fn count_audit_writes(
        &self,
        since: AuditMark,
        filter: impl Fn(&serde_json::Value) -> bool,
    ) -> usize {
        self.audit_events_since(since)
            .iter()
            .filter(|e| {
                matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete" | "deletecollection")
                )
            })
            .filter(|e| filter(e))
            .count()
    }
}

/// Audit filter: the request's object is in namespace `ns`.
pub fn audit_in_namespace(ns: &str) -> impl Fn(&serde_json::Value) -> bool + '_ {
    move |e| e["objectRef"]["namespace"].as_str() == Some(ns)
}
