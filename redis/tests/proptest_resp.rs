//! Property tests (proptest) of the Redis proxy's decoder path, the stable-toolchain
//! counterpart of the cargo-fuzz target `sync/fuzz` `resp_frames`: any bytes, cut anywhere,
//! never panic the decoder (client commands: flat arrays only; server replies: bounded
//! nesting), decode to the same frames as when they arrive at once, and every frame's raw
//! bytes are exactly the input it consumed.

use argocd_agent_redis::resp::{self, DEFAULT_MAX_DEPTH};
use argocd_agent_redis::{AppKey, Decoder, Frame, Protocol};
use proptest::prelude::*;

/// Frames decoded from `input` pushed in pieces cut at `cuts`; the error that stopped it.
fn frames(
    input: &[u8],
    cuts: &[usize],
    protocol: Protocol,
    depth: usize,
) -> (Vec<Frame>, Option<String>) {
    let mut dec = Decoder::new(4096, depth);
    let mut out = Vec::new();
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    points.push(input.len());
    for p in points {
        dec.push(&input[at..p.max(at)]);
        at = p.max(at);
        loop {
            match dec.next(protocol) {
                Ok(Some(f)) => {
                    // What the proxy does with a command.
                    if let Some(args) = f.command()
                        && let Some(arg) = args.get(1)
                    {
                        let _ = AppKey::parse(arg);
                    }
                    out.push(f);
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e.to_string())),
            }
        }
    }
    (out, None)
}

/// RESP-shaped bytes: headers of every type with small lengths, strings, CRLFs, noise.
fn resp_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            &b"*1\r\n"[..],
            b"*2\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"$3\r\nGET\r\n",
            b"$1\r\nk\r\n",
            b"$-1\r\n",
            b"+OK\r\n",
            b"-ERR x\r\n",
            b":12\r\n",
            b"%1\r\n",
            b"~1\r\n",
            b">3\r\n",
            b"|1\r\n",
            b"_\r\n",
            b"#t\r\n",
            b",1.5\r\n",
            b"(12\r\n",
            b"=7\r\ntxt:abc\r\n",
            b"!3\r\nerr\r\n",
            b"$33\r\napp|resources-tree|ns_app|1.8.3\r\n",
            b"\r\n",
        ])
        .prop_map(|b| b.to_vec()),
        prop::collection::vec(any::<u8>(), 0..6),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_bytes_cut_anywhere_decode_like_whole_bytes(
        input in prop_oneof![resp_bytes(), prop::collection::vec(any::<u8>(), 0..128)],
        cuts in prop::collection::vec(any::<usize>(), 0..6),
        resp3 in any::<bool>(),
        depth in prop::sample::select(vec![1usize, 2, DEFAULT_MAX_DEPTH]),
    ) {
        let protocol = if resp3 { Protocol::Resp3 } else { Protocol::Resp2 };
        let (whole, whole_err) = frames(&input, &[], protocol, depth);
        let (split, split_err) = frames(&input, &cuts, protocol, depth);
        let raw = |fs: &[Frame]| fs.iter().map(|f| f.raw.to_vec()).collect::<Vec<_>>();
        prop_assert_eq!(raw(&whole), raw(&split));
        prop_assert_eq!(whole_err.is_some(), split_err.is_some());
        let consumed: Vec<u8> = raw(&whole).concat();
        prop_assert!(input.starts_with(&consumed));
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused_at_any_depth(depth in 1usize..5000, max in 1usize..40) {
        let mut input = b"*1\r\n".repeat(depth);
        input.extend_from_slice(b"$1\r\nx\r\n");
        let (ok, err) = frames(&input, &[], Protocol::Resp2, max);
        if depth <= max {
            prop_assert_eq!(ok.len(), 1);
            prop_assert!(err.is_none());
        } else {
            prop_assert!(ok.is_empty());
            prop_assert!(err.unwrap().contains("nested deeper"));
        }
        // The stateless form agrees.
        let mut buf = bytes::BytesMut::from(&input[..]);
        let r = resp::decode(&mut buf, Protocol::Resp2, 1 << 20);
        prop_assert_eq!(r.is_ok(), depth <= DEFAULT_MAX_DEPTH);
    }
}
