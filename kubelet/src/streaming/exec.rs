//! The container side of exec and attach: one function per session taking the transport's
//! [`Streams`] and returning how it ended, so any transport (WebSocket here, SPDY beside it)
//! drives the same code. Docker itself is reached through [`Runtime`].

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{Outcome, Session, StreamOptions, Streams, TermSize};
use crate::runtime::{Attached, ExecConfig, Output, Runtime};

/// Run an exec (a new process) or attach (to the container's main process) in `container_id`.
pub async fn run(rt: &Runtime, session: Session, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    match session {
        Session::Exec => exec(rt, container_id, opts, s).await,
        Session::Attach => attach(rt, container_id, opts, s).await,
    }
}

/// `docker exec`: create, start attached, pump the streams, then read the exit code.
pub async fn exec(rt: &Runtime, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    let config = ExecConfig {
        command: opts.command.clone(),
        stdin: opts.stdin,
        stdout: opts.stdout,
        stderr: opts.stderr,
        tty: opts.tty,
    };
    let exec = match rt.exec(container_id, &config).await {
        Ok(e) => e,
        Err(e) => return Outcome::Error(format!("error executing command in container: {e}")),
    };
    let exec_id = exec.id;
    let resizer = |size: TermSize| {
        let exec_id = &exec_id;
        async move {
            match rt.resize_exec(exec_id, size.width, size.height).await {
                Ok(()) => tracing::debug!(width = size.width, height = size.height, "resized the exec tty"),
                Err(e) => tracing::debug!(error = %e, "resizing the exec tty"),
            }
        }
    };
    if let Err(gone) = pump(exec.streams, s, resizer, true).await {
        return gone;
    }
    // The output ended: the process exited (Docker may need a moment to record the code).
    for _ in 0..100 {
        match rt.exec_state(&exec_id).await {
            Ok(i) if !i.running => return Outcome::Exited(i.exit_code.unwrap_or(0)),
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(e) => return Outcome::Error(format!("error inspecting the exec: {e}")),
        }
    }
    Outcome::Error("the command's output ended but it is still running".into())
}

/// `docker attach`: the container's own stdio; ends when the main process does.
pub async fn attach(rt: &Runtime, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    let attached = match rt.attach(container_id, opts.stdin, opts.stdout, opts.stderr).await {
        Ok(a) => a,
        Err(e) => return Outcome::Error(format!("error attaching to the container: {e}")),
    };
    let resizer = |size: TermSize| async move {
        match rt.resize_tty(container_id, size.width, size.height).await {
            Ok(()) => tracing::debug!(width = size.width, height = size.height, "resized the container tty"),
            Err(e) => tracing::debug!(error = %e, "resizing the container tty"),
        }
    };
    // Docker ends an attach whose input closes unless the container is `stdinOnce` (then it
    // closes the container's stdin and streams on): keep the input open otherwise, as the
    // kubelet does, so the output flows until the process exits.
    let stdin_once = match rt.stdin_once(container_id).await {
        Ok(once) => once,
        Err(e) => return Outcome::Error(format!("error inspecting the container: {e}")),
    };
    match pump(attached, s, resizer, stdin_once).await {
        Ok(()) => Outcome::Exited(0),
        Err(gone) => gone,
    }
}

/// Move bytes until Docker's output ends: stdin and resizes in, stdout/stderr out; the end of
/// the client's stdin half-closes Docker's input when `close_stdin`.
/// `Err` when the session must stop early (the client went away or Docker failed).
async fn pump<R, F>(container: Attached, s: Streams, resize: R, close_stdin: bool) -> Result<(), Outcome>
where
    R: Fn(TermSize) -> F,
    F: std::future::Future<Output = ()>,
{
    let Attached { mut output, mut input } = container;
    let Streams { mut stdin, stdout, stderr, resize: mut resizes } = s;
    let mut stdin_open = stdin.is_some();
    if !stdin_open {
        let _ = input.shutdown().await;
    }
    let mut resizes_open = true;
    loop {
        tokio::select! {
            item = output.next() => {
                let Some(item) = item else { return Ok(()) };
                let (sink, bytes): (&Option<tokio::sync::mpsc::Sender<Bytes>>, Bytes) = match item {
                    Ok(Output::Stderr(message)) => (&stderr, message),
                    Ok(Output::Stdout(message)) => (&stdout, message),
                    Err(e) => return Err(Outcome::Error(format!("error reading the stream: {e}"))),
                };
                // tty output counts as stdout; with only stderr requested it goes there.
                let sink = if sink.is_none() { if stdout.is_some() { &stdout } else { &stderr } } else { sink };
                if let Some(tx) = sink {
                    if tx.send(bytes).await.is_err() {
                        return Err(Outcome::Error("the client went away".into()));
                    }
                }
            }
            data = async { stdin.as_mut()?.recv().await }, if stdin_open => match data {
                Some(data) => {
                    if input.write_all(&data).await.is_err() || input.flush().await.is_err() {
                        stdin_open = false;
                    }
                }
                None => {
                    stdin_open = false;
                    stdin = None;
                    if close_stdin {
                        let _ = input.shutdown().await;
                    }
                }
            },
            size = resizes.recv(), if resizes_open => match size {
                Some(size) if size.width > 0 && size.height > 0 => resize(size).await,
                Some(_) => {}
                None => resizes_open = false,
            },
        }
    }
}
