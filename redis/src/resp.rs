//! RESP2 and RESP3 frames read from a byte stream with a size limit, and the few replies
//! the proxy writes itself. Decoding and encoding are the `redis-protocol` crate's; this
//! module only adds buffering, the limit, and one view over both protocol versions.

use argocd_agent_domain::quoted;
use bytes::{Bytes, BytesMut};
pub use redis_protocol::resp2::types::BytesFrame as Frame2;
pub use redis_protocol::resp3::types::BytesFrame as Frame3;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The RESP version a connection speaks (RESP3 after a successful `HELLO 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2, what every connection starts with.
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The bytes are not a valid frame of the connection's RESP version.
    #[error("malformed RESP frame: {0}")]
    Malformed(String),
    /// One frame is longer than the reader's limit.
    #[error("frame larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// One frame nests deeper than the reader allows.
    #[error("frame nested deeper than {max_depth} levels")]
    TooDeep {
        /// Nesting levels allowed.
        max_depth: usize,
    },
    /// The server answered a command with an error (e.g. a failed AUTH).
    #[error("refused by the server: {0}")]
    Refused(String),
    /// Reading or writing the connection failed, or it closed.
    ///
    /// The message carries the cause, so it is no `source` (a chain would print it twice).
    #[error("connection error: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for RespError {
    fn from(e: std::io::Error) -> Self {
        RespError::Io(e)
    }
}

/// One decoded frame and the exact bytes it came from (forwarded unchanged).
#[derive(Debug, Clone)]
pub struct Frame {
    /// The frame's bytes as received.
    pub raw: Bytes,
    /// The frame decoded.
    pub value: Value,
}

/// A decoded frame of either version.
#[derive(Debug, Clone)]
pub enum Value {
    /// Read on a RESP2 connection.
    V2(Frame2),
    /// Read on a RESP3 connection.
    V3(Frame3),
}

impl Value {
    /// The RESP type of the frame, as messages name it (`integer`, `array`, ...).
    fn type_name(&self) -> &'static str {
        use redis_protocol::resp3::types::{FrameKind as K, Resp3Frame};
        match self {
            Value::V2(Frame2::SimpleString(_)) => "simple string",
            Value::V2(Frame2::Error(_)) => "error",
            Value::V2(Frame2::Integer(_)) => "integer",
            Value::V2(Frame2::BulkString(_)) => "bulk string",
            Value::V2(Frame2::Array(_)) => "array",
            Value::V2(Frame2::Null) => "null",
            Value::V3(f) => match f.kind() {
                K::Array => "array",
                K::BlobString => "blob string",
                K::SimpleString => "simple string",
                K::SimpleError => "simple error",
                K::Number => "number",
                K::Null => "null",
                K::Double => "double",
                K::Boolean => "boolean",
                K::BlobError => "blob error",
                K::VerbatimString => "verbatim string",
                K::Map => "map",
                K::Set => "set",
                K::Attribute => "attribute",
                K::Push => "push",
                K::Hello => "hello",
                K::BigNumber => "big number",
                K::ChunkedString => "chunked string",
                K::EndStream => "end of stream",
            },
        }
    }
}

/// Why a reply holds no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The server answered with an error (its text, as sent).
    #[error("{0}")]
    Error(String),
    /// A reply of another type than a value or nil.
    #[error("unexpected reply: {0}")]
    Unexpected(&'static str),
}

impl Frame {
    /// An error reply.
    pub fn is_error(&self) -> bool {
        match &self.value {
            Value::V2(f) => matches!(f, Frame2::Error(_)),
            Value::V3(f) => matches!(f, Frame3::SimpleError { .. } | Frame3::BlobError { .. }),
        }
    }

    /// An out-of-band RESP3 push.
    pub fn is_push(&self) -> bool {
        matches!(&self.value, Value::V3(Frame3::Push { .. }))
    }

    /// The frame as a command: an array of bulk (or simple) strings.
    pub fn command(&self) -> Option<Vec<Bytes>> {
        match &self.value {
            Value::V2(Frame2::Array(items)) => items
                .iter()
                .map(|i| match i {
                    Frame2::BulkString(b) | Frame2::SimpleString(b) => Some(b.clone()),
                    _ => None,
                })
                .collect(),
            Value::V3(Frame3::Array { data, .. }) => data
                .iter()
                .map(|i| match i {
                    Frame3::BlobString { data, .. } | Frame3::SimpleString { data, .. } => {
                        Some(data.clone())
                    }
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// A GET reply: `Ok(Some(value))`, `Ok(None)` for nil, `Err` for an error reply or an
    /// unexpected type.
    pub fn into_value(self) -> Result<Option<Bytes>, ReplyError> {
        match self.value {
            Value::V2(Frame2::BulkString(b) | Frame2::SimpleString(b)) => Ok(Some(b)),
            Value::V2(Frame2::Null) | Value::V3(Frame3::Null) => Ok(None),
            Value::V3(Frame3::BlobString { data, .. } | Frame3::SimpleString { data, .. }) => {
                Ok(Some(data))
            }
            Value::V2(Frame2::Error(e)) => Err(ReplyError::Error(e.to_string())),
            Value::V3(Frame3::SimpleError { data, .. }) => Err(ReplyError::Error(data.to_string())),
            Value::V3(Frame3::BlobError { data, .. }) => Err(ReplyError::Error(
                String::from_utf8_lossy(&data).into_owned(),
            )),
            other => Err(ReplyError::Unexpected(other.type_name())),
        }
    }

    /// The text of an error reply (what [`Frame::into_value`] refuses with); empty for a
    /// reply that is no error.
    pub fn error_text(self) -> String {
        self.into_value()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// A pub/sub message (`message <channel> <payload>`, RESP2 array or RESP3 push): the
    /// payload.
    pub fn into_message(self) -> Option<Bytes> {
        let items: Vec<Bytes> = match &self.value {
            Value::V2(Frame2::Array(_)) | Value::V3(Frame3::Push { .. }) => self.push_items()?,
            _ => return None,
        };
        match items.as_slice() {
            [kind, _channel, payload] if kind.eq_ignore_ascii_case(b"message") => {
                Some(payload.clone())
            }
            _ => None,
        }
    }

    fn push_items(&self) -> Option<Vec<Bytes>> {
        let as_bytes2 = |f: &Frame2| match f {
            Frame2::BulkString(b) | Frame2::SimpleString(b) => Some(b.clone()),
            Frame2::Integer(i) => Some(Bytes::from(i.to_string())),
            _ => None,
        };
        let as_bytes3 = |f: &Frame3| match f {
            Frame3::BlobString { data, .. } | Frame3::SimpleString { data, .. } => {
                Some(data.clone())
            }
            Frame3::Number { data, .. } => Some(Bytes::from(data.to_string())),
            _ => None,
        };
        match &self.value {
            Value::V2(Frame2::Array(items)) => items.iter().map(as_bytes2).collect(),
            Value::V3(Frame3::Push { data, .. } | Frame3::Array { data, .. }) => {
                data.iter().map(as_bytes3).collect()
            }
            _ => None,
        }
    }
}

/// Frames from bytes that arrive in pieces, holding at most `limit` bytes of one frame and
/// nesting at most `max_depth` levels. [`FrameReader`] feeds it from a stream.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    limit: usize,
    max_depth: usize,
    scan: Scan,
}

impl Decoder {
    /// An empty decoder: at most `limit` bytes per frame, `max_depth` nesting levels.
    pub fn new(limit: usize, max_depth: usize) -> Self {
        Decoder {
            buf: BytesMut::new(),
            limit,
            max_depth,
            scan: Scan::default(),
        }
    }

    /// Appends bytes as they arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if there is one.
    pub fn next(&mut self, protocol: Protocol) -> Result<Option<Frame>, RespError> {
        decode_with(
            &mut self.buf,
            &mut self.scan,
            protocol,
            self.limit,
            self.max_depth,
        )
    }

    /// Whether part of a frame is buffered.
    pub fn partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Reads frames from a stream through a [`Decoder`].
pub struct FrameReader<R> {
    io: R,
    dec: Decoder,
}

const READ_CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Reads `io`: at most `limit` bytes per frame, [`DEFAULT_MAX_DEPTH`] nesting levels.
    pub fn new(io: R, limit: usize) -> Self {
        let mut dec = Decoder::new(limit, DEFAULT_MAX_DEPTH);
        dec.buf.reserve(READ_CHUNK);
        FrameReader { io, dec }
    }

    /// Allows at most `max_depth` nesting levels (1: an array of strings, as a Redis server
    /// reads commands).
    pub fn with_max_depth(mut self, max_depth: usize) -> Self {
        self.dec.max_depth = max_depth;
        self
    }

    /// Changes the size limit (from the next frame on, and for the one being read).
    pub fn set_limit(&mut self, limit: usize) {
        self.dec.limit = limit;
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// Decodes one frame from what is buffered, if complete.
    pub fn decode(&mut self, protocol: Protocol) -> Result<Option<Frame>, RespError> {
        self.dec.next(protocol)
    }

    /// Reads more bytes; false at end of stream.
    pub async fn fill(&mut self) -> Result<bool, RespError> {
        self.dec.buf.reserve(READ_CHUNK);
        Ok(self.io.read_buf(&mut self.dec.buf).await? > 0)
    }

    /// The next frame; `None` at a clean end of stream.
    pub async fn next(&mut self, protocol: Protocol) -> Result<Option<Frame>, RespError> {
        loop {
            if let Some(f) = self.decode(protocol)? {
                return Ok(Some(f));
            }
            if !self.fill().await? {
                return if self.dec.partial() {
                    Err(RespError::Io(std::io::ErrorKind::UnexpectedEof.into()))
                } else {
                    Ok(None)
                };
            }
        }
    }

    /// Whether part of a frame is buffered (the client started a command).
    pub fn partial(&self) -> bool {
        self.dec.partial()
    }
}

/// Decodes one frame from `buf` (consuming it), or `None` when more bytes are needed; at
/// most [`DEFAULT_MAX_DEPTH`] nesting levels.
pub fn decode(
    buf: &mut BytesMut,
    protocol: Protocol,
    limit: usize,
) -> Result<Option<Frame>, RespError> {
    decode_with(
        buf,
        &mut Scan::default(),
        protocol,
        limit,
        DEFAULT_MAX_DEPTH,
    )
}

fn decode_with(
    buf: &mut BytesMut,
    scan: &mut Scan,
    protocol: Protocol,
    limit: usize,
    max_depth: usize,
) -> Result<Option<Frame>, RespError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let len = match scan.frame_len(buf, max_depth, limit)? {
        Some(len) if len > limit => return Err(RespError::TooLarge { limit }),
        Some(len) => len,
        None if buf.len() > limit => return Err(RespError::TooLarge { limit }),
        None => return Ok(None),
    };
    *scan = Scan::default();
    // The crate sees exactly one complete frame whose nesting is bounded.
    let mut one = buf.split_to(len);
    let decoded = match protocol {
        Protocol::Resp2 => redis_protocol::resp2::decode::decode_bytes_mut(&mut one).map(|o| {
            o.map(|(f, _, raw)| Frame {
                raw,
                value: Value::V2(f),
            })
        }),
        Protocol::Resp3 => {
            redis_protocol::resp3::decode::complete::decode_bytes_mut(&mut one).map(|o| {
                o.map(|(f, _, raw)| Frame {
                    raw,
                    value: Value::V3(f),
                })
            })
        }
    };
    match decoded {
        Ok(Some(f)) if one.is_empty() => Ok(Some(f)),
        Ok(_) => Err(RespError::Malformed(
            "the frame's length disagrees with its headers".into(),
        )),
        Err(e) => Err(RespError::Malformed(e.details().to_owned())),
    }
}

/// Nesting allowed by default in frames from a server (replies of real Redis commands nest a
/// few levels; the depth is what bounds the decoder's recursion).
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// Walks a frame's headers without recursion, before the `redis-protocol` crate decodes it:
/// that crate recurses once per nesting level with no limit of its own, so a deeply nested
/// array (a few bytes per level) would overflow the stack. The walk knows where the frame
/// ends, so the crate is called once per frame, never on a partial one; it resumes where it
/// stopped when more bytes arrive. (Hand-written: no RESP crate bounds nesting.)
#[derive(Debug, Default)]
struct Scan {
    /// Where the next header starts.
    pos: usize,
    /// Open aggregates: elements still expected, and whether it is an attribute (which
    /// precedes the value it describes and is not an element itself).
    open: Vec<(u64, bool)>,
}

/// A RESP length or count line (`-1` for the RESP2 null).
fn parse_len(line: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|n| *n >= -1)
        .ok_or_else(|| {
            RespError::Malformed(format!(
                "invalid length {}",
                quoted(&String::from_utf8_lossy(&line[..line.len().min(32)]))
            ))
        })
}

impl Scan {
    /// The length of the first frame of `buf` once it is complete; `None` while more bytes
    /// are needed. Errors for a frame nested deeper than `max_depth`, a frame or string
    /// larger than `limit`, and headers no RESP version has.
    fn frame_len(
        &mut self,
        buf: &[u8],
        max_depth: usize,
        limit: usize,
    ) -> Result<Option<usize>, RespError> {
        loop {
            if self.pos >= buf.len() {
                return Ok(None);
            }
            let ty = buf[self.pos];
            if !b"+-:_,#($!=*~>%|".contains(&ty) {
                return Err(RespError::Malformed(format!(
                    "unexpected type byte '{}'",
                    char::from(ty).escape_debug()
                )));
            }
            // The line after the type byte.
            let Some(eol) = buf[self.pos + 1..].windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            let eol = self.pos + 1 + eol;
            let line = &buf[self.pos + 1..eol];
            let body = eol + 2;
            let mut attribute = false;
            match ty {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => self.pos = body,
                b'$' | b'!' | b'=' => {
                    let n = parse_len(line)?;
                    if n == -1 && ty == b'$' {
                        self.pos = body;
                    } else if n < 0 {
                        return Err(RespError::Malformed("negative string length".into()));
                    } else {
                        let n = n as usize;
                        if n > limit {
                            return Err(RespError::TooLarge { limit });
                        }
                        let end = body + n + 2;
                        if end > buf.len() {
                            return Ok(None);
                        }
                        if &buf[end - 2..end] != b"\r\n" {
                            return Err(RespError::Malformed("string not followed by CRLF".into()));
                        }
                        self.pos = end;
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let n = parse_len(line)?;
                    self.pos = body;
                    if n == -1 && ty != b'*' {
                        return Err(RespError::Malformed("negative aggregate length".into()));
                    }
                    let count = if matches!(ty, b'%' | b'|') {
                        (n.max(0) as u64) * 2
                    } else {
                        n.max(0) as u64
                    };
                    attribute = ty == b'|';
                    if count > 0 {
                        if self.open.len() >= max_depth {
                            return Err(RespError::TooDeep { max_depth });
                        }
                        self.open.push((count, attribute));
                        continue;
                    }
                }
                _ => {
                    return Err(RespError::Malformed(format!(
                        "unexpected type byte '{}'",
                        char::from(ty).escape_debug()
                    )));
                }
            }
            // One element ended: close every aggregate it completes.
            loop {
                if attribute {
                    break;
                }
                let Some((remaining, is_attribute)) = self.open.last_mut() else {
                    return Ok(Some(self.pos));
                };
                *remaining -= 1;
                if *remaining > 0 {
                    break;
                }
                attribute = *is_attribute;
                self.open.pop();
            }
        }
    }
}

/// Encodes a command (an array of bulk strings; the same bytes in both versions).
pub fn command(args: &[&[u8]]) -> Bytes {
    let frame = Frame2::Array(
        args.iter()
            .map(|a| Frame2::BulkString(Bytes::copy_from_slice(a)))
            .collect(),
    );
    encode2(&frame)
}

fn encode2(frame: &Frame2) -> Bytes {
    let mut buf = BytesMut::new();
    // Encoding into a growable buffer cannot fail.
    let _ = redis_protocol::resp2::encode::extend_encode(&mut buf, frame, false);
    buf.freeze()
}

fn encode3(frame: &Frame3) -> Bytes {
    let mut buf = BytesMut::new();
    let _ = redis_protocol::resp3::encode::complete::extend_encode(&mut buf, frame, false);
    buf.freeze()
}

/// The nil reply (a cache miss for Argo CD).
pub fn nil(protocol: Protocol) -> Bytes {
    match protocol {
        Protocol::Resp2 => encode2(&Frame2::Null),
        Protocol::Resp3 => encode3(&Frame3::Null),
    }
}

/// A bulk string reply.
pub fn bulk(protocol: Protocol, value: Bytes) -> Bytes {
    match protocol {
        Protocol::Resp2 => encode2(&Frame2::BulkString(value)),
        Protocol::Resp3 => encode3(&Frame3::BlobString {
            data: value,
            attributes: None,
        }),
    }
}

/// An error reply `-<message>`; line breaks are replaced (they would end the frame).
pub fn error(message: &str) -> Bytes {
    let clean: String = message
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    encode2(&Frame2::Error(clean.into()))
}

/// A pub/sub frame `<kind> <channel> <payload>`: `message` with a payload, or
/// `subscribe`/`unsubscribe` with the subscription count (RESP2 array, RESP3 push).
pub fn pubsub(protocol: Protocol, kind: &str, channel: &[u8], payload: PubSub) -> Bytes {
    let kind = Bytes::copy_from_slice(kind.as_bytes());
    let channel = Bytes::copy_from_slice(channel);
    match protocol {
        Protocol::Resp2 => encode2(&Frame2::Array(vec![
            Frame2::BulkString(kind),
            Frame2::BulkString(channel),
            match payload {
                PubSub::Message(b) => Frame2::BulkString(b),
                PubSub::Count(n) => Frame2::Integer(n),
            },
        ])),
        Protocol::Resp3 => {
            let blob = |data| Frame3::BlobString {
                data,
                attributes: None,
            };
            encode3(&Frame3::Push {
                data: vec![
                    blob(kind),
                    blob(channel),
                    match payload {
                        PubSub::Message(b) => blob(b),
                        PubSub::Count(n) => Frame3::Number {
                            data: n,
                            attributes: None,
                        },
                    },
                ],
                attributes: None,
            })
        }
    }
}

/// The third element of a pub/sub frame.
pub enum PubSub {
    /// A published message's payload (`message`).
    Message(Bytes),
    /// The connection's subscription count after `subscribe`/`unsubscribe`.
    Count(i64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(s: &[u8]) -> BytesMut {
        BytesMut::from(s)
    }

    #[test]
    fn pipelined_commands_decode_one_by_one_and_keep_their_bytes() {
        let mut b = buf(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPI");
        let f = decode(&mut b, Protocol::Resp2, 1024).unwrap().unwrap();
        assert_eq!(
            f.command().unwrap(),
            vec![Bytes::from("GET"), Bytes::from("k")]
        );
        assert_eq!(&f.raw[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        let f = decode(&mut b, Protocol::Resp2, 1024).unwrap().unwrap();
        assert_eq!(f.command().unwrap(), vec![Bytes::from("PING")]);
        assert!(
            decode(&mut b, Protocol::Resp2, 1024).unwrap().is_none(),
            "incomplete frame waits"
        );
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        for bad in [
            &b"*2\r\n$3\r\nGET\r\n$x\r\nk\r\n"[..],
            b"?what\r\n",
            b"$-5\r\n",
            b"*-2\r\n",
            b":12a\r\n",
        ] {
            let r = decode(&mut buf(bad), Protocol::Resp2, 1024);
            assert!(matches!(r, Err(RespError::Malformed(_))), "{bad:?}: {r:?}");
        }
        let r = decode(&mut buf(b"~x\r\n"), Protocol::Resp3, 1024);
        assert!(matches!(r, Err(RespError::Malformed(_))), "{r:?}");
    }

    #[test]
    fn oversized_frames_are_refused_complete_or_not() {
        let mut big = buf(b"$100\r\n");
        big.extend_from_slice(&[b'x'; 100]);
        big.extend_from_slice(b"\r\n");
        assert!(matches!(
            decode(&mut big.clone(), Protocol::Resp2, 50),
            Err(RespError::TooLarge { limit: 50 })
        ));
        let mut partial = buf(b"$1000\r\n");
        partial.extend_from_slice(&[b'x'; 60]);
        assert!(matches!(
            decode(&mut partial, Protocol::Resp2, 50),
            Err(RespError::TooLarge { .. })
        ));
        assert!(decode(&mut big, Protocol::Resp2, 200).unwrap().is_some());
    }

    #[test]
    fn replies_follow_the_protocol_version() {
        assert_eq!(&nil(Protocol::Resp2)[..], b"$-1\r\n");
        assert_eq!(&nil(Protocol::Resp3)[..], b"_\r\n");
        assert_eq!(&bulk(Protocol::Resp2, Bytes::from("v"))[..], b"$1\r\nv\r\n");
        assert_eq!(&error("ERR a\r\nb")[..], b"-ERR a  b\r\n");
        let p = pubsub(
            Protocol::Resp3,
            "message",
            b"c",
            PubSub::Message(Bytes::new()),
        );
        assert_eq!(&p[..], b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$0\r\n\r\n");
        let s = pubsub(Protocol::Resp2, "subscribe", b"c", PubSub::Count(1));
        assert_eq!(&s[..], b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n");
    }

    #[test]
    fn messages_and_values_are_read_from_both_versions() {
        let mut b = buf(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n");
        let f = decode(&mut b, Protocol::Resp3, 1024).unwrap().unwrap();
        assert!(f.is_push());
        assert_eq!(f.into_message().unwrap(), Bytes::from("hi"));
        let mut b = buf(b"$-1\r\n");
        let f = decode(&mut b, Protocol::Resp2, 1024).unwrap().unwrap();
        assert_eq!(f.into_value(), Ok(None));
        let mut b = buf(b"-ERR no\r\n");
        let f = decode(&mut b, Protocol::Resp2, 1024).unwrap().unwrap();
        assert!(f.is_error());
    }

    /// `depth` arrays of one element around an empty array: about 4 bytes a level, the shape
    /// that overflowed the decoder's stack before any AUTH.
    fn nested(prefix: &[u8], depth: usize) -> BytesMut {
        let mut b = BytesMut::new();
        for _ in 0..depth {
            b.extend_from_slice(prefix);
            b.extend_from_slice(b"1\r\n");
        }
        b.extend_from_slice(b"*0\r\n");
        b
    }

    #[test]
    fn deep_nesting_is_refused_before_the_decoder_recurses() {
        for prefix in [&b"*"[..], b">", b"~", b"%"] {
            for protocol in [Protocol::Resp2, Protocol::Resp3] {
                let mut b = nested(prefix, 20_000);
                let r = decode(&mut b, protocol, 1 << 20);
                assert!(
                    matches!(
                        r,
                        Err(RespError::TooDeep {
                            max_depth: DEFAULT_MAX_DEPTH
                        })
                    ),
                    "{prefix:?} {protocol:?}: {r:?}"
                );
            }
        }
        // An attribute nests too.
        let mut b = BytesMut::new();
        for _ in 0..20_000 {
            b.extend_from_slice(b"|1\r\n+k\r\n");
        }
        b.extend_from_slice(b"+v\r\n");
        assert!(matches!(
            decode(&mut b, Protocol::Resp3, 1 << 20),
            Err(RespError::TooDeep { .. })
        ));
        // Up to the limit, nesting is fine.
        let mut b = nested(b"*", DEFAULT_MAX_DEPTH - 1);
        assert!(decode(&mut b, Protocol::Resp2, 1 << 20).unwrap().is_some());
        assert!(b.is_empty());
    }

    #[tokio::test]
    async fn a_command_reader_takes_flat_arrays_only() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(server, 1 << 20).with_max_depth(1);
        use tokio::io::AsyncWriteExt;
        client
            .write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n*1\r\n$4\r\nPING\r\n")
            .await
            .unwrap();
        let f = reader.next(Protocol::Resp2).await.unwrap().unwrap();
        assert_eq!(f.command().unwrap().len(), 2);
        let r = reader.next(Protocol::Resp2).await;
        assert!(
            matches!(r, Err(RespError::TooDeep { max_depth: 1 })),
            "{r:?}"
        );
    }

    #[test]
    fn a_frame_split_anywhere_decodes_as_one_and_resumes() {
        let whole: &[u8] =
            b"%2\r\n+a\r\n*2\r\n$1\r\nx\r\n$1\r\ny\r\n:1\r\n|1\r\n+t\r\n+u\r\n~1\r\n_\r\n+tail\r\n";
        let mut one = BytesMut::from(whole);
        let f = decode(&mut one, Protocol::Resp3, 1024).unwrap().unwrap();
        let first_len = f.raw.len();
        assert_eq!(&one[..], b"+tail\r\n");
        for cut in 0..first_len {
            let mut scan = Scan::default();
            let mut b = BytesMut::from(&whole[..cut]);
            let r = decode_with(&mut b, &mut scan, Protocol::Resp3, 1024, 8).unwrap();
            assert!(r.is_none(), "cut at {cut}");
            b.extend_from_slice(&whole[cut..]);
            let f = decode_with(&mut b, &mut scan, Protocol::Resp3, 1024, 8)
                .unwrap()
                .unwrap();
            assert_eq!(f.raw.len(), first_len, "cut at {cut}");
        }
    }

    #[test]
    fn a_string_longer_than_the_limit_is_refused_from_its_header() {
        let mut b = buf(b"*2\r\n$4\r\nAUTH\r\n$60000000\r\nxx");
        assert!(matches!(
            decode(&mut b, Protocol::Resp2, 16 * 1024),
            Err(RespError::TooLarge { .. })
        ));
        for bad in [
            &b"$-2\r\n"[..],
            b"*-7\r\n",
            b"$abc\r\n",
            b"$3\r\nabcde\r\n",
            // A CR right after a frame (the line search once started at the type byte).
            b"\r\n",
            b"\r\r\n*1\r\n",
            b"%-1\r\n",
        ] {
            let r = decode(&mut buf(bad), Protocol::Resp3, 1024);
            assert!(matches!(r, Err(RespError::Malformed(_))), "{bad:?}: {r:?}");
        }
    }
}
