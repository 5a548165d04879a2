//! A loopback TCP proxy for HTTP/1.1 that can hold or delay requests on their way to an
//! upstream (a real `registry_server` registry): a slow or stalled registry, on demand.
//!
//! Requests are recognised by their request line at the start of a
//! client write, which is how HTTP/1.1 clients without pipelining send them. Answers are
//! never touched. Everything it does is observable through [`ProxyStats`], and
//! [`SlowProxy::until`] waits on those counters, so tests wait on events, not on clocks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

const METHODS: [&str; 6] = ["GET ", "HEAD ", "DELETE ", "PUT ", "POST ", "PATCH "];

/// What happens to a request when it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward each request after this long (tokio time: paused clocks apply).
    Delay(Duration),
    /// Hold requests whose request line contains the pattern (all with `None`) until the
    /// mode no longer holds them, or the client gives up.
    Hold(Option<String>),
}

impl Mode {
    fn holds(&self, line: &str) -> bool {
        match self {
            Mode::Hold(None) => true,
            Mode::Hold(Some(pattern)) => line.contains(pattern.as_str()),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ProxyStats {
    /// Request lines seen, in arrival order ("HEAD /v2/vm/manifests/hibernate HTTP/1.1").
    pub lines: Vec<String>,
    /// Requests held right now.
    pub held: usize,
    /// Requests that were ever held.
    pub ever_held: usize,
    /// Held requests that have ended: let go by [`SlowProxy::resume`] or abandoned.
    pub held_ended: usize,
    /// Held requests whose client closed the connection (gave up, e.g. its timeout).
    pub abandoned: usize,
}

impl ProxyStats {
    pub fn requests(&self) -> usize {
        self.lines.len()
    }

    /// Requests whose line contains `pattern`.
    pub fn count(&self, pattern: &str) -> usize {
        self.lines.iter().filter(|l| l.contains(pattern)).count()
    }
}

struct Shared {
    upstream: String,
    mode: watch::Sender<Mode>,
    stats: watch::Sender<ProxyStats>,
}

/// The running proxy; dropping it closes the listener and every proxied connection.
pub struct SlowProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowProxy {
    /// Listens on a free loopback port and forwards to `upstream` ("host:port").
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            mode: watch::Sender::new(Mode::Pass),
            stats: watch::Sender::new(ProxyStats::default()),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Self { addr, shared, task }
    }

    /// "127.0.0.1:<port>": use as the registry host.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Holds every request from now on.
    pub fn stall(&self) {
        self.set_mode(Mode::Hold(None));
    }

    /// Holds requests whose request line contains `pattern`.
    pub fn hold_matching(&self, pattern: &str) {
        self.set_mode(Mode::Hold(Some(pattern.to_owned())));
    }

    /// Forwards each request after `delay`.
    pub fn delay_each(&self, delay: Duration) {
        self.set_mode(Mode::Delay(delay));
    }

    /// Forwards everything again; held requests go on.
    pub fn resume(&self) {
        self.set_mode(Mode::Pass);
    }

    pub fn stats(&self) -> ProxyStats {
        self.shared.stats.borrow().clone()
    }

    /// Waits until the stats satisfy `pred`; returns them. No timeout of its own: race it
    /// against the event that must not come first, or wrap it in one.
    pub async fn until(&self, pred: impl Fn(&ProxyStats) -> bool) -> ProxyStats {
        let mut rx = self.shared.stats.subscribe();
        let stats = rx
            .wait_for(|s| pred(s))
            .await
            .expect("the proxy is running");
        stats.clone()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Owned here, so aborting this task ends every connection too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    connections.spawn(proxy_connection(client, shared.clone()));
                }
                Err(e) => {
                    eprintln!("slow proxy: accept failed: {e}");
                    return;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// How a held request ended.
enum Held {
    Released,
    Abandoned,
}

async fn proxy_connection(client: TcpStream, shared: Arc<Shared>) {
    let Ok(upstream) = TcpStream::connect(&shared.upstream).await else {
        // As an unreachable registry would: the client sees the connection close.
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_upstream, mut to_upstream) = upstream.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_upstream, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    let mut mode = shared.mode.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    let mut more = vec![0u8; 64 * 1024];
    let mut client_gone = false;
    loop {
        let n = match from_client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut pending = buf[..n].to_vec();
        if let Some(line) = request_line(&pending) {
            shared.stats.send_modify(|s| s.lines.push(line.clone()));
            let now = mode.borrow_and_update().clone();
            if let Mode::Delay(delay) = now {
                tokio::time::sleep(delay).await;
            } else if now.holds(&line) {
                shared.stats.send_modify(|s| {
                    s.held += 1;
                    s.ever_held += 1;
                });
                let ended = loop {
                    tokio::select! {
                        changed = mode.changed() => {
                            if changed.is_err() || !mode.borrow_and_update().holds(&line) {
                                break Held::Released;
                            }
                        }
                        read = from_client.read(&mut more) => match read {
                            Ok(0) | Err(_) => break Held::Abandoned,
                            // The rest of the request (a body): held with it.
                            Ok(m) => pending.extend_from_slice(&more[..m]),
                        },
                    }
                };
                shared.stats.send_modify(|s| {
                    s.held -= 1;
                    s.held_ended += 1;
                    if matches!(ended, Held::Abandoned) {
                        s.abandoned += 1;
                    }
                });
                if matches!(ended, Held::Abandoned) {
                    client_gone = true;
                    break;
                }
            }
        }
        if to_upstream.write_all(&pending).await.is_err() {
            break;
        }
    }
    if client_gone {
        answers.abort();
        return;
    }
    let _ = to_upstream.shutdown().await;
    let _ = answers.await;
}

/// "METHOD /path HTTP/1.1" when `bytes` starts a request.
fn request_line(bytes: &[u8]) -> Option<String> {
    let end = bytes
        .iter()
        .take(2048)
        .position(|b| *b == b'\r' || *b == b'\n')
        .unwrap_or(bytes.len().min(2048));
    let line = String::from_utf8_lossy(&bytes[..end]);
    METHODS
        .iter()
        .any(|m| line.starts_with(m))
        .then(|| line.into_owned())
}
