//! RESP2 and RESP3 frames read from a byte stream with a size limit, and the few replies
//! the proxy writes itself. Decoding and encoding are the `redis-protocol` crate's; this
//! module only adds buffering, the limit, and one view over both protocol versions.

use bytes::{Bytes, BytesMut};
pub use redis_protocol::resp2::types::BytesFrame as Frame2;
pub use redis_protocol::resp3::types::BytesFrame as Frame3;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The RESP version a connection speaks (RESP3 after a successful `HELLO 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    #[error("malformed RESP frame: {0}")]
    Malformed(String),
    #[error("frame larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("refused by the server: {0}")]
    Refused(String),
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
}

/// One decoded frame and the exact bytes it came from (forwarded unchanged).
#[derive(Debug, Clone)]
pub struct Frame {
    pub raw: Bytes,
    pub value: Value,
}

/// A decoded frame of either version.
#[derive(Debug, Clone)]
pub enum Value {
    V2(Frame2),
    V3(Frame3),
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

    /// A GET reply: `Ok(Some(value))`, `Ok(None)` for nil, `Err(message)` for an error or
    /// an unexpected type.
    pub fn into_value(self) -> Result<Option<Bytes>, String> {
        match self.value {
            Value::V2(Frame2::BulkString(b) | Frame2::SimpleString(b)) => Ok(Some(b)),
            Value::V2(Frame2::Null) | Value::V3(Frame3::Null) => Ok(None),
            Value::V3(Frame3::BlobString { data, .. } | Frame3::SimpleString { data, .. }) => {
                Ok(Some(data))
            }
            Value::V2(Frame2::Error(e)) => Err(e.to_string()),
            Value::V3(Frame3::SimpleError { data, .. }) => Err(data.to_string()),
            Value::V3(Frame3::BlobError { data, .. }) => {
                Err(String::from_utf8_lossy(&data).into_owned())
            }
            other => Err(format!("unexpected reply {other:?}")),
        }
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

/// Reads frames from a stream, holding at most `limit` bytes of one frame.
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    limit: usize,
}

const READ_CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, limit: usize) -> Self {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            limit,
        }
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    /// Decodes one frame from what is buffered, if complete.
    pub fn decode(&mut self, protocol: Protocol) -> Result<Option<Frame>, RespError> {
        decode(&mut self.buf, protocol, self.limit)
    }

    /// Reads more bytes; false at end of stream.
    pub async fn fill(&mut self) -> Result<bool, RespError> {
        self.buf.reserve(READ_CHUNK);
        Ok(self.io.read_buf(&mut self.buf).await? > 0)
    }

    /// The next frame; `None` at a clean end of stream.
    pub async fn next(&mut self, protocol: Protocol) -> Result<Option<Frame>, RespError> {
        loop {
            if let Some(f) = self.decode(protocol)? {
                return Ok(Some(f));
            }
            self.buf.reserve(READ_CHUNK);
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(RespError::Io(std::io::ErrorKind::UnexpectedEof.into()))
                };
            }
        }
    }
}

/// Decodes one frame from `buf` (consuming it), or `None` when more bytes are needed.
pub fn decode(
    buf: &mut BytesMut,
    protocol: Protocol,
    limit: usize,
) -> Result<Option<Frame>, RespError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let decoded = match protocol {
        Protocol::Resp2 => redis_protocol::resp2::decode::decode_bytes_mut(buf).map(|o| {
            o.map(|(f, _, raw)| Frame {
                raw,
                value: Value::V2(f),
            })
        }),
        Protocol::Resp3 => {
            redis_protocol::resp3::decode::complete::decode_bytes_mut(buf).map(|o| {
                o.map(|(f, _, raw)| Frame {
                    raw,
                    value: Value::V3(f),
                })
            })
        }
    };
    match decoded {
        Ok(Some(f)) if f.raw.len() > limit => Err(RespError::TooLarge { limit }),
        Ok(Some(f)) => Ok(Some(f)),
        Ok(None) if buf.len() > limit => Err(RespError::TooLarge { limit }),
        Ok(None) => Ok(None),
        Err(e) => Err(RespError::Malformed(e.details().to_owned())),
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
    Message(Bytes),
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
}
