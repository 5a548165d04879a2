//! kubeconform on every render, with schemas made offline from the apiserver and the CRD.

use super::{Check, EXAMPLE_CR, OPTIONAL, TAG, captured};
use crate::chart::{log, mkdir, read, run_quiet_stdout, write};
use crate::cmd::{self, Error, Result, fail};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

impl Check<'_> {
    /// The kubeconform schemas: built-in kinds from the apiserver's OpenAPI (cached per
    /// server version and converter), the CRD's from the chart.
    fn schemas(&self) -> Result<(PathBuf, PathBuf)> {
        let converter = self.root.join("hack/chart-schemas.py");
        let bytes =
            fs::read(&converter).map_err(|e| Error(format!("{}: {e}", converter.display())))?;
        let key = &crate::chart::sha256_hex(&bytes)[..12];
        let base = crate::chart::cache_root()?.join("kubeconform-schemas");
        let builtin = base.join(format!("{}-{key}", self.server_version));
        if builtin.join(".complete").is_file() {
            log(
                TAG,
                format!("built-in schemas: {} (cached)", builtin.display()),
            );
        } else {
            log(
                TAG,
                format!(
                    "generating built-in schemas from {}'s /openapi/v2",
                    self.server_version
                ),
            );
            // Older converter versions.
            let prefix = format!("{}-", self.server_version);
            for e in fs::read_dir(&base).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
            mkdir(&builtin)?;
            let swagger = self.w("swagger.json");
            write(
                &swagger,
                cmd::output(self.tools.kubectl().args(["get", "--raw", "/openapi/v2"]))?,
            )?;
            let n = cmd::output(
                Command::new("python3")
                    .arg(&converter)
                    .arg("swagger")
                    .arg(&swagger)
                    .arg(&builtin),
            )?;
            log(
                TAG,
                format!("{} schemas in {}", n.trim(), builtin.display()),
            );
            write(&builtin.join(".complete"), "")?;
        }
        let crd = self.w("crd-schemas");
        run_quiet_stdout(
            Command::new("python3")
                .arg(&converter)
                .arg("crd")
                .arg(&self.crd_file)
                .arg(&crd),
        )?;
        if !crd.join("cocoonhibernation-cocoonset-v1.json").is_file() {
            return fail("no CocoonHibernation schema generated");
        }
        Ok((builtin, crd))
    }

    fn kubeconform(&self, schemas: &(PathBuf, PathBuf), file: &Path) -> Command {
        let mut c = self.tools.tool("kubeconform");
        c.args(["-strict", "-summary", "-exit-on-error=false"])
            .args(["-kubernetes-version", &self.kube_version]);
        for dir in [&schemas.0, &schemas.1] {
            c.arg("-schema-location").arg(format!(
                "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
                dir.display()
            ));
        }
        c.args(["-skip", "Certificate,Issuer,ServiceMonitor,PrometheusRule"])
            .arg(file);
        c
    }

    pub(super) fn validate(&self) -> Result<()> {
        let schemas = self.schemas()?;
        let [ff, full] = self.full();
        let mut all: Vec<&dyn AsRef<OsStr>> = vec![&"--include-crds", &ff, &full];
        all.extend(OPTIONAL.iter().map(|a| a as &dyn AsRef<OsStr>));
        self.render("self-signed", "self-signed.yaml", &all)?;
        self.render("cert-manager", "cert-manager.yaml", &all)?;
        // One replica without election (strategy Recreate) and without the S3 policy, on
        // purpose.
        let single = self.render(
            "self-signed",
            "single.yaml",
            &[
                &"--set",
                &"replicas=1",
                &"--set",
                &"leaderElection.enabled=false",
                &"--set",
                &"log.format=json",
                &"--set",
                &"registry.plainHTTP=true",
                &"--set",
                &"vmIdentityPolicy.enabled=false",
            ],
        )?;
        let single = read(&single)?;
        if !single.lines().any(|l| l == "    type: Recreate") {
            return fail("no strategy Recreate without leader election");
        }
        if single
            .lines()
            .any(|l| l.starts_with("kind: ValidatingAdmissionPolicy"))
        {
            return fail("vmIdentityPolicy.enabled=false still rendered the policy");
        }
        let kitchen = self.values.join("kitchen-sink.yaml");
        self.render("self-signed", "kitchen-sink.yaml", &[&"-f", &kitchen])?;
        let vm_identity = self.values.join("vm-identity.yaml");
        self.render("self-signed", "vm-identity.yaml", &[&"-f", &vm_identity])?;
        write(&self.w("example-cr.yaml"), EXAMPLE_CR)?;
        for f in [
            "self-signed",
            "cert-manager",
            "single",
            "kitchen-sink",
            "vm-identity",
            "example-cr",
        ] {
            log(TAG, format!("kubeconform {f}"));
            run_quiet_stdout(&mut self.kubeconform(&schemas, &self.w(&format!("{f}.yaml"))))?;
        }
        // The schemas must bite: unknown fields and bad enums are errors.
        write(
            &self.w("bad-cr.yaml"),
            EXAMPLE_CR.replace("desire: Hibernate", "desire: Sleep"),
        )?;
        let deploy: String = read(&self.w("self-signed.yaml"))?
            .lines()
            .map(|l| {
                if l == "  replicas: 2" {
                    "  replicas: 2\n  replicaz: 2\n".to_string()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        if !deploy.contains("replicaz") {
            return fail("could not build the negative Deployment sample");
        }
        write(&self.w("bad-deploy.yaml"), deploy)?;
        for f in ["bad-cr", "bad-deploy"] {
            let out = captured(&mut self.kubeconform(&schemas, &self.w(&format!("{f}.yaml"))))?;
            if out.status.success() {
                eprint!("{}", String::from_utf8_lossy(&out.stdout));
                return fail(format!(
                    "kubeconform accepted {f}.yaml; the schemas are not being applied"
                ));
            }
        }
        log(TAG, "negative samples rejected, as they should be");
        Ok(())
    }
}
