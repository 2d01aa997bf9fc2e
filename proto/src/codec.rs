//! The protobuf codec of every generated client and server: prost's, with small initial
//! codec buffers.
//!
//! tonic starts each stream with an 8 KiB encode buffer and an 8 KiB decode buffer. A
//! principal holds one long-lived stream per agent, and most agents are idle most of the
//! time, so those 16 KiB are most of what an idle agent costs it. The buffers grow to fit
//! larger messages as before; they only start small.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial size of a stream's encode and decode buffers.
pub const INITIAL_BUFFER: usize = 1024;
/// Encoded bytes after which a streaming encoder hands a batch to the transport (tonic's
/// default).
pub const YIELD_THRESHOLD: usize = 32 * 1024;

/// prost encoding with [`INITIAL_BUFFER`]-sized buffers (set with `codec_path` when the
/// code under `src/gen/` is generated).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = LeanEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        LeanEncoder(ProstCodec::<T, U>::raw_encoder(settings()))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

/// prost's encoder that first reserves the message's encoded length. After each batch
/// the stream's buffer goes out with it, and the next message starts again from
/// [`INITIAL_BUFFER`]: a 7 KB event then grew it four times (1, 2, 4, 8 KiB, each a new
/// allocation and a copy); reserved first, it is one allocation of its size.
#[derive(Debug)]
pub struct LeanEncoder<T>(ProstEncoder<T>);

impl<T: Message> Encoder for LeanEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        self.0.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    #[test]
    fn buffers_start_small() {
        let mut codec = LeanCodec::<prost_types::Duration, prost_types::Duration>::default();
        let enc = codec.encoder().buffer_settings();
        let dec = codec.decoder().buffer_settings();
        let default = BufferSettings::default();
        assert_eq!(format!("{enc:?}"), format!("{:?}", settings()));
        assert_eq!(format!("{dec:?}"), format!("{:?}", settings()));
        assert_ne!(format!("{enc:?}"), format!("{default:?}"));
    }
}
