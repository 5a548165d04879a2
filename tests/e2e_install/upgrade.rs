//! The upgrade from the previous release (S11): the chart and image of the commit
//! `cargo xtask old-release` pins are installed first; the suite then upgrades to this tree as
//! docs/install.md says (CRDs with `kubectl apply --server-side --force-conflicts` on the
//! CRDs Helm installed, then `helm upgrade --reset-then-reuse-values`), and again with
//! `helm upgrade --reuse-values`, each under load (steps::upgrade). After each, the
//! release's manifest must equal what the documented command renders from the same user
//! values: a default of the new chart that `--reuse-values` dropped would differ there.

use std::path::PathBuf;
use std::process::Command;

use crate::world::{RELEASE, RELEASE_NS, Result, World};

/// The previous release, as `cargo xtask install-test` hands it over.
pub struct OldRelease {
    /// Short commit, for the summary line.
    pub commit: String,
    pub chart: PathBuf,
    /// Only the image: the old build, pinned by digest.
    pub image_values: PathBuf,
}

fn required(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| {
        format!(
            "{name} is not set: run this suite with `make install-test` (cargo xtask old-release)"
        )
        .into()
    })
}

impl OldRelease {
    pub fn from_env(world: &World) -> Result<Self> {
        let commit = required("COCOON_UPGRADE_FROM")?;
        let chart = PathBuf::from(required("COCOON_OLD_CHART")?);
        let image = required("COCOON_OLD_IMAGE_REF")?;
        let (repo_tag, digest) = image
            .split_once('@')
            .ok_or_else(|| format!("COCOON_OLD_IMAGE_REF {image} has no @sha256: digest"))?;
        let repository = match repo_tag.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => repo_tag,
        };
        let image_values = world.values.with_file_name("old-image-values.yaml");
        std::fs::write(
            &image_values,
            format!("image:\n  repository: {repository}\n  digest: \"{digest}\"\n"),
        )?;
        Ok(OldRelease {
            commit: commit.chars().take(7).collect(),
            chart,
            image_values,
        })
    }

    /// `helm install` of the old chart with the user's values and the old image.
    pub fn install(&self, world: &World) -> Result<()> {
        let chart = self.chart.to_string_lossy().into_owned();
        let values = world.values.to_string_lossy().into_owned();
        let image = self.image_values.to_string_lossy().into_owned();
        world.helm(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "-f",
            &values,
            "-f",
            &image,
            "--wait",
            "--timeout",
            "180s",
        ])?;
        Ok(())
    }
}

fn kubectl(world: &World, args: &[&str]) -> Result<String> {
    world.kubectl_in(&repo(), args)
}

fn repo() -> PathBuf {
    testkit::repo_root()
}

fn read(rel: &str) -> Result<String> {
    std::fs::read_to_string(repo().join(rel)).map_err(|e| format!("{rel}: {e}").into())
}

/// The upgrade's two commands as docs/install.md writes them (its `### Upgrade` block):
/// the suite runs these words, so the docs cannot drift from what was tested. NOTES.txt
/// and operations.md must say the same.
pub struct Documented {
    pub crds: Vec<String>,
    pub release: Vec<String>,
}

impl Documented {
    pub fn read() -> Result<Self> {
        let install = read("docs/install.md")?;
        let block = install
            .split_once("### Upgrade\n")
            .and_then(|(_, rest)| rest.split_once("```sh\n"))
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(block, _)| block)
            .ok_or("docs/install.md has no ```sh block under ### Upgrade")?;
        let line = |program: &str| {
            block
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with(program))
                .map(|l| l.split_whitespace().skip(1).map(str::to_owned).collect())
                .ok_or_else(|| format!("docs/install.md's upgrade block has no {program} line"))
        };
        let doc = Documented {
            crds: line("kubectl ")?,
            release: line("helm ")?,
        };
        let crd_line = format!("kubectl {}", doc.crds.join(" "));
        let flag = doc
            .release
            .iter()
            .find(|a| a.ends_with("reuse-values"))
            .ok_or("docs/install.md's helm upgrade names no values flag")?;
        let notes = read("charts/cocoon-hibernation/templates/NOTES.txt")?;
        let ops = read("docs/operations.md")?;
        let ops = ops.split_whitespace().collect::<Vec<_>>().join(" ");
        let checks = [
            ("NOTES.txt", notes.contains(&crd_line), &crd_line),
            ("NOTES.txt", notes.contains(flag.as_str()), flag),
            ("docs/operations.md", ops.contains(&crd_line), &crd_line),
            ("docs/operations.md", ops.contains(flag.as_str()), flag),
        ];
        for (file, ok, what) in checks {
            if !ok {
                return Err(format!("{file} does not say `{what}` as docs/install.md does").into());
            }
        }
        Ok(doc)
    }
}

/// The CRDs' field managers, one line per CRD.
fn crd_managers(world: &World) -> Result<String> {
    kubectl(
        world,
        &[
            "get",
            "crd",
            "cocoonhibernations.cocoonset.cocoonstack.io",
            "cocoonhibernationschedules.cocoonset.cocoonstack.io",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}: {.metadata.managedFields[*].manager}{\"\\n\"}{end}",
        ],
    )
}

/// Step 1 of docs/install.md's upgrade, word for word, on the CRDs the old chart's
/// `helm install` created (field manager `helm`); then the served CRDs equal crds/.
pub fn crd_upgrade(world: &World, doc: &Documented) -> Result<()> {
    let before = crd_managers(world)?;
    println!(
        "  CRD managers before: {}",
        before.trim().replace('\n', "; ")
    );
    if before.lines().count() != 2 || !before.lines().all(|l| l.contains("helm")) {
        return Err(format!("the old release's CRDs are not Helm's: {before}").into());
    }
    let args: Vec<&str> = doc.crds.iter().map(String::as_str).collect();
    println!("  kubectl {}", args.join(" "));
    kubectl(world, &args)?;
    // `kubectl diff` exits 0 only when the apiserver holds exactly what the files say.
    let crds = repo().join("charts/cocoon-hibernation/crds");
    let crds = crds.to_string_lossy();
    kubectl(
        world,
        &["diff", "--server-side", "--force-conflicts", "-f", &crds],
    )
    .map_err(|e| format!("the served CRDs differ from crds/ after the upgrade: {e}"))?;
    println!(
        "  CRD managers after: {}",
        crd_managers(world)?.trim().replace('\n', "; ")
    );
    Ok(())
}

fn chart(world: &World) -> String {
    world.chart.to_string_lossy().into_owned()
}

/// Step 2 of docs/install.md's upgrade (`--reset-then-reuse-values`) word for word, with
/// the user's values file now naming the new image, and `--wait` for the suite.
pub fn documented_upgrade(world: &World, doc: &Documented) -> Result<()> {
    let (chart, values) = (chart(world), world.values.to_string_lossy().into_owned());
    let mut args: Vec<&str> = doc
        .release
        .iter()
        .map(|a| match a.as_str() {
            "charts/cocoon-hibernation" => chart.as_str(),
            a => a,
        })
        .collect();
    if args[..2] != ["upgrade", RELEASE] || !args.contains(&RELEASE_NS) {
        return Err(format!(
            "docs/install.md's helm line is not an upgrade of {RELEASE_NS}/{RELEASE}: {args:?}"
        )
        .into());
    }
    println!("  helm {} -f <values> --wait", args.join(" "));
    args.extend_from_slice(&["-f", &values, "--wait", "--timeout", "180s"]);
    world.helm(&args)?;
    Ok(())
}

/// `helm upgrade --reuse-values` with `extra` (what the user changes).
pub fn reuse_values_upgrade(world: &World, extra: &[&str]) -> Result<()> {
    let chart = chart(world);
    let mut args = vec![
        "upgrade",
        RELEASE,
        &chart,
        "-n",
        RELEASE_NS,
        "--reuse-values",
        "--wait",
        "--timeout",
        "180s",
    ];
    args.extend_from_slice(extra);
    world.helm(&args)?;
    Ok(())
}

/// What `helm upgrade <flag> <extra> --dry-run=server` would install now (lookups against
/// the apiserver, so the webhook's TLS Secret is read back as a real upgrade does).
fn render(world: &World, flag: &str, extra: &[&str]) -> Result<String> {
    render_chart(world, &chart(world), flag, extra)
}

fn render_chart(world: &World, chart: &str, flag: &str, extra: &[&str]) -> Result<String> {
    let mut args = vec![
        "upgrade",
        RELEASE,
        chart,
        "-n",
        RELEASE_NS,
        flag,
        "--dry-run=server",
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let out: serde_json::Value = serde_json::from_str(&world.helm(&args)?)?;
    out.get("manifest")
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .ok_or_else(|| "helm --dry-run=server -o json printed no manifest".into())
}

/// The lines of `got` and `want` that are not in the other, for the error.
fn differences(got: &str, want: &str) -> String {
    let only = |a: &str, b: &str, sign: &str| {
        let b: std::collections::BTreeSet<&str> = b.lines().collect();
        a.lines()
            .filter(|l| !b.contains(l))
            .map(|l| format!("  {sign} {l}"))
            .collect::<Vec<_>>()
    };
    let mut lines = only(got, want, "-");
    lines.extend(only(want, got, "+"));
    lines.truncate(40);
    lines.join("\n")
}

fn same_manifest(what: &str, got: &str, want: &str) -> Result<()> {
    if got == want {
        println!("  {what}: the manifest equals the documented command's render");
        return Ok(());
    }
    Err(format!(
        "{what}: a default of the new chart is not in force; \
         (-) {what}, (+) the documented command's render:\n{}",
        differences(got, want)
    )
    .into())
}

/// While the old release is installed: `--reuse-values` would render exactly what the
/// documented `--reset-then-reuse-values` does, from the same user values (the new image).
pub fn reuse_values_from_old_renders_defaults(world: &World) -> Result<()> {
    let values = world.values.to_string_lossy().into_owned();
    let extra = ["-f", values.as_str()];
    let reuse = render(world, "--reuse-values", &extra)?;
    let documented = render(world, "--reset-then-reuse-values", &extra)?;
    same_manifest("--reuse-values from the old release", &reuse, &documented)?;
    a_dropped_default_is_seen(world, &extra)
}

/// The comparison's own control: a copy of the new chart with one default added that no
/// template falls back for. From the old release, `--reuse-values` renders it absent;
/// the comparison must see that, or it could not see a real one either.
fn a_dropped_default_is_seen(world: &World, extra: &[&str]) -> Result<()> {
    let probe = world.values.with_file_name("probe-chart");
    if probe.exists() {
        std::fs::remove_dir_all(&probe)?;
    }
    let out = Command::new("cp")
        .arg("-r")
        .arg(&world.chart)
        .arg(&probe)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "cp -r of the chart: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    std::fs::write(
        probe.join("templates/s11-probe.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s11-probe\n  namespace: {{ .Release.Namespace }}\n\
         data:\n  value: {{ .Values.s11Probe | default \"absent\" | quote }}\n",
    )?;
    let values = probe.join("values.yaml");
    let text = std::fs::read_to_string(&values)?;
    std::fs::write(&values, format!("{text}\ns11Probe: present\n"))?;
    let schema_path = probe.join("values.schema.json");
    let mut schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path)?)?;
    if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        props.insert("s11Probe".into(), serde_json::json!({ "type": "string" }));
    }
    std::fs::write(&schema_path, serde_json::to_string(&schema)?)?;
    let chart = probe.to_string_lossy().into_owned();
    let reuse = render_chart(world, &chart, "--reuse-values", extra)?;
    let documented = render_chart(world, &chart, "--reset-then-reuse-values", extra)?;
    match same_manifest("control", &reuse, &documented) {
        Ok(()) => {
            Err("control: a default --reuse-values drops was not seen by the comparison".into())
        }
        Err(e) if e.to_string().contains("value: \"absent\"") => {
            println!(
                "  control: a default added by the chart and dropped by --reuse-values is seen"
            );
            Ok(())
        }
        Err(e) => Err(format!("control: the comparison saw another difference: {e}").into()),
    }
}

/// After an upgrade: the release's manifest equals the documented command's render of
/// the release's own user values.
pub fn defaults_in_force(world: &World, what: &str) -> Result<()> {
    let got = world.helm(&["get", "manifest", RELEASE, "-n", RELEASE_NS])?;
    let want = render(world, "--reset-then-reuse-values", &[])?;
    same_manifest(what, got.trim_end(), want.trim_end())
}
