//! The module's `filter_config` (JSON, from the control plane) and the process-wide
//! tables it feeds.
//!
//! ```json
//! {"route_table": "keg", "max_frame_size": 104857600, "max_held_bytes": 1073741824,
//!  "routes": [{"node_id": 1, "gateway": "127.0.0.1:19092", "broker": "kafka-1:9092"}],
//!  "interest": {"version": "7", "requests": [[0, 0, 32767]], "endpoints": ["127.0.0.1:5001"],
//!               "failure_mode_allow": false, "handoff_timeout_ms": 2000}}
//! ```
//!
//! Listeners with mutual TLS add `"principal_mapping_rules"` (Kafka's
//! ssl.principal.mapping.rules) and `"principal_from"` (`subject` or `uri_san`): the
//! client certificate's principal ([`crate::core::tls_principal`]). They belong to the
//! configuration, not the table: a TLS change is a listener change anyway.
//!
//! `"oauth_principal_claim"` names the JWT claim an OAUTHBEARER token's principal is
//! (the broker's `sasl.oauthbearer.sub.claim.name`, or its unsecured validator's
//! `unsecuredValidatorPrincipalClaimName`; default `sub`), so rules judge the principal
//! the broker acts as.
//!
//! Routes and the interest table (which requests go to the Python service, see
//! [`crate::core::interest`]) live in a process-wide table named by `route_table`:
//! loading a configuration (a listener or an ECDS update) replaces both, and every
//! connection, including those created from an older configuration, reads the table
//! when it decides a request or rewrites a response. A route or rule change therefore
//! reaches live connections without a listener change (which would drain them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde::Deserialize;

use crate::core::identity;
use crate::core::interest::Interest;
use crate::core::tls_principal::{PrincipalMapper, SUBJECT, URI_SAN};
use crate::core::rewrite::{Endpoint, Routes};
use crate::core::SessionLimits;
use crate::metrics::{self, Exporter, ExporterError, MetricsConfig};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    node_id: i32,
    gateway: String,
    #[serde(default)]
    broker: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_table")]
    route_table: String,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default = "default_max_frame_size")]
    max_frame_size: usize,
    #[serde(default = "default_max_held_bytes")]
    max_held_bytes: usize,
    #[serde(default)]
    interest: Option<serde_json::Value>,
    #[serde(default)]
    principal_mapping_rules: Option<String>,
    #[serde(default)]
    principal_from: Option<String>,
    #[serde(default)]
    oauth_principal_claim: Option<String>,
    /// Labelled metrics (crate::metrics): none without.
    #[serde(default)]
    metrics: Option<MetricsConfig>,
}

fn default_table() -> String {
    "default".to_string()
}

fn default_max_frame_size() -> usize {
    SessionLimits::default().max_frame_size
}

fn default_max_held_bytes() -> usize {
    1 << 30
}

/// What a configuration of a table installs, replaced whole.
#[derive(Debug, Default)]
pub struct Table {
    pub routes: Arc<Routes>,
    pub interest: Arc<Interest>,
}

/// One table's current contents; connections keep the slot, not the contents.
pub type TableSlot = Arc<RwLock<Arc<Table>>>;

#[derive(Debug)]
pub struct FilterConfig {
    pub route_table: String,
    pub table: TableSlot,
    pub limits: SessionLimits,
    /// Bytes all connections of the process may hold before new holds close theirs.
    pub max_held_bytes: usize,
    /// Mutual TLS: how a client certificate names the connection's principal.
    pub certificates: Option<Arc<CertificateMapping>>,
    /// The JWT claim an OAUTHBEARER token's principal is.
    pub oauth_principal_claim: Arc<str>,
    /// The process's exporter of labelled metrics, when the configuration asks for them.
    pub metrics: Option<Arc<Exporter>>,
    /// What the configuration asks for that the module cannot give now (logged).
    pub warnings: Vec<String>,
}

/// A mutual-TLS listener's mapping from client certificates to principals.
#[derive(Debug)]
pub struct CertificateMapping {
    pub mapper: PrincipalMapper,
    /// The rules as configured (the Python side gets them too, with the stream).
    pub rules: String,
    /// `subject` or `uri_san`: the name the rules apply to.
    pub from: String,
}

impl CertificateMapping {
    fn load(rules: Option<String>, from: Option<String>) -> Result<Option<CertificateMapping>, String> {
        if rules.is_none() && from.is_none() {
            return Ok(None);
        }
        let from = from.unwrap_or_else(|| SUBJECT.to_string());
        if from != SUBJECT && from != URI_SAN {
            return Err(format!("filter_config: principal_from must be {SUBJECT} or {URI_SAN}, not {from:?}"));
        }
        let rules = rules.unwrap_or_else(|| "DEFAULT".to_string());
        let mapper = PrincipalMapper::parse(Some(&rules)).map_err(|e| format!("filter_config: {e}"))?;
        Ok(Some(CertificateMapping { mapper, rules, from }))
    }
}

fn tables() -> &'static Mutex<HashMap<String, TableSlot>> {
    static TABLES: OnceLock<Mutex<HashMap<String, TableSlot>>> = OnceLock::new();
    TABLES.get_or_init(Default::default)
}

impl FilterConfig {
    /// Parses the JSON and installs its routes and interest as the current ones of its
    /// table.
    pub fn load(json: &[u8]) -> Result<FilterConfig, String> {
        let raw: RawConfig = serde_json::from_slice(json).map_err(|e| format!("filter_config: {e}"))?;
        let mut routes = Routes::default();
        for route in &raw.routes {
            let gateway = Endpoint::parse(&route.gateway)
                .ok_or_else(|| format!("filter_config: route {}: gateway {:?} is not host:port", route.node_id, route.gateway))?;
            routes.gateway.insert(route.node_id, gateway);
            if let Some(broker) = &route.broker {
                let broker = Endpoint::parse(broker)
                    .ok_or_else(|| format!("filter_config: route {}: broker {broker:?} is not host:port", route.node_id))?;
                routes.broker.insert(broker, route.node_id);
            }
        }
        if raw.max_frame_size < 8 {
            return Err("filter_config: max_frame_size must be at least 8".into());
        }
        let certificates = CertificateMapping::load(raw.principal_mapping_rules, raw.principal_from)?.map(Arc::new);
        let oauth_principal_claim: Arc<str> = match raw.oauth_principal_claim {
            None => identity::DEFAULT_OAUTH_CLAIM.into(),
            Some(claim) if claim.is_empty() => return Err("filter_config: oauth_principal_claim is empty".into()),
            Some(claim) => claim.into(),
        };
        let interest = match raw.interest {
            Some(value) => Interest::parse(value).map_err(|e| format!("filter_config: {e}"))?,
            None => Interest::default(),
        };
        let mut warnings = Vec::new();
        let metrics = match raw.metrics.as_ref().map(metrics::exporter) {
            None => None,
            Some(Ok(exporter)) => Some(exporter),
            Some(Err(ExporterError::Invalid(err))) => return Err(format!("filter_config: {err}")),
            Some(Err(ExporterError::Unavailable(err))) => {
                warnings.push(err);
                None
            }
        };
        let table = Arc::new(Table { routes: Arc::new(routes), interest: Arc::new(interest) });
        let slot = {
            let mut tables = tables().lock().unwrap_or_else(|e| e.into_inner());
            let slot = tables.entry(raw.route_table.clone())
                .or_insert_with(|| Arc::new(RwLock::new(table.clone())))
                .clone();
            *slot.write().unwrap_or_else(|e| e.into_inner()) = table;
            slot
        };
        Ok(FilterConfig {
            route_table: raw.route_table,
            table: slot,
            limits: SessionLimits { max_frame_size: raw.max_frame_size },
            max_held_bytes: raw.max_held_bytes,
            certificates,
            oauth_principal_claim,
            metrics,
            warnings,
        })
    }

    pub fn current(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn current_routes(&self) -> Arc<Routes> {
        self.current().routes.clone()
    }

    pub fn current_interest(&self) -> Arc<Interest> {
        self.current().interest.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_config_updates_connections_of_older_ones() {
        let first = FilterConfig::load(br#"{"route_table": "t1", "routes": [{"node_id": 1, "gateway": "gw:1"}]}"#).unwrap();
        assert_eq!(first.current_routes().gateway[&1].port, 1);
        let _second = FilterConfig::load(br#"{"route_table": "t1", "routes": [{"node_id": 1, "gateway": "gw:2"}]}"#).unwrap();
        assert_eq!(first.current_routes().gateway[&1].port, 2);
    }

    #[test]
    fn a_newer_interest_table_reaches_connections_of_older_configs() {
        let first = FilterConfig::load(br#"{"route_table": "t2"}"#).unwrap();
        assert!(!first.current_interest().wants(0, 9));
        let _second = FilterConfig::load(br#"{"route_table": "t2", "interest":
            {"version": "2", "requests": [[0, 0, 32767]], "endpoints": ["127.0.0.1:1"]}}"#).unwrap();
        assert!(first.current_interest().wants(0, 9));
        assert_eq!(first.current_interest().version, "2");
        let err = FilterConfig::load(br#"{"route_table": "t2", "interest": {"requests": [[0, 0, 1]]}}"#).unwrap_err();
        assert!(err.contains("no endpoints"), "{err}");
        assert!(first.current_interest().wants(0, 9), "a refused config changes nothing");
    }

    #[test]
    fn the_oauth_principal_claim_is_sub_unless_named() {
        assert_eq!(&*FilterConfig::load(br#"{"route_table": "t4"}"#).unwrap().oauth_principal_claim, "sub");
        let named = FilterConfig::load(br#"{"route_table": "t4", "oauth_principal_claim": "client_id"}"#).unwrap();
        assert_eq!(&*named.oauth_principal_claim, "client_id");
        let err = FilterConfig::load(br#"{"route_table": "t4", "oauth_principal_claim": ""}"#).unwrap_err();
        assert!(err.contains("oauth_principal_claim"), "{err}");
    }

    #[test]
    fn mutual_tls_listeners_name_their_principal_mapping() {
        let plain = FilterConfig::load(br#"{"route_table": "t3"}"#).unwrap();
        assert!(plain.certificates.is_none());
        let mtls = FilterConfig::load(br#"{"route_table": "t3", "principal_mapping_rules": "RULE:^CN=(.*?),.*$/$1/L",
            "principal_from": "subject"}"#).unwrap();
        let mapping = mtls.certificates.as_ref().unwrap();
        assert_eq!(mapping.mapper.principal("CN=Alice,O=keg").unwrap(), "User:alice");
        let err = FilterConfig::load(br#"{"principal_mapping_rules": "RULE:(/x/"}"#).unwrap_err();
        assert!(err.contains("ssl.principal.mapping.rules"), "{err}");
        let err = FilterConfig::load(br#"{"principal_from": "dns_san"}"#).unwrap_err();
        assert!(err.contains("principal_from"), "{err}");
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let err = FilterConfig::load(br#"{"routes": [{"node_id": 1, "gateway": "nope"}]}"#).unwrap_err();
        assert!(err.contains("gateway \"nope\""), "{err}");
        assert!(FilterConfig::load(br#"{"rotues": []}"#).unwrap_err().contains("unknown field"));
        let err = FilterConfig::load(br#"{"metrics": {"address": "localhost"}}"#).unwrap_err();
        assert!(err.contains("metrics.address"), "{err}");
        assert!(FilterConfig::load(br#"{"metrics": {"address": "127.0.0.1:0", "max_topic": 3}}"#).is_err());
    }

    #[test]
    fn a_metrics_port_taken_leaves_the_data_path_serving_and_says_so() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let json = format!(r#"{{"route_table": "t4", "metrics": {{"address": "{}"}}}}"#, taken.local_addr().unwrap());
        let config = FilterConfig::load(json.as_bytes()).unwrap();
        assert!(config.metrics.is_none());
        assert!(config.warnings.iter().any(|w| w.contains("serving without labelled metrics")), "{:?}", config.warnings);
    }
}
