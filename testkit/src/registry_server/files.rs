//! What a registry process needs on disk and on the wire: its binary, htpasswd, TLS
//! files, and a raw TLS stream to it.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// The crypto provider reqwest and rustls need in this process (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(super) fn registry_binary() -> PathBuf {
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
pub(super) fn write_htpasswd(path: &Path, user: &str, password: &str) {
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
pub(super) fn write_tls_files(dir: &Path) -> String {
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

pub(super) fn tls_stream(
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
pub(super) fn read_some(stream: &mut impl Read, out: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return !out.is_empty(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return !out.is_empty(),
        }
    }
}
