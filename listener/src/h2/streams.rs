//! Which streams of a connection are open, from the frames going both ways (RFC 9113,
//! section 5.1): a stream opens with the client's HEADERS and closes when both sides have
//! ended it (END_STREAM) or either reset it (RST_STREAM). What the connection's idle
//! timeout counts from (gRPC's `MaxConnectionIdle`: no open stream for that long).

use std::collections::HashMap;

use super::frames::{DATA, END_STREAM, FrameHeader, HEADERS, RST_STREAM};

/// Streams followed at most per connection. h2 refuses streams beyond the server's
/// concurrency limit with RST_STREAM, which closes them here too; past this many (a client
/// racing that limit) the connection counts as busy until it ends.
const MAX_TRACKED: usize = 4096;

/// The open streams of one server connection.
#[derive(Debug, Default)]
pub(super) struct Streams {
    /// Open streams: (the client ended its side, the server ended its side).
    open: HashMap<u32, (bool, bool)>,
    /// The highest stream the client opened.
    pub last_opened: u32,
    /// More streams were open at once than are followed: never idle again.
    overflow: bool,
}

impl Streams {
    /// Whether no stream is open.
    pub fn idle(&self) -> bool {
        self.open.is_empty() && !self.overflow
    }

    /// A frame the client sent.
    pub fn client_sent(&mut self, h: FrameHeader) {
        match h.kind {
            HEADERS if h.stream % 2 == 1 && h.stream > self.last_opened => {
                self.last_opened = h.stream;
                if self.open.len() >= MAX_TRACKED {
                    self.overflow = true;
                    return;
                }
                self.open.insert(h.stream, (false, false));
                if h.flags & END_STREAM != 0 {
                    self.end(h.stream, true);
                }
            }
            HEADERS | DATA if h.flags & END_STREAM != 0 => self.end(h.stream, true),
            RST_STREAM => {
                self.open.remove(&h.stream);
            }
            _ => {}
        }
    }

    /// A frame the server sent.
    pub fn server_sent(&mut self, h: FrameHeader) {
        match h.kind {
            HEADERS | DATA if h.flags & END_STREAM != 0 => self.end(h.stream, false),
            RST_STREAM => {
                self.open.remove(&h.stream);
            }
            _ => {}
        }
    }

    fn end(&mut self, stream: u32, client: bool) {
        if let Some(ends) = self.open.get_mut(&stream) {
            if client {
                ends.0 = true;
            } else {
                ends.1 = true;
            }
            if ends.0 && ends.1 {
                self.open.remove(&stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(kind: u8, flags: u8, stream: u32) -> FrameHeader {
        FrameHeader {
            len: 0,
            kind,
            flags,
            stream,
        }
    }

    #[test]
    fn a_stream_is_open_until_both_sides_end_it_or_one_resets_it() {
        let mut s = Streams::default();
        assert!(s.idle());
        // A unary call: request HEADERS, DATA with END_STREAM; response HEADERS, DATA,
        // trailers with END_STREAM.
        s.client_sent(h(HEADERS, 0x4, 1));
        assert!(!s.idle());
        s.client_sent(h(DATA, END_STREAM, 1));
        assert!(!s.idle(), "half closed");
        s.server_sent(h(HEADERS, 0x4, 1));
        s.server_sent(h(DATA, 0, 1));
        s.server_sent(h(HEADERS, 0x4 | END_STREAM, 1));
        assert!(s.idle());
        // A stream the server ends first, then the client.
        s.client_sent(h(HEADERS, 0x4, 3));
        s.server_sent(h(HEADERS, 0x4 | END_STREAM, 3));
        assert!(!s.idle());
        s.client_sent(h(DATA, END_STREAM, 3));
        assert!(s.idle());
        // A reset from either side closes it.
        s.client_sent(h(HEADERS, 0x4, 5));
        s.client_sent(h(HEADERS, 0x4, 7));
        s.server_sent(h(RST_STREAM, 0, 5));
        s.client_sent(h(RST_STREAM, 0, 7));
        assert!(s.idle());
        // Frames on unknown or old streams open nothing.
        s.client_sent(h(DATA, 0, 9));
        s.client_sent(h(HEADERS, 0x4, 3));
        s.server_sent(h(HEADERS, 0x4, 2));
        assert!(s.idle());
        assert_eq!(s.last_opened, 7);
    }

    #[test]
    fn past_the_tracked_streams_the_connection_stays_busy() {
        let mut s = Streams::default();
        for i in 0..=MAX_TRACKED as u32 {
            s.client_sent(h(HEADERS, 0x4, 2 * i + 1));
        }
        for i in 0..=MAX_TRACKED as u32 {
            s.client_sent(h(RST_STREAM, 0, 2 * i + 1));
        }
        assert!(!s.idle());
        assert!(s.open.len() <= MAX_TRACKED);
    }
}
