//! Mapping a SPIFFE ID through 1,000 rules, as the principal does for every new agent
//! stream: the ID matched by the first rule, by the last rule (every rule tried), and by
//! none (every rule tried, then denied). Rule sets of only exact rules, only templates, and
//! both interleaved; a single rule as the baseline; loading 1,000 rules from YAML and flags.

// `RuleSet::map` returns its denials by value (see the mapping module); so does the bench.
#![allow(clippy::result_large_err)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use argocd_agent_identity::SpiffeId;

use argocd_agent_domain::RuleSet;

const RULES: usize = 1_000;

#[derive(Clone, Copy)]
enum Kind {
    Exact,
    Template,
}

/// Rule `i` of a set: an exact rule for one cluster's agent, or a template for every
/// service account of one cluster.
fn kind_of(set: &str, i: usize) -> Kind {
    match set {
        "exact" => Kind::Exact,
        "template" => Kind::Template,
        _ if i.is_multiple_of(2) => Kind::Exact,
        _ => Kind::Template,
    }
}

fn yaml_rule(kind: Kind, i: usize) -> String {
    match kind {
        Kind::Exact => format!(
            "  - name: cluster-{i:04}\n    exact: \"spiffe://edge.example/cluster/c{i:04}/agent\"\n    agent: agent-{i:04}\n"
        ),
        Kind::Template => format!(
            "  - name: cluster-{i:04}\n    template: \"spiffe://{{trust_domain}}/cluster/c{i:04}/ns/{{ns}}/sa/{{sa}}\"\n    agent: \"{{sa}}\"\n    namespace: \"c{i:04}-{{ns}}\"\n"
        ),
    }
}

fn flag_rule(kind: Kind, i: usize) -> String {
    match kind {
        Kind::Exact => format!(
            "exact:spiffe://edge.example/cluster/c{i:04}/agent=>agent-{i:04},name=cluster-{i:04}"
        ),
        Kind::Template => format!(
            "template:spiffe://{{trust_domain}}/cluster/c{i:04}/ns/{{ns}}/sa/{{sa}}=>{{sa}},namespace=c{i:04}-{{ns}},name=cluster-{i:04}"
        ),
    }
}

/// An ID that rule `i` maps.
fn id_for(kind: Kind, i: usize) -> SpiffeId {
    let id = match kind {
        Kind::Exact => format!("spiffe://edge.example/cluster/c{i:04}/agent"),
        Kind::Template => format!("spiffe://edge.example/cluster/c{i:04}/ns/argocd/sa/agent-{i}"),
    };
    SpiffeId::parse(&id).unwrap()
}

fn rules_yaml(set: &str) -> String {
    let mut text = String::from("rules:\n");
    for i in 0..RULES {
        text.push_str(&yaml_rule(kind_of(set, i), i));
    }
    text
}

fn mapping(c: &mut Criterion) {
    let mut g = c.benchmark_group("mapping/map_1000_rules");
    for set in ["exact", "template", "mixed"] {
        let rules = RuleSet::from_yaml(&rules_yaml(set)).unwrap();
        assert_eq!(rules.len(), RULES);
        let first = id_for(kind_of(set, 0), 0);
        let last = id_for(kind_of(set, RULES - 1), RULES - 1);
        let none =
            SpiffeId::parse("spiffe://edge.example/cluster/c9999/ns/argocd/sa/agent-x").unwrap();
        assert_eq!(rules.map(&first).unwrap().rule, "cluster-0000");
        assert_eq!(rules.map(&last).unwrap().rule, "cluster-0999");
        assert!(rules.map(&none).is_err());
        for (case, id) in [("first", &first), ("last", &last), ("no_match", &none)] {
            g.bench_with_input(BenchmarkId::new(set, case), id, |b, id| {
                b.iter(|| rules.map(black_box(id)))
            });
        }
    }
    g.finish();

    // Baseline: the same matches with a single rule, to show what the other 999 cost.
    let mut g = c.benchmark_group("mapping/map_1_rule");
    for kind in [Kind::Exact, Kind::Template] {
        let name = match kind {
            Kind::Exact => "exact",
            Kind::Template => "template",
        };
        let rules = RuleSet::from_yaml(&format!("rules:\n{}", yaml_rule(kind, 0))).unwrap();
        let id = id_for(kind, 0);
        assert_eq!(rules.map(&id).unwrap().rule, "cluster-0000");
        g.bench_with_input(BenchmarkId::new(name, "match"), &id, |b, id| {
            b.iter(|| rules.map(black_box(id)))
        });
    }
    g.finish();

    // Loading compiles every template to a regex: what a rules ConfigMap reload costs.
    let mut g = c.benchmark_group("mapping/load_1000_rules");
    g.sample_size(10);
    let yaml = rules_yaml("mixed");
    g.bench_function("from_yaml/mixed", |b| {
        b.iter(|| RuleSet::from_yaml(black_box(&yaml)).unwrap())
    });
    let flags: Vec<String> = (0..RULES)
        .map(|i| flag_rule(kind_of("mixed", i), i))
        .collect();
    assert_eq!(RuleSet::from_flags(&flags).unwrap().len(), RULES);
    g.bench_function("from_flags/mixed", |b| {
        b.iter(|| RuleSet::from_flags(black_box(&flags)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, mapping);
criterion_main!(benches);
