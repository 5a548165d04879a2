//! What the benchmark observes and creates: watches that timestamp every CR phase change
//! and every simulator completion, realistic pods, product metrics and memory.

use cocoon_hibernation::api::annotations::{
    COCOONSET_GENERATION, LIFECYCLE_STATE, PodView, VM_ID, VM_NAME,
};
use cocoon_hibernation::api::conditions::READY;
use cocoon_hibernation::api::{CocoonHibernation, CocoonHibernationStatus, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

pub const PHASES: [Phase; 6] = Phase::ALL;

pub fn phase_index(p: Option<Phase>) -> usize {
    p.and_then(|p| PHASES.iter().position(|x| *x == p))
        .unwrap_or(PHASES.len())
}

/// How a CR status change seen by the watch differs from the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusChange {
    /// The phase moved.
    Phase,
    /// Same phase, same condition types: only Ready's reason or message changed.
    Reason,
    /// Anything else (a condition added or removed, vmName, observedGeneration).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDone {
    /// vk's lifecycle patch: hibernated for the round, VMID cleared (what H3 reads).
    Hibernated,
    /// vk's Running report after a new VMID (what W2 reads).
    Woken,
}

#[derive(Default)]
pub struct Seen {
    pub phase: HashMap<String, Option<Phase>>,
    status: HashMap<String, Option<CocoonHibernationStatus>>,
    pub transitions: Vec<(Instant, String, Phase)>,
    pub status_changes: Vec<(Instant, String, StatusChange)>,
    pod_state: HashMap<String, (bool, bool)>,
    pub pod_done: Vec<(Instant, String, PodDone)>,
}

fn classify(old: &CocoonHibernationStatus, new: &CocoonHibernationStatus) -> StatusChange {
    if old.phase != new.phase {
        return StatusChange::Phase;
    }
    let types = |s: &CocoonHibernationStatus| {
        let mut t: Vec<String> = s.conditions.iter().map(|c| c.type_.clone()).collect();
        t.sort();
        t
    };
    let ready = |s: &CocoonHibernationStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let same_rest = old.vm_name == new.vm_name
        && old.observed_generation == new.observed_generation
        && types(old) == types(new);
    let others_same = |s: &CocoonHibernationStatus| {
        s.conditions
            .iter()
            .filter(|c| c.type_ != READY)
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect::<Vec<_>>()
    };
    if same_rest && others_same(old) == others_same(new) && ready(old) != ready(new) {
        StatusChange::Reason
    } else {
        StatusChange::Other
    }
}

fn counts(s: &Seen, names: &[String]) -> [usize; 7] {
    let mut c = [0; 7];
    for n in names {
        c[phase_index(s.phase.get(n).copied().flatten())] += 1;
    }
    c
}

/// (ms since the start, counts by phase index).
pub type Sample = (f64, [usize; 7]);

/// Phase counts over time, sampled in the background.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Stops sampling and returns the samples.
    pub fn finish(self) -> Vec<Sample> {
        self.task.abort();
        self.samples.lock().expect("samples lock").clone()
    }
}

/// Watches of CRs and pods in one namespace, recording what they see with timestamps.
pub struct Watches {
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watches {
    pub fn start(client: &kube::Client, ns: &str, pods: bool) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut tasks = Vec::new();
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
        let s = seen.clone();
        tasks.push(tokio::spawn(async move {
            let stream = watcher(crs, watcher::Config::default().any_semantic());
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let now = Instant::now();
                let obj = match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let name = obj.metadata.name.clone().unwrap_or_default();
                let mut s = s.lock().expect("seen lock");
                let new_phase = obj.phase();
                let old_phase = s.phase.insert(name.clone(), new_phase).flatten();
                if let Some(p) = new_phase
                    && old_phase != Some(p)
                {
                    s.transitions.push((now, name.clone(), p));
                }
                let old = s.status.insert(name.clone(), obj.status.clone()).flatten();
                if let Some(new) = &obj.status
                    && old.as_ref() != Some(new)
                {
                    let change = classify(&old.unwrap_or_default(), new);
                    s.status_changes.push((now, name, change));
                }
            }
        }));
        if pods {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            let s = seen.clone();
            tasks.push(tokio::spawn(async move {
                let stream = watcher(pods, watcher::Config::default().any_semantic());
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    let now = Instant::now();
                    let pod = match ev {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                        _ => continue,
                    };
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let v = PodView::of(&pod);
                    let hib = v.lifecycle_hibernated_for_round() && v.vm_id.is_none();
                    let woke = v.woken();
                    let mut s = s.lock().expect("seen lock");
                    let (was_hib, was_woke) = s
                        .pod_state
                        .insert(name.clone(), (hib, woke))
                        .unwrap_or((false, true));
                    if hib && !was_hib {
                        s.pod_done.push((now, name.clone(), PodDone::Hibernated));
                    }
                    if woke && !was_woke {
                        s.pod_done.push((now, name, PodDone::Woken));
                    }
                }
            }));
        }
        Self { seen, tasks }
    }

    /// Counts of `names` by phase index (see [`PHASES`]; the last slot is "no phase").
    pub fn counts(&self, names: &[String]) -> [usize; 7] {
        counts(&self.seen.lock().expect("seen lock"), names)
    }

    /// Samples [`Self::counts`] every `every` (ms since `t0`) until the task is aborted.
    pub fn sampler(&self, names: Vec<String>, t0: Instant, every: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (seen, out) = (self.seen.clone(), samples.clone());
        let task = tokio::spawn(async move {
            loop {
                let c = counts(&seen.lock().expect("seen lock"), &names);
                out.lock()
                    .expect("samples lock")
                    .push((t0.elapsed().as_secs_f64() * 1000.0, c));
                tokio::time::sleep(every).await;
            }
        });
        Sampler { samples, task }
    }

    /// Waits until every name is in `want`; samples phase counts every `every` into
    /// `timeline` (ms since `t0`). Panics after `timeout`.
    pub async fn wait_all(
        &self,
        names: &[String],
        want: Phase,
        timeout: Duration,
        t0: Instant,
        every: Duration,
        timeline: &mut Vec<(f64, [usize; 7])>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.counts(names);
            timeline.push((t0.elapsed().as_secs_f64() * 1000.0, c));
            if c[phase_index(Some(want))] == names.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not all {} CRs reached {want} within {timeout:?}: counts {c:?} \
                 (Pending, Hibernating, Hibernated, Waking, Active, Failed, none)",
                names.len()
            );
            tokio::time::sleep(every).await;
        }
    }

    /// When each name first reached `want` at or after `since`.
    pub fn reached(
        &self,
        names: &[String],
        want: Phase,
        since: Instant,
    ) -> HashMap<String, Instant> {
        let s = self.seen.lock().expect("seen lock");
        let mut out = HashMap::new();
        for (t, n, p) in &s.transitions {
            if *p == want && *t >= since && names.contains(n) {
                out.entry(n.clone()).or_insert(*t);
            }
        }
        out
    }

    /// When each pod first reported `what` at or after `since`.
    pub fn pod_done(&self, what: PodDone, since: Instant) -> HashMap<String, Instant> {
        let s = self.seen.lock().expect("seen lock");
        let mut out = HashMap::new();
        for (t, n, d) in &s.pod_done {
            if *d == what && *t >= since {
                out.entry(n.clone()).or_insert(*t);
            }
        }
        out
    }

    /// Status changes of `names` between two instants, by kind.
    pub fn status_changes(&self, names: &[String], from: Instant, to: Instant) -> [usize; 3] {
        let s = self.seen.lock().expect("seen lock");
        let mut c = [0; 3];
        for (t, n, k) in &s.status_changes {
            if *t >= from && *t <= to && names.contains(n) {
                c[match k {
                    StatusChange::Phase => 0,
                    StatusChange::Reason => 1,
                    StatusChange::Other => 2,
                }] += 1;
            }
        }
        c
    }
}

/// Runs `f` over `items` with at most `concurrency` in flight.
pub async fn for_each_concurrent<T, F, Fut>(items: Vec<T>, concurrency: usize, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(items)
        .map(f)
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
}

/// Retries a write a few times on transient errors (a loaded apiserver may time out).
pub async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut last = None;
    for attempt in 0..5 {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
    panic!("{what}: {:?}", last);
}

// ---------------------------------------------------------------------------------------
// Realistic pods for the cache-memory run.

/// A VM-backed pod as a real workload looks: three containers with env, resources,
/// probes and mounts, labels and annotations; about 8 KB of JSON. Running (VMID, ready).
pub fn realistic_pod(name: &str, vm: &str) -> Pod {
    let container = |cname: &str, image: &str| {
        let env: Vec<serde_json::Value> = (0..10)
            .map(|i| {
                serde_json::json!({
                    "name": format!("{}_SETTING_{i:02}", cname.to_uppercase()),
                    "value": format!("value-{i:02}-for-{cname}-in-{name}-abcdefgh")
                })
            })
            .collect();
        serde_json::json!({
            "name": cname,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "args": ["--config=/etc/app/config.yaml", "--log-level=info", "--port=8080"],
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "env": env,
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                          "limits": {"cpu": "1", "memory": "1Gi"}},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true},
                             {"name": "data", "mountPath": "/var/lib/app"}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080},
                               "periodSeconds": 10, "timeoutSeconds": 2},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080},
                              "periodSeconds": 20, "failureThreshold": 3},
            "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]}}
        })
    };
    let vm_id = format!("vmid-{:016x}", crate::cluster::random_u64());
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "sandbox",
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/part-of": "cocoonset-bench",
                "cocoonset.cocoonstack.io/set": "bench",
                "pod-template-hash": "5d8f7c9b6d"
            },
            "annotations": {
                VM_NAME: vm,
                COCOONSET_GENERATION: "1",
                VM_ID: vm_id,
                LIFECYCLE_STATE: "ready",
                "cocoonset.cocoonstack.io/template": "sandbox-python-3.12-large",
                "prometheus.io/scrape": "true"
            }
        },
        "spec": {
            "containers": [
                container("vm", "registry.example.com/cocoon/vm:1.4.2"),
                container("agent", "registry.example.com/cocoon/agent:0.9.1"),
                container("proxy", "registry.example.com/cocoon/proxy:2.1.0")
            ],
            "volumes": [{"name": "config", "configMap": {"name": "sandbox-config"}},
                        {"name": "data", "emptyDir": {"sizeLimit": "10Gi"}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": "default",
            "tolerations": [{"key": "cocoonstack.io/vm", "operator": "Exists", "effect": "NoSchedule"}]
        }
    }))
    .expect("realistic pod")
}

/// Every container Running, as vk reports a live VM.
pub fn running_status(pod: &Pod) -> serde_json::Value {
    let vm_id = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VM_ID))
        .cloned()
        .unwrap_or_default();
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let statuses: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name, "image": c.image, "imageID": "",
                "containerID": format!("cocoon://{vm_id}/{}", c.name),
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            })
        })
        .collect();
    serde_json::json!({ "status": {
        "phase": "Running",
        "podIP": "10.0.0.17",
        "conditions": [
            { "type": "Ready", "status": "True", "lastTransitionTime": now },
            { "type": "ContainersReady", "status": "True", "lastTransitionTime": now },
        ],
        "containerStatuses": statuses,
    }})
}

/// Creates a realistic running pod (create, then the status write vk would make); returns
/// its JSON size without managedFields.
pub async fn create_realistic_pod(api: &Api<Pod>, name: &str, vm: &str) -> usize {
    let pod = realistic_pod(name, vm);
    let pp = PostParams::default();
    let created = retry(&format!("create pod {name}"), || api.create(&pp, &pod)).await;
    let status = running_status(&created);
    let (params, patch) = (PatchParams::default(), Patch::Merge(&status));
    let mut done = retry(&format!("pod {name} status"), || {
        api.patch_status(name, &params, &patch)
    })
    .await;
    // The size a cache holds: the product drops managedFields.
    done.metadata.managed_fields = None;
    serde_json::to_vec(&done).map_or(0, |v| v.len())
}

/// Deletes every pod of a namespace at once (unscheduled pods go immediately).
pub async fn delete_pods(client: &kube::Client, ns: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = kube::api::DeleteParams::default().grace_period(0);
    let _ = api.delete_collection(&dp, &Default::default()).await;
}

// ---------------------------------------------------------------------------------------
// Product observation.

/// Every sample of the product's /metrics, keyed by `name{labels}`.
pub fn scrape(product: &crate::product::Product) -> HashMap<String, f64> {
    let Ok((200, body)) = product.get("/metrics") else {
        return HashMap::new();
    };
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// `after - before` of every sample whose key starts with `prefix`, by label set.
pub fn delta(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    prefix: &str,
) -> std::collections::BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| {
            let labels = k[prefix.len()..].to_owned();
            (labels, v - before.get(k).copied().unwrap_or(0.0))
        })
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

/// The `q` quantile of a Prometheus histogram from its `_bucket` deltas (keys
/// `{le="…",…}`, every label set summed): the upper bound of the bucket it falls in.
pub fn histogram_quantile(
    buckets: &std::collections::BTreeMap<String, f64>,
    q: f64,
) -> Option<f64> {
    let mut by_le: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for (labels, count) in buckets {
        let le = labels.split("le=\"").nth(1)?.split('"').next()?;
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        by_le.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += count;
    }
    let mut cumulative: Vec<(f64, f64)> = by_le.into_values().collect();
    cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = cumulative.last()?.1;
    cumulative
        .into_iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| le)
}

pub const REGISTRY_CALLS: &str = "cocoon_hibernation_registry_calls_total";
pub const RECONCILE_PASSES: &str = "cocoon_hibernation_reconcile_passes_total";
pub const RECONCILE_ERRORS: &str = "cocoon_hibernation_reconcile_errors_total";

/// (VmRSS, VmHWM) in KiB of a process.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Lists every CR of a namespace in pages (for counting without a watch).
pub async fn count_crs(api: &Api<CocoonHibernation>) -> usize {
    let mut n = 0;
    let mut lp = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.expect("list CRs");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return n,
        }
    }
}
