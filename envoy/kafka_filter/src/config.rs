//! The module's `filter_config` (JSON, from the control plane) and the process-wide
//! route tables it feeds.
//!
//! ```json
//! {"route_table": "keg", "max_frame_size": 104857600, "max_held_bytes": 1073741824,
//!  "routes": [{"node_id": 1, "gateway": "127.0.0.1:19092", "broker": "kafka-1:9092"}]}
//! ```
//!
//! Routes live in a process-wide table named by `route_table`: loading a configuration
//! (a listener or an ECDS update) replaces that table's routes, and every connection,
//! including those created from an older configuration, reads the table when it
//! rewrites a response. A route change therefore reaches live connections without a
//! listener change (which would drain them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde::Deserialize;

use crate::core::rewrite::{Endpoint, Routes};
use crate::core::SessionLimits;

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

/// One route table's current routes; connections keep the slot, not the routes.
pub type RouteSlot = Arc<RwLock<Arc<Routes>>>;

#[derive(Debug)]
pub struct FilterConfig {
    pub route_table: String,
    pub routes: RouteSlot,
    pub limits: SessionLimits,
    /// Bytes all connections of the process may hold before new holds close theirs.
    pub max_held_bytes: usize,
}

fn tables() -> &'static Mutex<HashMap<String, RouteSlot>> {
    static TABLES: OnceLock<Mutex<HashMap<String, RouteSlot>>> = OnceLock::new();
    TABLES.get_or_init(Default::default)
}

impl FilterConfig {
    /// Parses the JSON and installs its routes as the current ones of its table.
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
        let routes = Arc::new(routes);
        let slot = {
            let mut tables = tables().lock().unwrap_or_else(|e| e.into_inner());
            let slot = tables.entry(raw.route_table.clone())
                .or_insert_with(|| Arc::new(RwLock::new(routes.clone())))
                .clone();
            *slot.write().unwrap_or_else(|e| e.into_inner()) = routes;
            slot
        };
        Ok(FilterConfig {
            route_table: raw.route_table,
            routes: slot,
            limits: SessionLimits { max_frame_size: raw.max_frame_size },
            max_held_bytes: raw.max_held_bytes,
        })
    }

    pub fn current_routes(&self) -> Arc<Routes> {
        self.routes.read().unwrap_or_else(|e| e.into_inner()).clone()
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
    fn bad_configs_say_what_is_wrong() {
        let err = FilterConfig::load(br#"{"routes": [{"node_id": 1, "gateway": "nope"}]}"#).unwrap_err();
        assert!(err.contains("gateway \"nope\""), "{err}");
        assert!(FilterConfig::load(br#"{"rotues": []}"#).unwrap_err().contains("unknown field"));
    }
}
