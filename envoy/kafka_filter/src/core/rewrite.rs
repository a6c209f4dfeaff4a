//! Broker addresses in responses become the gateway's, so clients stay on the gateway.
//!
//! The decision to look at a response is made when its request passes (responses carry
//! no API key): [`plan`]. Every response field that carries a broker address:
//!
//! | API | field | what happens |
//! |---|---|---|
//! | Metadata (3) | `Brokers[]` | gateway listener of that broker |
//! | FindCoordinator (10) | v0-3 `NodeId/Host/Port`, v4+ `Coordinators[]` | same |
//! | DescribeCluster (60) | `Brokers[]` | same |
//! | Produce (0) v10+, Fetch (1) v16+ | tagged `NodeEndpoints` (KIP-951) | same |
//! | ShareFetch (78), ShareAcknowledge (79) | `NodeEndpoints` | same |
//! | DescribeQuorum (55) v2+ | `Nodes[].Listeners` | controller endpoints: removed |
//! | DescribeConfigs (32), broker resources | `listeners`, `advertised.listeners`, `controller.quorum.*` | known broker endpoints -> gateway, the rest redacted |
//!
//! A broker with no route yet (a new node before the control plane's next update) is
//! sent to the listener the client is on, never to the broker itself: the client then
//! gets NOT_LEADER errors and refreshes, instead of silently bypassing the gateway.
//!
//! Fetch v16+ responses are the bulk of a consumer's bytes and carry `NodeEndpoints`
//! only after a leader change: [`super::skim`] walks their structure to the top-level
//! tagged fields without decoding records; only a response that has the tag is decoded.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, DescribeClusterResponse, DescribeConfigsResponse, DescribeQuorumResponse,
    FetchResponse, FindCoordinatorResponse, MetadataResponse, ProduceResponse, ResponseHeader,
    ShareAcknowledgeResponse, ShareFetchResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::ProtocolError;

pub const REDACTED_HOST: &str = "redacted";

/// What to do with a response, decided when its request passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Forward as it arrives.
    Pass,
    /// Hold the whole frame, decode it, rewrite addresses.
    Decode,
    /// Hold the whole frame, walk it to its tagged fields; decode only if NodeEndpoints.
    Skim,
}

const METADATA: i16 = 3;
const FIND_COORDINATOR: i16 = 10;
const DESCRIBE_CONFIGS: i16 = 32;
const DESCRIBE_QUORUM: i16 = 55;
const DESCRIBE_CLUSTER: i16 = 60;
const SHARE_FETCH: i16 = 78;
const SHARE_ACKNOWLEDGE: i16 = 79;
const PRODUCE: i16 = 0;
const FETCH: i16 = 1;

/// The plan for the response to (`api_key`, `version`), and whether the version is one
/// this module cannot read although that API's responses may carry addresses (then the
/// response passes untouched and the caller counts it).
pub fn plan(api_key: i16, version: i16) -> (Plan, bool) {
    let wanted = match api_key {
        METADATA | FIND_COORDINATOR | DESCRIBE_CLUSTER | SHARE_FETCH | SHARE_ACKNOWLEDGE
        | DESCRIBE_CONFIGS => Plan::Decode,
        DESCRIBE_QUORUM if version >= 2 => Plan::Decode,
        PRODUCE if version >= 10 => Plan::Decode,
        FETCH if version >= 16 => Plan::Skim,
        _ => return (Plan::Pass, false),
    };
    let readable = ApiKey::try_from(api_key)
        .map(|key| {
            let range = key.valid_versions();
            range.min <= version && version <= range.max
        })
        .unwrap_or(false);
    if readable {
        (wanted, false)
    } else {
        (Plan::Pass, true)
    }
}

/// A gateway endpoint (what clients are told) or a broker endpoint (what brokers say).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: i32,
}

impl Endpoint {
    pub fn parse(text: &str) -> Option<Endpoint> {
        let (host, port) = text.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(Endpoint { host: host.to_string(), port: port.parse().ok()? })
    }
}

/// The gateway's routes: broker node id -> the gateway listener that fronts it, and the
/// broker's own endpoint (to recognise it inside config values).
#[derive(Debug, Clone, Default)]
pub struct Routes {
    pub gateway: HashMap<i32, Endpoint>,
    pub broker: HashMap<Endpoint, i32>,
}

/// Routes as one connection sees them: plus the listener the client is on.
#[derive(Debug, Clone, Copy)]
pub struct RouteView<'a> {
    pub routes: &'a Routes,
    pub own_listener: Option<&'a Endpoint>,
}

/// What rewriting one response did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RewriteReport {
    pub addresses: u32,
    pub unknown_brokers: u32,
    pub redacted: u32,
}

impl RouteView<'_> {
    fn target(&self, node: i32, report: &mut RewriteReport) -> Result<&Endpoint, ProtocolError> {
        if let Some(endpoint) = self.routes.gateway.get(&node) {
            return Ok(endpoint);
        }
        report.unknown_brokers += 1;
        self.own_listener.ok_or(ProtocolError::NoRoute(node))
    }

    /// Points (`host`, `port`) of broker `node` at the gateway; counts what changed.
    fn point<P: Copy + TryFrom<i32> + PartialEq>(
        &self,
        node: i32,
        host: &mut StrBytes,
        port: &mut P,
        report: &mut RewriteReport,
    ) -> Result<(), ProtocolError> {
        let target = self.target(node, report)?;
        let new_port = P::try_from(target.port).map_err(|_| ProtocolError::NoRoute(node))?;
        if host.as_str() != target.host || *port != new_port {
            *host = StrBytes::from_string(target.host.clone());
            *port = new_port;
            report.addresses += 1;
        }
        Ok(())
    }
}

/// Rewrites a complete response frame (with its size prefix); `Ok(None)`: unchanged.
pub fn rewrite(
    api_key: i16,
    version: i16,
    frame: &[u8],
    view: RouteView<'_>,
    report: &mut RewriteReport,
) -> Result<Option<Vec<u8>>, ProtocolError> {
    let key = ApiKey::try_from(api_key).map_err(|_| ProtocolError::Malformed("unknown API key"))?;
    let ctx = Recode { key, version, frame, view };
    match api_key {
        METADATA => ctx.run(report, |m: &mut MetadataResponse, view, report| {
            for b in &mut m.brokers {
                view.point(b.node_id.0, &mut b.host, &mut b.port, report)?;
            }
            // Topic ids (v10+) name the topics of Produce/Fetch v13+ for topic-selective
            // hand-offs (the broker's answer: a client cannot forge it).
            for t in &m.topics {
                if let (0, Some(name)) = (t.error_code, &t.name) {
                    super::topics::learn_topic_id(*t.topic_id.as_bytes(), name.as_str());
                }
            }
            Ok(())
        }),
        FIND_COORDINATOR => ctx.run(report, |m: &mut FindCoordinatorResponse, view, report| {
            if version < 4 {
                if m.node_id.0 >= 0 {
                    view.point(m.node_id.0, &mut m.host, &mut m.port, report)?;
                }
            } else {
                for c in &mut m.coordinators {
                    if c.node_id.0 >= 0 {
                        view.point(c.node_id.0, &mut c.host, &mut c.port, report)?;
                    }
                }
            }
            Ok(())
        }),
        DESCRIBE_CLUSTER => ctx.run(report, |m: &mut DescribeClusterResponse, view, report| {
            for b in &mut m.brokers {
                view.point(b.broker_id.0, &mut b.host, &mut b.port, report)?;
            }
            Ok(())
        }),
        PRODUCE => ctx.run(report, |m: &mut ProduceResponse, view, report| {
            for n in &mut m.node_endpoints {
                view.point(n.node_id.0, &mut n.host, &mut n.port, report)?;
            }
            Ok(())
        }),
        FETCH => ctx.run(report, |m: &mut FetchResponse, view, report| {
            for n in &mut m.node_endpoints {
                view.point(n.node_id.0, &mut n.host, &mut n.port, report)?;
            }
            Ok(())
        }),
        SHARE_FETCH => ctx.run(report, |m: &mut ShareFetchResponse, view, report| {
            for n in &mut m.node_endpoints {
                view.point(n.node_id.0, &mut n.host, &mut n.port, report)?;
            }
            Ok(())
        }),
        SHARE_ACKNOWLEDGE => ctx.run(report, |m: &mut ShareAcknowledgeResponse, view, report| {
            for n in &mut m.node_endpoints {
                view.point(n.node_id.0, &mut n.host, &mut n.port, report)?;
            }
            Ok(())
        }),
        DESCRIBE_QUORUM => ctx.run(report, |m: &mut DescribeQuorumResponse, _, report| {
            for node in &mut m.nodes {
                report.redacted += node.listeners.len() as u32;
                node.listeners.clear();
            }
            Ok(())
        }),
        DESCRIBE_CONFIGS => ctx.run(report, |m: &mut DescribeConfigsResponse, view, report| {
            for result in m.results.iter_mut().filter(|r| r.resource_type == BROKER_RESOURCE) {
                for config in &mut result.configs {
                    let Some(kind) = address_config(&config.name) else { continue };
                    if config.config_source != DEFAULT_CONFIG {
                        rewrite_config_value(&mut config.value, kind, view, report);
                    }
                    for synonym in config.synonyms.iter_mut().filter(|s| s.source != DEFAULT_CONFIG) {
                        rewrite_config_value(&mut synonym.value, kind, view, report);
                    }
                }
            }
            Ok(())
        }),
        _ => Ok(None),
    }
}

struct Recode<'a> {
    key: ApiKey,
    version: i16,
    frame: &'a [u8],
    view: RouteView<'a>,
}

impl Recode<'_> {
    /// Decodes the frame as `M`, lets `edit` change it, encodes it again if it changed.
    fn run<M: Decodable + Encodable>(
        &self,
        report: &mut RewriteReport,
        edit: impl FnOnce(&mut M, &RouteView<'_>, &mut RewriteReport) -> Result<(), ProtocolError>,
    ) -> Result<Option<Vec<u8>>, ProtocolError> {
        let header_version = self.key.response_header_version(self.version);
        let mut buf = Bytes::copy_from_slice(&self.frame[4..]);
        let header = ResponseHeader::decode(&mut buf, header_version)
            .map_err(|_| ProtocolError::Malformed("response header"))?;
        let mut message =
            M::decode(&mut buf, self.version).map_err(|_| ProtocolError::Malformed("response body"))?;
        let before = *report;
        edit(&mut message, &self.view, report)?;
        if *report == before {
            return Ok(None);
        }
        let mut out = BytesMut::with_capacity(self.frame.len() + 64);
        out.extend_from_slice(&[0; 4]);
        header
            .encode(&mut out, header_version)
            .and_then(|_| message.encode(&mut out, self.version))
            .map_err(|_| ProtocolError::Malformed("re-encoding a rewritten response"))?;
        let size = i32::try_from(out.len() - 4).map_err(|_| ProtocolError::Malformed("rewritten response too large"))?;
        out[..4].copy_from_slice(&size.to_be_bytes());
        Ok(Some(out.to_vec()))
    }
}

const BROKER_RESOURCE: i8 = 4;
/// ConfigSource.DEFAULT_CONFIG: Kafka's built-in default (`listeners` is
/// `PLAINTEXT://:9092` on every Kafka), no address of this cluster: left as it is.
const DEFAULT_CONFIG: i8 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressConfig {
    /// `NAME://host:port,...`
    Listeners,
    /// `id@host:port,...`
    Voters,
    /// `host:port,...`
    Servers,
}

fn address_config(name: &str) -> Option<AddressConfig> {
    match name {
        "listeners" | "advertised.listeners" => Some(AddressConfig::Listeners),
        "controller.quorum.voters" => Some(AddressConfig::Voters),
        "controller.quorum.bootstrap.servers" => Some(AddressConfig::Servers),
        _ => None,
    }
}

fn rewrite_config_value(value: &mut Option<StrBytes>, kind: AddressConfig, view: &RouteView<'_>, report: &mut RewriteReport) {
    let Some(text) = value.as_ref() else { return };
    if text.is_empty() {
        return;
    }
    let rewritten = rewrite_address_list(text.as_str(), kind, view, report);
    if rewritten != text.as_str() {
        *value = Some(StrBytes::from_string(rewritten));
    }
}

/// Each endpoint in a comma-separated list: a known broker endpoint becomes its gateway
/// listener, anything else (controller, inter-broker and bind addresses) is redacted.
fn rewrite_address_list(text: &str, kind: AddressConfig, view: &RouteView<'_>, report: &mut RewriteReport) -> String {
    let mut parts = Vec::new();
    for entry in text.split(',') {
        let entry = entry.trim();
        let (prefix, address) = match kind {
            AddressConfig::Listeners => match entry.find("://") {
                Some(i) => entry.split_at(i + 3),
                None => ("", entry),
            },
            AddressConfig::Voters => match entry.find('@') {
                Some(i) => entry.split_at(i + 1),
                None => ("", entry),
            },
            AddressConfig::Servers => ("", entry),
        };
        let known = Endpoint::parse(address)
            .and_then(|e| view.routes.broker.get(&e).copied())
            .and_then(|node| view.routes.gateway.get(&node));
        match known {
            Some(gateway) if kind != AddressConfig::Voters => {
                report.addresses += 1;
                parts.push(format!("{prefix}{}:{}", gateway.host, gateway.port));
            }
            _ => {
                report.redacted += 1;
                parts.push(format!("{prefix}{REDACTED_HOST}:0"));
            }
        }
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        let mut r = Routes::default();
        r.gateway.insert(1, Endpoint { host: "gw".into(), port: 19092 });
        r.gateway.insert(2, Endpoint { host: "gw".into(), port: 19093 });
        r.broker.insert(Endpoint { host: "kafka-1".into(), port: 9092 }, 1);
        r
    }

    #[test]
    fn plans_follow_the_schema() {
        assert_eq!(plan(0, 9), (Plan::Pass, false));
        assert_eq!(plan(0, 10), (Plan::Decode, false));
        assert_eq!(plan(1, 15), (Plan::Pass, false));
        assert_eq!(plan(1, 16), (Plan::Skim, false));
        assert_eq!(plan(3, 99), (Plan::Pass, true));
        assert_eq!(plan(18, 4), (Plan::Pass, false));
        assert_eq!(plan(55, 1), (Plan::Pass, false));
    }

    #[test]
    fn config_values_keep_clients_on_the_gateway() {
        let routes = routes();
        let view = RouteView { routes: &routes, own_listener: None };
        let mut report = RewriteReport::default();
        let out = rewrite_address_list(
            "PLAINTEXT://kafka-1:9092,CONTROLLER://kafka-1:9093",
            AddressConfig::Listeners, &view, &mut report);
        assert_eq!(out, "PLAINTEXT://gw:19092,CONTROLLER://redacted:0");
        let voters = rewrite_address_list("1@kafka-1:9092", AddressConfig::Voters, &view, &mut report);
        assert_eq!(voters, "1@redacted:0");
        assert_eq!(report, RewriteReport { addresses: 1, unknown_brokers: 0, redacted: 2 });
    }
}
