//! Operation keys and fingerprints: RFC 8785 canonical JSON, stability, selection, errors.

use lambda_idempotency::key::{JsonPointer, canonical_json};
use lambda_idempotency::{
    ConfigError, Error, Fingerprint, KeyPolicy, OperationKey, OperationScope,
};
use serde_json::{Value, json};

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("test JSON parses")
}

fn canonical(text: &str) -> String {
    String::from_utf8(canonical_json(&parse(text)).expect("canonicalizes")).expect("UTF-8")
}

fn scope() -> OperationScope {
    OperationScope::new("shop", "create-order").expect("scope")
}

#[test]
fn rfc8785_sample_from_section_3_2_2() {
    let input = r#"{
        "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
        "literals": [null, true, false]
    }"#;
    let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    assert_eq!(canonical(input), expected);
}

#[test]
fn rfc8785_property_sorting_by_utf16_code_units() {
    let input = r#"{
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\ud83d\ude00": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis"
    }"#;
    let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
    assert_eq!(canonical(input), expected);
}

#[test]
fn rfc8785_number_serialization_vectors() {
    // From the RFC's Appendix B (IEEE 754 bit patterns as their JSON spellings).
    for (input, expected) in [
        ("0", "0"),
        ("-0", "0"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("9007199254740992", "9007199254740992"),
        ("295147905179352830000", "295147905179352830000"),
        ("1e+21", "1e+21"),
        ("999999999999999900000", "999999999999999900000"),
        ("0.000001", "0.000001"),
        ("1e-7", "1e-7"),
    ] {
        assert_eq!(canonical(input), expected, "number {input}");
    }
}

#[test]
fn key_is_stable_across_order_whitespace_and_number_spelling() {
    let policy = KeyPolicy::<Value>::pointer("/order").expect("pointer");
    let spellings = [
        r#"{"order": {"id": "o-1", "qty": 1}}"#,
        r#"{"order":{"qty":1.0,"id":"o-1"}}"#,
        "{ \"order\" : { \"qty\" : 1e0 ,\n \"id\" : \"o-1\" } }",
        r#"{"order": {"id": "o-1", "qty": 10E-1}}"#,
    ];
    let derived: Vec<_> = spellings
        .iter()
        .map(|s| policy.derive(&scope(), &parse(s)).expect("derive"))
        .collect();
    for (key, fingerprint) in &derived[1..] {
        assert_eq!(key, &derived[0].0);
        assert_eq!(fingerprint, &derived[0].1);
    }
}

#[test]
fn key_shape_is_scope_then_hash() {
    let key = OperationKey::derive(&scope().with_version(3), Some("tenant-a"), "o-1").expect("key");
    let (prefix, hash) = key.as_str().rsplit_once('#').expect("separator");
    assert_eq!(prefix, "shop#create-order#t=tenant-a#v3");
    assert_eq!(hash.len(), 64);
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(key.short(), &hash[..12]);
}

#[test]
fn scope_tenant_and_version_separate_keys() {
    let base = OperationKey::derive(&scope(), None, "o-1").expect("key");
    let other_tenant = OperationKey::derive(&scope(), Some("t2"), "o-1").expect("key");
    let other_version = OperationKey::derive(&scope().with_version(2), None, "o-1").expect("key");
    let other_operation = OperationKey::derive(
        &OperationScope::new("shop", "refund").expect("scope"),
        None,
        "o-1",
    )
    .expect("key");
    let other_material = OperationKey::derive(&scope(), None, "o-2").expect("key");
    for other in [other_tenant, other_version, other_operation, other_material] {
        assert_ne!(base, other);
    }
}

#[test]
fn changed_intent_changes_fingerprint_only() {
    let policy = KeyPolicy::<Value>::pointer("/id").expect("pointer");
    let (key_a, fp_a) = policy
        .derive(&scope(), &json!({"id": "o-1", "amount": 10}))
        .expect("derive");
    let (key_b, fp_b) = policy
        .derive(&scope(), &json!({"id": "o-1", "amount": 11}))
        .expect("derive");
    assert_eq!(key_a, key_b);
    assert_ne!(fp_a, fp_b);
}

#[test]
fn intent_projection_ignores_volatile_fields() {
    let policy = KeyPolicy::<Value>::pointer("/id")
        .expect("pointer")
        .with_intent(JsonPointer::new("/body").expect("pointer"));
    let (_, fp_a) = policy
        .derive(
            &scope(),
            &json!({"id": "o-1", "body": {"n": 1}, "receivedAt": 1}),
        )
        .expect("derive");
    let (_, fp_b) = policy
        .derive(
            &scope(),
            &json!({"id": "o-1", "body": {"n": 1}, "receivedAt": 2}),
        )
        .expect("derive");
    assert_eq!(fp_a, fp_b);
}

#[derive(serde::Serialize)]
struct Order {
    id: Option<String>,
    tenant: String,
    amount: u64,
}

#[test]
fn typed_closures_select_key_intent_and_tenant() {
    let policy = KeyPolicy::from_fns(|o: &Order| o.id.clone(), |o: &Order| Some(o.amount))
        .with_tenant(|o| Some(o.tenant.clone()));
    let order = Order {
        id: Some("o-1".into()),
        tenant: "acme".into(),
        amount: 5,
    };
    let (key, fingerprint) = policy.derive(&scope(), &order).expect("derive");
    assert!(key.as_str().starts_with("shop#create-order#t=acme#v1#"));
    assert_eq!(fingerprint, Fingerprint::of(&5).expect("fingerprint"));
}

#[test]
fn missing_or_empty_key_is_an_error() {
    let policy = KeyPolicy::<Value>::pointer("/id").expect("pointer");
    for event in [
        json!({}),
        json!({"id": null}),
        json!({"id": ""}),
        json!({"id": "  "}),
        json!({"id": []}),
        json!({"id": {"a": null}}),
    ] {
        let err = policy.derive(&scope(), &event).expect_err("no key");
        assert!(
            matches!(&err, Error::MissingKey { operation } if operation == "create-order"),
            "{event}: {err:?}"
        );
    }
    let typed = KeyPolicy::select(|o: &Order| o.id.clone());
    let order = Order {
        id: None,
        tenant: "acme".into(),
        amount: 1,
    };
    assert!(matches!(
        typed.derive(&scope(), &order),
        Err(Error::MissingKey { .. })
    ));
}

#[test]
fn zero_and_false_are_keys() {
    let policy = KeyPolicy::<Value>::pointer("/id").expect("pointer");
    assert!(policy.derive(&scope(), &json!({"id": 0})).is_ok());
    assert!(policy.derive(&scope(), &json!({"id": false})).is_ok());
}

#[test]
fn malformed_configuration_is_refused() {
    assert!(matches!(
        JsonPointer::new("id"),
        Err(ConfigError::InvalidPointer { .. })
    ));
    assert!(matches!(
        OperationScope::new("", "op"),
        Err(ConfigError::InvalidScope {
            field: "namespace",
            ..
        })
    ));
    assert!(matches!(
        OperationScope::new("ns", "a#b"),
        Err(ConfigError::InvalidScope {
            field: "operation",
            ..
        })
    ));
    assert!(matches!(
        OperationKey::derive(&scope(), Some("bad#tenant"), "o-1"),
        Err(Error::InvalidEvent { .. })
    ));
}

#[test]
fn downstream_keys_are_stable_and_distinct_per_step() {
    let key = OperationKey::derive(&scope(), None, "o-1").expect("key");
    let again = OperationKey::derive(&scope(), None, "o-1").expect("key");
    assert_eq!(key.downstream("charge"), again.downstream("charge"));
    assert_ne!(key.downstream("charge"), key.downstream("email"));
    assert_eq!(key.downstream("charge").len(), 64);
}

#[test]
fn business_identity_comes_from_a_typed_closure() {
    let policy = KeyPolicy::select(|o: &Order| o.id.clone())
        .with_identity(|o| Some(format!("invoice:{}:{}", o.tenant, o.amount)));
    let order = Order {
        id: Some("o-1".into()),
        tenant: "acme".into(),
        amount: 5,
    };
    let invocation = policy
        .invocation(&scope(), &order, std::time::Duration::from_secs(30))
        .expect("invocation");
    assert_eq!(invocation.identity(), Some("invoice:acme:5"));
    assert_eq!(
        invocation.key(),
        &policy.derive(&scope(), &order).expect("derive").0
    );

    let blank = KeyPolicy::select(|o: &Order| o.id.clone()).with_identity(|_| Some("  ".into()));
    assert!(matches!(
        blank.invocation(&scope(), &order, std::time::Duration::from_secs(30)),
        Err(Error::InvalidEvent { .. })
    ));
    let none = KeyPolicy::select(|o: &Order| o.id.clone());
    assert_eq!(
        none.invocation(&scope(), &order, std::time::Duration::from_secs(30))
            .expect("invocation")
            .identity(),
        None
    );
}

#[test]
fn the_default_intent_ignores_what_a_redelivery_changes() {
    let policy = KeyPolicy::<Value>::pointer("/messageId").expect("pointer");
    let delivery = |receive_count: &str, receipt: &str, body: &str| {
        json!({
            "messageId": "m-1", "receiptHandle": receipt, "body": body,
            "attributes": {"ApproximateReceiveCount": receive_count,
                "ApproximateFirstReceiveTimestamp": "1700000000000", "SentTimestamp": "1699999999000"},
            "eventSource": "aws:sqs"
        })
    };
    let (_, first) = policy
        .derive(&scope(), &delivery("1", "rh-1", r#"{"amount":10}"#))
        .expect("first");
    let (_, redelivered) = policy
        .derive(&scope(), &delivery("2", "rh-2", r#"{"amount":10}"#))
        .expect("redelivery");
    let (_, changed) = policy
        .derive(&scope(), &delivery("2", "rh-2", r#"{"amount":99}"#))
        .expect("changed");

    assert_eq!(first, redelivered, "a redelivery is the same intent");
    assert_ne!(first, changed, "a changed body is not");

    let original = json!({"id": "e-1", "detail-type": "OrderPlaced", "source": "shop", "detail": {"order": 7}});
    let mut replayed = original.clone();
    replayed["replay-name"] = json!("archive-replay-1");
    let by_id = KeyPolicy::<Value>::pointer("/id").expect("pointer");
    assert_eq!(
        by_id.derive(&scope(), &original).expect("original").1,
        by_id.derive(&scope(), &replayed).expect("replay").1,
        "an EventBridge archive replay is the same intent"
    );
    let custom = json!({"id": "c-1", "replay-name": "a business field"});
    let other = json!({"id": "c-1", "replay-name": "another value"});
    assert_ne!(
        by_id.derive(&scope(), &custom).expect("custom").1,
        by_id.derive(&scope(), &other).expect("other").1,
        "a field of another event type is kept"
    );
}
