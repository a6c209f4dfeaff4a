//! The module's payload checks give the Python service's verdicts.
//!
//! `tests/data/payload_verdicts.json` holds schemas of the subset the service lets the
//! module check (`interceptors.json_schema.native_subset`), payloads, and the service's
//! verdict on each (written, and kept current, by
//! `tests/unit/interceptors/test_native_subset.py`). A payload the module accepts and
//! the service refuses would be a bypass; one the module refuses and the service
//! accepts a needless hand-off: both are failures here.

use keg_kafka_filter::core::payload::PayloadSchema;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    schema: String,
    payload: String,
    valid: bool,
}

#[test]
fn every_verdict_of_the_corpus_is_the_services() {
    let cases: Vec<Case> = serde_json::from_str(include_str!("data/payload_verdicts.json")).unwrap();
    assert!(cases.len() > 100);
    let mut differ = Vec::new();
    for case in &cases {
        let schema = PayloadSchema::compile(&case.schema).unwrap_or_else(|e| panic!("{}: {e}", case.schema));
        if schema.accepts(case.payload.as_bytes()) != case.valid {
            differ.push(format!("{} on {:?}: the service says {}", case.schema, case.payload, case.valid));
        }
    }
    assert!(differ.is_empty(), "{} of {} verdicts differ:\n{}", differ.len(), cases.len(), differ.join("\n"));
}
