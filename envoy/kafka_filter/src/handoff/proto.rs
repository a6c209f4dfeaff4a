//! The messages of `envoy.service.network_ext_proc.v3` the hand-off uses, written out
//! with prost's derive (field numbers from Envoy's
//! `api/envoy/service/network_ext_proc/v3/network_external_processor.proto` and
//! `api/envoy/config/core/v3/base.proto`): no protoc, no generated code.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use prost_types::value::Kind;
use prost_types::{Struct, Value};

use crate::core::handoff::{Direction, HandOff, Resolution};
use crate::core::topics;
use crate::core::payload::PayloadSchema;
use crate::core::vouch::Vouch;

pub const PROCESS: &str = "/envoy.service.network_ext_proc.v3.NetworkExternalProcessor/Process";
/// `filter_metadata` namespace (and `dynamic_metadata` key) of keg.
pub const NAMESPACE: &str = "keg";

#[derive(Clone, PartialEq, prost::Message)]
pub struct Data {
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

/// `envoy.config.core.v3.Metadata` (typed_filter_metadata is not used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(map = "string, message", tag = "1")]
    pub filter_metadata: HashMap<String, Struct>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(message, optional, tag = "1")]
    pub read_data: Option<Data>,
    #[prost(message, optional, tag = "2")]
    pub write_data: Option<Data>,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<Metadata>,
}

/// `ProcessingResponse.ConnectionStatus`: CONTINUE = 0, CLOSE = 1, CLOSE_RST = 2.
pub const CONTINUE: i32 = 0;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingResponse {
    #[prost(message, optional, tag = "1")]
    pub read_data: Option<Data>,
    #[prost(message, optional, tag = "2")]
    pub write_data: Option<Data>,
    #[prost(int32, tag = "3")]
    pub data_processing_status: i32,
    #[prost(int32, tag = "4")]
    pub connection_status: i32,
    #[prost(message, optional, tag = "5")]
    pub dynamic_metadata: Option<Struct>,
}

fn string(s: impl Into<String>) -> Value {
    Value { kind: Some(Kind::StringValue(s.into())) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

/// The message for one hand-off: the frame as `read_data` (a request) or `write_data`
/// (a response), with what the module knows in `filter_metadata["keg"]`.
pub fn message(handoff: &HandOff) -> ProcessingRequest {
    let mut fields = BTreeMap::new();
    fields.insert("api_key".to_string(), number(f64::from(handoff.api_key)));
    fields.insert("api_version".to_string(), number(f64::from(handoff.api_version)));
    fields.insert("security_protocol".to_string(), string(handoff.security_protocol));
    if let Some(principal) = &handoff.principal {
        fields.insert("principal".to_string(), string(principal.clone()));
    }
    // The names of the topic ids it carries (v13+), as this module learned them: the
    // worker that gets the frame may not have seen the Metadata answer.
    let named = match handoff.direction {
        Direction::Request => topics::named_ids(handoff.api_key, handoff.api_version, &handoff.frame),
        Direction::Response if topics::judged_by_answer(handoff.api_key) => topics::answer_named_ids(handoff.api_key, handoff.api_version, &handoff.frame),
        Direction::Response => Vec::new(),
    };
    // Heartbeats, commits and admin calls carry ids too, wherever their schemas put them.
    let named = if named.is_empty() { topics::scanned_ids(handoff.api_key, &handoff.frame) } else { named };
    if !named.is_empty() {
        let ids = named.into_iter().map(|(id, name)| (hex(&id), string(name.as_ref()))).collect();
        fields.insert("topic_ids".to_string(), Value { kind: Some(Kind::StructValue(Struct { fields: ids })) });
    }
    let metadata = Metadata { filter_metadata: HashMap::from([(NAMESPACE.to_string(), Struct { fields })]) };
    let data = Some(Data { data: handoff.frame.clone(), end_of_stream: false });
    match handoff.direction {
        Direction::Request => ProcessingRequest { read_data: data, write_data: None, metadata: Some(metadata) },
        Direction::Response => ProcessingRequest { read_data: None, write_data: data, metadata: Some(metadata) },
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn keg(metadata: Option<&Struct>) -> Option<&Struct> {
    metadata.and_then(|m| m.fields.get(NAMESPACE)).and_then(|v| match &v.kind {
        Some(Kind::StructValue(s)) => Some(s),
        _ => None,
    })
}

fn want_response(metadata: Option<&Struct>) -> bool {
    matches!(keg(metadata).and_then(|s| s.fields.get("want_response")).and_then(|v| v.kind.as_ref()), Some(Kind::BoolValue(true)))
}

/// The longest pause a reply may ask for (`keg.throttle_ms`), as the service bounds what
/// a rate may owe (`ext_proc.filters.rates.MAX_DEBT_S`).
pub const MAX_THROTTLE: Duration = Duration::from_secs(10);

/// `keg.throttle_ms`: the request was over a rate; the connection's next hand-offs wait
/// this long (bounded by [`MAX_THROTTLE`]). None when absent, zero or not a number.
pub fn throttle(reply: &ProcessingResponse) -> Option<Duration> {
    pause(reply, "throttle_ms")
}

/// `keg.defer_ms`: the request was not judged (it came while the connection was
/// muted); it is sent again this much later (bounded by [`MAX_THROTTLE`]).
pub fn defer(reply: &ProcessingResponse) -> Option<Duration> {
    pause(reply, "defer_ms")
}

fn pause(reply: &ProcessingResponse, key: &str) -> Option<Duration> {
    match keg(reply.dynamic_metadata.as_ref()).and_then(|s| s.fields.get(key)).and_then(|v| v.kind.as_ref()) {
        Some(Kind::NumberValue(ms)) if *ms >= 1.0 => Some(Duration::from_secs_f64(ms / 1000.0).min(MAX_THROTTLE)),
        _ => None,
    }
}

/// `keg.vouched`: `[{"topic": ..., "ids": [...], "ttl_ms": ..., "json_schemas": {"<id>":
/// "<JSON Schema>"}}]` (`json_schemas`: ids whose payloads must meet a schema, optional).
/// Entries that are not of that shape are left out, and so is an id whose schema does
/// not compile (a vouch missed costs a hand-off, never a bypass).
fn vouched(metadata: Option<&Struct>) -> Vec<Vouch> {
    let Some(Kind::ListValue(list)) = keg(metadata).and_then(|s| s.fields.get("vouched")).and_then(|v| v.kind.as_ref()) else {
        return Vec::new();
    };
    let whole = |v: &Value| match v.kind {
        Some(Kind::NumberValue(n)) if n >= 0.0 && n.fract() == 0.0 && n <= f64::from(u32::MAX) => Some(n as u32),
        _ => None,
    };
    list.values.iter().filter_map(|entry| {
        let Some(Kind::StructValue(fields)) = &entry.kind else { return None };
        let Some(Kind::StringValue(topic)) = fields.fields.get("topic").and_then(|v| v.kind.as_ref()) else { return None };
        let Some(Kind::ListValue(ids)) = fields.fields.get("ids").and_then(|v| v.kind.as_ref()) else { return None };
        let ids: Option<Vec<u32>> = ids.values.iter().map(whole).collect();
        let ttl_ms = fields.fields.get("ttl_ms").and_then(whole)?;
        let mut ids = ids?;
        let mut schemas = Vec::new();
        if let Some(Kind::StructValue(texts)) = fields.fields.get("json_schemas").and_then(|v| v.kind.as_ref()) {
            for (id, text) in &texts.fields {
                let (Ok(id), Some(Kind::StringValue(text))) = (id.parse::<u32>(), text.kind.as_ref()) else { continue };
                match compiled(text) {
                    Some(schema) => schemas.push((id, schema)),
                    None => ids.retain(|&i| i != id),
                }
            }
        }
        Some(Vouch { topic: topic.clone(), ids, ttl_ms: u64::from(ttl_ms), schemas })
    }).collect()
}

/// Schemas compiled, by text: a reply carries its vouched ids' schemas each time, a
/// schema is compiled once (on the hand-off thread, never an Envoy worker).
static COMPILED: Mutex<Vec<Arc<PayloadSchema>>> = Mutex::new(Vec::new());
const COMPILED_KEPT: usize = 64;

fn compiled(text: &str) -> Option<Arc<PayloadSchema>> {
    let mut known = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(schema) = known.iter().find(|s| s.text() == text) {
        return Some(schema.clone());
    }
    let schema = Arc::new(PayloadSchema::compile(text).ok()?);
    if known.len() >= COMPILED_KEPT {
        known.remove(0);
    }
    known.push(schema.clone());
    Some(schema)
}

/// What the service's reply to a message of `direction` means.
pub fn resolution(direction: Direction, reply: ProcessingResponse) -> Resolution {
    if reply.connection_status != CONTINUE {
        return Resolution::Close;
    }
    match direction {
        Direction::Request => Resolution::Request {
            forward: reply.read_data.map(|d| d.data.to_vec()).unwrap_or_default(),
            answer: reply.write_data.map(|d| d.data.to_vec()).filter(|a| !a.is_empty()),
            want_response: want_response(reply.dynamic_metadata.as_ref()),
            vouched: vouched(reply.dynamic_metadata.as_ref()),
        },
        Direction::Response => Resolution::Response {
            answer: reply.write_data.map(|d| d.data.to_vec()).unwrap_or_default(),
            vouched: vouched(reply.dynamic_metadata.as_ref()),
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use prost::Message;

    /// A reply whose `keg` metadata holds `fields`.
    pub(crate) fn with_keg(mut reply: ProcessingResponse, fields: Vec<(&str, Value)>) -> ProcessingResponse {
        let keg = Struct { fields: fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect() };
        reply.dynamic_metadata = Some(Struct { fields: BTreeMap::from([(NAMESPACE.to_string(), Value { kind: Some(Kind::StructValue(keg)) })]) });
        reply
    }

    #[test]
    fn a_throttle_is_a_bounded_pause_and_anything_else_is_none() {
        let ms = |n: f64| vec![("throttle_ms", Value { kind: Some(Kind::NumberValue(n)) })];
        let reply = |fields| with_keg(ProcessingResponse::default(), fields);
        assert_eq!(throttle(&reply(ms(250.0))), Some(Duration::from_millis(250)));
        assert_eq!(throttle(&reply(ms(3_600_000.0))), Some(MAX_THROTTLE));
        for none in [ms(0.0), ms(-5.0), ms(f64::NAN), vec![("throttle_ms", Value { kind: Some(Kind::StringValue("9".into())) })], vec![]] {
            assert_eq!(throttle(&reply(none)), None);
        }
        assert_eq!(throttle(&ProcessingResponse::default()), None);
    }

    #[test]
    fn replies_mean_what_the_protocol_says() {
        let keg = Struct { fields: BTreeMap::from([("want_response".to_string(), Value { kind: Some(Kind::BoolValue(true)) })]) };
        let reply = ProcessingResponse {
            read_data: Some(Data { data: Bytes::from_static(b"frame"), end_of_stream: false }),
            dynamic_metadata: Some(Struct { fields: BTreeMap::from([(NAMESPACE.to_string(), Value { kind: Some(Kind::StructValue(keg)) })]) }),
            ..Default::default()
        };
        // Through the wire, as the Python service's bytes would come.
        let reply = ProcessingResponse::decode(reply.encode_to_vec().as_slice()).unwrap();
        assert_eq!(resolution(Direction::Request, reply),
                   Resolution::Request { forward: b"frame".to_vec(), answer: None, want_response: true, vouched: vec![] });
        let answered = ProcessingResponse { write_data: Some(Data { data: Bytes::from_static(b"answer"), end_of_stream: false }), ..Default::default() };
        assert_eq!(resolution(Direction::Request, answered.clone()),
                   Resolution::Request { forward: vec![], answer: Some(b"answer".to_vec()), want_response: false, vouched: vec![] });
        assert_eq!(resolution(Direction::Response, answered), Resolution::Response { answer: b"answer".to_vec(), vouched: vec![] });
        let close = ProcessingResponse { connection_status: 2, ..Default::default() };
        assert_eq!(resolution(Direction::Request, close), Resolution::Close);
    }

    #[test]
    fn messages_carry_the_frame_and_the_identity() {
        let handoff = HandOff { id: 1, direction: Direction::Response, frame: Bytes::from_static(b"f"), api_key: 1,
                                api_version: 17, principal: Some("User:alice".into()), security_protocol: "SASL_PLAINTEXT" };
        let m = message(&handoff);
        assert!(m.read_data.is_none());
        assert_eq!(m.write_data.unwrap().data, Bytes::from_static(b"f"));
        let keg = &m.metadata.unwrap().filter_metadata[NAMESPACE];
        assert_eq!(keg.fields["principal"], string("User:alice"));
        assert_eq!(keg.fields["api_version"], number(17.0));
    }
}
