//! The per-peer send queue: filling it with changes to many resources, coalescing a burst of
//! updates to one resource, and the push -> next -> ack round every delivered event makes,
//! alone and with the in-flight window almost full.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

use argocd_agent_domain::Namespace;
use argocd_agent_domain::{
    Event, EventType, Payload, QueueLimits, ResourceKind, ResourceRef, SendQueue,
};

const EVENTS: usize = 1_000;

fn update(name: &str, generation: usize) -> Event {
    let resource = ResourceRef::new(
        ResourceKind::Application,
        Namespace::new("agent-edge-7").unwrap(),
        name,
    );
    // Payloads are shared `Arc`s in the queue, so their size does not matter here.
    let object = json!({ "metadata": { "name": name, "generation": generation } });
    Event::resource(
        "principal",
        EventType::SpecUpdate,
        resource,
        Payload::Object(Arc::new(object)),
    )
}

/// Limits under which nothing is resent while a benchmark runs.
fn limits() -> QueueLimits {
    QueueLimits {
        resend_initial: Duration::from_secs(3600),
        resend_max: Duration::from_secs(3600),
        ..QueueLimits::default()
    }
}

fn queue(c: &mut Criterion) {
    let distinct: Vec<Event> = (0..EVENTS)
        .map(|i| update(&format!("app-{i:04}"), 1))
        .collect();
    let same: Vec<Event> = (0..EVENTS).map(|i| update("app-0000", i)).collect();

    let mut g = c.benchmark_group("queue");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.bench_function("push/1000_distinct", |b| {
        b.iter_batched(
            || (SendQueue::new(limits()), distinct.clone()),
            |(q, events)| {
                for e in events {
                    q.push(e).unwrap();
                }
                assert_eq!(q.len(), EVENTS);
                q
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("push/1000_same_resource", |b| {
        b.iter_batched(
            || (SendQueue::new(limits()), same.clone()),
            |(q, events)| {
                for e in events {
                    q.push(e).unwrap();
                }
                assert_eq!(q.len(), 1);
                q
            },
            BatchSize::SmallInput,
        )
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    g.throughput(Throughput::Elements(1));
    let idle = SendQueue::new(limits());
    let one = update("app-0000", 1);
    g.bench_function("cycle/push_next_ack", |b| {
        b.to_async(&rt).iter_batched(
            || one.clone(),
            |e| {
                let q = &idle;
                async move {
                    q.push(e).unwrap();
                    let sent = q.next().await;
                    q.ack(&sent.id).unwrap()
                }
            },
            BatchSize::SmallInput,
        )
    });

    // A busy peer: 255 of the default 256 in-flight slots wait for their acknowledgement.
    let busy = SendQueue::new(limits());
    rt.block_on(async {
        for e in &distinct[1..256] {
            busy.push(e.clone()).unwrap();
            black_box(busy.next().await);
        }
    });
    assert_eq!(busy.in_flight(), 255);
    g.bench_function("cycle/push_next_ack/255_in_flight", |b| {
        b.to_async(&rt).iter_batched(
            || one.clone(),
            |e| {
                let q = &busy;
                async move {
                    q.push(e).unwrap();
                    let sent = q.next().await;
                    q.ack(&sent.id).unwrap()
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, queue);
criterion_main!(benches);
