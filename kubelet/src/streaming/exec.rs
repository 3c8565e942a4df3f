//! The Docker side of exec and attach: one function per session taking the transport's
//! [`Streams`] and returning how it ended, so any transport (WebSocket here, SPDY beside it)
//! drives the same code.

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{AttachContainerOptions, ResizeContainerTTYOptions, ResizeExecOptions};
use bollard::Docker;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::pin::Pin;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{Outcome, Session, StreamOptions, Streams, TermSize};

/// Run an exec (a new process) or attach (to the container's main process) in `container_id`.
pub async fn run(docker: &Docker, session: Session, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    match session {
        Session::Exec => exec(docker, container_id, opts, s).await,
        Session::Attach => attach(docker, container_id, opts, s).await,
    }
}

type Output = Pin<Box<dyn Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// `docker exec`: create, start attached, pump the streams, then read the exit code.
pub async fn exec(docker: &Docker, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    let config = CreateExecOptions::<String> {
        cmd: Some(opts.command.clone()),
        attach_stdin: Some(opts.stdin),
        attach_stdout: Some(opts.stdout),
        attach_stderr: Some(opts.stderr),
        tty: Some(opts.tty),
        ..Default::default()
    };
    let exec_id = match docker.create_exec(container_id, config).await {
        Ok(r) => r.id,
        Err(e) => return Outcome::Error(format!("error executing command in container: {}", docker_message(&e))),
    };
    let started = docker
        .start_exec(&exec_id, Some(StartExecOptions { detach: false, tty: opts.tty, output_capacity: None }))
        .await;
    let (output, input) = match started {
        Ok(StartExecResults::Attached { output, input }) => (output, input),
        Ok(StartExecResults::Detached) => return Outcome::Error("the exec started detached".into()),
        Err(e) => return Outcome::Error(format!("error executing command in container: {}", docker_message(&e))),
    };
    let resizer = {
        let docker = docker.clone();
        let exec_id = exec_id.clone();
        move |size: TermSize| {
            let docker = docker.clone();
            let exec_id = exec_id.clone();
            async move {
                let opts = ResizeExecOptions { h: size.height.into(), w: size.width.into() };
                match docker.resize_exec(&exec_id, opts).await {
                    Ok(()) => tracing::debug!(width = size.width, height = size.height, "resized the exec tty"),
                    Err(e) => tracing::debug!(error = %e, "resizing the exec tty"),
                }
            }
        }
    };
    if let Err(gone) = pump(output, input, s, resizer, true).await {
        return gone;
    }
    // The output ended: the process exited (Docker may need a moment to record the code).
    for _ in 0..100 {
        match docker.inspect_exec(&exec_id).await {
            Ok(i) if i.running != Some(true) => return Outcome::Exited(i.exit_code.unwrap_or(0)),
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(e) => return Outcome::Error(format!("error inspecting the exec: {}", docker_message(&e))),
        }
    }
    Outcome::Error("the command's output ended but it is still running".into())
}

/// `docker attach`: the container's own stdio; ends when the main process does.
pub async fn attach(docker: &Docker, container_id: &str, opts: &StreamOptions, s: Streams) -> Outcome {
    let options = AttachContainerOptions {
        stdin: opts.stdin,
        stdout: opts.stdout,
        stderr: opts.stderr,
        stream: true,
        logs: false,
        ..Default::default()
    };
    let attached = match docker.attach_container(container_id, Some(options)).await {
        Ok(a) => a,
        Err(e) => return Outcome::Error(format!("error attaching to the container: {}", docker_message(&e))),
    };
    let resizer = {
        let docker = docker.clone();
        let id = container_id.to_string();
        move |size: TermSize| {
            let docker = docker.clone();
            let id = id.clone();
            async move {
                let opts = ResizeContainerTTYOptions { h: size.height.into(), w: size.width.into() };
                match docker.resize_container_tty(&id, opts).await {
                    Ok(()) => tracing::debug!(width = size.width, height = size.height, "resized the container tty"),
                    Err(e) => tracing::debug!(error = %e, "resizing the container tty"),
                }
            }
        }
    };
    // Docker ends an attach whose input closes unless the container is `stdinOnce` (then it
    // closes the container's stdin and streams on): keep the input open otherwise, as the
    // kubelet does, so the output flows until the process exits.
    let stdin_once = match docker
        .inspect_container(container_id, None::<bollard::query_parameters::InspectContainerOptions>)
        .await
    {
        Ok(c) => c.config.and_then(|c| c.stdin_once).unwrap_or(false),
        Err(e) => return Outcome::Error(format!("error inspecting the container: {}", docker_message(&e))),
    };
    match pump(attached.output, attached.input, s, resizer, stdin_once).await {
        Ok(()) => Outcome::Exited(0),
        Err(gone) => gone,
    }
}

/// Move bytes until Docker's output ends: stdin and resizes in, stdout/stderr out; the end of
/// the client's stdin half-closes Docker's input when `close_stdin`.
/// `Err` when the session must stop early (the client went away or Docker failed).
async fn pump<R, F>(
    mut output: Output,
    mut input: Input,
    s: Streams,
    resize: R,
    close_stdin: bool,
) -> Result<(), Outcome>
where
    R: Fn(TermSize) -> F,
    F: std::future::Future<Output = ()>,
{
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
                    Ok(bollard::container::LogOutput::StdErr { message }) => (&stderr, message),
                    Ok(bollard::container::LogOutput::StdOut { message })
                    | Ok(bollard::container::LogOutput::Console { message }) => (&stdout, message),
                    Ok(bollard::container::LogOutput::StdIn { .. }) => continue,
                    Err(e) => return Err(Outcome::Error(format!("error reading the stream: {}", docker_message(&e)))),
                };
                // tty output comes as Console; with only stderr requested it goes there.
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

/// Docker's own message for an API error.
fn docker_message(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
