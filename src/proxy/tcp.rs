//! Raw TCP through the proxy (Q1, Q2): a connection accepted on a route's listening port
//! is held while the pod wakes, then joined to the pod's port byte for byte. A refused or
//! timed-out connection is closed: TCP has no place for a reason.

use super::Proxy;
use super::hold::{VmKey, resolve};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};

/// Accepts connections for ever on one listening port.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, port, "accept");
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move { handle(&proxy, stream, port).await });
    }
}

async fn handle(proxy: &Proxy, mut client: TcpStream, port: u16) {
    let _ = client.set_nodelay(true);
    let Some(target) = proxy.cluster.routes().tcp(port).cloned() else {
        proxy.metrics.refused("no_route");
        return;
    };
    let key: VmKey = (target.namespace().to_owned(), target.pod.clone());
    // Held or joined, the session keeps the pod awake until it ends (I3).
    let _open = proxy.reporter.opened(&key);
    // Nothing is read from the client while it is held (Q2).
    let ready = match resolve(&*proxy.cluster, &proxy.holds, &proxy.metrics, &target).await {
        Ok(r) => r,
        Err(a) => {
            proxy.metrics.refused(a.cause());
            tracing::info!(ns = %target.namespace(), pod = %target.pod, cause = a.cause(), "TCP connection closed unserved");
            return;
        }
    };
    let mut upstream = match TcpStream::connect(SocketAddr::new(ready.ip, target.port)).await {
        Ok(s) => s,
        Err(e) => {
            proxy.metrics.refused("upstream");
            tracing::info!(ns = %key.0, pod = %key.1, error = %e, "upstream connect failed");
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    proxy.metrics.forwarded("tcp");
    proxy.reporter.note(&key);
    if let Ok((up, down)) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await
        && up + down > 0
    {
        proxy.reporter.note(&key);
    }
}
