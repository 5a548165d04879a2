//! The simulated VMs' own traffic (issue 37): with [`super::SimKnobs::set_serve`], each awake
//! VM serves HTTP and a TCP echo on a loopback address of its own, which the simulator
//! reports as the pod's IP (`status.podIP`). A VM removed by a hibernate stops serving:
//! its address refuses connections, as a hibernated VM's would. Each wake gets a fresh
//! address, so a proxy that kept a stale one would fail.
//!
//! HTTP answers `vm=<VMID> pod=<pod> path=<path> body=<bytes read>`; the TCP echo first
//! writes `vm=<VMID>\n`, then echoes. Both name the VMID, so a test can tell which VM
//! served it. An HTTP/1.1 request with `Upgrade` (any protocol, WebSocket's handshake
//! left out) is answered `101` and the connection becomes that same echo.

use super::SimError;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use tokio::io::{AsyncWriteExt, copy};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Attempts at a free loopback address before giving up.
const ADDRESS_TRIES: u32 = 16;

/// One VM's two servers; dropping it closes both and every connection they hold.
struct VmServer {
    vm_id: String,
    ip: IpAddr,
    _tasks: JoinSet<()>,
}

/// The serving VMs, by (namespace, pod).
#[derive(Default)]
pub(super) struct Servers {
    by_pod: Mutex<HashMap<(String, String), VmServer>>,
}

impl Servers {
    /// The address the pod's VM `vm_id` serves on, starting its servers if they are not
    /// running for that VMID (a new VMID replaces the old VM's servers).
    pub(super) fn ensure(
        &self,
        key: &(String, String),
        vm_id: &str,
        ports: (u16, u16),
        net: Option<(Ipv4Addr, u8)>,
    ) -> Result<IpAddr, SimError> {
        let mut by_pod = self.by_pod.lock().map_err(|_| "servers lock poisoned")?;
        if let Some(s) = by_pod.get(key)
            && s.vm_id == vm_id
        {
            return Ok(s.ip);
        }
        by_pod.remove(key);
        let server = start(&key.1, vm_id, ports, net)?;
        let ip = server.ip;
        by_pod.insert(key.clone(), server);
        Ok(ip)
    }

    /// Stops the pod's VM servers: its address refuses from now on.
    pub(super) fn stop(&self, key: &(String, String)) {
        if let Ok(mut by_pod) = self.by_pod.lock()
            && by_pod.remove(key).is_some()
        {
            tracing::info!(ns = %key.0, pod = %key.1, "vk-sim: VM stopped serving");
        }
    }

    /// Stops the servers of pods no longer known.
    pub(super) fn retain(&self, known: impl Fn(&(String, String)) -> bool) {
        if let Ok(mut by_pod) = self.by_pod.lock() {
            by_pod.retain(|k, _| known(k));
        }
    }
}

/// A random address in `net` (base, prefix length) that is neither its first nor its
/// last; without one, in 127.64.0.0/10, clear of 127.0.0.1 and its neighbours.
fn random_address(net: Option<(Ipv4Addr, u8)>) -> IpAddr {
    let r = RandomState::new().hash_one(std::time::SystemTime::now());
    let Some((base, bits)) = net else {
        let [a, b, c, ..] = r.to_le_bytes();
        return IpAddr::V4(Ipv4Addr::new(127, 64 + (a % 64), b, c.max(1)));
    };
    let size = 1u64 << (32 - u32::from(bits.clamp(8, 30)));
    let offset = 1 + r % (size - 2);
    IpAddr::V4(Ipv4Addr::from(u32::from(base).wrapping_add(offset as u32)))
}

fn start(
    pod: &str,
    vm_id: &str,
    (http_port, tcp_port): (u16, u16),
    net: Option<(Ipv4Addr, u8)>,
) -> Result<VmServer, SimError> {
    let mut last = None;
    for _ in 0..ADDRESS_TRIES {
        let ip = random_address(net);
        match bind_both(ip, http_port, tcp_port) {
            Ok((http, tcp)) => {
                let mut tasks = JoinSet::new();
                tasks.spawn(serve_http(http, vm_id.to_owned(), pod.to_owned()));
                tasks.spawn(serve_echo(tcp, vm_id.to_owned()));
                tracing::info!(%pod, %vm_id, %ip, "vk-sim: VM serving");
                return Ok(VmServer {
                    vm_id: vm_id.to_owned(),
                    ip,
                    _tasks: tasks,
                });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(format!("no free loopback address for {pod}: {last:?}").into())
}

fn bind_both(ip: IpAddr, http: u16, tcp: u16) -> std::io::Result<(TcpListener, TcpListener)> {
    let bind = |port| -> std::io::Result<TcpListener> {
        let l = std::net::TcpListener::bind(SocketAddr::new(ip, port))?;
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    };
    Ok((bind(http)?, bind(tcp)?))
}

async fn serve_http(listener: TcpListener, vm_id: String, pod: String) {
    // Connections live in this set: the VM's removal (this task aborted) closes them.
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (vm_id, pod) = (vm_id.clone(), pod.clone());
        conns.spawn(async move {
            let banner = format!("vm={vm_id}\n");
            // The upgraded connection is echoed in this task, so the VM's removal ends it.
            let (upgraded_tx, mut upgraded) = tokio::sync::mpsc::unbounded_channel();
            let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                let (vm_id, pod) = (vm_id.clone(), pod.clone());
                let upgrade = req.headers().get(hyper::header::UPGRADE).cloned();
                if upgrade.is_some() {
                    let _ = upgraded_tx.send(hyper::upgrade::on(&mut req));
                }
                async move {
                    if let Some(protocol) = upgrade {
                        let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                        *resp.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
                        resp.headers_mut().insert(hyper::header::UPGRADE, protocol);
                        resp.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("upgrade"),
                        );
                        return Ok(resp);
                    }
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect().await?.to_bytes();
                    let text = format!("vm={vm_id} pod={pod} path={path} body={}\n", body.len());
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from(text))))
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades()
                .await;
            if let Ok(on) = upgraded.try_recv()
                && let Ok(io) = on.await
            {
                let (mut rd, mut wr) = tokio::io::split(TokioIo::new(io));
                if wr.write_all(banner.as_bytes()).await.is_ok() {
                    let _ = copy(&mut rd, &mut wr).await;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn serve_echo(listener: TcpListener, vm_id: String) {
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let banner = format!("vm={vm_id}\n");
        conns.spawn(async move {
            let (mut rd, mut wr) = stream.into_split();
            if wr.write_all(banner.as_bytes()).await.is_ok() {
                let _ = copy(&mut rd, &mut wr).await;
            }
        });
        while conns.try_join_next().is_some() {}
    }
}
