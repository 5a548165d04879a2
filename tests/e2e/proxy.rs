//! End-to-end: the wake proxy (Q1–Q8) on the real control plane. The product and the vk
//! simulator run as in every e2e; the simulator's awake VMs serve HTTP and a TCP echo on
//! an address of their own ([`vk_sim::SimKnobs::set_serve`]) and refuse while hibernated.
//! The proxy is the real binary (`cocoon-hibernation proxy`) under a Role that grants only
//! what Q8 allows, so a verb it lacks fails here.

use cocoon_hibernation::api::activity::lease_name;
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use product::{eventually, free_port};
use std::time::{Duration, Instant};
use testkit::wake_proxy::{DOMAIN, HTTP_PORT, WakeProxy, hibernated_pod, world};
use testkit::{cluster, env, product};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn vm_id(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    cocoon_hibernation::api::annotations::PodView::of(pod)
        .vm_id
        .unwrap_or_default()
}

/// The CR writes `user` made after `mark`, refused ones included: (verb, status code).
fn cr_writes_by(mark: cluster::AuditMark, ns: &str, user: &str) -> Vec<(String, i64)> {
    cluster::cluster()
        .audit_events_since(mark)
        .iter()
        .filter(|e| {
            e["objectRef"]["namespace"].as_str() == Some(ns)
                && e["objectRef"]["resource"].as_str() == Some("cocoonhibernations")
                && e["user"]["username"].as_str() == Some(user)
                && matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete")
                )
        })
        .map(|e| {
            let verb = e["verb"].as_str().unwrap_or_default().to_owned();
            (
                verb,
                e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

/// A TCP session through the proxy: the banner naming the VM that served it, and the
/// echo of `line`.
async fn tcp_session(port: u16, line: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(line.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let want = line.len();
    tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((banner, rest)) = text.split_once('\n')
                && rest.len() >= want
            {
                return (banner.to_owned(), rest.to_owned());
            }
        }
    })
    .await
    .expect("TCP session answered within 90 s")
}

/// SPEC Q1, Q2, Q3, Q4, Q5, Q7, Q8: a probe to a hibernated VM is answered and wakes
/// nothing; then 50 concurrent HTTP requests and 5 TCP sessions to it write exactly one
/// desire flip, and every one is served by the woken VM (none lost); the warm path then
/// forwards HTTP/2 too; traffic renewed the activity Lease; the proxy's metrics saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn q1_q2_q3_q4_q5_q7_q8_burst_to_a_hibernated_vm_wakes_it_once_and_all_are_served() {
    let tcp_listen = free_port();
    let env = world("proxy-burst", "60s", "web-0", tcp_listen).await;
    let old_ip = hibernated_pod(&env, "web-0", None).await;
    // The simulator refuses on a hibernated VM's address.
    assert!(
        TcpStream::connect((old_ip.as_str(), HTTP_PORT))
            .await
            .is_err(),
        "a hibernated VM still answers on {old_ip}"
    );
    let proxy = WakeProxy::start_on(&env, tcp_listen).await;
    let mark = cluster::cluster().audit_mark();

    // Q5: a probe gets the fixed answer, wakes nothing and reports nothing.
    let (status, body, answer) = proxy.request("web-0", "/healthz").await;
    assert_eq!(
        (status, body.as_str(), answer.as_deref()),
        (200, "ok\n", Some("probe"))
    );
    // Q5: a pod the policy does not select is no route, and names nothing.
    let (status, _, answer) = proxy.request("stranger", "/").await;
    assert_eq!((status, answer.as_deref()), (404, Some("no_route")));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cr = env.crs.get("web-0").await.unwrap();
    assert_eq!(cr.spec.desire, Desire::Hibernate, "a probe woke the VM");
    // The idle controller may have made the pod's Lease (I2); a probe never renews it.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let lease = lease_name("web-0").unwrap();
    let holder = leases
        .get_opt(&lease)
        .await
        .unwrap()
        .and_then(|l| l.spec.and_then(|s| s.holder_identity));
    assert!(
        holder
            .as_deref()
            .is_none_or(|h| h == cocoon_hibernation::idle::writes::HOLDER),
        "a probe counted as activity: the Lease was renewed by {holder:?}"
    );

    // Q2: the burst.
    let started = Instant::now();
    let http: Vec<_> = (0..50)
        .map(|i| {
            let (port, path) = (proxy.http, format!("/req/{i}"));
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!("http://127.0.0.1:{port}{path}"))
                    .header("host", format!("web-0.{DOMAIN}"))
                    .body(format!("body-{i}"))
                    .timeout(Duration::from_secs(90))
                    .send()
                    .await
                    .unwrap();
                (resp.status().as_u16(), resp.text().await.unwrap(), path)
            })
        })
        .collect();
    let tcp: Vec<_> = (0..5)
        .map(|i| tokio::spawn(async move { tcp_session(tcp_listen, &format!("ping-{i}\n")).await }))
        .collect();
    let mut http_results = Vec::new();
    for t in http {
        http_results.push(t.await.unwrap());
    }
    let mut tcp_results = Vec::new();
    for t in tcp {
        tcp_results.push(t.await.unwrap());
    }
    let served_in = started.elapsed();

    let pod = env.pods.get("web-0").await.unwrap();
    let woken = vm_id(&pod);
    let new_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    assert_ne!(new_ip, old_ip, "the woken VM serves on a fresh address");
    for (status, body, path) in &http_results {
        assert_eq!(
            *status,
            200,
            "{path}: {body}\nproxy log:\n{}",
            proxy.log_text()
        );
        // Served by the woken VM, the path and the body (7 or 8 bytes) intact.
        assert!(
            body.starts_with(&format!("vm={woken} pod=web-0 path={path} body=")),
            "{body}"
        );
    }
    for (i, (banner, echo)) in tcp_results.iter().enumerate() {
        assert_eq!(banner, &format!("vm={woken}"));
        assert_eq!(echo, &format!("ping-{i}\n"));
    }
    // One flip landed; a flip fenced on a resourceVersion the controller had just moved
    // past is refused (409) and written again, which is still one wake.
    // The audit log may trail the response a little.
    let writes = eventually(
        "the flip in the audit log",
        Duration::from_secs(10),
        || async {
            let w = cr_writes_by(mark, &env.ns, &proxy.user);
            w.iter().any(|(_, code)| *code == 200).then_some(w)
        },
    )
    .await;
    let landed = writes.iter().filter(|(_, code)| *code == 200).count();
    assert!(
        landed == 1
            && writes
                .iter()
                .all(|(verb, code)| verb == "patch" && [200, 409].contains(code)),
        "exactly one desire flip for 55 held requests: {writes:?}"
    );
    eprintln!("proxy CR writes: {writes:?}");
    let cr: CocoonHibernation = env.crs.get("web-0").await.unwrap();
    assert_eq!(cr.spec.desire, Desire::Wake);
    assert_eq!(
        cr.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(cocoon_hibernation::proxy::IDLE_DESIRE))
            .map(String::as_str),
        Some("Wake"),
        "the flip is recorded as the idle policy's"
    );
    eprintln!("burst of 55 served in {served_in:?}");

    // Q3: the warm path, HTTP/2 with prior knowledge included.
    let stream = TcpStream::connect(("127.0.0.1", proxy.http)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://web-0.{DOMAIN}/h2"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).starts_with(&format!("vm={woken} pod=web-0 path=/h2")));

    // Q4: the traffic renewed the pod's activity Lease, as this proxy. The policy may have
    // made the Lease first (I2), and the first connection's count goes out before the
    // activity, which is owed to the end of its window (I2's coalescing): so, eventually.
    let spec = eventually("activity Lease renewed by the proxy", env::LONG, || async {
        let spec = leases.get_opt(&lease).await.ok().flatten()?.spec?;
        (spec.holder_identity.as_deref() == Some(proxy.user.as_str())).then_some(spec)
    })
    .await;
    assert!(spec.renew_time.is_some());

    // Q7: held, the hold histogram, activity reports.
    let m = proxy.metrics().await;
    for want in [
        "cocoon_wake_proxy_held 0",
        "cocoon_wake_proxy_wakes_total 1",
        "cocoon_wake_proxy_hold_seconds_count 55",
        "cocoon_wake_proxy_refusals_total{cause=\"no_route\"} 1",
    ] {
        assert!(m.contains(want), "{want} missing from:\n{m}");
    }
    assert!(
        !m.contains("cocoon_wake_proxy_activity_reports_total 0"),
        "{m}"
    );
}

/// SPEC Q2, Q5, Q6: a wake that ends Failed answers its held request 503 with the CR's
/// reason at once (not at maxWait); a CR Failed so is not woken again by requests; with
/// the product down a client that gives up frees its place at once, a held request waits
/// maxWait, then 503 with Retry-After, a held TCP connection is closed, and the CR's state
/// does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn q2_q5_q6_failed_wake_and_product_down_answer_503() {
    let tcp_listen = free_port();
    let mut env = world("proxy-faults", "20s", "down-0", tcp_listen).await;
    hibernated_pod(&env, "fail-0", Some("3s")).await;
    let proxy = WakeProxy::start_on(&env, tcp_listen).await;

    // The VM never comes back: vk ignores the wake, the CR fails after 3 s.
    env.sim.knobs.set_never_complete(true);
    let started = Instant::now();
    let (status, body, answer) = proxy.request("fail-0", "/").await;
    let took = started.elapsed();
    assert_eq!(
        (status, answer.as_deref()),
        (503, Some("wake_failed")),
        "{body}"
    );
    assert!(body.contains("WakeTimedOut"), "{body}");
    assert!(
        took < Duration::from_secs(15),
        "answered after {took:?}, not at once"
    );
    // Q5: a CR Failed after a wake answers at once and writes nothing more.
    let mark = cluster::cluster().audit_mark();
    let (status, _, answer) = proxy.request("fail-0", "/").await;
    assert_eq!((status, answer.as_deref()), (503, Some("wake_failed")));
    assert_eq!(cr_writes_by(mark, &env.ns, &proxy.user), vec![]);

    // The product down: held requests time out at maxWait (20 s), nothing moves.
    env.sim.knobs.set_never_complete(false);
    hibernated_pod(&env, "down-0", None).await;
    env.product.kill9();
    // Q2: a client that gives up while held frees its place at once.
    let gives_up = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/", proxy.http))
        .header("host", format!("down-0.{DOMAIN}"))
        .timeout(Duration::from_secs(3))
        .send();
    let (gave_up, ()) = tokio::join!(gives_up, async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let m = proxy.metrics().await;
        assert!(m.contains("cocoon_wake_proxy_held 1"), "not held:\n{m}");
    });
    assert!(
        gave_up.is_err(),
        "answered while the product is down: {gave_up:?}"
    );
    eventually(
        "the abandoned request's place freed",
        Duration::from_secs(5),
        || async {
            proxy
                .metrics()
                .await
                .contains("cocoon_wake_proxy_held 0")
                .then_some(())
        },
    )
    .await;
    let started = Instant::now();
    let (http, tcp) = tokio::join!(proxy.request("down-0", "/"), async {
        let mut s = TcpStream::connect(("127.0.0.1", tcp_listen)).await.unwrap();
        let mut buf = [0u8; 16];
        // Q2: TCP has no status line: the connection is closed unserved.
        tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await
    });
    let took = started.elapsed();
    let (status, body, answer) = http;
    assert_eq!(
        (status, answer.as_deref()),
        (503, Some("timed_out")),
        "{body}"
    );
    assert!(body.contains("did not wake within 20s"), "{body}");
    assert!(
        took >= Duration::from_secs(19) && took < Duration::from_secs(40),
        "held {took:?}, maxWait 20s"
    );
    assert!(matches!(tcp, Ok(Ok(0))), "TCP not closed unserved: {tcp:?}");
    let cr = env.crs.get("down-0").await.unwrap();
    assert_eq!(cr.status.and_then(|s| s.phase), Some(Phase::Hibernated));
    let pod = env.pods.get("down-0").await.unwrap();
    assert!(
        vm_id(&pod).is_empty(),
        "the VM came back with the product down"
    );
    let m = proxy.metrics().await;
    assert!(
        m.contains("cocoon_wake_proxy_refusals_total{cause=\"timed_out\"} 2"),
        "{m}"
    );
}

/// Reads from `s` into `got` until `pat` appears: the bytes up to and with it.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, pat: &[u8]) -> String {
    tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            if let Some(at) = got.windows(pat.len()).position(|w| w == pat) {
                let head: Vec<u8> = got.drain(..at + pat.len()).collect();
                return String::from_utf8_lossy(&head).into_owned();
            }
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("answered within 90 s")
}

/// The pod's activity Lease's open-connections count (I3), as the proxy wrote it.
async fn open_connections(leases: &Api<Lease>, pod: &str) -> Option<String> {
    let lease = leases.get_opt(&lease_name(pod)?).await.ok()??;
    lease
        .metadata
        .annotations?
        .get(cocoon_hibernation::api::activity::OPEN_CONNECTIONS)
        .cloned()
}

/// SPEC Q1, Q2, I3: an HTTP/1.1 Upgrade to a hibernated VM is held like any request, wakes
/// it, gets the woken VM's `101`, and is then joined to it both ways; while it and a TCP
/// session are open, the pod's activity Lease counts them (an idle policy keeps the pod
/// awake), and the count goes back to 0 once both have closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn q1_q2_i3_upgrade_is_held_then_joined_and_open_connections_are_counted() {
    let tcp_listen = free_port();
    let env = world("proxy-upgrade", "60s", "web-0", tcp_listen).await;
    hibernated_pod(&env, "web-0", None).await;
    let proxy = WakeProxy::start_on(&env, tcp_listen).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);

    let mut ws = TcpStream::connect(("127.0.0.1", proxy.http)).await.unwrap();
    let ask = format!(
        "GET /ws HTTP/1.1\r\nHost: web-0.{DOMAIN}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    );
    ws.write_all(ask.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let head = read_until(&mut ws, &mut got, b"\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: echo"),
        "{head}"
    );
    let banner = read_until(&mut ws, &mut got, b"\n").await;
    let pod = env.pods.get("web-0").await.unwrap();
    assert_eq!(banner, format!("vm={}\n", vm_id(&pod)), "not the woken VM");
    ws.write_all(b"ping over the upgrade\n").await.unwrap();
    let echo = read_until(&mut ws, &mut got, b"\n").await;
    assert_eq!(echo, "ping over the upgrade\n");
    let cr = env.crs.get("web-0").await.unwrap();
    assert_eq!(cr.spec.desire, Desire::Wake);

    // I3: the upgraded connection is open, then a TCP session too.
    eventually("open-connections 1", Duration::from_secs(30), || async {
        (open_connections(&leases, "web-0").await.as_deref() == Some("1")).then_some(())
    })
    .await;
    let (tcp_banner, tcp_echo) = tcp_session(tcp_listen, "tcp too\n").await;
    assert_eq!(tcp_banner, format!("vm={}", vm_id(&pod)));
    assert_eq!(tcp_echo, "tcp too\n");
    let mut session = TcpStream::connect(("127.0.0.1", tcp_listen)).await.unwrap();
    session.write_all(b"x").await.unwrap();
    eventually("open-connections 2", Duration::from_secs(30), || async {
        (open_connections(&leases, "web-0").await.as_deref() == Some("2")).then_some(())
    })
    .await;
    drop(ws);
    drop(session);
    eventually("open-connections 0", Duration::from_secs(30), || async {
        (open_connections(&leases, "web-0").await.as_deref() == Some("0")).then_some(())
    })
    .await;
}
