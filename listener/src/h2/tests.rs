use super::frames::{DATA, END_STREAM, GOAWAY, HEADERS, frame};
use super::*;
use crate::caps::Caps;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

fn ping() -> Vec<u8> {
    frame(PING, 0, 0, &[7; 8])
}

fn connection(
    server: DuplexStream,
    policy: H2Policy,
) -> (H2Connection<DuplexStream>, Arc<Mutex<Vec<&'static str>>>) {
    let closed = Arc::new(Mutex::new(Vec::new()));
    let seen = closed.clone();
    let hook: OnClose = Arc::new(move |r| seen.lock().unwrap().push(r));
    let admission = Caps::new(10, 10).admit(None).unwrap();
    let c = H2Connection::new(server, admission, None, policy, Some(hook));
    (c, closed)
}

fn pings(min: Duration) -> H2Policy {
    H2Policy {
        min_ping_interval: min,
        ..H2Policy::default()
    }
}

/// Reads what the connection replays first: the preface.
async fn preface(c: &mut H2Connection<DuplexStream>) {
    let mut p = [0; 24];
    c.read_exact(&mut p).await.unwrap();
    assert_eq!(&p, H2_PREFACE);
}

/// The probe's bypass: the client alternates an application-level `ping` event (a DATA
/// frame on its stream) with an HTTP/2 PING, and the principal answers every event with
/// a `pong` (a DATA frame). Each answer used to forgive the next PING.
#[tokio::test]
async fn answers_to_the_clients_own_events_do_not_buy_unlimited_pings() {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut guard, closed) = connection(server, pings(Duration::from_secs(1)));
    preface(&mut guard).await;
    let opening = frame(HEADERS, 4, 1, &[0; 4]);
    client_w.write_all(&opening).await.unwrap();
    let mut buf = vec![0; opening.len()];
    guard.read_exact(&mut buf).await.unwrap();
    let event = frame(DATA, 0, 1, &[0; 20]);
    let pong = frame(DATA, 0, 1, &[1; 30]);
    let mut pings = 0;
    let closed_conn = loop {
        if pings == 300 {
            break false;
        }
        client_w.write_all(&event).await.unwrap();
        let mut e = vec![0; event.len()];
        if guard.read_exact(&mut e).await.is_err() || guard.write_all(&pong).await.is_err() {
            break true;
        }
        client_w.write_all(&ping()).await.unwrap();
        pings += 1;
        let mut p = [0; 17];
        if guard.read_exact(&mut p).await.is_err() {
            break true;
        }
    };
    assert!(closed_conn, "300 PINGs in a burst were all forgiven");
    assert!(
        pings <= MAX_PING_STRIKES as usize + 2,
        "closed only after {pings} PINGs"
    );
    assert_eq!(*closed.lock().unwrap(), vec!["TooManyPings"]);
    // The client got the answers it provoked, then the GOAWAY.
    drop(guard);
    let mut out = Vec::new();
    client_r.read_to_end(&mut out).await.unwrap();
    let expected = Close::TooManyPings.goaway(1);
    assert!(out.ends_with(&expected), "GOAWAY too_many_pings");
}

#[tokio::test]
async fn goaway_after_the_frame_in_progress_then_closed() {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut guard, _) = connection(server, pings(Duration::from_secs(60)));
    preface(&mut guard).await;
    let mut input = frame(HEADERS, 4, 5, &[0; 4]);
    for _ in 0..=MAX_PING_STRIKES + 1 {
        input.extend(ping());
    }
    client_w.write_all(&input).await.unwrap();
    // Our side is in the middle of a DATA frame when the pings arrive.
    let data = frame(DATA, 0, 5, &[9; 100]);
    guard.write_all(&data[..50]).await.unwrap();
    let mut buf = vec![0; input.len()];
    guard.read_exact(&mut buf).await.unwrap();
    // The rest of the frame goes out, then the GOAWAY; more frames are refused.
    guard.write_all(&data[50..]).await.unwrap();
    let err = guard.write_all(&ping()).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    assert_eq!(guard.read(&mut buf).await.unwrap(), 0, "reads end");
    let expected = Close::TooManyPings.goaway(5);
    let mut out = vec![0; data.len() + expected.len()];
    client_r.read_exact(&mut out).await.unwrap();
    assert_eq!(&out[..data.len()], &data[..]);
    assert_eq!(&out[data.len()..], &expected[..]);
    assert_eq!(&expected[3..5], &[GOAWAY, 0]);
    assert_eq!(&expected[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
    assert!(expected.ends_with(TOO_MANY_PINGS));
}

#[tokio::test]
async fn spaced_or_unguarded_pings_pass() {
    for min in [Duration::ZERO, Duration::from_millis(1)] {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut client_r, mut client_w) = tokio::io::split(client);
        let (mut guard, closed) = connection(server, pings(min));
        preface(&mut guard).await;
        let input = frame(HEADERS, 4, 1, &[]);
        client_w.write_all(&input).await.unwrap();
        let mut buf = vec![0; input.len()];
        guard.read_exact(&mut buf).await.unwrap();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(3)).await;
            client_w.write_all(&ping()).await.unwrap();
            let mut p = [0; 17];
            guard.read_exact(&mut p).await.unwrap();
            guard
                .write_all(&frame(PING, ACK, 0, &[7; 8]))
                .await
                .unwrap();
            client_r.read_exact(&mut p).await.unwrap();
            assert_eq!(p[4], ACK);
        }
        assert!(closed.lock().unwrap().is_empty());
    }
}

fn idle_after(max: Duration) -> H2Policy {
    H2Policy {
        max_idle: max,
        ..H2Policy::default()
    }
}

/// Reads from the connection until it ends, or fails the test after `within`.
async fn read_until_closed(c: &mut H2Connection<DuplexStream>, within: Duration) -> Instant {
    let mut buf = [0; 64];
    tokio::time::timeout(within, async {
        while c.read(&mut buf).await.unwrap() > 0 {}
    })
    .await
    .expect("the connection was not closed");
    Instant::now()
}

#[tokio::test(start_paused = true)]
async fn a_connection_without_a_stream_is_closed_after_the_idle_timeout() {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut c, closed) = connection(server, idle_after(Duration::from_secs(300)));
    let start = Instant::now();
    preface(&mut c).await;
    // SETTINGS and PINGs are not streams: they keep nothing open.
    client_w.write_all(&frame(0x4, 0, 0, &[])).await.unwrap();
    client_w.write_all(&ping()).await.unwrap();
    let ended = read_until_closed(&mut c, Duration::from_secs(600)).await;
    assert!(
        ended - start >= Duration::from_secs(300),
        "{:?}",
        ended - start
    );
    assert_eq!(*closed.lock().unwrap(), vec!["IdleTimeout"]);
    let mut out = vec![0; Close::Idle.goaway(0).len()];
    client_r.read_exact(&mut out).await.unwrap();
    assert_eq!(out, Close::Idle.goaway(0));
    assert_eq!(&out[13..17], &NO_ERROR.to_be_bytes());
    assert!(out.ends_with(MAX_IDLE));
    let err = c.write_all(&ping()).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
}

#[tokio::test(start_paused = true)]
async fn an_open_stream_keeps_the_connection_and_the_idle_time_counts_from_its_end() {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut c, closed) = connection(server, idle_after(Duration::from_secs(60)));
    preface(&mut c).await;
    let open = frame(HEADERS, 4, 1, &[0; 4]);
    client_w.write_all(&open).await.unwrap();
    let mut buf = vec![0; open.len()];
    c.read_exact(&mut buf).await.unwrap();
    // A quiet event stream for ten minutes: not idle.
    let mut one = [0; 1];
    let waited = tokio::time::timeout(Duration::from_secs(600), c.read(&mut one)).await;
    assert!(
        waited.is_err(),
        "a connection with an open stream was closed"
    );
    assert!(closed.lock().unwrap().is_empty());
    // The client ends its side, the server answers with trailers ending the stream.
    client_w
        .write_all(&frame(DATA, END_STREAM, 1, &[]))
        .await
        .unwrap();
    let mut end = vec![0; 9];
    c.read_exact(&mut end).await.unwrap();
    let trailers = frame(HEADERS, 4 | END_STREAM, 1, &[0; 3]);
    c.write_all(&trailers).await.unwrap();
    let last = Instant::now();
    let ended = read_until_closed(&mut c, Duration::from_secs(120)).await;
    assert!(
        ended - last >= Duration::from_secs(60),
        "{:?}",
        ended - last
    );
    assert_eq!(*closed.lock().unwrap(), vec!["IdleTimeout"]);
    let mut out = vec![0; trailers.len() + Close::Idle.goaway(1).len()];
    client_r.read_exact(&mut out).await.unwrap();
    assert!(
        out.ends_with(&Close::Idle.goaway(1)),
        "GOAWAY names the last stream"
    );
}

#[tokio::test]
async fn without_a_policy_bytes_pass_through() {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut c, _) = connection(server, H2Policy::default());
    assert!(c.guard.is_none());
    preface(&mut c).await;
    client_w.write_all(b"anything at all").await.unwrap();
    let mut buf = [0; 15];
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"anything at all");
    c.write_all(b"back").await.unwrap();
    let mut back = [0; 4];
    client_r.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"back");
}
