//! The demo's steps on the cluster through its kubectl: the demo pod made afresh, its
//! CocoonHibernation hibernated and woken while each phase is printed.

use crate::cmd::{Error, Result, describe, fail};
use crate::lanes::control_plane::Env;
use crate::lanes::{interrupted, utc_hms_ms};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const NS: &str = "demo";
pub const POD: &str = "web-0";

pub struct Kube {
    pub kubectl: PathBuf,
    pub env: Env,
}

impl Kube {
    pub fn new(env: Env) -> Result<Kube> {
        Ok(Kube {
            kubectl: env.kubectl()?,
            env,
        })
    }

    /// kubectl `args` with `stdin` fed in; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str], stdin: &str) -> Result<String> {
        let mut cmd = Command::new(&self.kubectl);
        self.env.apply(&mut cmd).args(args);
        feed(&mut cmd, stdin)
    }

    pub fn apply(&self, yaml: &str, extra: &[&str]) -> Result<()> {
        let mut args = vec!["apply"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-f", "-"]);
        self.run(&args, yaml).map(drop)
    }

    /// Pod demo/web-0 recreated as vk-cocoon would run it (a fresh VMID, state ready), bound
    /// to `node` when given, with any CocoonHibernation of an earlier run gone.
    pub fn fresh_pod(&self, node: Option<&str>) -> Result<()> {
        self.apply(
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"),
            &[],
        )?;
        self.run(
            &[
                "-n",
                NS,
                "delete",
                "ch",
                POD,
                "--ignore-not-found",
                "--wait=true",
            ],
            "",
        )?;
        let _ = self.run(
            &[
                "-n",
                NS,
                "delete",
                "pod",
                POD,
                "--ignore-not-found",
                "--grace-period=0",
                "--force",
            ],
            "",
        );
        let vm_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.apply(&pod_yaml(node, vm_id), &["-n", NS])
    }

    /// Creates CocoonHibernation demo/web-0 with desire Hibernate, then flips it to Wake,
    /// printing each phase as it changes. `alive` fails when a process the demo needs has
    /// exited; `hint` says where to look when a phase does not come within 90 s.
    pub fn round_trip(&self, alive: &dyn Fn() -> Result<()>, hint: &str) -> Result<()> {
        let start = Instant::now();
        let ch = format!(
            "apiVersion: cocoonset.cocoonstack.io/v1\nkind: CocoonHibernation\nmetadata:\n  name: {POD}\n\
             spec:\n  podRef: {{ name: {POD} }}\n  desire: Hibernate\n"
        );
        self.apply(&ch, &["-n", NS])?;
        self.watch_until("Hibernated", alive, hint)?;
        let wake = r#"{"spec":{"desire":"Wake"}}"#;
        self.run(
            &["-n", NS, "patch", "ch", POD, "--type", "merge", "-p", wake],
            "",
        )?;
        self.watch_until("Active", alive, hint)?;
        super::say(&format!(
            "     round trip took {}s",
            start.elapsed().as_secs()
        ));
        println!();
        print!("{}", self.run(&["-n", NS, "get", "ch"], "")?);
        Ok(())
    }

    fn watch_until(&self, want: &str, alive: &dyn Fn() -> Result<()>, hint: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut last = String::new();
        while Instant::now() < deadline {
            if interrupted() {
                return fail("interrupted");
            }
            alive()?;
            let args = ["-n", NS, "get", "ch", POD, "-o", "jsonpath={.status.phase}"];
            let now = self.run(&args, "").unwrap_or_default();
            if !now.is_empty() && now != last {
                println!("{}     {NS}/{POD}  {now}", utc_hms_ms());
                last = now;
            }
            if last == want {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        fail(format!(
            "{NS}/{POD} did not reach {want} in 90s; see {hint}"
        ))
    }
}

/// Runs `cmd` with `stdin` as its input; its stdout, or an error with its stderr.
pub fn feed(cmd: &mut Command, stdin: &str) -> Result<String> {
    let line = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error(format!("could not start `{line}`: {e}")))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.as_bytes())
            .map_err(|e| Error(format!("`{line}`: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error(format!("`{line}`: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        fail(format!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn pod_yaml(node: Option<&str>, vm_id: u64) -> String {
    let node_line = node
        .map(|n| format!("  nodeName: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {POD}
  annotations:
    vm.cocoonstack.io/name: demo-{POD}
    cocoonset.cocoonstack.io/generation: \"1\"
    vm.cocoonstack.io/id: vm-{vm_id}
    vm.cocoonstack.io/lifecycle-state: ready
spec:
{node_line}  containers:
    - name: vm
      image: cocoon/vm:demo
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_pod_is_bound_to_a_node_only_when_given() {
        let free = pod_yaml(None, 7);
        assert!(free.contains("vm.cocoonstack.io/id: vm-7\n"), "{free}");
        assert!(free.contains("spec:\n  containers:\n"), "{free}");
        let bound = pod_yaml(Some("vk-0"), 7);
        assert!(
            bound.contains("spec:\n  nodeName: vk-0\n  containers:\n"),
            "{bound}"
        );
    }

    #[test]
    fn feed_passes_stdin_and_names_a_failure() {
        assert_eq!(
            feed(&mut Command::new("cat"), "a: b\n").ok().as_deref(),
            Some("a: b\n")
        );
        let err = feed(Command::new("sh").args(["-c", "echo no >&2; exit 3"]), "").err();
        assert!(err.is_some_and(|e| e.0.contains("no")));
    }
}
