//! The WebSocket channel protocol of `kubectl exec`/`attach` (Kubernetes'
//! `k8s.io/apimachinery/pkg/util/httpstream/wsstream`): every message starts with a channel
//! number — 0 stdin, 1 stdout, 2 stderr, 3 error (v4+: a `meta/v1 Status`), 4 resize
//! (`{"Width":…,"Height":…}`) — and v5 adds channel 255, a one-byte "this channel is closed"
//! signal (the client closing stdin). The base64 variants send text messages: the channel as an
//! ASCII digit, then the data in base64.
//!
//! [`Protocol`], [`encode`] and [`decode`] are pure; [`serve`] is the shell driving one
//! session over an axum WebSocket.

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket};
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Outcome, Streams, TermSize};

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: "the channel in the payload is closed".
pub const CLOSE: u8 = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `channel.k8s.io` (no protocol header either): the error channel carries plain text.
    V1,
    /// `base64.channel.k8s.io`
    V1Base64,
    /// `v4.channel.k8s.io`: the error channel carries a `Status`.
    V4,
    /// `v4.base64.channel.k8s.io`
    V4Base64,
    /// `v5.channel.k8s.io`: v4 plus the close signal.
    V5,
}

/// The subprotocols the kubelet speaks, in its order of preference.
pub const PROTOCOLS: [&str; 5] =
    ["v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io", "channel.k8s.io", "base64.channel.k8s.io"];

impl Protocol {
    /// The protocol of a negotiated `Sec-WebSocket-Protocol` value (None: no header, i.e. v1).
    pub fn from_header(selected: Option<&str>) -> Option<Protocol> {
        match selected.map(str::trim) {
            None | Some("") | Some("channel.k8s.io") => Some(Protocol::V1),
            Some("base64.channel.k8s.io") => Some(Protocol::V1Base64),
            Some("v4.channel.k8s.io") => Some(Protocol::V4),
            Some("v4.base64.channel.k8s.io") => Some(Protocol::V4Base64),
            Some("v5.channel.k8s.io") => Some(Protocol::V5),
            Some(_) => None,
        }
    }
    pub fn base64(self) -> bool {
        matches!(self, Protocol::V1Base64 | Protocol::V4Base64)
    }
    /// Whether the error channel carries a JSON `Status` (v4 and later).
    pub fn status_errors(self) -> bool {
        matches!(self, Protocol::V4 | Protocol::V4Base64 | Protocol::V5)
    }
}

/// One WebSocket message, without the library's type (so the framing is testable as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    Binary(Vec<u8>),
    Text(String),
}

/// What a client message means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Stdin(Vec<u8>),
    /// v5: the client closed its stdin.
    StdinClosed,
    Resize(TermSize),
    /// Anything else the protocol allows and the server does not act on (empty messages,
    /// closes of other channels, data on channels the server does not read).
    Ignored,
}

/// Frame `data` for `channel`.
pub fn encode(proto: Protocol, channel: u8, data: &[u8]) -> Wire {
    if proto.base64() {
        let digit = char::from(b'0' + channel.min(9));
        Wire::Text(format!("{digit}{}", base64::engine::general_purpose::STANDARD.encode(data)))
    } else {
        let mut v = Vec::with_capacity(data.len() + 1);
        v.push(channel);
        v.extend_from_slice(data);
        Wire::Binary(v)
    }
}

/// Unframe a client message. The frame's type does not matter, as it does not to
/// Kubernetes (its server reads every message as bytes): the Python client sends a `str`
/// written to stdin as a text frame holding the raw channel byte, on binary protocols too.
pub fn decode(proto: Protocol, msg: &Wire) -> Result<Incoming, String> {
    let bytes = match msg {
        Wire::Binary(b) => b.as_slice(),
        Wire::Text(t) => t.as_bytes(),
    };
    let Some((&first, rest)) = bytes.split_first() else { return Ok(Incoming::Ignored) };
    let (channel, data): (u8, Vec<u8>) = if proto.base64() {
        let channel =
            char::from(first).to_digit(10).ok_or_else(|| format!("invalid channel {:?}", char::from(first)))?;
        let text = std::str::from_utf8(rest).map_err(|e| format!("invalid base64 data on channel {channel}: {e}"))?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| format!("invalid base64 data on channel {channel}: {e}"))?;
        (channel as u8, data)
    } else {
        (first, rest.to_vec())
    };
    Ok(match channel {
        STDIN if data.is_empty() => Incoming::Ignored,
        STDIN => Incoming::Stdin(data),
        RESIZE => Incoming::Resize(parse_resize(&data)?),
        CLOSE if proto == Protocol::V5 => match data.first() {
            Some(&STDIN) => Incoming::StdinClosed,
            _ => Incoming::Ignored,
        },
        _ => Incoming::Ignored,
    })
}

/// A resize message: `{"Width": w, "Height": h}`.
pub fn parse_resize(data: &[u8]) -> Result<TermSize, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("invalid resize message: {e}"))?;
    let dim = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n.min(u16::MAX as u64) as u16).unwrap_or(0);
    Ok(TermSize { width: dim("Width"), height: dim("Height") })
}

/// The error-channel payload that ends a session (None: v1 success sends nothing).
pub fn final_message(proto: Protocol, outcome: &Outcome) -> Option<Vec<u8>> {
    if proto.status_errors() {
        return Some(serde_json::to_vec(&outcome.status()).unwrap_or_default());
    }
    match outcome {
        Outcome::Exited(0) => None,
        other => other.status().get("message").and_then(Value::as_str).map(|m| m.as_bytes().to_vec()),
    }
}

fn to_message(w: Wire) -> Message {
    match w {
        Wire::Binary(b) => Message::Binary(Bytes::from(b)),
        Wire::Text(t) => Message::Text(t.into()),
    }
}

/// How long after the upgrade the first message waits. client-go (kubectl ≥ 1.30) starts
/// reading the connection in one goroutine while another creates its streams, and drops a
/// message for a stream not created yet, printing `Unknown stream id 1, discarding message`
/// on the user's terminal (and losing what it carried). Kubernetes' own path puts a dial to the
/// kubelet and a runtime round trip between the upgrade and the first byte; a fast
/// `docker exec` here leaves the client none, and a loaded machine delays its goroutines by
/// milliseconds. The session itself starts at once; only its output waits.
pub const ANNOUNCE_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// Drive one session over `socket`: client messages feed stdin and resizes, the session's
/// output is framed back, and the outcome ends it on the error channel before the close.
pub async fn serve<F, Fut>(socket: WebSocket, proto: Protocol, stdin: bool, stdout: bool, stderr: bool, session: F)
where
    F: FnOnce(Streams) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let (mut sink, mut incoming) = socket.split();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let (resize_tx, resize_rx) = mpsc::channel::<TermSize>(4);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(16);
    let (err_tx, mut err_rx) = mpsc::channel::<Bytes>(16);

    // Kubernetes announces the connection with an empty message on the lowest writable channel.
    let first = if stdout {
        STDOUT
    } else if stderr {
        STDERR
    } else {
        ERROR
    };
    // Nothing is sent for ANNOUNCE_DELAY after the upgrade (the session starts meanwhile).
    let announce = tokio::time::sleep(ANNOUNCE_DELAY);
    tokio::pin!(announce);
    let mut announced = false;

    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some(Ok(msg)) = incoming.next().await {
            let wire = match msg {
                Message::Binary(b) => Wire::Binary(b.to_vec()),
                Message::Text(t) => Wire::Text(t.to_string()),
                Message::Close(_) => break,
                _ => continue,
            };
            match decode(proto, &wire) {
                Ok(Incoming::Stdin(data)) => {
                    if let Some(tx) = &stdin_tx {
                        if tx.send(Bytes::from(data)).await.is_err() {
                            stdin_tx = None;
                        }
                    }
                }
                Ok(Incoming::StdinClosed) => stdin_tx = None,
                Ok(Incoming::Resize(size)) => {
                    let _ = resize_tx.try_send(size);
                }
                Ok(Incoming::Ignored) => {}
                Err(e) => tracing::debug!(error = %e, "ignoring a malformed stream message"),
            }
        }
        // The client is gone (or closed its side): stdin ends with it.
    });

    let streams = Streams {
        stdin: stdin.then_some(stdin_rx),
        stdout: stdout.then_some(out_tx),
        stderr: stderr.then_some(err_tx),
        resize: resize_rx,
    };
    let session = session(streams);
    tokio::pin!(session);
    let mut outcome = None;
    let (mut out_open, mut err_open) = (true, true);
    while !announced || outcome.is_none() || out_open || err_open {
        let (channel, data) = tokio::select! {
            o = &mut session, if outcome.is_none() => { outcome = Some(o); continue; }
            () = &mut announce, if !announced => { announced = true; (first, Bytes::new()) }
            d = out_rx.recv(), if announced && out_open => match d { Some(d) => (STDOUT, d), None => { out_open = false; continue; } },
            d = err_rx.recv(), if announced && err_open => match d { Some(d) => (STDERR, d), None => { err_open = false; continue; } },
        };
        if sink.send(to_message(encode(proto, channel, &data))).await.is_err() {
            reader.abort();
            return;
        }
    }
    reader.abort();
    let outcome = outcome.unwrap_or(Outcome::Exited(0));
    if let Some(payload) = final_message(proto, &outcome) {
        let _ = sink.send(to_message(encode(proto, ERROR, &payload))).await;
    }
    // A normal closure (1000) is EOF to client-go; a close without a code is an error to it.
    let _ = sink.send(Message::Close(Some(CloseFrame { code: close_code::NORMAL, reason: "".into() }))).await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates() {
        assert_eq!(Protocol::from_header(Some("v5.channel.k8s.io")), Some(Protocol::V5));
        assert_eq!(Protocol::from_header(Some("v4.base64.channel.k8s.io")), Some(Protocol::V4Base64));
        assert_eq!(Protocol::from_header(None), Some(Protocol::V1));
        assert_eq!(Protocol::from_header(Some("v9.channel.k8s.io")), None);
        assert!(PROTOCOLS.iter().all(|p| Protocol::from_header(Some(p)).is_some()));
    }

    #[test]
    fn frames_binary_and_base64() {
        assert_eq!(encode(Protocol::V5, STDOUT, b"hi"), Wire::Binary(vec![1, b'h', b'i']));
        assert_eq!(encode(Protocol::V4Base64, STDERR, b"hi"), Wire::Text("2aGk=".into()));
        assert_eq!(decode(Protocol::V4, &Wire::Binary(vec![0, b'x'])).unwrap(), Incoming::Stdin(b"x".to_vec()));
        assert_eq!(decode(Protocol::V4Base64, &Wire::Text("0eA==".into())).unwrap(), Incoming::Stdin(b"x".to_vec()));
        assert_eq!(decode(Protocol::V4, &Wire::Binary(vec![])).unwrap(), Incoming::Ignored);
        assert_eq!(decode(Protocol::V4, &Wire::Binary(vec![0])).unwrap(), Incoming::Ignored);
        // A text frame on a binary protocol carries the raw channel byte (Python's client).
        assert_eq!(decode(Protocol::V5, &Wire::Text("\0hi\n".into())).unwrap(), Incoming::Stdin(b"hi\n".to_vec()));
        assert_eq!(
            decode(Protocol::V4, &Wire::Text("\u{4}{\"Width\":80}".into())).unwrap(),
            Incoming::Resize(TermSize { width: 80, height: 0 })
        );
        assert_eq!(
            decode(Protocol::V4Base64, &Wire::Binary(b"0eA==".to_vec())).unwrap(),
            Incoming::Stdin(b"x".to_vec())
        );
        assert!(decode(Protocol::V4Base64, &Wire::Text("0!!!".into())).is_err());
    }

    #[test]
    fn close_signal_only_in_v5() {
        assert_eq!(decode(Protocol::V5, &Wire::Binary(vec![255, 0])).unwrap(), Incoming::StdinClosed);
        assert_eq!(decode(Protocol::V5, &Wire::Binary(vec![255, 1])).unwrap(), Incoming::Ignored);
        assert_eq!(decode(Protocol::V4, &Wire::Binary(vec![255, 0])).unwrap(), Incoming::Ignored);
    }

    #[test]
    fn resize_messages() {
        let m = Wire::Binary([&[RESIZE][..], br#"{"Width":120,"Height":40}"#].concat());
        assert_eq!(decode(Protocol::V5, &m).unwrap(), Incoming::Resize(TermSize { width: 120, height: 40 }));
        assert!(decode(Protocol::V5, &Wire::Binary(vec![RESIZE, b'{'])).is_err());
    }

    #[test]
    fn error_channel_payloads() {
        let ok: Value = serde_json::from_slice(&final_message(Protocol::V5, &Outcome::Exited(0)).unwrap()).unwrap();
        assert_eq!(ok["status"], "Success");
        let bad: Value = serde_json::from_slice(&final_message(Protocol::V4, &Outcome::Exited(3)).unwrap()).unwrap();
        assert_eq!(bad["reason"], "NonZeroExitCode");
        assert_eq!(bad["details"]["causes"][0]["message"], "3");
        assert_eq!(final_message(Protocol::V1, &Outcome::Exited(0)), None);
        let v1 = String::from_utf8(final_message(Protocol::V1, &Outcome::Exited(3)).unwrap()).unwrap();
        assert!(v1.contains("exit code 3"), "{v1}");
    }
}
