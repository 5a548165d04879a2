//! Running Go: `go mod download -json` answers, `go build`/`go install` with a clean
//! environment.

use crate::cmd::{self, Result};
use std::path::Path;
use std::process::Command;

pub fn need(what: &str) -> Result<()> {
    match Command::new("go").arg("version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => cmd::fail(format!(
            "go is required to build {what} (install Go >= 1.24)"
        )),
    }
}

/// `go mod download -json MODULE@VERSION` run in `dir`, returning the field `key`
/// (`GoMod`, `Dir`) of its answer.
pub fn mod_download(dir: &Path, module_at: &str, key: &str) -> Result<String> {
    let out = cmd::output(
        Command::new("go")
            .args(["mod", "download", "-json", module_at])
            .current_dir(dir)
            .env("GOFLAGS", ""),
    )?;
    match json_field(&out, key) {
        Some(v) => Ok(v),
        None => cmd::fail(format!("`go mod download -json {module_at}` gave no {key}")),
    }
}

/// The string value of `"key": "value"` in go's indented JSON (no escapes in paths).
/// A JSON parser would be one more dependency for two fields of a fixed shape.
pub fn json_field(json: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\": \"");
    json.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(&needle)?;
        Some(rest.split('"').next()?.to_owned())
    })
}

/// The version `module` is required at in a go.mod's text.
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let first = words.next()?;
        let (name, version) = if first == "require" {
            (words.next()?, words.next()?)
        } else {
            (first, words.next()?)
        };
        (name == module).then(|| version.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_of_go_mod_download_json() {
        let json = "{\n\t\"Path\": \"helm.sh/helm/v3\",\n\t\"GoMod\": \"/root/go/pkg/mod/cache/download/helm.sh/helm/v3/@v/v3.21.4.mod\",\n\t\"Dir\": \"/x/y\"\n}\n";
        assert_eq!(
            json_field(json, "GoMod").as_deref(),
            Some("/root/go/pkg/mod/cache/download/helm.sh/helm/v3/@v/v3.21.4.mod")
        );
        assert_eq!(json_field(json, "Dir").as_deref(), Some("/x/y"));
        assert_eq!(json_field(json, "Sum"), None);
    }

    #[test]
    fn finds_a_required_version_in_a_block_or_on_one_line() {
        let go_mod = "module x\n\nrequire k8s.io/api v0.36.2\nrequire (\n\tk8s.io/client-go v0.36.2 // indirect\n)\n";
        assert_eq!(
            required_version(go_mod, "k8s.io/client-go").as_deref(),
            Some("v0.36.2")
        );
        assert_eq!(
            required_version(go_mod, "k8s.io/api").as_deref(),
            Some("v0.36.2")
        );
        assert_eq!(required_version(go_mod, "k8s.io/kubectl"), None);
    }
}
