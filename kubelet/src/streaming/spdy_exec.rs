//! Exec and attach over SPDY/3.1 (kubectl ≤ 1.29 and client-go's SPDY executor): the client
//! opens one SPDY stream per channel, named by its `streamType` header — `error`, `stdin`,
//! `stdout`, `stderr`, `resize` (tty, v3+) — and the server runs the session once all the
//! streams the request's options call for are there. The `error` stream ends the session: a
//! JSON `Status` (v4), or the failure's text (v2, v3).
//!
//! The session itself is the transport-independent one of `mod.rs` ([`Streams`] → [`Outcome`]).

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::spdy;
use super::websocket::{final_message, Protocol};
use super::{Outcome, StreamOptions, Streams, TermSize};

/// The remotecommand protocols over SPDY, in the server's order of preference.
pub const PROTOCOLS: [&str; 3] = ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"];

/// How long the client may take to open every stream (the kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The stream types a session with `opts` waits for under `protocol`.
pub fn expected_streams(opts: &StreamOptions, protocol: &str) -> Vec<&'static str> {
    let mut v = vec!["error"];
    if opts.stdin {
        v.push("stdin");
    }
    if opts.stdout {
        v.push("stdout");
    }
    if opts.stderr && !opts.tty {
        v.push("stderr");
    }
    if opts.tty && protocol != "v2.channel.k8s.io" {
        v.push("resize");
    }
    v
}

/// Split concatenated JSON resize messages (`{"Width":w,"Height":h}` each, as Go's
/// `json.Encoder` writes them) off the front of `buf`; an incomplete tail stays.
pub fn take_resizes(buf: &mut Vec<u8>) -> Vec<TermSize> {
    let mut out = Vec::new();
    let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<serde_json::Value>();
    let mut consumed = 0;
    loop {
        match it.next() {
            Some(Ok(v)) => {
                consumed = it.byte_offset();
                let dim = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).map(|n| n.min(u16::MAX as u64) as u16);
                if let (Some(width), Some(height)) = (dim("Width"), dim("Height")) {
                    out.push(TermSize { width, height });
                }
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(_)) => {
                // Garbage: drop everything buffered.
                consumed = buf.len();
                break;
            }
            None => break,
        }
    }
    buf.drain(..consumed);
    out
}

/// Run one exec/attach session on an upgraded SPDY connection.
pub async fn serve<T, F, Fut>(io: T, protocol: String, opts: StreamOptions, session: F)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    F: FnOnce(Streams) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let (mut incoming, conn) = spdy::serve(io);
    let want = expected_streams(&opts, &protocol);
    let mut got: std::collections::HashMap<&'static str, spdy::Stream> = Default::default();
    let deadline = tokio::time::sleep(STREAM_CREATION_TIMEOUT);
    tokio::pin!(deadline);
    while got.len() < want.len() {
        tokio::select! {
            s = incoming.recv() => {
                let Some(s) = s else { return };
                let kind = s.header("streamType").unwrap_or_default().to_ascii_lowercase();
                match want.iter().find(|w| **w == kind) {
                    Some(w) if !got.contains_key(w) => { got.insert(w, s); }
                    _ => {
                        tracing::debug!(stream_type = %kind, "exec: unexpected stream");
                        let _ = s.writer.reset().await;
                    }
                }
            }
            _ = &mut deadline => {
                tracing::info!("exec: timed out waiting for the client to create streams");
                conn.shutdown().await;
                return;
            }
        }
    }

    let error = got.remove("error");
    let stdin = got.remove("stdin");
    let pump = |s: Option<spdy::Stream>| -> (Option<mpsc::Sender<Bytes>>, Option<tokio::task::JoinHandle<()>>) {
        let Some(s) = s else { return (None, None) };
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let task = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if s.writer.write(&b).await.is_err() {
                    break;
                }
            }
            let _ = s.writer.close().await;
        });
        (Some(tx), Some(task))
    };
    let (stdout, out_task) = pump(got.remove("stdout"));
    let (stderr, err_task) = pump(got.remove("stderr"));
    let (resize_tx, resize_rx) = mpsc::channel::<TermSize>(4);
    let resize_task = got.remove("resize").map(|mut s| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(b) = s.data.recv().await {
                buf.extend_from_slice(&b);
                for size in take_resizes(&mut buf) {
                    let _ = resize_tx.try_send(size);
                }
            }
        })
    });
    let (stdin_rx, stdin_writer) = match stdin {
        Some(s) => (Some(s.data), Some(s.writer)),
        None => (None, None),
    };

    let outcome = session(Streams { stdin: stdin_rx, stdout, stderr, resize: resize_rx }).await;
    for t in [out_task, err_task].into_iter().flatten() {
        let _ = t.await;
    }
    if let Some(t) = resize_task {
        t.abort();
    }
    let proto = if protocol == "v4.channel.k8s.io" { Protocol::V4 } else { Protocol::V1 };
    if let Some(e) = error {
        if let Some(payload) = final_message(proto, &outcome) {
            let _ = e.writer.write(&payload).await;
        }
        let _ = e.writer.close().await;
    }
    if let Some(w) = stdin_writer {
        let _ = w.close().await;
    }
    conn.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> StreamOptions {
        StreamOptions { command: vec!["sh".into()], stdin, stdout, stderr, tty }
    }

    #[test]
    fn which_streams_a_session_waits_for() {
        assert_eq!(
            expected_streams(&opts(false, true, true, false), "v4.channel.k8s.io"),
            ["error", "stdout", "stderr"]
        );
        assert_eq!(
            expected_streams(&opts(true, true, false, true), "v4.channel.k8s.io"),
            ["error", "stdin", "stdout", "resize"]
        );
        // v2 has no resize stream; tty means no stderr.
        assert_eq!(expected_streams(&opts(true, true, true, true), "v2.channel.k8s.io"), ["error", "stdin", "stdout"]);
    }

    #[test]
    fn resize_messages_split_anywhere() {
        let mut buf = br#"{"Width":80,"Height":24}
{"Width":100,"He"#
            .to_vec();
        assert_eq!(take_resizes(&mut buf), vec![TermSize { width: 80, height: 24 }]);
        buf.extend_from_slice(b"ight\":30}\n");
        assert_eq!(take_resizes(&mut buf), vec![TermSize { width: 100, height: 30 }]);
        assert!(buf.iter().all(u8::is_ascii_whitespace));
        let mut junk = b"}}not json".to_vec();
        assert!(take_resizes(&mut junk).is_empty());
        assert!(junk.is_empty());
    }
}
