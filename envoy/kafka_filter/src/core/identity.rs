//! Who is on a connection: the principal a broker attributes its requests to, learned
//! from the SASL exchange as it passes (SaslHandshake 17, SaslAuthenticate 36).
//!
//! The same rules as the Python side's `ext_proc/identity.py` (its docstring is the
//! reference), so the principal the module hands to the Python service with a frame
//! is the one the ext_proc path would have derived:
//!
//! - PLAIN: the authcid (`[authzid] NUL authcid NUL passwd`); the password is never
//!   copied out of the frame.
//! - SCRAM-SHA-256/512: `n=` of the client-first message (`=2C`/`=3D` unescaped);
//!   authenticated on the server-final message (`v=`). A delegation-token login
//!   (`tokenauth=true`) authenticates an owner only the broker knows: ANONYMOUS.
//! - OAUTHBEARER: the `sub` claim of a JWT bearer token, read WITHOUT verifying it
//!   (the broker verifies it and refuses the login if it is bad); a token that is not
//!   a JWT: ANONYMOUS.
//! - GSSAPI and other mechanisms: `User:unknown` once the broker accepts.
//!
//! A name read from the client's bytes is only a candidate until the broker answers
//! with error code 0; a failure leaves `User:ANONYMOUS`. Malformed SASL bytes never
//! fail the connection: the principal stays ANONYMOUS.
//!
//! TLS (terminated by Envoy on the gateway's listener, [`Identity::on_tls`]): the
//! security protocol is `SSL`, or `SASL_SSL` once a SaslHandshake passed; without it
//! `PLAINTEXT` / `SASL_PLAINTEXT`. With mutual TLS the client certificate names a
//! principal (`core::tls_principal`), which holds until a SASL exchange authenticates
//! another one, as on a broker's SASL_SSL listener.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::Decodable;

pub const SASL_HANDSHAKE: i16 = 17;
pub const SASL_AUTHENTICATE: i16 = 36;
pub const ANONYMOUS: &str = "User:ANONYMOUS";
const UNKNOWN_NAME: &str = "unknown";
/// Kafka's default `sasl.server.max.receive.size`: bigger auth bytes are not read.
pub const MAX_AUTH_BYTES: usize = 512 * 1024;

/// The SASL frames the tracker reads (their bytes are copied while they pass).
pub fn observes(api_key: i16) -> bool {
    api_key == SASL_HANDSHAKE || api_key == SASL_AUTHENTICATE
}

/// The JWT claim an OAUTHBEARER token's principal is unless configured otherwise (Kafka's
/// `sasl.oauthbearer.sub.claim.name` default).
pub const DEFAULT_OAUTH_CLAIM: &str = "sub";

#[derive(Debug, Default, Clone)]
pub struct Identity {
    /// The JWT claim naming an OAUTHBEARER principal (None: [`DEFAULT_OAUTH_CLAIM`]).
    oauth_claim: Option<Arc<str>>,
    mechanism: Option<String>,
    authenticated: bool,
    handshake_seen: bool,
    name: Option<String>,
    in_exchange: bool,
    steps: u32,
    candidate: Option<String>,
    candidate_opaque: bool,
    tls: bool,
    /// The client certificate's principal (`User:alice`), mutual TLS only.
    certificate_principal: Option<String>,
    /// Moves whenever what [`Identity::principal`] says may have changed.
    epoch: u64,
}

impl Identity {
    /// Reads OAUTHBEARER principals from `claim`, as the broker does.
    pub fn with_oauth_claim(claim: Arc<str>) -> Self {
        Identity { oauth_claim: Some(claim), ..Identity::default() }
    }

    /// The connection is TLS (Envoy terminated it); with mutual TLS, the principal its
    /// client certificate names.
    pub fn on_tls(&mut self, certificate_principal: Option<String>) {
        self.tls = true;
        self.certificate_principal = certificate_principal;
        self.epoch += 1;
    }

    /// Moves whenever the principal may have changed (readers of it cache by it).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Kafka's form (`User:alice`); until SASL authenticates a name, the certificate's
    /// principal, else `User:ANONYMOUS`.
    pub fn principal(&self) -> String {
        match (&self.name, self.authenticated) {
            (Some(name), true) => format!("User:{name}"),
            _ => self.certificate_principal.clone().unwrap_or_else(|| ANONYMOUS.to_string()),
        }
    }

    /// Authenticated (by SASL or a client certificate), and the gateway could read who
    /// (not ANONYMOUS, not unknown).
    pub fn principal_known(&self) -> bool {
        if self.authenticated {
            return self.name.as_deref().is_some_and(|n| n != UNKNOWN_NAME);
        }
        self.certificate_principal.is_some()
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// A plaintext connection that began no SASL exchange: its principal is
    /// `User:ANONYMOUS` for the broker and for the Python chain alike.
    pub fn plainly_anonymous(&self) -> bool {
        !self.handshake_seen && !self.tls
    }

    /// The principal to tell the Python chain: when the broker authenticated a name
    /// the gateway could read (or `User:unknown` for opaque mechanisms), else, without
    /// SASL authentication, the client certificate's; None leaves it to the Python
    /// side's own tracker (`User:ANONYMOUS`, or the certificate's after a token login).
    pub fn known_principal(&self) -> Option<String> {
        if self.authenticated {
            return self.name.is_some().then(|| self.principal());
        }
        self.certificate_principal.clone()
    }

    pub fn security_protocol(&self) -> &'static str {
        match (self.handshake_seen, self.tls) {
            (true, true) => "SASL_SSL",
            (true, false) => "SASL_PLAINTEXT",
            (false, true) => "SSL",
            (false, false) => "PLAINTEXT",
        }
    }

    /// A whole request frame (size prefix included) of SaslHandshake or SaslAuthenticate.
    pub fn observe_request(&mut self, api_key: i16, api_version: i16, frame: &[u8]) {
        self.epoch += 1;
        match api_key {
            SASL_HANDSHAKE => match decode_request::<SaslHandshakeRequest>(ApiKey::SaslHandshake, api_version, frame) {
                Some(request) => self.on_handshake(Some(request.mechanism.as_str())),
                None => self.on_handshake(None),
            },
            SASL_AUTHENTICATE => {
                if !self.in_exchange {
                    return;
                }
                self.steps += 1;
                if self.steps > 1 {
                    return; // SCRAM's client-final message, GSSAPI tokens, OAUTHBEARER's \x01
                }
                if frame.len() > MAX_AUTH_BYTES + 64 {
                    self.fail_candidate();
                    return;
                }
                match decode_request::<SaslAuthenticateRequest>(ApiKey::SaslAuthenticate, api_version, frame) {
                    Some(request) => self.on_auth_bytes(&request.auth_bytes),
                    None => self.fail_candidate(),
                }
            }
            _ => {}
        }
    }

    /// A whole response frame to a SaslHandshake or SaslAuthenticate request.
    pub fn observe_response(&mut self, api_key: i16, api_version: i16, frame: &[u8]) {
        self.epoch += 1;
        match api_key {
            SASL_HANDSHAKE => {
                let error = decode_response::<SaslHandshakeResponse>(ApiKey::SaslHandshake, api_version, frame)
                    .map_or(-1, |r| r.error_code);
                if error != 0 {
                    self.in_exchange = false;
                }
            }
            SASL_AUTHENTICATE => {
                if !self.in_exchange {
                    return;
                }
                match decode_response::<SaslAuthenticateResponse>(ApiKey::SaslAuthenticate, api_version, frame) {
                    Some(response) if response.error_code == 0 => self.on_accepted_step(&response.auth_bytes),
                    _ => self.end_exchange(false),
                }
            }
            _ => {}
        }
    }

    fn on_handshake(&mut self, mechanism: Option<&str>) {
        self.handshake_seen = true;
        self.mechanism = mechanism.map(str::to_ascii_uppercase);
        // A new handshake on an authenticated connection is KIP-368 re-authentication:
        // the current principal holds until the new exchange ends.
        self.in_exchange = true;
        self.steps = 0;
        self.candidate = None;
        self.candidate_opaque = false;
    }

    fn on_auth_bytes(&mut self, data: &[u8]) {
        let parsed = match self.mechanism.as_deref() {
            Some("PLAIN") => parse_plain(data).map(Candidate::Name),
            Some("SCRAM-SHA-256" | "SCRAM-SHA-512") => parse_scram_client_first(data)
                .map(|(user, token)| if token { Candidate::Opaque } else { Candidate::Name(user) }),
            Some("OAUTHBEARER") => parse_oauthbearer(data, self.oauth_claim.as_deref().unwrap_or(DEFAULT_OAUTH_CLAIM))
                .map(|s| s.map_or(Candidate::Opaque, Candidate::Name)),
            _ => Some(Candidate::Name(UNKNOWN_NAME.to_string())),
        };
        match parsed {
            Some(Candidate::Name(name)) => self.candidate = Some(name),
            Some(Candidate::Opaque) => self.candidate_opaque = true,
            None => self.fail_candidate(),
        }
    }

    fn fail_candidate(&mut self) {
        self.candidate = None;
        self.candidate_opaque = false;
    }

    fn on_accepted_step(&mut self, challenge: &[u8]) {
        match self.mechanism.as_deref() {
            Some("PLAIN") => self.end_exchange(true),
            Some("SCRAM-SHA-256" | "SCRAM-SHA-512") => {
                if challenge.starts_with(b"v=") {
                    self.end_exchange(true); // server-final: the broker verified the proof
                } else if challenge.starts_with(b"e=") {
                    self.end_exchange(false);
                } // else server-first: the exchange goes on
            }
            Some("OAUTHBEARER") => {
                if challenge.is_empty() {
                    self.end_exchange(true);
                } // else an RFC 7628 error challenge: the broker fails the next step
            }
            // GSSAPI and others: the last step is not recognisable from outside.
            _ => self.accept(),
        }
    }

    fn accept(&mut self) {
        self.authenticated = true;
        self.name = if self.candidate_opaque { None } else { self.candidate.clone() };
    }

    fn end_exchange(&mut self, success: bool) {
        self.in_exchange = false;
        if success {
            self.accept();
        } else {
            self.authenticated = false;
            self.name = None;
        }
        self.candidate = None;
        self.candidate_opaque = false;
        self.steps = 0;
    }
}

enum Candidate {
    Name(String),
    /// A token whose owner only the broker knows.
    Opaque,
}

fn decode_request<M: Decodable>(key: ApiKey, version: i16, frame: &[u8]) -> Option<M> {
    decode(key, version, frame, |buf| RequestHeader::decode(buf, key.request_header_version(version)).is_ok())
}

fn decode_response<M: Decodable>(key: ApiKey, version: i16, frame: &[u8]) -> Option<M> {
    decode(key, version, frame, |buf| ResponseHeader::decode(buf, key.response_header_version(version)).is_ok())
}

/// The body of a whole frame of a version kafka-protocol reads, after `header` read
/// its header.
fn decode<M: Decodable>(key: ApiKey, version: i16, frame: &[u8], header: impl FnOnce(&mut Bytes) -> bool) -> Option<M> {
    let range = key.valid_versions();
    if frame.len() < 4 || version < range.min || version > range.max {
        return None;
    }
    let mut buf = Bytes::copy_from_slice(&frame[4..]);
    if !header(&mut buf) {
        return None;
    }
    M::decode(&mut buf, version).ok()
}

/// PLAIN's authcid (RFC 4616); the password is neither copied nor decoded.
pub fn parse_plain(data: &[u8]) -> Option<String> {
    let first = data.iter().position(|&b| b == 0)?;
    let second = first + 1 + data[first + 1..].iter().position(|&b| b == 0)?;
    let authcid = std::str::from_utf8(&data[first + 1..second]).ok()?;
    if authcid.is_empty() {
        return None;
    }
    if first > 0 && std::str::from_utf8(&data[..first]).ok()? != authcid {
        return None; // Kafka's PlainSaslServer refuses an authzid other than the authcid
    }
    Some(authcid.to_string())
}

/// RFC 5802 saslname: `=2C` is `,` and `=3D` is `=`; any other `=` (or a `,`) is bad.
pub fn unescape_saslname(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        match c {
            '=' if rest.starts_with("=2C") => { out.push(','); rest = &rest[3..]; }
            '=' if rest.starts_with("=3D") => { out.push('='); rest = &rest[3..]; }
            '=' | ',' => return None,
            _ => { out.push(c); rest = &rest[c.len_utf8()..]; }
        }
    }
    Some(out)
}

/// (username, token_authenticated) of a SCRAM client-first message.
pub fn parse_scram_client_first(data: &[u8]) -> Option<(String, bool)> {
    let text = std::str::from_utf8(data).ok()?;
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() < 4 {
        return None;
    }
    let (flag, authzid, mut bare) = (parts[0], parts[1], &parts[2..]);
    if !(flag == "n" || flag == "y" || flag.starts_with("p=")) {
        return None;
    }
    if !authzid.is_empty() && !authzid.starts_with("a=") {
        return None;
    }
    if bare.first().is_some_and(|p| p.starts_with("m=")) {
        bare = &bare[1..];
    }
    if bare.len() < 2 || !bare[0].starts_with("n=") || !bare[1].starts_with("r=") {
        return None;
    }
    let user = unescape_saslname(&bare[0][2..])?;
    if user.is_empty() || bare[1].len() <= 2 {
        return None;
    }
    if !authzid.is_empty() && unescape_saslname(&authzid[2..])? != user {
        return None;
    }
    let mut token = false;
    for item in &bare[2..] {
        let (key, value) = item.split_once('=')?;
        if key.is_empty() {
            return None;
        }
        if key == "tokenauth" {
            token = value.eq_ignore_ascii_case("true");
        }
    }
    Some((user, token))
}

/// The payload of a JWS compact token, unverified; None when it is not one.
pub fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let parts: Vec<&str> = token.split('.').collect();
    let jwt_part = |p: &str| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if parts.len() != 3 || !parts.iter().all(|p| jwt_part(p)) {
        return None;
    }
    let decode = |p: &str| -> Option<serde_json::Value> {
        let raw = URL_SAFE_NO_PAD.decode(p.trim_end_matches('=')).ok()?;
        serde_json::from_slice(&raw).ok()
    };
    let header = decode(parts[0])?;
    let serde_json::Value::Object(payload) = decode(parts[1])? else { return None };
    header.is_object().then_some(payload)
}

/// The `sub` claim of an OAUTHBEARER client initial response (RFC 7628): Some(None)
/// when the token is not a JWT (opaque), None when the bytes are malformed.
pub fn parse_oauthbearer(data: &[u8], claim: &str) -> Option<Option<String>> {
    let text = std::str::from_utf8(data).ok()?;
    let (gs2, rest) = text.split_once('\x01')?;
    let gs2: Vec<&str> = gs2.split(',').collect();
    if gs2.len() != 3 || !(gs2[0] == "n" || gs2[0] == "y") || !gs2[2].is_empty() {
        return None;
    }
    if !gs2[1].is_empty() && !gs2[1].starts_with("a=") {
        return None;
    }
    let body = rest.strip_suffix('\x01')?;
    let mut auth = None;
    for item in body.split('\x01').filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('=')?;
        if key.is_empty() {
            return None;
        }
        if key == "auth" {
            auth = Some(value);
        }
    }
    let (scheme, token) = auth?.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    let scheme_ok = !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let token_ok = !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !scheme_ok || !token_ok || !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let Some(claims) = jwt_claims(token) else { return Some(None) };
    let subject = claims.get(claim)?.as_str().filter(|s| !s.is_empty())?.to_string();
    let authzid = gs2[1].strip_prefix("a=").unwrap_or("");
    if !authzid.is_empty() && authzid != subject {
        return None;
    }
    Some(Some(subject))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn request_frame<M: Encodable>(key: ApiKey, version: i16, message: &M) -> Vec<u8> {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_client_id(Some(StrBytes::from_static_str("t")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        message.encode(&mut buf, version).unwrap();
        [(buf.len() as i32).to_be_bytes().to_vec(), buf.to_vec()].concat()
    }

    fn response_frame<M: Encodable>(key: ApiKey, version: i16, message: &M) -> Vec<u8> {
        let mut buf = BytesMut::new();
        ResponseHeader::default().encode(&mut buf, key.response_header_version(version)).unwrap();
        message.encode(&mut buf, version).unwrap();
        [(buf.len() as i32).to_be_bytes().to_vec(), buf.to_vec()].concat()
    }

    /// Runs one exchange: handshake, then (client bytes, server bytes, error) steps.
    fn exchange(mechanism: &'static str, steps: &[(&[u8], &[u8], i16)]) -> Identity {
        exchange_as(Identity::default(), mechanism, steps)
    }

    fn exchange_as(mut id: Identity, mechanism: &'static str, steps: &[(&[u8], &[u8], i16)]) -> Identity {
        let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
        id.observe_request(SASL_HANDSHAKE, 1, &request_frame(ApiKey::SaslHandshake, 1, &hs));
        id.observe_response(SASL_HANDSHAKE, 1, &response_frame(ApiKey::SaslHandshake, 1, &SaslHandshakeResponse::default()));
        for (client, server, error) in steps {
            let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(client));
            id.observe_request(SASL_AUTHENTICATE, 2, &request_frame(ApiKey::SaslAuthenticate, 2, &req));
            let resp = SaslAuthenticateResponse::default()
                .with_error_code(*error)
                .with_auth_bytes(Bytes::copy_from_slice(server));
            id.observe_response(SASL_AUTHENTICATE, 2, &response_frame(ApiKey::SaslAuthenticate, 2, &resp));
        }
        id
    }

    fn jwt(payload: &str) -> String {
        format!("{}.{}.sig", URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#), URL_SAFE_NO_PAD.encode(payload))
    }

    #[test]
    fn plain_is_the_authcid_once_the_broker_accepts() {
        let id = exchange("PLAIN", &[(b"\0alice\0secret", b"", 0)]);
        assert_eq!(id.principal(), "User:alice");
        assert!(id.principal_known());
        assert_eq!(id.security_protocol(), "SASL_PLAINTEXT");
        let refused = exchange("PLAIN", &[(b"\0alice\0wrong", b"", 58)]);
        assert_eq!(refused.principal(), ANONYMOUS);
        assert_eq!(Identity::default().security_protocol(), "PLAINTEXT");
        assert_eq!(exchange("PLAIN", &[(b"bob\0alice\0pw", b"", 0)]).principal(), ANONYMOUS, "authzid differs");
    }

    #[test]
    fn scram_is_n_of_client_first_after_the_server_final_message() {
        let first: &[u8] = b"n,,n=al=2Cice,r=abc";
        let mid = exchange("SCRAM-SHA-256", &[(first, b"r=abcdef,s=salt,i=4096", 0)]);
        assert_eq!(mid.principal(), ANONYMOUS, "not before the server-final message");
        let id = exchange("SCRAM-SHA-512", &[(first, b"r=abcdef,s=salt,i=4096", 0), (b"c=biws,r=abcdef,p=proof", b"v=ok", 0)]);
        assert_eq!(id.principal(), "User:al,ice");
        let token = exchange("SCRAM-SHA-256", &[(b"n,,n=tok,r=abc,tokenauth=true", b"r=x", 0), (b"c=,p=", b"v=ok", 0)]);
        assert!(token.authenticated() && !token.principal_known());
        assert_eq!(token.principal(), ANONYMOUS);
        assert_eq!(token.known_principal(), None, "the token's owner is the broker's to know");
        assert_eq!(id.known_principal().as_deref(), Some("User:al,ice"));
    }

    #[test]
    fn oauthbearer_is_the_jwt_subject_and_opaque_tokens_are_anonymous() {
        let bytes = format!("n,,\x01auth=Bearer {}\x01\x01", jwt(r#"{"sub":"svc-orders"}"#));
        assert_eq!(exchange("OAUTHBEARER", &[(bytes.as_bytes(), b"", 0)]).principal(), "User:svc-orders");
        let opaque = exchange("OAUTHBEARER", &[(b"n,,\x01auth=Bearer abc123\x01\x01", b"", 0)]);
        assert!(opaque.authenticated());
        assert_eq!(opaque.principal(), ANONYMOUS);
    }

    #[test]
    fn oauthbearer_reads_the_claim_the_broker_names_the_principal_with() {
        // A broker reading another claim (sasl.oauthbearer.sub.claim.name) acted as alice
        // while the rules judged bob, whose token's sub it was.
        let bytes = format!("n,,\x01auth=Bearer {}\x01\x01", jwt(r#"{"sub":"bob","client_id":"alice"}"#));
        let steps: &[(&[u8], &[u8], i16)] = &[(bytes.as_bytes(), b"", 0)];
        assert_eq!(exchange("OAUTHBEARER", steps).principal(), "User:bob");
        assert_eq!(exchange_as(Identity::with_oauth_claim("client_id".into()), "OAUTHBEARER", steps).principal(), "User:alice");
        let missing = exchange_as(Identity::with_oauth_claim("azp".into()), "OAUTHBEARER", steps);
        assert!(!missing.authenticated() || missing.principal() != "User:bob");
    }

    #[test]
    fn other_mechanisms_are_unknown_and_malformed_bytes_anonymous() {
        let gssapi = exchange("GSSAPI", &[(b"\x60\x82token", b"\x60", 0)]);
        assert_eq!(gssapi.principal(), "User:unknown");
        assert_eq!(gssapi.known_principal().as_deref(), Some("User:unknown"));
        assert!(!gssapi.principal_known());
        let bad = exchange("PLAIN", &[(b"no separators", b"", 0)]);
        assert!(bad.authenticated());
        assert_eq!(bad.principal(), ANONYMOUS);
        let mut id = Identity::default();
        id.observe_request(SASL_HANDSHAKE, 1, &[0, 0, 0, 1, 0]);
        id.observe_request(SASL_AUTHENTICATE, 2, b"\0\0\0\x02xx");
        assert_eq!(id.principal(), ANONYMOUS);
    }

    #[test]
    fn tls_is_ssl_and_the_certificate_principal_holds_until_sasl_names_another() {
        let mut id = Identity::default();
        id.on_tls(Some("User:alice".into()));
        assert_eq!((id.principal().as_str(), id.principal_known(), id.security_protocol()), ("User:alice", true, "SSL"));
        assert_eq!(id.known_principal().as_deref(), Some("User:alice"));
        let mut sasl = exchange("PLAIN", &[(b"\0bob\0pw", b"", 0)]);
        sasl.on_tls(Some("User:alice".into()));
        assert_eq!((sasl.principal().as_str(), sasl.security_protocol()), ("User:bob", "SASL_SSL"));
        let mut refused = exchange("PLAIN", &[(b"\0bob\0wrong", b"", 58)]);
        refused.on_tls(Some("User:alice".into()));
        assert_eq!(refused.principal(), "User:alice", "a failed login leaves the certificate's");
        let mut server_only = Identity::default();
        server_only.on_tls(None);
        assert_eq!((server_only.principal().as_str(), server_only.security_protocol()), (ANONYMOUS, "SSL"));
        assert_eq!(server_only.known_principal(), None);
    }

    #[test]
    fn parsers_follow_identity_py() {
        assert_eq!(unescape_saslname("a=3Db=2Cc"), Some("a=b,c".into()));
        assert_eq!(unescape_saslname("a=4"), None);
        assert_eq!(parse_scram_client_first(b"n,a=bob,n=alice,r=x"), None, "authzid differs");
        assert_eq!(parse_scram_client_first(b"n,,m=ext,n=u,r=nonce"), Some(("u".into(), false)));
        assert_eq!(parse_oauthbearer(b"n,,\x01auth=Basic abc\x01\x01", DEFAULT_OAUTH_CLAIM), None);
        assert_eq!(parse_oauthbearer(format!("n,,\x01auth=Bearer {}\x01\x01", jwt("{}")).as_bytes(), DEFAULT_OAUTH_CLAIM), None, "no sub");
    }
}
