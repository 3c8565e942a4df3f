//! SPDY/3.1 as Kubernetes' streaming protocols use it (the `spdystream` flavour): framing,
//! header-block compression, and a small server-side connection driver.
//!
//! Frames (draft-mbelshe-httpbis-spdy-00): a control frame is `1 | version:15 | type:16 |
//! flags:8 | length:24 | payload`, a data frame `0 | stream-id:31 | flags:8 | length:24 |
//! data`. Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are `count:32` then `len:32 name
//! len:32 value` pairs, compressed with zlib using SPDY/3's preset dictionary; each direction
//! of a connection keeps one compression context for its lifetime and flushes it (SYNC_FLUSH)
//! at the end of every header block.
//!
//! The driver ([`serve`]) is what a Kubernetes streaming server needs: the client opens every
//! stream; the server answers each SYN_STREAM with an empty SYN_REPLY, answers PINGs, and
//! ignores flow control (spdystream neither sends nor honours WINDOW_UPDATE).

use std::collections::HashMap;
use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

pub const VERSION: u16 = 3;
pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used here.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_CANCEL: u32 = 5;

/// The largest frame payload accepted from a peer (spdystream never sends more than 64 KiB
/// of data per frame; header blocks are tiny).
pub const MAX_FRAME_LEN: usize = 1 << 20;
/// Data written by the server is split into frames of at most this size.
const MAX_DATA_CHUNK: usize = 32 * 1024;
/// The largest decompressed header block accepted.
const MAX_HEADER_BLOCK: usize = 256 * 1024;

/// SPDY/3's zlib dictionary: length-prefixed common header names and values, then a run of
/// status codes, month and day names and common content types (spec section 2.6.10.1).
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
        "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
        "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
        "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
        "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
        "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
        "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut d = Vec::with_capacity(1423);
    for w in WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(TAIL.as_bytes());
    d
});

/// Header names are lower case on the wire; a name may carry several values (NUL-separated
/// on the wire, separate entries here).
pub type Headers = Vec<(String, String)>;

/// The first value of header `name` (case-insensitive).
pub fn header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type this implementation does not know (ignored, as the spec says).
    Unknown {
        kind: u16,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("header block: {0}")]
    Headers(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One direction's header compression context plus framing: `encode` for what we send,
/// `decode` for what we receive. A connection owns one of each (they never share state).
pub struct Encoder {
    deflate: Compress,
}

pub struct Decoder {
    inflate: Decompress,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        let mut deflate = Compress::new(Compression::default(), true);
        // Only fails if called after data was compressed.
        let _ = deflate.set_dictionary(&DICTIONARY);
        Encoder { deflate }
    }

    fn compress_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, Error> {
        // Group repeated names into one NUL-separated value, keeping first-seen order.
        let mut order: Vec<String> = Vec::new();
        let mut values: HashMap<String, Vec<&str>> = HashMap::new();
        for (k, v) in headers {
            let k = k.to_ascii_lowercase();
            if !values.contains_key(&k) {
                order.push(k.clone());
            }
            values.entry(k).or_default().push(v);
        }
        let mut raw = Vec::new();
        raw.put_u32(order.len() as u32);
        for k in &order {
            let v = values[k].join("\0");
            raw.put_u32(k.len() as u32);
            raw.put_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.put_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut consumed = 0usize;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let before_in = self.deflate.total_in();
            self.deflate
                .compress_vec(&raw[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| Error::Headers(e.to_string()))?;
            consumed += (self.deflate.total_in() - before_in) as usize;
            // Done when all input is in and the flush left spare room in the buffer.
            if consumed == raw.len() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }

    /// Append the wire form of `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), Error> {
        let control = |out: &mut BytesMut, kind: u16, flags: u8, payload: &[u8]| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32(((flags as u32) << 24) | payload.len() as u32);
            out.put_slice(payload);
        };
        let mut p = Vec::new();
        match frame {
            Frame::SynStream { stream_id, associated, priority, flags, headers } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(associated & 0x7fff_ffff);
                p.put_u8((priority & 0x7) << 5);
                p.put_u8(0); // slot
                p.extend(self.compress_headers(headers)?);
                control(out, SYN_STREAM, *flags, &p);
            }
            Frame::SynReply { stream_id, flags, headers } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.extend(self.compress_headers(headers)?);
                control(out, SYN_REPLY, *flags, &p);
            }
            Frame::Headers { stream_id, flags, headers } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.extend(self.compress_headers(headers)?);
                control(out, HEADERS, *flags, &p);
            }
            Frame::RstStream { stream_id, status } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(*status);
                control(out, RST_STREAM, 0, &p);
            }
            Frame::Settings { flags, entries } => {
                p.put_u32(entries.len() as u32);
                for (f, id, value) in entries {
                    p.put_u32(((*f as u32) << 24) | (id & 0x00ff_ffff));
                    p.put_u32(*value);
                }
                control(out, SETTINGS, *flags, &p);
            }
            Frame::Ping { id } => control(out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                p.put_u32(last_good & 0x7fff_ffff);
                p.put_u32(*status);
                control(out, GOAWAY, 0, &p);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(delta & 0x7fff_ffff);
                control(out, WINDOW_UPDATE, 0, &p);
            }
            Frame::Data { stream_id, flags, data } => {
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u32(((*flags as u32) << 24) | data.len() as u32);
                out.put_slice(data);
            }
            Frame::Unknown { .. } => {}
        }
        Ok(())
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder { inflate: Decompress::new(true) }
    }

    fn decompress_headers(&mut self, mut input: &[u8]) -> Result<Headers, Error> {
        let herr = |m: &str| Error::Headers(m.to_string());
        let mut raw: Vec<u8> = Vec::with_capacity(input.len() * 4 + 64);
        loop {
            if raw.capacity() - raw.len() < 256 {
                raw.reserve(1024);
            }
            let (before_in, before_out) = (self.inflate.total_in(), self.inflate.total_out());
            match self.inflate.decompress_vec(input, &mut raw, FlushDecompress::Sync) {
                Ok(Status::StreamEnd) => return Err(herr("compression stream ended")),
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate.set_dictionary(&DICTIONARY).map_err(|e| Error::Headers(e.to_string()))?;
                }
                Err(e) => return Err(Error::Headers(e.to_string())),
            }
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            if used == 0 && self.inflate.total_out() == before_out && !input.is_empty() && raw.len() < raw.capacity() {
                return Err(herr("truncated compressed data"));
            }
            if raw.len() > MAX_HEADER_BLOCK {
                return Err(herr("header block too large"));
            }
            // All input consumed with room to spare: everything it holds has been produced.
            if input.is_empty() && raw.len() < raw.capacity() {
                break;
            }
        }
        parse_header_block(&raw)
    }

    /// Take one complete frame off the front of `buf`; `Ok(None)` when more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, Error> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = (u32::from_be_bytes([0, buf[5], buf[6], buf[7]])) as usize;
        if len > MAX_FRAME_LEN {
            return Err(Error::TooLarge(len));
        }
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let head = buf.split_to(8);
        let mut p = buf.split_to(len).freeze();
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            let stream_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
            return Ok(Some(Frame::Data { stream_id, flags, data: p }));
        }
        let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
        if version != VERSION {
            return Err(Error::Version(version));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let need =
            |p: &Bytes, n: usize, what: &'static str| if p.len() < n { Err(Error::Malformed(what)) } else { Ok(()) };
        let frame = match kind {
            SYN_STREAM => {
                need(&p, 10, "SYN_STREAM")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let associated = p.get_u32() & 0x7fff_ffff;
                let priority = p.get_u8() >> 5;
                let _slot = p.get_u8();
                let headers = self.decompress_headers(&p)?;
                Frame::SynStream { stream_id, associated, priority, flags, headers }
            }
            SYN_REPLY => {
                need(&p, 4, "SYN_REPLY")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                Frame::SynReply { stream_id, flags, headers: self.decompress_headers(&p)? }
            }
            HEADERS => {
                need(&p, 4, "HEADERS")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                Frame::Headers { stream_id, flags, headers: self.decompress_headers(&p)? }
            }
            RST_STREAM => {
                need(&p, 8, "RST_STREAM")?;
                Frame::RstStream { stream_id: p.get_u32() & 0x7fff_ffff, status: p.get_u32() }
            }
            SETTINGS => {
                need(&p, 4, "SETTINGS")?;
                let n = p.get_u32() as usize;
                if p.len() != n.saturating_mul(8) {
                    return Err(Error::Malformed("SETTINGS"));
                }
                let entries = (0..n)
                    .map(|_| {
                        let a = p.get_u32();
                        ((a >> 24) as u8, a & 0x00ff_ffff, p.get_u32())
                    })
                    .collect();
                Frame::Settings { flags, entries }
            }
            PING => {
                need(&p, 4, "PING")?;
                Frame::Ping { id: p.get_u32() }
            }
            GOAWAY => {
                need(&p, 4, "GOAWAY")?;
                let last_good = p.get_u32() & 0x7fff_ffff;
                let status = if p.len() >= 4 { p.get_u32() } else { 0 };
                Frame::GoAway { last_good, status }
            }
            WINDOW_UPDATE => {
                need(&p, 8, "WINDOW_UPDATE")?;
                Frame::WindowUpdate { stream_id: p.get_u32() & 0x7fff_ffff, delta: p.get_u32() & 0x7fff_ffff }
            }
            kind => Frame::Unknown { kind },
        };
        Ok(Some(frame))
    }
}

/// Parse an uncompressed header block.
pub fn parse_header_block(mut b: &[u8]) -> Result<Headers, Error> {
    let herr = |m: &str| Error::Headers(m.to_string());
    let take = |b: &mut &[u8]| -> Result<Vec<u8>, Error> {
        if b.len() < 4 {
            return Err(herr("truncated"));
        }
        let n = b.get_u32() as usize;
        if b.len() < n {
            return Err(herr("truncated"));
        }
        let v = b[..n].to_vec();
        b.advance(n);
        Ok(v)
    };
    if b.len() < 4 {
        return Err(herr("truncated"));
    }
    let count = b.get_u32() as usize;
    let mut out = Vec::new();
    for _ in 0..count {
        let name = String::from_utf8(take(&mut b)?).map_err(|_| herr("name is not UTF-8"))?;
        let value = String::from_utf8(take(&mut b)?).map_err(|_| herr("value is not UTF-8"))?;
        if name.is_empty() {
            return Err(herr("empty header name"));
        }
        for v in value.split('\0') {
            out.push((name.to_ascii_lowercase(), v.to_string()));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The HTTP upgrade.

pub const HEADER_PROTOCOL_VERSION: &str = "X-Stream-Protocol-Version";
pub const HEADER_ACCEPTED_PROTOCOL_VERSIONS: &str = "X-Accepted-Stream-Protocol-Versions";

/// Whether a request asks to upgrade to SPDY/3.1.
pub fn is_spdy_upgrade(headers: &http::HeaderMap) -> bool {
    let has = |name: http::header::HeaderName, want: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(want))
    };
    has(http::header::CONNECTION, "upgrade") && has(http::header::UPGRADE, "SPDY/3.1")
}

/// Kubernetes' stream protocol negotiation: the first protocol the client lists that the
/// server supports. `Err` carries the HTTP status and message when there is none.
pub fn negotiate(client: &[String], server: &[&str]) -> Result<String, (u16, String)> {
    if client.is_empty() {
        return Err((400, format!("unable to upgrade: {HEADER_PROTOCOL_VERSION} is required")));
    }
    client.iter().find(|c| server.contains(&c.as_str())).cloned().ok_or_else(|| {
        (
            403,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{}]",
                client.join(" "),
                server.join(" ")
            ),
        )
    })
}

/// The protocols a client offers in `X-Stream-Protocol-Version` (repeated or comma-separated).
pub fn client_protocols(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all(HEADER_PROTOCOL_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Answer a SPDY upgrade request: negotiate among `server_protocols`, reply 101, and once the
/// connection is switched run `serve(connection, negotiated protocol)`.
pub fn upgrade<F, Fut>(mut req: axum::extract::Request, server_protocols: &[&str], serve: F) -> axum::response::Response
where
    F: FnOnce(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use axum::response::IntoResponse;
    let protocol = match negotiate(&client_protocols(req.headers()), server_protocols) {
        Ok(p) => p,
        Err((code, msg)) => {
            let mut resp =
                (http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_REQUEST), msg).into_response();
            for p in server_protocols {
                if let Ok(v) = http::HeaderValue::from_str(p) {
                    resp.headers_mut().append(HEADER_ACCEPTED_PROTOCOL_VERSIONS, v);
                }
            }
            return resp;
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let chosen = protocol.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => serve(hyper_util::rt::TokioIo::new(up), chosen).await,
            Err(e) => tracing::debug!(error = %e, "SPDY upgrade failed"),
        }
    });
    let mut resp = http::Response::new(axum::body::Body::empty());
    *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(http::header::CONNECTION, http::HeaderValue::from_static("Upgrade"));
    h.insert(http::header::UPGRADE, http::HeaderValue::from_static("SPDY/3.1"));
    if let Ok(v) = http::HeaderValue::from_str(&protocol) {
        h.insert(HEADER_PROTOCOL_VERSION, v);
    }
    resp
}

// ---------------------------------------------------------------------------------------------
// The connection driver.

/// What the driver's writer task is asked to do.
enum Out {
    Frame(Frame),
    /// Flush and close the write side of the transport.
    Shutdown,
}

/// The sending side of a connection; cheap to clone.
#[derive(Clone)]
pub struct Sender {
    tx: mpsc::Sender<Out>,
}

/// The connection has gone away.
#[derive(Debug, thiserror::Error)]
#[error("SPDY connection closed")]
pub struct Closed;

impl Sender {
    async fn frame(&self, f: Frame) -> Result<(), Closed> {
        self.tx.send(Out::Frame(f)).await.map_err(|_| Closed)
    }
    /// Close the connection (after what was queued before is written).
    pub async fn shutdown(&self) {
        let _ = self.tx.send(Out::Shutdown).await;
    }
}

/// The write half of one stream.
#[derive(Clone)]
pub struct StreamWriter {
    pub id: u32,
    sender: Sender,
}

impl StreamWriter {
    /// Send `data` (split into frames as needed).
    pub async fn write(&self, data: &[u8]) -> Result<(), Closed> {
        for chunk in data.chunks(MAX_DATA_CHUNK) {
            let data = Bytes::copy_from_slice(chunk);
            self.sender.frame(Frame::Data { stream_id: self.id, flags: 0, data }).await?;
        }
        Ok(())
    }
    /// Half-close: an empty data frame with FIN.
    pub async fn close(&self) -> Result<(), Closed> {
        self.sender.frame(Frame::Data { stream_id: self.id, flags: FLAG_FIN, data: Bytes::new() }).await
    }
    /// Abort the stream.
    pub async fn reset(&self) -> Result<(), Closed> {
        self.sender.frame(Frame::RstStream { stream_id: self.id, status: RST_CANCEL }).await
    }
}

/// A stream the client opened: its headers, the data it sends (ends at FIN, RST or when the
/// connection goes away), and a writer.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub data: mpsc::Receiver<Bytes>,
    pub writer: StreamWriter,
}

impl Stream {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
    /// Read everything the client sends until it half-closes.
    #[cfg(test)]
    pub async fn read_to_end(&mut self) -> Vec<u8> {
        let mut all = Vec::new();
        while let Some(b) = self.data.recv().await {
            all.extend_from_slice(&b);
        }
        all
    }
}

/// The server side of a SPDY connection over `io`: returns the stream of client-opened
/// streams and a sender for closing the connection. The connection ends when the client
/// closes it (GOAWAY or EOF) or on a protocol error; then every stream's data ends.
pub fn serve<T>(io: T) -> (mpsc::Receiver<Stream>, Sender)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(64);
    let sender = Sender { tx: out_tx };
    let (streams_tx, streams_rx) = mpsc::channel::<Stream>(16);

    let writer = tokio::spawn(async move {
        let mut enc = Encoder::new();
        let mut buf = BytesMut::new();
        while let Some(out) = out_rx.recv().await {
            match out {
                Out::Frame(f) => {
                    buf.clear();
                    if let Err(e) = enc.encode(&f, &mut buf) {
                        tracing::warn!(error = %e, "SPDY: cannot encode a frame");
                        break;
                    }
                    if wr.write_all(&buf).await.is_err() {
                        break;
                    }
                    // Flush when nothing else is queued.
                    if out_rx.is_empty() && wr.flush().await.is_err() {
                        break;
                    }
                }
                Out::Shutdown => break,
            }
        }
        let _ = wr.flush().await;
        let _ = wr.shutdown().await;
    });

    let reader_sender = sender.clone();
    tokio::spawn(async move {
        let mut dec = Decoder::new();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut open: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
        let mut last_id = 0u32;
        'conn: loop {
            loop {
                let frame = match dec.decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "SPDY protocol error");
                        let _ = reader_sender.frame(Frame::GoAway { last_good: last_id, status: 1 }).await;
                        break 'conn;
                    }
                };
                match frame {
                    Frame::SynStream { stream_id, flags, headers, .. } => {
                        if stream_id == 0 || open.contains_key(&stream_id) {
                            let _ =
                                reader_sender.frame(Frame::RstStream { stream_id, status: RST_PROTOCOL_ERROR }).await;
                            continue;
                        }
                        last_id = last_id.max(stream_id);
                        let (dtx, drx) = mpsc::channel(64);
                        if flags & FLAG_FIN == 0 {
                            open.insert(stream_id, dtx);
                        }
                        let _ = reader_sender.frame(Frame::SynReply { stream_id, flags: 0, headers: vec![] }).await;
                        let stream = Stream {
                            id: stream_id,
                            headers,
                            data: drx,
                            writer: StreamWriter { id: stream_id, sender: reader_sender.clone() },
                        };
                        if streams_tx.send(stream).await.is_err() {
                            // Nobody accepts streams any more.
                            let _ = reader_sender.frame(Frame::RstStream { stream_id, status: RST_CANCEL }).await;
                        }
                    }
                    Frame::Data { stream_id, flags, data } => {
                        if let Some(tx) = open.get(&stream_id) {
                            // A consumer that went away just drops the data.
                            if !data.is_empty() && tx.send(data).await.is_err() {
                                tracing::trace!(stream_id, "SPDY data for a dropped stream");
                            }
                        }
                        if flags & FLAG_FIN != 0 {
                            open.remove(&stream_id);
                        }
                    }
                    Frame::RstStream { stream_id, .. } => {
                        open.remove(&stream_id);
                    }
                    Frame::Ping { id } => {
                        let _ = reader_sender.frame(Frame::Ping { id }).await;
                    }
                    Frame::GoAway { .. } => break 'conn,
                    Frame::SynReply { .. }
                    | Frame::Headers { .. }
                    | Frame::Settings { .. }
                    | Frame::WindowUpdate { .. }
                    | Frame::Unknown { .. } => {}
                }
            }
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        drop(open);
        drop(streams_tx);
        reader_sender.shutdown().await;
        // Once the writer has drained, nothing more can be sent.
        let _ = writer.await;
    });
    (streams_rx, sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let mut wire = BytesMut::new();
        for f in frames {
            enc.encode(f, &mut wire).unwrap();
        }
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut wire).unwrap() {
            out.push(f);
        }
        assert!(wire.is_empty());
        out
    }

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn protocol_negotiation() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let server = ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"];
        assert_eq!(
            negotiate(&c(&["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io"]), &server).unwrap(),
            "v4.channel.k8s.io"
        );
        assert_eq!(negotiate(&c(&["channel.k8s.io"]), &server).unwrap(), "channel.k8s.io");
        let (code, msg) = negotiate(&c(&["portforward.k8s.io"]), &server).unwrap_err();
        assert_eq!(code, 403);
        assert!(msg.contains("unable to negotiate protocol"), "{msg}");
        assert_eq!(negotiate(&[], &server).unwrap_err().0, 400);
        let mut h = http::HeaderMap::new();
        h.append(HEADER_PROTOCOL_VERSION, "v4.channel.k8s.io".parse().unwrap());
        h.append(HEADER_PROTOCOL_VERSION, "v3.channel.k8s.io, v2.channel.k8s.io".parse().unwrap());
        assert_eq!(client_protocols(&h), c(&["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"]));
        h.insert(http::header::CONNECTION, "Upgrade".parse().unwrap());
        assert!(!is_spdy_upgrade(&h));
        h.insert(http::header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_spdy_upgrade(&h));
    }

    #[test]
    fn dictionary_is_spdy3s() {
        let d = &*DICTIONARY;
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b",*,enq=0."));
        // zlib's dictionary id (Adler-32) as it appears in every SPDY/3 header stream.
        let (mut a, mut b) = (1u32, 0u32);
        for &x in d {
            a = (a + x as u32) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn every_frame_type_round_trips() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated: 0,
                priority: 3,
                flags: 0,
                headers: h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynReply { stream_id: 1, flags: 0, headers: vec![] },
            Frame::Data { stream_id: 1, flags: 0, data: Bytes::from_static(b"hello") },
            Frame::Data { stream_id: 1, flags: FLAG_FIN, data: Bytes::new() },
            Frame::RstStream { stream_id: 3, status: RST_CANCEL },
            Frame::Settings { flags: 0, entries: vec![(0, 7, 65536), (1, 4, 100)] },
            Frame::Ping { id: 7 },
            Frame::GoAway { last_good: 5, status: 0 },
            Frame::Headers { stream_id: 5, flags: FLAG_FIN, headers: h(&[("a", "b")]) },
            Frame::WindowUpdate { stream_id: 5, delta: 1000 },
            Frame::SynStream {
                stream_id: 3,
                associated: 0,
                priority: 0,
                flags: FLAG_FIN,
                headers: h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            },
        ];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn header_compression_shares_one_context_per_direction() {
        // A value that does not compress on its own (an LCG's hex digits)...
        let mut x = 12345u32;
        let noise: String = (0..400)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                char::from_digit((x >> 16) % 16, 16).unwrap_or('0')
            })
            .collect();
        let one = h(&[("streamtype", "stdout"), ("x-noise", &noise)]);
        let mut enc = Encoder::new();
        let mut first = BytesMut::new();
        enc.encode(&Frame::SynReply { stream_id: 1, flags: 0, headers: one.clone() }, &mut first).unwrap();
        let mut second = BytesMut::new();
        enc.encode(&Frame::SynReply { stream_id: 3, flags: 0, headers: one.clone() }, &mut second).unwrap();
        // The second block refers back to the first, so it is much smaller...
        assert!(second.len() < first.len() / 2, "{} vs {}", second.len(), first.len());
        // ...and decodes only in sequence with the same context.
        let mut dec = Decoder::new();
        let mut wire = first.clone();
        wire.extend_from_slice(&second);
        assert!(
            matches!(dec.decode(&mut wire).unwrap(), Some(Frame::SynReply { stream_id: 1, ref headers, .. }) if *headers == one)
        );
        assert!(
            matches!(dec.decode(&mut wire).unwrap(), Some(Frame::SynReply { stream_id: 3, ref headers, .. }) if *headers == one)
        );
        let mut fresh = Decoder::new();
        assert!(fresh.decode(&mut second).is_err());
    }

    #[test]
    fn the_first_block_announces_the_dictionary() {
        let mut enc = Encoder::new();
        let mut wire = BytesMut::new();
        enc.encode(&Frame::SynReply { stream_id: 1, flags: 0, headers: vec![] }, &mut wire).unwrap();
        let block = &wire[12..];
        // zlib header with FDICT set, then the dictionary's Adler-32.
        assert_eq!(block[0] & 0x0f, 8);
        assert_ne!(block[1] & 0x20, 0);
        assert_eq!(&block[2..6], &0xe3c6_a7c2u32.to_be_bytes());
    }

    #[test]
    fn repeated_names_travel_nul_separated() {
        let hs = h(&[
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ("x-stream-protocol-version", "v3.channel.k8s.io"),
        ]);
        let got = roundtrip(&[Frame::Headers { stream_id: 1, flags: 0, headers: hs.clone() }]);
        assert_eq!(got, vec![Frame::Headers { stream_id: 1, flags: 0, headers: hs }]);
        let raw = [0, 0, 0, 1, 0, 0, 0, 1, b'A', 0, 0, 0, 3, b'x', 0, b'y'];
        assert_eq!(parse_header_block(&raw).unwrap(), h(&[("a", "x"), ("a", "y")]));
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut enc = Encoder::new();
        let mut wire = BytesMut::new();
        enc.encode(&Frame::Data { stream_id: 9, flags: 0, data: Bytes::from_static(b"0123456789") }, &mut wire)
            .unwrap();
        let mut dec = Decoder::new();
        let mut part = BytesMut::from(&wire[..12]);
        assert_eq!(dec.decode(&mut part).unwrap(), None);
        part.extend_from_slice(&wire[12..]);
        assert!(matches!(dec.decode(&mut part).unwrap(), Some(Frame::Data { stream_id: 9, .. })));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut dec = Decoder::new();
        // Version 2 control frame.
        let mut v2 = BytesMut::from(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert!(matches!(dec.decode(&mut v2), Err(Error::Version(2))));
        // Too large.
        let mut big = BytesMut::from(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xff][..]);
        assert!(matches!(dec.decode(&mut big), Err(Error::TooLarge(_))));
        // Short RST_STREAM.
        let mut short = BytesMut::from(&[0x80, 3, 0, 3, 0, 0, 0, 2, 0, 1][..]);
        assert!(matches!(dec.decode(&mut short), Err(Error::Malformed("RST_STREAM"))));
        // Garbage header block.
        let mut garbage = BytesMut::from(&[0x80, 3, 0, 2, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4][..]);
        assert!(dec.decode(&mut garbage).is_err());
        assert!(parse_header_block(&[0, 0, 0, 5, 0, 0, 0, 200]).is_err());
    }

    #[tokio::test]
    async fn driver_replies_pings_and_delivers_stream_data() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut streams, _sender) = serve(server);
        let (mut crd, mut cwr) = tokio::io::split(client);
        let mut enc = Encoder::new();
        let mut wire = BytesMut::new();
        for f in [
            Frame::Ping { id: 1 },
            Frame::SynStream {
                stream_id: 1,
                associated: 0,
                priority: 0,
                flags: 0,
                headers: h(&[("streamtype", "data")]),
            },
            Frame::Data { stream_id: 1, flags: 0, data: Bytes::from_static(b"ping") },
            Frame::Data { stream_id: 1, flags: FLAG_FIN, data: Bytes::new() },
        ] {
            enc.encode(&f, &mut wire).unwrap();
        }
        cwr.write_all(&wire).await.unwrap();
        let mut s = streams.recv().await.unwrap();
        assert_eq!(s.header("StreamType"), Some("data"));
        assert_eq!(s.read_to_end().await, b"ping");
        s.writer.write(b"pong").await.unwrap();
        s.writer.close().await.unwrap();

        let mut dec = Decoder::new();
        let mut got = Vec::new();
        let mut rbuf = BytesMut::new();
        while got.len() < 4 {
            crd.read_buf(&mut rbuf).await.unwrap();
            while let Some(f) = dec.decode(&mut rbuf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got[0], Frame::Ping { id: 1 });
        assert_eq!(got[1], Frame::SynReply { stream_id: 1, flags: 0, headers: vec![] });
        assert_eq!(got[2], Frame::Data { stream_id: 1, flags: 0, data: Bytes::from_static(b"pong") });
        assert_eq!(got[3], Frame::Data { stream_id: 1, flags: FLAG_FIN, data: Bytes::new() });

        // The client going away ends the stream of streams.
        drop(cwr);
        drop(crd);
        assert!(streams.recv().await.is_none());
    }
}
