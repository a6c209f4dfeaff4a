//! Who sends a request, as keg's rules match it: the principal, the client's network,
//! the listener, and the request's client id. A range of the interest table may carry a
//! who-selector (computed by the Python side from the top-level identity matchers of
//! every rule that may act on the range, `ext_proc.filters.match_who`): a request is
//! handed off only when one of the selector's clauses admits it.
//!
//! ```json
//! [{"principals": {"exact": ["User:alice"], "prefix": ["User:acme-"], "regex": []},
//!   "client_addresses": ["10.20.0.0/16", "fd00:20::/32"], "listeners": ["127.0.0.1:19092"],
//!   "client_ids": {"exact": ["billing"], "prefix": ["etl-"], "regex": []}}]
//! ```
//!
//! A clause admits a request when every matcher it has does. The selector is a
//! necessary condition for any of those rules to match, so whatever the module cannot
//! tell is admitted (handed off, for the Python side to judge): a principal it could not
//! read (an authentication by a name it did not read, where the Python side might know
//! more; a plaintext connection without SASL is `User:ANONYMOUS`, as for the broker),
//! a client address that is not an IP address, a listener it does not know, a client id
//! that is not ASCII or runs past its frame (the Python side decodes it, or refuses the
//! frame). A null client id matches no client-id matcher, as in the rules.

use std::collections::HashSet;
use std::net::IpAddr;

use serde::Deserialize;

use super::head::ClientIdField;
use super::identity::Identity;
use super::topics::{SelectorReading, TopicSelector};

/// Past this many clauses a selector is not applied (Python sends none that large).
pub const MAX_CLAUSES: usize = 4096;

/// What the module knows of a connection that rules match on, besides its principal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peer {
    /// The client's address (an IPv4-mapped IPv6 address as its IPv4 address, as the
    /// Python side's `filter_rules.parse_host` reads it).
    pub client_ip: Option<IpAddr>,
    /// The listener as the module names it to the Python service (`host:port`).
    pub listener: Option<String>,
}

impl Peer {
    pub fn new(client_host: Option<&str>, listener: Option<String>) -> Peer {
        let client_ip = client_host.and_then(|host| host.parse::<IpAddr>().ok()).map(|ip| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        });
        Peer { client_ip, listener }
    }
}

/// A request's client id, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientId<'a> {
    Null,
    /// Its bytes (a client id that is not ASCII is admitted by every clause, as a name
    /// the module does not match by pattern).
    Bytes(&'a [u8]),
    /// Not read (malformed): admitted by every clause.
    Unknown,
}

impl<'a> ClientId<'a> {
    /// The client id a request head found, in `frame` (the frame's first bytes, as many
    /// as the head was parsed from).
    pub fn read(field: ClientIdField, frame: &'a [u8]) -> ClientId<'a> {
        match field {
            ClientIdField::Null => ClientId::Null,
            ClientIdField::Bytes(_) => field.bytes(frame).map_or(ClientId::Unknown, ClientId::Bytes),
            ClientIdField::Unreadable => ClientId::Unknown,
        }
    }
}

/// Who sends a request: the connection's identity and peer, the request's client id.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub identity: &'a Identity,
    pub peer: &'a Peer,
    pub client_id: ClientId<'a>,
}

/// An IP network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    fn parse(text: &str) -> Result<Network, String> {
        let bad = || format!("who: {text:?} is not an IP network");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| bad())?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => prefix.parse::<u8>().ok().filter(|p| *p <= bits).ok_or_else(bad)?,
        };
        Ok(Network { address, prefix })
    }

    /// Same family and the same first `prefix` bits (Python's `address in network`).
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClause {
    #[serde(default)]
    principals: Option<serde_json::Value>,
    #[serde(default)]
    client_addresses: Option<Vec<String>>,
    #[serde(default)]
    listeners: Option<Vec<String>>,
    #[serde(default)]
    client_ids: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Clause {
    principals: Option<TopicSelector>,
    networks: Option<Vec<Network>>,
    listeners: Option<HashSet<String>>,
    client_ids: Option<TopicSelector>,
}

impl Clause {
    /// `principal`: the connection's, None when the module cannot tell it.
    fn admits(&self, principal: Option<&str>, from: &Requester<'_>) -> bool {
        let principal = || match (&self.principals, principal) {
            (Some(selector), Some(principal)) => selector.selects(principal.as_bytes()),
            _ => true,
        };
        let network = || match (&self.networks, from.peer.client_ip) {
            (Some(networks), Some(ip)) => networks.iter().any(|n| n.contains(ip)),
            _ => true,
        };
        let listener = || match (&self.listeners, &from.peer.listener) {
            (Some(listeners), Some(own)) => listeners.contains(own),
            _ => true,
        };
        let client_id = || match (&self.client_ids, from.client_id) {
            (Some(_), ClientId::Null) => false, // the rules' matcher wants a client id
            (Some(selector), ClientId::Bytes(bytes)) => selector.selects(bytes), // not ASCII: admitted
            _ => true,
        };
        network() && listener() && client_id() && principal()
    }
}

/// The connections a range's rules may act for: any clause admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhoSelector {
    clauses: Vec<Clause>,
    /// Some clause matches principals (the principal is built for them alone).
    reads_principals: bool,
}

impl WhoSelector {
    /// Parses a list of clauses. Malformed: an error (the configuration is refused). A
    /// principal pattern this module cannot compile, or too many clauses: None, every
    /// request of the range is handed off (refusing the table would keep the previous
    /// one, which may lack a rule the Python side enforces), with the reason.
    pub fn read(value: serde_json::Value) -> Result<Result<WhoSelector, String>, String> {
        let raw: Vec<RawClause> = serde_json::from_value(value).map_err(|e| format!("who: {e}"))?;
        if raw.len() > MAX_CLAUSES {
            return Ok(Err(format!("who: more than {MAX_CLAUSES} clauses")));
        }
        let mut clauses = Vec::with_capacity(raw.len());
        let mut unreadable = None;
        for clause in raw {
            if clause.principals.is_none() && clause.client_addresses.is_none() && clause.listeners.is_none()
                && clause.client_ids.is_none()
            {
                return Err("who: a clause names no principals, client_addresses, listeners or client_ids".into());
            }
            let mut names = |field: &str, value: Option<serde_json::Value>| {
                match value.map(TopicSelector::read).transpose().map_err(|e| format!("who: {field} {e}"))? {
                    None => Ok::<_, String>(None),
                    Some(SelectorReading::Topics(selector)) => Ok(Some(selector)),
                    Some(SelectorReading::Everything(reason)) => {
                        unreadable = Some(format!("who: {field} {reason}"));
                        Ok(None)
                    }
                }
            };
            let principals = names("principals", clause.principals)?;
            let client_ids = names("client_ids", clause.client_ids)?;
            let networks = clause.client_addresses
                .map(|list| list.iter().map(|n| Network::parse(n)).collect::<Result<Vec<_>, _>>())
                .transpose()?;
            let listeners = clause.listeners.map(|list| list.into_iter().collect());
            clauses.push(Clause { principals, networks, listeners, client_ids });
        }
        Ok(match unreadable {
            Some(reason) => Err(reason),
            None => Ok(WhoSelector { reads_principals: clauses.iter().any(|c| c.principals.is_some()), clauses }),
        })
    }

    pub fn admits(&self, from: &Requester<'_>) -> bool {
        // Built once per request, and only when a clause reads it.
        let identity = from.identity;
        let principal = (self.reads_principals && (identity.principal_known() || identity.plainly_anonymous()))
            .then(|| identity.principal());
        self.clauses.iter().any(|c| c.admits(principal.as_deref(), from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(value: serde_json::Value) -> WhoSelector {
        WhoSelector::read(value).unwrap().unwrap()
    }

    const APP: ClientId<'static> = ClientId::Bytes(b"app");

    fn peer(host: &str, listener: &str) -> Peer {
        Peer::new(Some(host), Some(listener.to_string()))
    }

    #[test]
    fn networks_contain_what_python_says_they_do() {
        let n = Network::parse("10.20.0.0/16").unwrap();
        assert!(n.contains("10.20.255.1".parse().unwrap()) && !n.contains("10.21.0.1".parse().unwrap()));
        assert!(!n.contains("::ffff:10.20.0.1".parse().unwrap()), "another family");
        let v6 = Network::parse("fd00:20::/32").unwrap();
        assert!(v6.contains("fd00:20:1::5".parse().unwrap()) && !v6.contains("fd00:21::".parse().unwrap()));
        assert!(Network::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(Network::parse("::/0").unwrap().contains("::1".parse().unwrap()));
        let one = Network::parse("10.0.0.7").unwrap();
        assert!(one.contains("10.0.0.7".parse().unwrap()) && !one.contains("10.0.0.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "::/129", "nope", "10.0.0.0/x", "10.0.0.0/"] {
            assert!(Network::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_mapped_ipv6_client_is_its_ipv4_address() {
        assert_eq!(Peer::new(Some("::ffff:10.20.0.9"), None).client_ip, Some("10.20.0.9".parse().unwrap()));
        assert_eq!(Peer::new(Some("fd00::1"), None).client_ip, Some("fd00::1".parse().unwrap()));
        assert_eq!(Peer::new(Some("not-an-address"), None).client_ip, None);
    }

    #[test]
    fn every_matcher_of_a_clause_must_admit_and_any_clause_will_do() {
        let s = selector(json!([
            {"client_addresses": ["10.20.0.0/16"], "listeners": ["127.0.0.1:19092"]},
            {"listeners": ["127.0.0.1:29092"]}]));
        let anonymous = Identity::default();
        let from = |p: &Peer| s.admits(&Requester { identity: &anonymous, peer: p, client_id: APP });
        assert!(from(&peer("10.20.3.4", "127.0.0.1:19092")));
        assert!(!from(&peer("10.21.3.4", "127.0.0.1:19092")), "the network does not admit it");
        assert!(!from(&peer("10.20.3.4", "127.0.0.1:19093")), "nor does the listener");
        assert!(from(&peer("192.168.0.1", "127.0.0.1:29092")), "the second clause");
    }

    #[test]
    fn what_the_module_cannot_tell_is_admitted() {
        let s = selector(json!([{"client_addresses": ["10.20.0.0/16"], "listeners": ["127.0.0.1:19092"]}]));
        let anonymous = Identity::default();
        let unknown = Peer::default();
        assert!(s.admits(&Requester { identity: &anonymous, peer: &unknown, client_id: APP }));
        let principals = selector(json!([{"principals": {"exact": ["User:alice"]}}]));
        let mut tls = Identity::default();
        tls.on_tls(None);
        assert!(principals.admits(&Requester { identity: &tls, peer: &unknown, client_id: APP }),
                "TLS without a principal the module mapped: the Python side decides");
    }

    #[test]
    fn a_plaintext_connection_without_sasl_is_anonymous() {
        let alice = selector(json!([{"principals": {"exact": ["User:alice"]}}]));
        let anonymous = selector(json!([{"principals": {"exact": ["User:ANONYMOUS"]}}]));
        let plain = Identity::default();
        let from = Requester { identity: &plain, peer: &Peer::default(), client_id: APP };
        assert!(!alice.admits(&from) && anonymous.admits(&from));
    }

    #[test]
    fn a_known_principal_is_matched_as_kafka_names_it() {
        let s = selector(json!([{"principals": {"exact": ["User:alice"], "prefix": ["User:acme-"],
                                                "regex": ["User:ops-[a-z]+"]}}]));
        let admits = |name: &str| {
            let mut identity = Identity::default();
            identity.on_tls(Some(name.to_string()));
            s.admits(&Requester { identity: &identity, peer: &Peer::default(), client_id: APP })
        };
        assert!(admits("User:alice") && admits("User:acme-1") && admits("User:ops-night"));
        assert!(!admits("User:bob") && !admits("User:ops-9") && !admits("User:alice2"));
        assert!(admits("User:\u{e9}t\u{e9}"), "a name the module does not match by pattern: handed off");
    }

    #[test]
    fn client_ids_are_matched_per_request_and_a_null_one_matches_none() {
        let s = selector(json!([{"client_ids": {"exact": ["billing"], "prefix": ["etl-"], "regex": ["ops-[0-9]+"]},
                                 "listeners": ["127.0.0.1:19092"]}]));
        let anonymous = Identity::default();
        let here = peer("10.0.0.1", "127.0.0.1:19092");
        let admits = |client_id| s.admits(&Requester { identity: &anonymous, peer: &here, client_id });
        for admitted in [&b"billing"[..], b"etl-7", b"ops-42"] {
            assert!(admits(ClientId::Bytes(admitted)), "{admitted:?}");
        }
        for refused in [&b"billing2"[..], b"etl", b"ops-x", b""] {
            assert!(!admits(ClientId::Bytes(refused)), "{refused:?}");
        }
        assert!(!admits(ClientId::Null), "the rules' client-id matcher wants a client id");
        assert!(admits(ClientId::Unknown), "an unreadable client id: the Python side decides");
        assert!(admits(ClientId::Bytes("caf\u{e9}".as_bytes())), "not ASCII: the Python side decides");
        let elsewhere = peer("10.0.0.1", "127.0.0.1:19093");
        assert!(!s.admits(&Requester { identity: &anonymous, peer: &elsewhere, client_id: ClientId::Bytes(b"billing") }),
                "every matcher of the clause must admit");
    }

    #[test]
    fn a_client_id_is_read_from_the_frame_as_its_head_found_it() {
        let frame = [0, 0, 0, 20, 0, 3, 0, 12, 0, 0, 0, 1, 0, 3, b'a', b'p', b'p'];
        assert_eq!(ClientId::read(ClientIdField::Bytes(3), &frame), ClientId::Bytes(b"app"));
        assert_eq!(ClientId::read(ClientIdField::Bytes(4), &frame), ClientId::Unknown, "past the bytes at hand");
        assert_eq!(ClientId::read(ClientIdField::Null, &frame), ClientId::Null);
        assert_eq!(ClientId::read(ClientIdField::Unreadable, &frame), ClientId::Unknown);
    }

    #[test]
    fn bad_selectors_say_what_is_wrong_and_unreadable_patterns_admit_everyone() {
        for (bad, says) in [
            (json!({}), "invalid type"),
            (json!([{}]), "names no principals"),
            (json!([{"client_addresses": ["10.0.0.0/40"]}]), "not an IP network"),
            (json!([{"listeners": "x"}]), "invalid type"),
            (json!([{"principals": {"names": []}}]), "unknown field"),
            (json!([{"groups": ["g"]}]), "unknown field"),
            (json!([{"client_ids": ["a"]}]), "client_ids"),
        ] {
            let err = WhoSelector::read(bad).unwrap_err();
            assert!(err.contains(says), "{err} (expected {says:?})");
        }
        let unreadable = WhoSelector::read(json!([{"principals": {"regex": ["("]}}])).unwrap().unwrap_err();
        assert!(unreadable.contains("does not compile"), "{unreadable}");
        let unreadable = WhoSelector::read(json!([{"client_ids": {"regex": ["("]}}])).unwrap().unwrap_err();
        assert!(unreadable.contains("client_ids") && unreadable.contains("does not compile"), "{unreadable}");
        let many = serde_json::Value::Array(vec![json!({"listeners": ["a:1"]}); MAX_CLAUSES + 1]);
        assert!(WhoSelector::read(many).unwrap().is_err());
    }
}
