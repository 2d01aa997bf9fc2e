//! Fuzz target: the Redis proxy's decoder path, from the bytes a client or the hub Redis sends
//! to the frames the proxy acts on. The first byte picks the protocol, the nesting limit (1
//! for client commands, as the proxy reads them; the default for server replies) and where
//! the rest is cut into pieces (as TCP delivers it). Must never panic (the decoder once
//! recursed without a limit and overflowed the stack before AUTH); the frames decoded from
//! the pieces must be those decoded from the whole input, each frame's raw bytes must be
//! exactly what it consumed, and what the proxy reads of a frame (the command's arguments,
//! an Application key, a reply's value or message) must not panic either.
#![no_main]

use argocd_agent_redis::resp::DEFAULT_MAX_DEPTH;
use argocd_agent_redis::{AppKey, Decoder, Frame, Protocol};
use libfuzzer_sys::fuzz_target;

fn decode(input: &[u8], cuts: &[usize], protocol: Protocol, depth: usize) -> (Vec<Frame>, bool) {
    let mut dec = Decoder::new(64 * 1024, depth);
    let mut out = Vec::new();
    let mut at = 0;
    for &p in cuts.iter().chain(std::iter::once(&input.len())) {
        let p = p.clamp(at, input.len());
        dec.push(&input[at..p]);
        at = p;
        loop {
            match dec.next(protocol) {
                Ok(Some(f)) => {
                    if let Some(args) = f.command() {
                        for a in &args {
                            let _ = AppKey::parse(a);
                        }
                    }
                    let _ = f.is_error();
                    let _ = f.is_push();
                    let _ = f.clone().into_message();
                    let _ = f.clone().into_value();
                    out.push(f);
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let protocol = if mode & 1 == 0 { Protocol::Resp2 } else { Protocol::Resp3 };
    let depth = if mode & 2 == 0 { 1 } else { DEFAULT_MAX_DEPTH };
    let step = usize::from(mode >> 2) + 1;
    let cuts: Vec<usize> = (step..input.len()).step_by(step).collect();
    let (whole, whole_failed) = decode(input, &[], protocol, depth);
    let (split, split_failed) = decode(input, &cuts, protocol, depth);
    assert_eq!(whole_failed, split_failed);
    assert_eq!(whole.len(), split.len());
    let mut consumed = Vec::new();
    for (a, b) in whole.iter().zip(&split) {
        assert_eq!(a.raw, b.raw);
        consumed.extend_from_slice(&a.raw);
    }
    assert!(input.starts_with(&consumed));
});
