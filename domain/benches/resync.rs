//! Resync on reconnect: both sides summarise 10,000 resources of one kind, exchange the
//! summaries and work out what to send and what to delete. Measured for equal sides (the
//! common case after a short disconnect) and for sides that differ in 1% of the entries.
//! Results are dropped inside the timed loop, as they are in the real code.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

use argocd_agent_domain::resync::{
    Checksums, from_state, key_list_checksum, plan, sha256_hex, to_state,
};

const ENTRIES: usize = 10_000;
const KIND: &str = "Application";

/// `ENTRIES` applications named like real ones, each with a sha256 spec checksum.
fn source() -> Checksums {
    (0..ENTRIES)
        .map(|i| {
            (
                format!("team-{:02}-service-{i:05}", i % 40),
                sha256_hex(format!("spec of {i}").as_bytes()),
            )
        })
        .collect()
}

/// `source` with 1% of the entries differing: a third changed, a third missing at the
/// replica, a third present at the replica only.
fn replica_one_percent_off(source: &Checksums) -> Checksums {
    let mut replica = Checksums::new();
    for (i, (name, sum)) in source.iter().enumerate() {
        match i % 300 {
            0 => {
                replica.insert(name.clone(), sha256_hex(b"older spec"));
            }
            100 => {}
            200 => {
                replica.insert(name.clone(), sum.clone());
                replica.insert(format!("{name}-deleted-at-source"), sum.clone());
            }
            _ => {
                replica.insert(name.clone(), sum.clone());
            }
        }
    }
    replica
}

fn resync(c: &mut Criterion) {
    let src = source();
    let equal = src.clone();
    let differing = replica_one_percent_off(&src);
    let expected = plan(&src, &differing);
    assert_eq!(
        expected.send.len() + expected.delete.len(),
        ENTRIES / 100,
        "1% of the entries differ"
    );
    let state = to_state(KIND, &src);

    let mut g = c.benchmark_group("resync");
    g.throughput(Throughput::Elements(ENTRIES as u64));
    g.bench_function("key_list_checksum/10k", |b| {
        b.iter(|| key_list_checksum(black_box(&src)))
    });
    g.bench_function("to_state/10k", |b| {
        b.iter(|| to_state(KIND, black_box(&src)))
    });
    g.bench_function("from_state/10k", |b| {
        b.iter(|| from_state(KIND, black_box(&state)))
    });
    g.bench_function("plan/equal/10k", |b| {
        b.iter(|| plan(black_box(&src), black_box(&equal)))
    });
    g.bench_function("plan/1pct_differing/10k", |b| {
        b.iter(|| plan(black_box(&src), black_box(&differing)))
    });
    g.finish();
}

criterion_group!(benches, resync);
criterion_main!(benches);
