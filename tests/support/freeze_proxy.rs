//! Test support: a TLS-terminating proxy in front of kube-apiserver that can freeze the
//! product's informers (S8) while every other call passes.
//!
//! It serves a certificate of the test cluster's CA (which the product's kubeconfig
//! trusts) and reaches the apiserver with a client certificate of the product's own
//! identity, so the product authenticates as before. Informer traffic is a GET on a
//! collection of pods or cocoonhibernations (a list or a watch). Once
//! [`FreezeProxy::freeze_informers`] is called, open informer replies stop: not one more
//! byte, not even their end, reaches the product, and the connections stay open; new
//! informer requests are held unanswered. Lease, event and single-object calls pass.
//! [`FreezeProxy::thaw`] lets everything through again.
//!
//! Include with `#[path = "support/freeze_proxy.rs"] mod freeze_proxy;`.
#![allow(dead_code)]

use futures::StreamExt;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The proxy; stops on drop.
pub struct FreezeProxy {
    pub port: u16,
    frozen: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A list or a watch of one of the product's informers.
fn is_informer(req: &Request<Incoming>) -> bool {
    let last = req.uri().path().trim_end_matches('/').rsplit('/').next();
    req.method() == http::Method::GET && matches!(last, Some("pods" | "cocoonhibernations"))
}

impl FreezeProxy {
    /// `serving`: (cert, key) PEM it presents; `client`: (cert, key) PEM of the identity
    /// it uses upstream; `ca_pem` verifies the apiserver.
    pub async fn start(
        upstream: SocketAddr,
        serving: (String, String),
        client: (String, String),
        ca_pem: &str,
    ) -> Self {
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
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_pem) {
            roots.add(c).expect("CA certificate");
        }
        let mut client_cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs(&client.0), key(&client.1))
            .expect("proxy client config");
        client_cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_cfg));

        let (frozen, frozen_rx) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the freeze proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let held_count = held.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, connector, frozen, held) = (
                    acceptor.clone(),
                    connector.clone(),
                    frozen_rx.clone(),
                    held_count.clone(),
                );
                tokio::spawn(async move {
                    let Ok(down) = acceptor.accept(tcp).await else {
                        return;
                    };
                    // One upstream connection per downstream one, opened on first use.
                    let up: Upstream = Arc::new(tokio::sync::Mutex::new(None));
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        handle(
                            req,
                            connector.clone(),
                            up.clone(),
                            frozen.clone(),
                            held.clone(),
                            upstream,
                        )
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(down), service)
                        .await;
                });
            }
        });
        Self {
            port,
            frozen,
            held,
            task,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// From now on no informer reply moves and no new informer request is answered.
    pub fn freeze_informers(&self) {
        self.frozen.send_replace(true);
    }

    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Informer requests that arrived while frozen.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

type Upstream = Arc<tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Body>>>>;

/// Forwards one request on this connection's upstream connection, holding informer
/// traffic while frozen.
async fn handle(
    req: Request<Incoming>,
    connector: tokio_rustls::TlsConnector,
    up: Upstream,
    frozen: watch::Receiver<bool>,
    held: Arc<AtomicUsize>,
    upstream: SocketAddr,
) -> Result<Response<Body>, BoxError> {
    let informer = is_informer(&req);
    if informer && *frozen.borrow() {
        held.fetch_add(1, Ordering::SeqCst);
        thawed(frozen.clone()).await;
    }
    let mut guard = up.lock().await;
    let usable = match guard.as_mut() {
        Some(s) => !s.is_closed() && s.ready().await.is_ok(),
        None => false,
    };
    if !usable {
        let tcp = TcpStream::connect(upstream).await?;
        let tls = connector
            .connect(ServerName::from(upstream.ip()), tcp)
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *guard = Some(sender);
    }
    let Some(sender) = guard.as_mut() else {
        return Err("no upstream connection".into());
    };
    let req = req.map(|b| b.map_err(BoxError::from).boxed_unsync());
    let res = sender.send_request(req).await?;
    drop(guard);
    Ok(if informer {
        res.map(|b| gated(b, frozen))
    } else {
        res.map(|b| b.map_err(BoxError::from).boxed_unsync())
    })
}

async fn thawed(mut frozen: watch::Receiver<bool>) {
    // A dropped proxy never thaws: the request stays unanswered.
    if frozen.wait_for(|f| !*f).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The reply body, each frame and its end held while frozen.
fn gated(body: Incoming, frozen: watch::Receiver<bool>) -> Body {
    let end = frozen.clone();
    let frames = BodyStream::new(body)
        .then(move |frame| {
            let frozen = frozen.clone();
            async move {
                thawed(frozen).await;
                frame.map_err(BoxError::from)
            }
        })
        .chain(
            futures::stream::once(async move { thawed(end).await }).filter_map(|()| async { None }),
        );
    StreamBody::new(frames).boxed_unsync()
}
