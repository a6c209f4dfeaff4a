//! JSON Schema checks of record payloads the service vouched for with their schema.
//!
//! A `schema` rule with `validate_payload` passes a record when its id is one the
//! registry and the rule accept *and* its payload is valid for that id's schema. For
//! JSON Schemas within the subset both validators judge alike
//! (`interceptors.json_schema.native_subset` on the Python side: local `$ref`s only, no
//! `pattern`, no draft 4/6, bounded numbers), the service sends the schema with the
//! vouched id, and the module checks each payload itself (the `jsonschema` crate,
//! tested against the JSON-Schema-Test-Suite like Python's `jsonschema`). A payload
//! that is not JSON, or not valid, makes the frame go to the service, which refuses it
//! with its own reason: a pass here only repeats the verdict the service would give.

use std::fmt;

use serde_json::Value;

/// Bytes of payload one frame's walk may check (JSON parsing and validation run on the
/// Envoy worker thread: ~8 MiB is a few tens of milliseconds, `examples/inflate_cost.rs`);
/// past it the frame is handed off and the pool of Python workers checks it.
pub const MAX_VALIDATED: usize = 8 << 20;
/// Longest schema text accepted (what the Python side sends is far smaller).
pub const MAX_SCHEMA_TEXT: usize = 64 << 10;

/// A compiled JSON Schema, and the text it was compiled from (its identity).
pub struct PayloadSchema {
    text: String,
    validator: jsonschema::Validator,
}

impl PayloadSchema {
    /// Compiles `text` (formats as annotations, as the Python side; patterns with the
    /// linear-time `regex` engine; no remote references).
    pub fn compile(text: &str) -> Result<Self, String> {
        if text.len() > MAX_SCHEMA_TEXT {
            return Err(format!("schema of {} bytes, over {MAX_SCHEMA_TEXT}", text.len()));
        }
        let schema: Value = serde_json::from_str(text).map_err(|e| format!("schema is not JSON: {e}"))?;
        let validator = jsonschema::options()
            .should_validate_formats(false)
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&schema)
            .map_err(|e| format!("schema does not compile: {e}"))?;
        Ok(Self { text: text.to_owned(), validator })
    }

    /// Whether `payload` (after the Confluent prefix) is JSON valid for the schema.
    pub fn accepts(&self, payload: &[u8]) -> bool {
        serde_json::from_slice::<Value>(payload).is_ok_and(|doc| self.validator.is_valid(&doc))
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

impl PartialEq for PayloadSchema {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for PayloadSchema {}

impl fmt::Debug for PayloadSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PayloadSchema").field("text", &self.text).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type": "object", "required": ["id", "amount"],
        "properties": {"id": {"type": "integer", "minimum": 1},
                       "amount": {"type": "number"}, "note": {"type": "string", "maxLength": 4}},
        "additionalProperties": false}"#;

    #[test]
    fn payloads_are_judged_as_json_schema_says() {
        let schema = PayloadSchema::compile(ORDER).unwrap();
        assert!(schema.accepts(br#"{"id": 1, "amount": 2.5}"#));
        assert!(schema.accepts(br#" {"id": 1.0, "amount": 2, "note": "\u00e9t\u00e9"} "#), "1.0 is an integer; lengths in code points");
        for bad in [&br#"{"id": 0, "amount": 1}"#[..], br#"{"id": 1}"#, br#"{"id": 1, "amount": 1, "x": 1}"#,
                    br#"{"id": 1, "amount": 1, "note": "12345"}"#, br#"{"id": 1, "amount": "1"}"#,
                    b"", b"{", br#"{"id": 1, "amount": 1} x"#, b"\xff", br#"{"id": NaN, "amount": 1}"#,
                    br#"{"id": "\ud800", "amount": 1}"#] {
            assert!(!schema.accepts(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn what_cannot_be_compiled_offline_is_refused() {
        assert!(PayloadSchema::compile("{").is_err());
        assert!(PayloadSchema::compile(r#"{"type": 5}"#).is_err());
        assert!(PayloadSchema::compile(r#"{"$ref": "https://example.com/other.json"}"#).is_err());
        assert!(PayloadSchema::compile(&format!(r#"{{"description": "{}"}}"#, "x".repeat(MAX_SCHEMA_TEXT))).is_err());
        let formats = PayloadSchema::compile(r#"{"type": "string", "format": "email"}"#).unwrap();
        assert!(formats.accepts(br#""not an address""#), "formats are annotations, as on the Python side");
    }
}
