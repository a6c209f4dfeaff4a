//! The module's labelled metrics, served in Prometheus' text format on an address of
//! their own (`metrics.address` in the filter config).
//!
//! Envoy 1.40's network-filter ABI defines counters when a configuration loads and has
//! no labelled ones, so the series whose labels come from traffic (topic, client id,
//! principal) cannot be Envoy stats. They are the ext_proc path's series, with its names
//! and labels (ext_proc/metrics.py), so a dashboard reads either path the same way:
//!
//! ```text
//! keg_requests_total{api,version,client_id,principal}
//! keg_topic_requests_total{api,topic,client_id,principal}       (Produce)
//! keg_topic_record_bytes_total{api,topic,client_id,principal}   (Produce)
//! ```
//!
//! Connections count into their [`crate::core::meter::Meter`] and drain it here after
//! each callback; `prometheus-client` (the Prometheus project's Rust client) keeps the
//! series and writes the exposition, a small HTTP/1 server (hyper, already in the
//! module for gRPC) on a thread of its own answers scrapes. One exporter per Envoy
//! process: every configuration naming the same address shares it.
//!
//! Cardinality, as on the ext_proc path: topics, client ids and principals come from
//! clients, so only the first `max_topics` / `max_clients` / `max_principals` distinct
//! values get a series of their own, later ones count as `other`. Their combinations are
//! bounded too (1,000 topics x 1,000 client ids is a million series, which one client
//! makes by changing its client id): a family admits its first `max_series` label sets,
//! a later one counts with its topic, client id and principal `other`.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use kafka_protocol::messages::ApiKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::core::meter::{MeterSink, TopicKey};
use crate::core::stats::MAX_API_KEY;
use crate::core::topics;

pub const OTHER: &str = "other";
const PRODUCE_LABEL: &str = "Produce";
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The filter config's `metrics` object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// host:port the exporter listens on.
    pub address: String,
    /// Read Produce requests for the topic series.
    #[serde(default = "yes")]
    pub topics: bool,
    #[serde(default = "thousand")]
    pub max_topics: usize,
    #[serde(default = "thousand")]
    pub max_clients: usize,
    #[serde(default = "thousand")]
    pub max_principals: usize,
    /// Label sets per series family.
    #[serde(default = "ten_thousand")]
    pub max_series: usize,
}

fn yes() -> bool {
    true
}

fn thousand() -> usize {
    1000
}

fn ten_thousand() -> usize {
    10_000
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: String,
    version: String,
    client_id: String,
    principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    api: String,
    topic: String,
    client_id: String,
    principal: String,
}

/// Admits the first `limit` distinct values; any later one becomes [`OTHER`].
struct Bounded {
    limit: usize,
    seen: Mutex<HashSet<String>>,
}

impl Bounded {
    fn new(limit: usize) -> Self {
        Bounded { limit, seen: Mutex::new(HashSet::new()) }
    }

    fn label(&self, value: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(value) {
            return value.to_string();
        }
        if seen.len() < self.limit {
            seen.insert(value.to_string());
            return value.to_string();
        }
        OTHER.to_string()
    }
}

/// Admits the first `limit` distinct label sets of a series family; a later one is
/// folded (its labels that clients choose become [`OTHER`]).
struct BoundedSeries<L> {
    limit: usize,
    seen: Mutex<HashSet<L>>,
}

impl<L: Clone + Eq + std::hash::Hash> BoundedSeries<L> {
    fn new(limit: usize) -> Self {
        BoundedSeries { limit, seen: Mutex::new(HashSet::new()) }
    }

    fn admit(&self, labels: L, fold: impl FnOnce(L) -> L) -> L {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&labels) {
            return labels;
        }
        if seen.len() < self.limit {
            seen.insert(labels.clone());
            return labels;
        }
        fold(labels)
    }
}

/// The process's labelled series and their HTTP server.
pub struct Exporter {
    config: MetricsConfig,
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    topic_requests: Family<TopicLabels, Counter>,
    topic_record_bytes: Family<TopicLabels, Counter>,
    api_names: Vec<String>,
    topics: Bounded,
    clients: Bounded,
    principals: Bounded,
    request_series: BoundedSeries<RequestLabels>,
    topic_series: BoundedSeries<TopicLabels>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Exporter {
    pub fn new(config: MetricsConfig) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let topic_requests = Family::<TopicLabels, Counter>::default();
        let topic_record_bytes = Family::<TopicLabels, Counter>::default();
        registry.register("keg_requests", "Kafka requests seen (keg's Kafka filter in Envoy)", requests.clone());
        registry.register("keg_topic_requests", "Produce requests, once per topic they name", topic_requests.clone());
        registry.register("keg_topic_record_bytes", "Record-batch bytes produced per topic", topic_record_bytes.clone());
        let api_names = (0..=MAX_API_KEY as i16)
            .map(|key| ApiKey::try_from(key).map_or_else(|_| OTHER.to_string(), |k| format!("{k:?}")))
            .collect();
        Exporter {
            topics: Bounded::new(config.max_topics),
            clients: Bounded::new(config.max_clients),
            principals: Bounded::new(config.max_principals),
            request_series: BoundedSeries::new(config.max_series),
            topic_series: BoundedSeries::new(config.max_series),
            config,
            registry,
            requests,
            topic_requests,
            topic_record_bytes,
            api_names,
        }
    }

    pub fn config(&self) -> &MetricsConfig {
        &self.config
    }

    /// The API's name; "other" for a key no Kafka API has: each made a series of its
    /// own, past every bound (51,838 series from connections sending made-up keys).
    fn api_label(&self, api_key: i16) -> String {
        usize::try_from(api_key).ok().and_then(|k| self.api_names.get(k)).cloned().unwrap_or_else(|| OTHER.to_string())
    }

    /// The exposition (OpenMetrics text, which Prometheus reads).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Serves `GET /metrics` on `listener` on a thread of its own, for the process's life.
    fn serve(self: &Arc<Self>, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let exporter = Arc::clone(self);
        std::thread::Builder::new().name("keg-metrics".into()).spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() else { return };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        // Out of descriptors, say: try again shortly, without spinning.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    };
                    let exporter = Arc::clone(&exporter);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let exporter = Arc::clone(&exporter);
                            async move { Ok::<_, Infallible>(exporter.answer(&request)) }
                        });
                        let io = hyper_util::rt::TokioIo::new(stream);
                        // A scraper sends its request at once: a peer that dribbles its
                        // headers is cut off rather than held forever.
                        let _ = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .serve_connection(io, service)
                            .await;
                    });
                }
            });
        })?;
        Ok(())
    }

    fn answer<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match request.uri().path() {
            "/metrics" => (StatusCode::OK, CONTENT_TYPE, self.encode()),
            _ => (StatusCode::NOT_FOUND, "text/plain", "keg's Kafka filter serves /metrics\n".to_string()),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// Most topics a connection keeps counter handles for (past them, each drain looks its
/// series up again): a client naming many topics costs lookups, not memory.
const CACHED_TOPICS: usize = 256;

/// One connection's handles on its series: a drain adds to counters it already holds,
/// without building labels or looking series up, while its client id and principal stay
/// (they rarely change on a connection; when they do, the handles are dropped).
pub struct ConnectionCounters {
    exporter: Arc<Exporter>,
    /// The client id and principal the handles are for, as the meter said them.
    who: Option<(String, String)>,
    requests: Vec<((i16, i16), Counter)>,
    topics: Vec<(TopicKey, Counter, Counter)>,
}

impl ConnectionCounters {
    pub fn new(exporter: Arc<Exporter>) -> Self {
        ConnectionCounters { exporter, who: None, requests: Vec::new(), topics: Vec::new() }
    }

    fn switch(&mut self, client_id: &str, principal: &str) {
        let same = self.who.as_ref().is_some_and(|(c, p)| c == client_id && p == principal);
        if !same {
            self.who = Some((client_id.to_string(), principal.to_string()));
            self.requests.clear();
            self.topics.clear();
        }
    }
}

impl MeterSink for ConnectionCounters {
    fn requests(&mut self, api_key: i16, api_version: i16, client_id: &str, principal: &str, count: u64) {
        self.switch(client_id, principal);
        let key = (api_key, api_version);
        if let Some((_, counter)) = self.requests.iter().find(|(k, _)| *k == key) {
            counter.inc_by(count);
            return;
        }
        let counter = self.exporter.request_counter(api_key, api_version, client_id, principal);
        counter.inc_by(count);
        self.requests.push((key, counter));
    }

    fn topic(&mut self, topic: &TopicKey, client_id: &str, principal: &str, requests: u64, record_bytes: u64) {
        self.switch(client_id, principal);
        if let Some((_, count, bytes)) = self.topics.iter().find(|(t, _, _)| t == topic) {
            count.inc_by(requests);
            bytes.inc_by(record_bytes);
            return;
        }
        let (name, named) = self.exporter.topic_label(topic);
        let (count, bytes) = self.exporter.topic_counters(&name, client_id, principal);
        count.inc_by(requests);
        bytes.inc_by(record_bytes);
        // An id not named yet may be named later: its handles are not kept.
        if named && self.topics.len() < CACHED_TOPICS {
            self.topics.push((topic.clone(), count, bytes));
        }
    }
}

impl Exporter {
    fn request_counter(&self, api_key: i16, api_version: i16, client_id: &str, principal: &str) -> Counter {
        let labels = RequestLabels {
            api: self.api_label(api_key),
            version: api_version.to_string(),
            client_id: self.clients.label(client_id),
            principal: self.principals.label(principal),
        };
        // Past the bound the version goes too: a made-up version of a real API was
        // a series each.
        let labels = self.request_series.admit(labels, |l| RequestLabels {
            version: OTHER.to_string(),
            client_id: OTHER.to_string(),
            principal: OTHER.to_string(),
            ..l
        });
        self.requests.get_or_create(&labels).clone()
    }

    /// The topic's label, and whether it is its name (an id not learned yet is not).
    fn topic_label(&self, topic: &TopicKey) -> (String, bool) {
        match topic {
            TopicKey::Name(name) => (name.to_string(), true),
            // Named from the Metadata answers the module saw; an id it was never told stays the id.
            TopicKey::Id(id) => topics::topic_name(id).map_or_else(|| (uuid_text(id), false), |n| (n.to_string(), true)),
        }
    }

    /// (requests, record bytes) counters of a topic.
    fn topic_counters(&self, name: &str, client_id: &str, principal: &str) -> (Counter, Counter) {
        let labels = TopicLabels {
            api: PRODUCE_LABEL.to_string(),
            topic: self.topics.label(name),
            client_id: self.clients.label(client_id),
            principal: self.principals.label(principal),
        };
        let labels = self.topic_series.admit(labels, |l| TopicLabels {
            topic: OTHER.to_string(),
            client_id: OTHER.to_string(),
            principal: OTHER.to_string(),
            ..l
        });
        (self.topic_requests.get_or_create(&labels).clone(), self.topic_record_bytes.get_or_create(&labels).clone())
    }
}

/// `8-4-4-4-12` hex, as Python's `str(uuid.UUID(...))`.
fn uuid_text(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Why there is no exporter for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExporterError {
    /// The configuration is wrong (it is refused).
    Invalid(String),
    /// It cannot listen now (the port is taken, say): the data path serves without its
    /// labelled metrics, and the next configuration tries again.
    Unavailable(String),
}

/// The process's exporter for `config`: the running one when its address is the same,
/// else a new one listening there.
pub fn exporter(config: &MetricsConfig) -> Result<Arc<Exporter>, ExporterError> {
    static RUNNING: OnceLock<Mutex<Vec<Arc<Exporter>>>> = OnceLock::new();
    let mut running = RUNNING.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = running.iter().find(|e| e.config.address == config.address) {
        return Ok(Arc::clone(found));
    }
    let address: SocketAddr = config.address.parse().map_err(|_| ExporterError::Invalid(
        format!("metrics.address {:?} is not host:port (an IP address and a port)", config.address)))?;
    let listener = std::net::TcpListener::bind(address).map_err(|e| ExporterError::Unavailable(
        format!("the metrics exporter cannot listen on {address} ({e}): serving without labelled metrics")))?;
    let exporter = Arc::new(Exporter::new(config.clone()));
    exporter.serve(listener)
        .map_err(|e| ExporterError::Unavailable(format!("the metrics exporter cannot start: {e}")))?;
    running.push(Arc::clone(&exporter));
    Ok(exporter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max: usize) -> MetricsConfig {
        MetricsConfig { address: "127.0.0.1:0".into(), topics: true, max_topics: max, max_clients: max, max_principals: max, max_series: 10_000 }
    }

    #[test]
    fn series_have_the_ext_proc_paths_names_and_labels() {
        let exporter = Arc::new(Exporter::new(config(10)));
        let mut sink = ConnectionCounters::new(Arc::clone(&exporter));
        sink.requests(0, 11, "billing", "User:alice", 3);
        sink.requests(1000, 0, "", "User:ANONYMOUS", 1);
        sink.topic(&TopicKey::Name("orders".into()), "billing", "User:alice", 2, 610);
        sink.topic(&TopicKey::Id([0xab; 16]), "billing", "User:alice", 1, 0);
        let text = exporter.encode();
        for line in [
            r#"keg_requests_total{api="Produce",version="11",client_id="billing",principal="User:alice"} 3"#,
            r#"keg_requests_total{api="other",version="0",client_id="",principal="User:ANONYMOUS"} 1"#,
            r#"keg_topic_requests_total{api="Produce",topic="orders",client_id="billing",principal="User:alice"} 2"#,
            r#"keg_topic_record_bytes_total{api="Produce",topic="orders",client_id="billing",principal="User:alice"} 610"#,
            r#"keg_topic_requests_total{api="Produce",topic="abababab-abab-abab-abab-abababababab",client_id="billing",principal="User:alice"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn labels_past_their_bound_count_as_other() {
        let exporter = Arc::new(Exporter::new(config(2)));
        let mut sink = ConnectionCounters::new(Arc::clone(&exporter));
        for client in ["a", "b", "c", "d", "a"] {
            sink.requests(3, 12, client, "User:x", 1);
        }
        let text = exporter.encode();
        let count = |client: &str| text.lines().find(|l| l.contains(&format!("client_id=\"{client}\"")))
            .and_then(|l| l.rsplit(' ').next()).map(|n| n.to_string());
        assert_eq!((count("a"), count("b"), count("other")), (Some("2".into()), Some("1".into()), Some("2".into())));
        assert_eq!(count("c"), None);
    }

    #[test]
    fn made_up_api_keys_and_versions_stay_within_the_bound() {
        // Connections sending made-up api keys (and versions) made a series each, past
        // max_series: 51,838 series, a 4.4 MB page, from one client.
        let exporter = Arc::new(Exporter::new(MetricsConfig { max_series: 8, ..config(100) }));
        let mut sink = ConnectionCounters::new(Arc::clone(&exporter));
        for key in 0..2000_i16 {
            sink.requests(key.saturating_add(1000), 0, "probe", "User:a", 1);
            sink.requests(0, key, "probe", "User:a", 1);
        }
        let text = exporter.encode();
        let series = text.lines().filter(|l| l.starts_with("keg_requests_total{")).count();
        assert!(series <= 8 + 2, "{series} series:\n{text}");
        assert!(text.contains(r#"keg_requests_total{api="other",version="0",client_id="probe",principal="User:a"} 2000"#), "{text}");
    }

    #[test]
    fn combinations_of_bounded_labels_are_bounded_too() {
        // Each label under its bound, their combinations were not: one client changing
        // its client id per request made topics x client ids series.
        let exporter = Arc::new(Exporter::new(MetricsConfig { max_series: 4, ..config(100) }));
        for n in 0..10 {
            let mut sink = ConnectionCounters::new(Arc::clone(&exporter));
            for t in 0..10 {
                sink.topic(&TopicKey::Name(format!("t{t}").into()), &format!("c{n}"), "User:a", 1, 10);
                sink.requests(0, 9, &format!("c{n}-{t}"), "User:a", 1);
            }
        }
        let text = exporter.encode();
        let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        assert_eq!((series("keg_topic_requests_total{"), series("keg_requests_total{")), (5, 5), "{text}");
        for line in [
            r#"keg_topic_requests_total{api="Produce",topic="other",client_id="other",principal="other"} 96"#,
            r#"keg_topic_record_bytes_total{api="Produce",topic="other",client_id="other",principal="other"} 960"#,
            r#"keg_requests_total{api="Produce",version="other",client_id="other",principal="other"} 96"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn one_exporter_per_address_and_a_taken_port_is_an_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let err = exporter(&MetricsConfig { address: address.clone(), ..config(1) }).err().unwrap();
        assert!(matches!(&err, ExporterError::Unavailable(m) if m.contains("cannot listen")), "{err:?}");
        let err = exporter(&MetricsConfig { address: "nonsense".into(), ..config(1) }).err().unwrap();
        assert!(matches!(err, ExporterError::Invalid(_)), "{err:?}");
        drop(taken);
        let first = exporter(&MetricsConfig { address: address.clone(), ..config(1) }).unwrap();
        let again = exporter(&MetricsConfig { address: address.clone(), ..config(5) }).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        // It answers a scrape.
        ConnectionCounters::new(Arc::clone(&first)).requests(18, 4, "probe", "User:ANONYMOUS", 1);
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains(r#"keg_requests_total{api="ApiVersions",version="4",client_id="probe""#), "{reply}");
    }
}
