//! `kubectl exec (POD | TYPE/NAME) [-c CONTAINER] [-i] [-t] [-q] -- COMMAND [args…]` and
//! `kubectl attach (POD | TYPE/NAME) [-c CONTAINER] [-i] [-t] [-q]` over `pods/exec` and
//! `pods/attach` (kube's WebSocket client, `v5.channel.k8s.io`/`v4.channel.k8s.io`).
//!
//! As the official kubectl: the default container is the
//! `kubectl.kubernetes.io/default-container` annotation's, else the first (announced on stderr
//! when there are others); a non-zero exit ends with `command terminated with exit code N`
//! and exit code N. With `-t` and a terminal on stdin, the terminal is put in raw mode and its
//! size (and every change of it) sent to the container. Choosing the container, the message
//! and the exit code are pure functions.

use std::io::Write;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::client::{with_query, Ctx};
use crate::error::{from_kube, KubectlError, Result};

/// Execute a command in a container.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// POD or TYPE/NAME.
    pub args: Vec<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Container name. If omitted, use the kubectl.kubernetes.io/default-container annotation
    /// for selecting the container, or the first container in the pod will be chosen.
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// Pass stdin to the container.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Stdin is a TTY.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Only print output from the remote session.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Attach to a running container.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// POD or TYPE/NAME.
    pub args: Vec<String>,
    /// Container name. If omitted, use the kubectl.kubernetes.io/default-container annotation
    /// for selecting the container to be attached or the first container in the pod will be chosen.
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// Pass stdin to the container.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Stdin is a TTY.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Only print output from the remote session.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn names(pod: &Value, p: &str) -> Vec<String> {
    super::describe::names(pod.pointer(p)).into_iter().map(String::from).collect()
}

/// The container kubectl talks to, and the "Defaulted container" notice when it chose one of
/// several (podcmd.FindOrDefaultContainerByName). Pure.
pub fn default_container(pod: &Value, requested: Option<&str>) -> Result<(String, Option<String>)> {
    if let Some(c) = requested.filter(|c| !c.is_empty()) {
        return Ok((c.to_string(), None));
    }
    let app = names(pod, "/spec/containers");
    let init = names(pod, "/spec/initContainers");
    let ephemeral = names(pod, "/spec/ephemeralContainers");
    let Some(first) = app.first() else {
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        return Err(KubectlError::msg(format!("pod {ns}/{name} does not have any containers")));
    };
    if let Some(a) =
        pod.pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container").and_then(Value::as_str)
    {
        if app.iter().chain(&init).chain(&ephemeral).any(|c| c == a) {
            return Ok((a.to_string(), None));
        }
    }
    let notice = (app.len() > 1 || !init.is_empty() || !ephemeral.is_empty()).then(|| {
        let all: Vec<String> = app
            .iter()
            .cloned()
            .chain(init.iter().map(|c| format!("{c} (init)")))
            .chain(ephemeral.iter().map(|c| format!("{c} (ephem)")))
            .collect();
        format!("Defaulted container \"{first}\" out of: {}", all.join(", "))
    });
    Ok((first.clone(), notice))
}

/// What a session's final `Status` means: (exit code, message for stderr). Pure.
pub fn outcome(status: Option<&Status>) -> (i32, Option<String>) {
    let Some(s) = status else { return (0, None) };
    if s.status.as_deref() != Some("Failure") {
        return (0, None);
    }
    if s.reason.as_deref() == Some("NonZeroExitCode") {
        let code = s
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.parse::<i32>().ok());
        if let Some(code) = code {
            return (code, Some(format!("command terminated with exit code {code}")));
        }
        return (
            1,
            Some(format!(
                "error: command terminated with non-zero exit code: {}",
                s.message.clone().unwrap_or_default()
            )),
        );
    }
    (1, Some(format!("error: {}", s.message.clone().unwrap_or_default())))
}

/// POD or TYPE/NAME to a pod name (a workload's first pod by its selector).
async fn pod_name(ctx: &Ctx, target: &str) -> Result<String> {
    let Some((t, n)) = target.split_once('/') else { return Ok(target.to_string()) };
    let res = ctx.resolve(t).await?;
    if res.plural == "pods" {
        return Ok(n.to_string());
    }
    let ns = &ctx.namespace;
    let obj = ctx.get(&res.object_path(Some(ns), n)).await?;
    let sel = super::logs::pod_selector(&obj)
        .ok_or_else(|| KubectlError::msg(format!("cannot attach to {t}/{n}: selector for {t} not implemented")))?;
    let pods = ctx.get(&with_query(&format!("/api/v1/namespaces/{ns}/pods"), &[("labelSelector", sel)])).await?;
    let items = pods.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    super::logs::pick_pod(&items)
        .and_then(|p| p.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| KubectlError::msg(format!("no pods found for {t}/{n}")))
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let Some(target) = a.args.first() else {
        return Err(KubectlError::msg("pod, type/name or --filename must be specified"));
    };
    if a.args.len() > 1 {
        return Err(KubectlError::msg(
            "exec [POD] [COMMAND] is not supported anymore. Use exec [POD] -- [COMMAND] instead",
        ));
    }
    if a.command.is_empty() {
        return Err(KubectlError::msg("you must specify at least one command for the container"));
    }
    session(ctx, target, a.container.as_deref(), a.stdin, a.tty, a.quiet, Some(&a.command)).await
}

pub async fn attach(ctx: &Ctx, a: &AttachArgs) -> Result<()> {
    let Some(target) = a.args.first() else {
        return Err(KubectlError::msg("expected POD, TYPE/NAME, or TYPE NAME, (at most 2 arguments) saw 0"));
    };
    session(ctx, target, a.container.as_deref(), a.stdin, a.tty, a.quiet, None).await
}

/// Run one exec (`command` given) or attach session; exits the process with its code.
async fn session(
    ctx: &Ctx,
    target: &str,
    container: Option<&str>,
    stdin: bool,
    tty: bool,
    quiet: bool,
    command: Option<&[String]>,
) -> Result<()> {
    let name = pod_name(ctx, target).await?;
    let ns = ctx.namespace.clone();
    let pod = ctx.get(&format!("/api/v1/namespaces/{ns}/pods/{}", crate::client::enc(&name))).await?;
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
    if matches!(phase, "Succeeded" | "Failed") {
        let what = if command.is_some() { "exec into" } else { "attach to" };
        return Err(KubectlError::msg(format!(
            "cannot {what} a container in a completed pod; current phase is {phase}"
        )));
    }
    let (container, notice) = default_container(&pod, container)?;
    if let (Some(n), false) = (notice, quiet) {
        eprintln!("{n}");
    }
    // kubectl: a TTY needs stdin, and a terminal on it.
    let is_terminal = unsafe { libc::isatty(0) == 1 };
    let tty = tty && stdin && {
        if !is_terminal && !quiet {
            eprintln!("Unable to use a TTY - input is not a terminal or the right kind of file");
        }
        is_terminal
    };
    let params = AttachParams {
        container: Some(container.clone()),
        stdin,
        stdout: true,
        stderr: !tty,
        tty,
        ..Default::default()
    };
    if command.is_none() && stdin && !quiet {
        eprintln!("If you don't see a command prompt, try pressing enter.");
    }
    let api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let attached = match command {
        Some(cmd) => api.exec(&name, cmd.to_vec(), &params).await,
        None => api.attach(&name, &params).await,
    };
    let mut proc = match attached {
        Ok(p) => p,
        Err(kube::Error::UpgradeConnection(_)) => {
            // The upgrade was refused: the same request without it gets the server's Status.
            let sub = if command.is_some() { "exec" } else { "attach" };
            let mut q = vec![("container", container.clone()), ("stdout", "true".to_string())];
            for c in command.unwrap_or_default() {
                q.push(("command", c.clone()));
            }
            let path = with_query(&format!("/api/v1/namespaces/{ns}/pods/{}/{sub}", crate::client::enc(&name)), &q);
            return Err(match ctx.get(&path).await {
                Err(e) => e,
                Ok(_) => KubectlError::msg("unable to upgrade connection"),
            });
        }
        Err(e) => return Err(from_kube(e, &ctx.server)),
    };
    let raw = if tty { RawMode::enable() } else { None };
    let code = pump(&mut proc, stdin, tty).await;
    drop(raw);
    let status = match proc.take_status() {
        Some(s) => s.await,
        None => None,
    };
    let _ = proc.join().await;
    let (mut exit, msg) = outcome(status.as_ref());
    if let Err(e) = code {
        exit = exit.max(1);
        eprintln!("error: {e}");
    }
    let _ = std::io::stdout().flush();
    if let Some(m) = msg {
        eprintln!("{m}");
    }
    // Exit here: a blocking read of our stdin may still be pending, and the code is the remote one.
    std::process::exit(exit)
}

/// Copy our stdin to the process and its stdout/stderr to ours until both end.
async fn pump(proc: &mut AttachedProcess, stdin: bool, tty: bool) -> std::io::Result<()> {
    if stdin {
        if let Some(mut w) = proc.stdin() {
            tokio::spawn(async move {
                let mut input = tokio::io::stdin();
                let mut buf = vec![0u8; 8192];
                loop {
                    match input.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if w.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = w.shutdown().await;
            });
        }
    }
    if tty {
        if let Some(mut sizes) = proc.terminal_size() {
            tokio::spawn(async move {
                use futures::SinkExt;
                if let Some(s) = terminal_size() {
                    let _ = sizes.send(s).await;
                }
                let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                else {
                    return;
                };
                while winch.recv().await.is_some() {
                    if let Some(s) = terminal_size() {
                        if sizes.send(s).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    }
    let out = copy_to(proc.stdout(), std::io::stdout());
    let err = copy_to(proc.stderr(), std::io::stderr());
    let (a, b) = tokio::join!(out, err);
    a.and(b)
}

async fn copy_to<R: AsyncRead + Unpin, W: Write>(from: Option<R>, mut to: W) -> std::io::Result<()> {
    let Some(mut from) = from else { return Ok(()) };
    let mut buf = vec![0u8; 8192];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

/// The size of the terminal on stdin.
fn terminal_size() -> Option<TerminalSize> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize for a terminal fd; 0 is ours.
    let rc = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(TerminalSize { width: ws.ws_col, height: ws.ws_row })
}

/// The terminal on stdin in raw mode until dropped.
struct RawMode(libc::termios);

impl RawMode {
    fn enable() -> Option<RawMode> {
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: plain termios calls on fd 0 with a valid struct.
        unsafe {
            if libc::tcgetattr(0, &mut t) != 0 {
                return None;
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return None;
            }
            Some(RawMode(saved))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `enable`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};
    use serde_json::json;

    #[test]
    fn picks_the_container_as_kubectl() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(default_container(&one, None).unwrap(), ("a".into(), None));
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "i"}]}});
        let (c, n) = default_container(&two, None).unwrap();
        assert_eq!(c, "a");
        assert_eq!(n.as_deref(), Some("Defaulted container \"a\" out of: a, b, i (init)"));
        assert_eq!(default_container(&two, Some("b")).unwrap(), ("b".into(), None));
        let mut annotated = two.clone();
        annotated["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "b"});
        assert_eq!(default_container(&annotated, None).unwrap(), ("b".into(), None));
        let none = json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": []}});
        assert!(default_container(&none, None).is_err());
    }

    #[test]
    fn exit_codes_from_status() {
        assert_eq!(outcome(None), (0, None));
        let ok = Status { status: Some("Success".into()), ..Default::default() };
        assert_eq!(outcome(Some(&ok)), (0, None));
        let three = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    field: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(outcome(Some(&three)), (3, Some("command terminated with exit code 3".into())));
        let internal = Status {
            status: Some("Failure".into()),
            reason: Some("InternalError".into()),
            message: Some("Internal error occurred: boom".into()),
            ..Default::default()
        };
        assert_eq!(outcome(Some(&internal)), (1, Some("error: Internal error occurred: boom".into())));
    }
}
