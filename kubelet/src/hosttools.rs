//! The host's network tools, run as commands (`iptables`, `iptables-restore`), and the
//! short name hash the node's bridge, veths and nat chains are named with.

use anyhow::{bail, Context, Result};

/// A short stable hash for interface names (at most 15 bytes on Linux).
pub fn fnv32(s: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    h
}

/// Run a command; an error with its stderr when it fails.
pub async fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(cmd).args(args).output().await.with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Whether a command succeeds (its output discarded).
pub async fn succeeds(cmd: &str, args: &[&str]) -> bool {
    tokio::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run a command; its stdout.
pub async fn output(cmd: &str, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(cmd).args(args).output().await.with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run a command with `input` on its stdin.
pub async fn run_with_input(cmd: &str, args: &[&str], input: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(cmd)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    if !out.status.success() {
        bail!("{cmd}: {}\ninput:\n{input}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
