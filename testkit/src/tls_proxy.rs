//! Test support shared by the HTTP-aware fault proxies in front of kube-apiserver
//! ([`crate::api_tap`], tests/soak/proxy.rs): the TLS ends of a proxy, the upstream
//! side of one proxied HTTP/1.1 connection, and the TLS accept loop.
//!
//! A proxy serves a certificate of the test cluster's CA (which the product's kubeconfig
//! trusts) and reaches the apiserver with a client certificate of the product's own
//! identity, so the product authenticates as before.

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Opens a new upstream connection.
pub type Connect = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = std::io::Result<Box<dyn Io>>> + Send>> + Send + Sync,
>;

/// The TLS ends of a proxy: it presents `serving` (cert, key) PEM, reaches upstream as
/// `client` (cert, key) PEM, and verifies the upstream with `ca_pem`. Both speak HTTP/1.1.
pub fn tls_ends(
    serving: &(String, String),
    client: &(String, String),
    ca_pem: &str,
) -> (tokio_rustls::TlsAcceptor, tokio_rustls::TlsConnector) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = |pem: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("certificate PEM")
    };
    let key = |pem: &str| PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("key PEM");
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs(&serving.0), key(&serving.1))
        .expect("proxy serving config");
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca_pem) {
        roots.add(c).expect("CA certificate");
    }
    let mut client_cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs(&client.0), key(&client.1))
        .expect("proxy client config");
    client_cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    (
        tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        tokio_rustls::TlsConnector::from(Arc::new(client_cfg)),
    )
}

/// Connects to `upstream` over TLS, naming it by its IP address.
pub fn tls_connect(connector: tokio_rustls::TlsConnector, upstream: SocketAddr) -> Connect {
    Arc::new(move || {
        let connector = connector.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(upstream).await?;
            let name = rustls::pki_types::ServerName::from(upstream.ip());
            let tls = connector.connect(name, tcp).await?;
            Ok(Box::new(tls) as Box<dyn Io>)
        })
    })
}

/// The upstream side of one proxied connection, opened on first use; reconnects when the
/// old one closed.
pub struct Upstream<B> {
    connect: Connect,
    sender: Option<SendRequest<B>>,
}

impl<B> Upstream<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    pub fn new(connect: Connect) -> Self {
        Self {
            connect,
            sender: None,
        }
    }

    /// Sends `req` and returns when the answer's headers are in.
    pub async fn send(&mut self, req: Request<B>) -> Result<Response<Incoming>, BoxError> {
        let usable = match self.sender.as_mut() {
            Some(s) => !s.is_closed() && s.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let io = (self.connect)().await?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().ok_or("no upstream connection")?;
        Ok(sender.send_request(req).await?)
    }
}

/// Listens on 127.0.0.1 (a free port) and hands each connection that completes the TLS
/// handshake to `serve`, on a task of its own; the loop stops when its handle is aborted.
pub async fn serve_tls<F, Fut>(
    acceptor: tokio_rustls::TlsAcceptor,
    serve: F,
) -> (u16, JoinHandle<()>)
where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let port = listener.local_addr().expect("proxy address").port();
    let serve = Arc::new(serve);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, serve) = (acceptor.clone(), serve.clone());
            tokio::spawn(async move {
                if let Ok(down) = acceptor.accept(tcp).await {
                    serve(down).await;
                }
            });
        }
    });
    (port, task)
}
