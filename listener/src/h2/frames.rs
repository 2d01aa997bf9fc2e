//! HTTP/2 frame headers followed in a byte stream seen in pieces (RFC 9113, section 4.1),
//! and the GOAWAY frame the connection guard sends. Only the 9-byte headers are read;
//! payloads are skipped (h2 itself parses them, after us).

/// The length of a frame header.
pub(super) const FRAME_HEADER_LEN: usize = 9;
/// Frame types (RFC 9113, section 6).
pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
/// The ACK flag of a PING.
pub(super) const ACK: u8 = 0x1;
/// The END_STREAM flag of DATA and HEADERS.
pub(super) const END_STREAM: u8 = 0x1;
/// GOAWAY error codes (RFC 9113, section 7).
pub(super) const NO_ERROR: u32 = 0x0;
pub(super) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One HTTP/2 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameHeader {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Follows frame boundaries in a byte stream seen in pieces.
#[derive(Debug, Default)]
pub(super) struct FrameScanner {
    header: [u8; FRAME_HEADER_LEN],
    have: usize,
    payload_left: usize,
}

impl FrameScanner {
    /// Scans `bytes`, calling `on_header` for every frame header completed in them.
    pub fn scan(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(FrameHeader)) {
        while !bytes.is_empty() {
            let n = if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                n
            } else {
                let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                if self.have == FRAME_HEADER_LEN {
                    self.have = 0;
                    let h = &self.header;
                    let header = FrameHeader {
                        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                    };
                    self.payload_left = header.len;
                    on_header(header);
                }
                n
            };
            bytes = &bytes[n..];
        }
    }

    /// Bytes until the current frame ends (0: between frames).
    pub fn to_boundary(&self) -> usize {
        if self.have > 0 {
            // Inside a header: its length is not known yet; finish the header first.
            FRAME_HEADER_LEN - self.have
        } else {
            self.payload_left
        }
    }
}

/// A GOAWAY frame: `last_stream`, the error `code` and the debug data.
pub(super) fn goaway(last_stream: u32, code: u32, debug: &[u8]) -> Vec<u8> {
    let len = 8 + debug.len();
    let mut f = Vec::with_capacity(FRAME_HEADER_LEN + len);
    f.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&last_stream.to_be_bytes());
    f.extend_from_slice(&code.to_be_bytes());
    f.extend_from_slice(debug);
    f
}

/// A frame of `kind` with `flags` on `stream` carrying `payload` (for the tests).
#[cfg(test)]
pub(super) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanner_finds_headers_split_anywhere() {
        let mut bytes = frame(HEADERS, 4, 1, &[1, 2, 3]);
        bytes.extend(frame(PING, 0, 0, &[7; 8]));
        bytes.extend(frame(DATA, 0, 3, &[0; 300]));
        for cut in 1..bytes.len() {
            let mut s = FrameScanner::default();
            let mut seen = Vec::new();
            for piece in bytes.chunks(cut) {
                s.scan(piece, |h| seen.push((h.kind, h.stream, h.len)));
            }
            assert_eq!(
                seen,
                vec![(HEADERS, 1, 3), (PING, 0, 8), (DATA, 3, 300)],
                "{cut}"
            );
            assert_eq!(s.to_boundary(), 0);
        }
    }

    #[test]
    fn goaway_is_a_well_formed_frame() {
        let f = goaway(5, ENHANCE_YOUR_CALM, b"too_many_pings");
        let mut s = FrameScanner::default();
        let mut seen = Vec::new();
        s.scan(&f, |h| seen.push(h));
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].kind, seen[0].stream, seen[0].len),
            (GOAWAY, 0, 8 + 14)
        );
        assert_eq!(&f[9..13], &5u32.to_be_bytes());
        assert_eq!(&f[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(s.to_boundary(), 0);
    }
}
