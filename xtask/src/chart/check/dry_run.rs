//! The server-side dry run on the real apiserver, and the self-signed certificate's
//! reuse and renewal through `lookup`.

use super::text::*;
use super::{CRD_NAME, Check, FIELD_MANAGER, OPTIONAL, RELEASE, TAG};
use crate::chart::{log, read, run_quiet_stdout, write};
use crate::cmd::{self, Result, fail};
use std::ffi::OsStr;
use std::path::Path;

impl Check<'_> {
    /// A server-side dry run against the real apiserver.
    fn apply_dry(&self, file: &Path) -> Result<()> {
        run_quiet_stdout(
            self.tools
                .kubectl()
                .args(["apply", "--server-side", "--dry-run=server"])
                .arg(format!("--field-manager={FIELD_MANAGER}"))
                .arg("-f")
                .arg(file),
        )
    }

    pub(super) fn dry_run(&self) -> Result<()> {
        // CRD for real (later objects reference its kind), namespace for real, the rest
        // dry-run. A CRD someone else already installed (tests may install a variant) is
        // left as it is: ours is then only dry-run against it.
        let kubectl = || self.tools.kubectl();
        let crds = self.chart.join("crds/");
        if crate::chart::succeeds(kubectl().args(["get", "crd", CRD_NAME])) {
            log(
                TAG,
                format!("CRD {CRD_NAME} already installed; server-side dry run of ours only"),
            );
            run_quiet_stdout(
                kubectl()
                    .args([
                        "apply",
                        "--server-side",
                        "--force-conflicts",
                        "--dry-run=server",
                    ])
                    .arg(format!("--field-manager={FIELD_MANAGER}"))
                    .arg("-f")
                    .arg(&crds),
            )?;
        } else {
            run_quiet_stdout(
                kubectl()
                    .args(["apply", "--server-side"])
                    .arg(format!("--field-manager={FIELD_MANAGER}"))
                    .arg("-f")
                    .arg(&crds),
            )?;
        }
        run_quiet_stdout(kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{CRD_NAME}"),
        ]))?;
        if !crate::chart::succeeds(kubectl().args(["get", "namespace", &self.ns])) {
            run_quiet_stdout(kubectl().args(["create", "namespace", &self.ns]))?;
        }
        // Kinds this cluster has no CRD for (cert-manager, Prometheus Operator) are left out.
        let core: Vec<String> = [
            "serviceaccount",
            "rbac",
            "deployment",
            "service",
            "pdb",
            "webhook",
            "grafana-dashboard",
            "vmidentitypolicy",
        ]
        .iter()
        .flat_map(|t| ["-s".to_string(), format!("templates/{t}.yaml")])
        .collect();
        let [ff, full] = self.full();
        for mode in ["self-signed", "cert-manager"] {
            let mut args: Vec<&dyn AsRef<OsStr>> = vec![&ff, &full];
            args.extend(OPTIONAL.iter().map(|a| a as &dyn AsRef<OsStr>));
            args.extend(core.iter().map(|a| a as &dyn AsRef<OsStr>));
            let file = self.render(mode, &format!("{mode}.dry.yaml"), &args)?;
            log(TAG, format!("server-side dry run: {mode}"));
            self.apply_dry(&file)?;
        }
        // Also refuses duplicate env names (extraEnv replacing a built-in).
        log(TAG, "server-side dry run: kitchen-sink values");
        self.apply_dry(&self.w("kitchen-sink.yaml"))?;
        // The apiserver type-checks the VM identity policy's CEL (S3).
        log(TAG, "server-side dry run: VM identity policy");
        let vm_identity = self.values.join("vm-identity.yaml");
        let vap = self.render(
            "self-signed",
            "vap.yaml",
            &[
                &"-f",
                &vm_identity,
                &"-s",
                &"templates/vmidentitypolicy.yaml",
            ],
        )?;
        self.apply_dry(&vap)?;
        // A CR is accepted by the real CRD (schema + CEL compile) too.
        self.apply_dry(&self.w("example-cr.yaml"))?;
        let secret = format!("{RELEASE}-tls");
        let result = self.certificate(&secret);
        let _ = cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "delete",
            "secret",
            &secret,
            "--ignore-not-found",
        ]));
        result
    }

    /// self-signed: the webhook trusts the CA of the Secret it renders; an upgrade reuses
    /// that certificate (lookup) and renews it when it is about to expire. helm
    /// --dry-run=server lets lookup see the cluster.
    fn certificate(&self, secret: &str) -> Result<()> {
        let kubectl = || self.tools.kubectl();
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "delete",
            "secret",
            secret,
            "--ignore-not-found",
        ]))?;
        let render = |out: &str, templates: &[&str]| -> Result<String> {
            let mut args: Vec<&dyn AsRef<OsStr>> = vec![&"--dry-run=server"];
            for t in templates {
                args.extend([&"-s" as &dyn AsRef<OsStr>, t]);
            }
            read(&self.render("self-signed", out, &args)?)
        };
        let install = render("install.yaml", &["templates/webhook.yaml"])?;
        let ca_bundle = field(&install, "caBundle").unwrap_or_default().to_string();
        if ca_bundle.is_empty() || Some(ca_bundle.as_str()) != field(&install, "ca.crt") {
            return fail("caBundle is not the CA of the rendered TLS Secret");
        }
        let first = first_document(&install);
        if !first.lines().any(|l| l == "kind: Secret") {
            return fail("templates/webhook.yaml no longer starts with the Secret");
        }
        let secret_file = self.w("secret.yaml");
        write(&secret_file, first)?;
        cmd::output(
            kubectl()
                .args(["apply", "--server-side"])
                .arg(format!("--field-manager={FIELD_MANAGER}"))
                .arg("-f")
                .arg(&secret_file),
        )?;
        // As Helm would have left it (Helm 4's --dry-run=server checks release ownership).
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "annotate",
            "secret",
            secret,
            "--overwrite",
            &format!("meta.helm.sh/release-name={RELEASE}"),
            &format!("meta.helm.sh/release-namespace={}", self.ns),
        ]))?;
        let install_dep = render("install-dep.yaml", &["templates/deployment.yaml"])?;
        let upgrade = render(
            "upgrade.yaml",
            &["templates/webhook.yaml", "templates/deployment.yaml"],
        )?;
        if field(&upgrade, "caBundle") != Some(ca_bundle.as_str()) {
            return fail("upgrade regenerated the self-signed CA although the Secret is valid");
        }
        if field(&install_dep, "checksum/tls") != field(&upgrade, "checksum/tls") {
            return fail("upgrade changed checksum/tls although the certificate was reused");
        }
        log(
            TAG,
            "upgrade reuses the self-signed certificate and keeps checksum/tls",
        );
        let soon = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() + 86400)
            .unwrap_or_default();
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "annotate",
            "secret",
            secret,
            "--overwrite",
            &format!("cocoon-hibernation.cocoonstack.io/tls-expires={soon}"),
        ]))?;
        let renew = render("renew.yaml", &["templates/webhook.yaml"])?;
        if field(&renew, "caBundle") == Some(ca_bundle.as_str()) {
            return fail("a certificate expiring within renewBeforeDays was not renewed");
        }
        log(TAG, "upgrade renews a certificate that is about to expire");
        Ok(())
    }
}
