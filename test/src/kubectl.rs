//! Helpers for the kubectl end-to-end tests: build our `kubectl` and address it by full path,
//! find the official kubectl on PATH (never ours), run either against a server, and compare
//! outputs with the parts that legitimately differ between runs (ages, IPs) masked.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

/// Our `kubectl` (from [`crate::workspace_bins`]), its full path; `MINIK8S_KUBECTL_BIN`
/// overrides it.
pub fn our_kubectl() -> PathBuf {
    let bin = crate::workspace_bin("kubectl", "MINIK8S_KUBECTL_BIN");
    bin.canonicalize().unwrap_or(bin)
}

/// The official kubectl: `MINIK8S_KUBECTL`, else the first `kubectl` on PATH that is not
/// ours. `None` when there is none; under `CI=true` that is a failure.
pub fn official_kubectl() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MINIK8S_KUBECTL") {
        return Some(PathBuf::from(p));
    }
    let ours = our_kubectl();
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|d| d.join("kubectl")).find(|c| {
            c.is_file()
                && c.canonicalize().ok().as_deref() != Some(ours.as_path())
                && !c.starts_with(ours.parent().unwrap_or(Path::new("/nonexistent")))
        })
    });
    if found.is_none() && std::env::var("CI").as_deref() == Ok("true") {
        panic!("the official kubectl is required under CI=true but none is on PATH (install google-cloud-cli's kubectl or set MINIK8S_KUBECTL)");
    }
    found
}

/// One kubectl run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Run `bin --server URL args…` with an empty kubeconfig, `stdin` as standard input.
pub fn run(bin: &Path, server: &str, args: &[&str], stdin: Option<&str>) -> Result<Run> {
    let mut cmd = Command::new(bin);
    cmd.arg("--server").arg(server).args(args).env("KUBECONFIG", "/dev/null").env_remove("KUBE_EDITOR");
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {}", bin.display()))?;
    if let (Some(input), Some(mut si)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        si.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Whether a token is an age (`5s`, `3m20s`, `2d`, `<invalid>`) or an IPv4 address.
fn volatile(tok: &str) -> bool {
    let is_age = {
        let mut rest = tok;
        let mut ok = !tok.is_empty();
        while !rest.is_empty() && ok {
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            let unit = rest[digits..].chars().next();
            ok = digits > 0 && matches!(unit, Some('s' | 'm' | 'h' | 'd' | 'y'));
            rest = if ok { &rest[digits + 1..] } else { rest };
        }
        ok
    };
    let is_ip = {
        let parts: Vec<&str> = tok.split(['/', ':']).next().unwrap_or("").split('.').collect();
        parts.len() == 4 && parts.iter().all(|p| !p.is_empty() && p.parse::<u8>().is_ok())
    };
    is_age || is_ip
}

/// Text with ages and IPs masked and runs of spaces collapsed (column widths follow them).
pub fn normalize(s: &str) -> String {
    s.lines()
        .map(|l| l.split_whitespace().map(|t| if volatile(t) { "~" } else { t }).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_ages_and_ips() {
        assert_eq!(normalize("NAME   AGE\nweb    3m20s\nsvc 10.96.0.1 443/TCP"), "NAME AGE\nweb ~\nsvc ~ 443/TCP");
        assert_eq!(normalize("a 5x"), "a 5x");
    }
}
