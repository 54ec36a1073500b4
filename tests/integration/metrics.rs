//! The EMF observer (feature `emf`): what the engine decides comes out as CloudWatch Embedded
//! Metric Format documents, checked against the specification's structure.

use std::time::Duration;

use lambda_idempotency::observe::emf::{MetricsObserver, metrics_cloudwatch_embedded};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{
    Config, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::Value;

fn invocation(material: &str, intent: u32) -> Invocation {
    let scope = OperationScope::new("metrics-test", "charge").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(
        key,
        Fingerprint::of(&intent).expect("fingerprint"),
        Duration::from_secs(30),
    )
}

#[tokio::test]
async fn decisions_and_latencies_come_out_as_embedded_metric_format() {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace("IdempotencyTest")
        .with_dimension("service", "checkout")
        .init()
        .expect("the only recorder in this test binary");
    let db = dynamo::start().await;
    let idem =
        Idempotency::new(db.store(), Config::default()).with_observer(MetricsObserver::new());
    let ok = |value: u32| async move { Ok::<_, std::io::Error>(value) };

    idem.execute(&invocation("o-1", 1), |_| ok(1))
        .await
        .expect("first");
    idem.execute(&invocation("o-1", 1), |_| ok(1))
        .await
        .expect("replay");
    idem.execute(&invocation("o-1", 1), |_| ok(1))
        .await
        .expect("replay");
    let err = idem
        .execute(&invocation("o-1", 2), |_| ok(2))
        .await
        .expect_err("conflict");
    assert!(matches!(err, Error::PayloadConflict { .. }));

    let mut out = Vec::new();
    collector.flush(&mut out).expect("flush");
    let documents: Vec<Value> = String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON document"))
        .collect();
    assert!(!documents.is_empty());

    let mut counts = std::collections::BTreeMap::new();
    for document in &documents {
        let aws = &document["_aws"];
        assert!(aws["Timestamp"].is_u64(), "epoch milliseconds: {document}");
        let directives = aws["CloudWatchMetrics"].as_array().expect("directives");
        for directive in directives {
            assert_eq!(directive["Namespace"], "IdempotencyTest");
            let dimension_sets = directive["Dimensions"].as_array().expect("dimension sets");
            for set in dimension_sets {
                let names: Vec<&str> = set
                    .as_array()
                    .expect("a set")
                    .iter()
                    .map(|name| name.as_str().expect("a name"))
                    .collect();
                assert!(
                    names.contains(&"operation"),
                    "the operation is a dimension: {names:?}"
                );
                for name in names {
                    assert!(
                        document[name].is_string(),
                        "each dimension has a value: {name}"
                    );
                }
            }
            for metric in directive["Metrics"].as_array().expect("metrics") {
                let name = metric["Name"].as_str().expect("a metric name");
                assert!(!document[name].is_null(), "each metric has a value: {name}");
                if name.ends_with("_latency") {
                    assert_eq!(metric["Unit"], "Milliseconds");
                }
                if let Some(count) = document[name].as_u64() {
                    counts.insert(name.to_owned(), count);
                }
            }
        }
        assert_eq!(document["operation"], "charge");
        assert_eq!(document["service"], "checkout");
    }
    assert_eq!(counts.get("idempotency.first_execution"), Some(&1));
    assert_eq!(counts.get("idempotency.replay"), Some(&2));
    assert_eq!(counts.get("idempotency.payload_conflict"), Some(&1));
}
