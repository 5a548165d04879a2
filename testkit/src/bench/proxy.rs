//! The wake proxy's part (`--parts proxy`, issue 37), side by side in one run:
//! - warm path: the same keep-alive HTTP load straight to an awake VM, through our proxy
//!   and through Debian's nginx (started and stopped here, proxying to the same address):
//!   added latency p50/p99 over direct, and requests per second;
//! - cold path: a burst to the hibernated VM; from the first request sent to the first
//!   answer, against the CR's own wake (desire `Wake` seen → `Active` seen, by a watch).
//!
//! Prints `proxy: warm_p99_added_ms=… nginx_p99_added_ms=… rps_ratio_vs_nginx=…
//! cold_overhead_ms=… wakes_per_burst=…`.

use super::report::{Figures, Kind};
use super::{Opts, log, ms};
use crate::ports::free_port;
use crate::wake_proxy::{self, DOMAIN, HTTP_PORT, WakeProxy};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Map, Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// Concurrent keep-alive connections of the warm load.
const WARM_CONCURRENCY: usize = 16;
/// Requests of the cold burst.
const BURST: usize = 20;

/// One warm run's figures.
struct Load {
    p50_ms: f64,
    p99_ms: f64,
    rps: f64,
}

pub(super) async fn proxy(o: &Opts, figs: &mut Figures, detail: &mut Map<String, Value>) {
    let nginx_bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| panic!("the proxy part needs nginx: apt-get install nginx-light"));
    let pod = "vm-0";
    let env = wake_proxy::world("bench-proxy", "60s", pod, free_port()).await;
    let ip = wake_proxy::serving_pod(&env, pod, None).await;
    let proxy = WakeProxy::start_on(&env, free_port()).await;
    let nginx = Nginx::start(nginx_bin, &format!("{ip}:{HTTP_PORT}"));
    let host = format!("{pod}.{DOMAIN}");
    let secs = Duration::from_secs_f64(o.proxy_s);

    log(format!(
        "proxy: warm load, {WARM_CONCURRENCY} connections, {secs:?} each"
    ));
    let direct = load(&format!("{ip}:{HTTP_PORT}"), &host, secs).await;
    let ours = load(&format!("127.0.0.1:{}", proxy.http), &host, secs).await;
    let theirs = load(&format!("127.0.0.1:{}", nginx.port), &host, secs).await;
    drop(nginx);

    log("proxy: cold burst on the hibernated VM");
    let crs: Api<CocoonHibernation> = Api::namespaced(env.client.clone(), &env.ns);
    wake_proxy::hibernate(&env, pod).await;
    let seen = tokio::spawn(wake_seen(crs.clone(), pod.to_owned()));
    let t0 = Instant::now();
    let port = proxy.http;
    let burst: Vec<_> = (0..BURST)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                let ok = one_request(&format!("127.0.0.1:{port}"), &host).await;
                (ok, Instant::now())
            })
        })
        .collect();
    let mut first = None::<Instant>;
    let mut served = 0;
    for b in burst {
        let (ok, at) = b.await.expect("burst task");
        served += usize::from(ok);
        first = Some(first.map_or(at, |f| f.min(at)));
    }
    let (wake_seen_at, active_seen_at) = seen.await.expect("watch task");
    let held_ms = first.map(|f| ms(f - t0));
    let cr_wake_ms = ms(active_seen_at - wake_seen_at);
    let cold_overhead = held_ms.map(|h| h - cr_wake_ms);
    let metrics = proxy.metrics().await;
    let wakes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cocoon_wake_proxy_wakes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());

    let added = |l: &Load| l.p99_ms - direct.p99_ms;
    figs.set(
        "proxy.warm_p99_added_ms",
        Some(added(&ours)),
        "ms, ours p99 − direct p99",
        Kind::Tail,
    );
    figs.set(
        "proxy.nginx_p99_added_ms",
        Some(added(&theirs)),
        "ms, nginx p99 − direct p99",
        Kind::Info,
    );
    figs.set(
        "proxy.rps_ratio_vs_nginx",
        Some(ours.rps / theirs.rps),
        "ours ÷ nginx",
        Kind::Rate,
    );
    figs.set(
        "proxy.cold_overhead_ms",
        cold_overhead,
        "ms, held→answered − the CR's own wake",
        Kind::Time,
    );
    figs.set(
        "proxy.wakes_per_burst",
        wakes,
        "desire flips for one burst",
        Kind::Count,
    );
    detail.insert(
        "proxy".into(),
        json!({
            "direct": { "p50_ms": direct.p50_ms, "p99_ms": direct.p99_ms, "rps": direct.rps },
            "ours": { "p50_ms": ours.p50_ms, "p99_ms": ours.p99_ms, "rps": ours.rps },
            "nginx": { "p50_ms": theirs.p50_ms, "p99_ms": theirs.p99_ms, "rps": theirs.rps },
            "burst": BURST, "served": served, "held_to_answer_ms": held_ms, "cr_wake_ms": cr_wake_ms,
        }),
    );
    let show = |v: Option<f64>| v.map_or("na".to_owned(), |v| format!("{v:.2}"));
    println!(
        "proxy: warm_p99_added_ms={} nginx_p99_added_ms={} rps_ratio_vs_nginx={} cold_overhead_ms={} wakes_per_burst={}",
        show(Some(added(&ours))),
        show(Some(added(&theirs))),
        show(Some(ours.rps / theirs.rps)),
        show(cold_overhead),
        wakes.map_or("na".to_owned(), |w| format!("{w}")),
    );
    assert_eq!(served, BURST, "every request of the burst served");
}

/// When the CR's desire `Wake` and then its phase `Active` were first seen.
async fn wake_seen(crs: Api<CocoonHibernation>, name: String) -> (Instant, Instant) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(crs, cfg).applied_objects();
    futures::pin_mut!(stream);
    let mut wake = None;
    while let Some(ev) = stream.next().await {
        let Ok(cr) = ev else { continue };
        if cr.spec.desire == Desire::Wake && wake.is_none() {
            wake = Some(Instant::now());
        }
        if let Some(w) = wake
            && cr.phase() == Some(Phase::Active)
        {
            return (w, Instant::now());
        }
    }
    panic!("the CR watch ended before Active");
}

/// One GET on a fresh connection: answered 200.
async fn one_request(addr: &str, host: &str) -> bool {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return false;
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(io).await else {
        return false;
    };
    tokio::spawn(conn);
    let req = http::Request::get("/cold")
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .expect("request");
    match tokio::time::timeout(Duration::from_secs(90), send.send_request(req)).await {
        Ok(Ok(resp)) => resp.status() == 200 && resp.into_body().collect().await.is_ok(),
        _ => false,
    }
}

/// [`WARM_CONCURRENCY`] keep-alive connections sending GETs for `secs`.
async fn load(addr: &str, host: &str, secs: Duration) -> Load {
    let started = Instant::now();
    let tasks: Vec<_> = (0..WARM_CONCURRENCY)
        .map(|_| {
            let (addr, host) = (addr.to_owned(), host.to_owned());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                // A server may close a keep-alive connection after so many requests:
                // connect again, as a client would.
                while started.elapsed() < secs {
                    let stream = TcpStream::connect(&addr).await.expect("connect");
                    let _ = stream.set_nodelay(true);
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                        .await
                        .expect("handshake");
                    tokio::spawn(conn);
                    while started.elapsed() < secs {
                        let req = http::Request::get("/warm")
                            .header("host", &host)
                            .body(Empty::<Bytes>::new())
                            .expect("request");
                        if send.ready().await.is_err() {
                            break;
                        }
                        let t = Instant::now();
                        let Ok(resp) = send.send_request(req).await else {
                            break;
                        };
                        assert_eq!(resp.status(), 200, "warm path through {addr}");
                        resp.into_body().collect().await.expect("body");
                        lat.push(ms(t.elapsed()));
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("load task"));
    }
    let wall = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    Load {
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        rps: all.len() as f64 / wall,
    }
}

/// nginx as a reverse proxy to one upstream, in a directory of its own; stopped on drop.
struct Nginx {
    child: Child,
    port: u16,
    bin: String,
    dir: tempfile::TempDir,
}

impl Nginx {
    fn start(bin: &str, upstream: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let p = dir.path().display();
        // As a reverse proxy is usually run: upstream keep-alive, no access log.
        let conf = format!(
            "worker_processes auto; daemon off; pid {p}/nginx.pid; error_log {p}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {p}/body; proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/fcgi; uwsgi_temp_path {p}/uwsgi; scgi_temp_path {p}/scgi;
  upstream vm {{ server {upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    keepalive_requests 1000000;
    location / {{ proxy_pass http://vm; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; }}
  }}
}}
"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).expect("write nginx.conf");
        let child = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port,
            bin: bin.to_owned(),
            dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // `-s stop` stops the workers too; killing the master alone would leave them.
        let conf = self.dir.path().join("nginx.conf");
        let stopped = Command::new(&self.bin)
            .arg("-p")
            .arg(self.dir.path())
            .arg("-c")
            .arg(&conf)
            .args(["-s", "stop"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
