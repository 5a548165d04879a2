//! End-to-end: the status an operator reads (O2), per-CR timeouts (O3) and the phase
//! gauges (O4), read back through the real apiserver, and `kubectl wait` for both desires.

use testkit::cluster;
use testkit::env;
use testkit::product;

use cocoon_hibernation::api::conditions::{self, PROGRESSING, READY};
use cocoon_hibernation::api::{CocoonHibernation, CocoonHibernationStatus, Desire, Phase};
use env::{LONG, Setup, condition_status, setup};
use kube::api::PostParams;
use product::{eventually, wait_phase};

fn status(cr: &CocoonHibernation) -> CocoonHibernationStatus {
    cr.status.clone().unwrap_or_default()
}

fn progressing_reason(cr: &CocoonHibernation) -> Option<String> {
    conditions::find(&status(cr).conditions, PROGRESSING).map(|c| c.reason.clone())
}

fn kubectl(env: &env::Env, args: &[&str]) -> (bool, String) {
    let mut all = vec!["-n", env.ns.as_str()];
    all.extend_from_slice(args);
    let out = cluster::cluster().kubectl(&all);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// O2 O4 H3 W2: `kubectl wait --for=condition=Ready` ends at each desire's terminal phase,
/// never on the previous desire's answer; the status carries the digest, timestamps,
/// attempts and a settled Progressing; `kubectl get -o wide` shows Reason and Digest; the
/// phase gauge counts the CR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_o2_o4_status_and_kubectl_wait_for_both_desires() {
    let env = setup("status", Setup::default()).await;
    env.pod("web-0").await;
    let vm = env.vm("web-0");
    product::create_cr(&env.crs, "web-0", "web-0", Desire::Hibernate).await;
    let (ok, out) = kubectl(
        &env,
        &["wait", "ch/web-0", "--for=condition=Ready", "--timeout=90s"],
    );
    assert!(ok, "kubectl wait (hibernate): {out}");
    let cr = env.crs.get("web-0").await.unwrap();
    assert_eq!(cr.phase(), Some(Phase::Hibernated), "{:?}", cr.status);
    let s = status(&cr);
    assert!(s.hibernated_at.is_some());
    assert_eq!(s.attempts, Some(1));
    assert_eq!(progressing_reason(&cr).as_deref(), Some("Done"));
    assert_eq!(condition_status(&cr, PROGRESSING).as_deref(), Some("False"));
    let digest = s
        .snapshot
        .and_then(|snap| snap.digest)
        .expect("status.snapshot.digest");
    assert!(digest.starts_with("sha256:"), "{digest}");
    assert!(env.tag_exists(&vm).await);

    let (ok, out) = kubectl(&env, &["get", "ch", "web-0", "-o", "wide"]);
    assert!(ok, "{out}");
    let header = out.lines().next().unwrap_or_default();
    for column in ["POD", "DESIRE", "PHASE", "REASON", "VM", "AGE", "DIGEST"] {
        assert!(header.contains(column), "{column} missing: {out}");
    }
    assert!(out.contains(&digest), "{out}");

    let metrics_ok = eventually("the phase gauge counts the CR", LONG, || async {
        let text = env.product.get("/metrics").ok()?.1;
        text.contains(r#"cocoon_hibernation_crs{phase="Hibernated"} 1"#)
            .then_some(text)
    })
    .await;
    assert!(metrics_ok.contains("cocoon_hibernation_crs_overdue 0"));

    // Flip, then wait at once: Ready still says True for the old generation, which
    // kubectl wait must not take.
    product::set_desire(&env.crs, "web-0", Desire::Wake).await;
    let (ok, out) = kubectl(
        &env,
        &["wait", "ch/web-0", "--for=condition=Ready", "--timeout=90s"],
    );
    assert!(ok, "kubectl wait (wake): {out}");
    let cr = env.crs.get("web-0").await.unwrap();
    assert_eq!(cr.phase(), Some(Phase::Active), "{:?}", cr.status);
    let s = status(&cr);
    assert!(s.woken_at.is_some());
    assert_eq!(s.attempts, Some(1), "a flipped desire starts at 1");
    assert_eq!(s.snapshot, None, "the tag is gone, and so is its digest");
    assert_eq!(condition_status(&cr, READY).as_deref(), Some("True"));
    // The metric is recorded once the status write returns, which kubectl may see first.
    eventually("the wake's reaction is recorded", LONG, || async {
        let text = env.product.get("/metrics").ok()?.1;
        text.contains(r#"cocoon_hibernation_reaction_seconds_count{transition="wake"} 1"#)
            .then_some(())
    })
    .await;
}

/// O3 H5 O2 F2: a CR's own 3s hibernate timeout trips long before the flag's 60s; the
/// failure stays in lastFailure after the retry, and attempts counts that retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_o3_o2_per_cr_timeout_trips_first_and_last_failure_survives_the_retry() {
    let env = setup("cr-timeout", Setup::default()).await;
    env.pod("web-0").await;
    env.sim.knobs.set_never_complete(true);
    let mut cr = product::new_cr("web-0", "web-0", Desire::Hibernate);
    cr.spec.hibernate_timeout = Some("3s".into());
    env.crs.create(&PostParams::default(), &cr).await.unwrap();
    let mut seen = Vec::new();
    let failed = wait_phase(&env.crs, "web-0", Phase::Failed, LONG, &mut seen).await;
    let failure = status(&failed).last_failure.expect("status.lastFailure");
    assert_eq!(failure.reason, "HibernateTimedOut");
    assert!(failure.message.contains("3s"), "{}", failure.message);
    assert_eq!(
        progressing_reason(&failed).as_deref(),
        Some("HibernateTimedOut")
    );

    // F2 retries on the next pass: Failed is gone, the failure is not.
    let retried = eventually("the retry", LONG, || async {
        let cr = env.crs.get("web-0").await.ok()?;
        (status(&cr).attempts >= Some(2)).then_some(cr)
    })
    .await;
    assert_eq!(
        status(&retried).last_failure.map(|f| f.reason).as_deref(),
        Some("HibernateTimedOut")
    );
    env.sim.knobs.set_never_complete(false);
}

/// O3: the CRD refuses a negative, oversized or malformed timeout, and takes a good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_o3_crd_refuses_negative_or_oversized_timeouts() {
    let env = setup("cr-timeout-crd", Setup::default()).await;
    for (i, bad) in ["-5m", "25h", "soon", "0s"].iter().enumerate() {
        let name = format!("bad-{i}");
        let mut cr = product::new_cr(&name, &name, Desire::Hibernate);
        cr.spec.wake_timeout = Some((*bad).into());
        let err = env
            .crs
            .create(&PostParams::default(), &cr)
            .await
            .expect_err(&format!("wakeTimeout {bad} must be refused"));
        assert!(err.to_string().contains("wakeTimeout"), "{bad}: {err}");
    }
    let mut cr = product::new_cr("good", "good", Desire::Hibernate);
    cr.spec.hibernate_timeout = Some("1h30m".into());
    env.crs.create(&PostParams::default(), &cr).await.unwrap();
}
