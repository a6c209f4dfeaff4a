//! The event hooks Envoy calls: a thin adapter from Envoy's buffers to the sans-IO core.
//!
//! Every hook runs inside [`guard`]: a panic (or a protocol error) closes that one
//! connection and is counted; nothing unwinds into Envoy. Hooks of one connection run
//! on one worker thread; configurations are shared by workers and read-only (routes are
//! behind the table's lock, see `config`).
//!
//! Buffers: a chunk whose output is exactly its input (the common pass-through case)
//! is left in Envoy's buffer (`Continue`, zero copy). Otherwise the buffer is drained
//! and the output injected after this filter: the ABI cannot forward part of a buffer,
//! so the bytes of that callback are copied once. Bytes the core keeps (a partial head,
//! a frame held to be examined or handed off, what waits behind a hand-off) are copied
//! into it: Envoy owns its buffers once the hook returns.
//!
//! TLS: at the client's first bytes (the handshake is done by then) the filter asks
//! Envoy whether the connection is TLS and, on a mutual-TLS listener (the config has
//! principal mapping rules), reads the client certificate's subject and URI SANs and
//! maps them to the connection's principal (`core::tls_principal`); a certificate no
//! rule maps closes the connection, as a broker refuses it.
//!
//! Hand-offs: frames the interest table selects go to the hand-off thread
//! ([`crate::handoff`]); on the first one the filter makes an Envoy scheduler and a
//! [`Link`]. Answers come back through `on_network_filter_scheduled`, on the worker
//! thread, where they are applied to the session and what may leave is injected (a
//! client's or broker's end of stream waits with them). On destroy the link is closed
//! and the scheduler deleted, under the link's lock, so the hand-off thread never
//! commits to a deleted scheduler; later answers are dropped. Bytes in flight are
//! bounded per connection (beyond it the filter stops reading from the client until
//! half of them are answered) and per process (beyond it a hand-off is not made and
//! fails at once: fail-closed or fail-open as the table says).

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use kafka_protocol::messages::ApiKey;

use crate::abi::{self, Callbacks, ConfigEnvoyPtr, ConfigModulePtr, EnvoyBuffer, FilterEnvoyPtr, FilterModulePtr, ModuleBuffer, SchedulerPtr};
use crate::config::{FilterConfig, TableSlot};
use crate::core::handoff::{reading_paused, Failure, ReadBound, MAX_HELD_PER_CONNECTION, MAX_PENDING_PER_CONNECTION};
use crate::core::head::RequestHead;
use crate::core::identity::Identity;
use crate::core::interest::{Interest, Want};
use crate::core::rewrite::{Endpoint, RouteView};
use crate::core::meter::Meter;
use crate::core::tls_principal::certificate_name;
use crate::core::stats::{ApiCounter, API_COUNTERS, COUNTERS, OTHER_API};
use crate::core::{Disposition, Output, Peer, ProtocolError, RequestPolicy, Requester, Resolution, Session};
use crate::handoff::{self, proto, Connection, Link, Outgoing, Wake};
use crate::metrics::ConnectionCounters;

/// Bytes held by all connections of the process.
static HELD_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes handed off, or waiting behind hand-offs, in all connections of the process.
static HANDOFF_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Module-level failures, counted per configuration.
#[derive(Debug, Clone, Copy)]
enum Fault {
    ProtocolErrors = 0,
    Panics = 1,
    HeldLimit = 2,
    /// A client certificate no principal mapping rule applies to (a broker refuses it).
    CertificateRefused = 3,
}

const FAULT_NAMES: [&str; 4] = ["protocol_errors", "panics", "held_bytes_limit", "certificate_refused"];

/// Filter-level counters the core does not keep.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// Answers that came back after their connection closed (dropped).
    LateAnswers = 0,
    /// Times a connection stopped reading from its client (hand-off bytes bound).
    ReadPaused = 1,
    /// Requests a throttle held back when their client ended its connection: dropped.
    ThrottledDropped = 2,
}

const EVENT_NAMES: [&str; 3] = ["handoff_late_answers", "handoff_read_paused", "handoff_throttled_dropped"];

/// Envoy counter ids of one configuration.
#[derive(Debug, Default)]
struct CounterIds {
    api: Vec<[Option<usize>; 3]>,
    counters: Vec<Option<usize>>,
    faults: [Option<usize>; 4],
    events: [Option<usize>; 3],
}

pub struct Config {
    settings: FilterConfig,
    ids: CounterIds,
}

type Policy = Box<dyn RequestPolicy + Send>;

/// Hands off what the current interest table of the filter's table wants.
struct InterestPolicy {
    table: TableSlot,
}

impl RequestPolicy for InterestPolicy {
    fn decide(&mut self, head: &RequestHead, from: &Requester<'_>) -> Disposition {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        // The failure mode only matters for what is handed off: most requests pass.
        let fail_open = || table.interest.fails_open(head.api_key, head.api_version);
        match table.interest.want_from(head.api_key, head.api_version, from) {
            Want::No => Disposition::Forward,
            Want::All => Disposition::HandOff { fail_open: fail_open() },
            Want::Topics(selector, vouching) => Disposition::Select { fail_open: fail_open(), selector, vouching },
            Want::Checked(selector, checks) => Disposition::Checked { fail_open: fail_open(), selector, checks },
        }
    }

    fn fails_open_for(&mut self, api_key: i16, api_version: i16, frame: &[u8]) -> bool {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.interest.fails_open_for(api_key, api_version, frame)
    }
}

/// Envoy's scheduler of one connection: commits from the hand-off thread, deleted when
/// the link drops it (on the worker thread, in `Link::close`).
struct Scheduler(SchedulerPtr);

// SAFETY: Envoy's scheduler commit is the one call that is safe off the worker thread;
// the pointer is only deleted once, by Drop, under the link's lock.
unsafe impl Send for Scheduler {}

impl Wake for Scheduler {
    fn wake(&self) {
        if let Some(cb) = Callbacks::get() {
            // SAFETY: a live scheduler (the link drops it before the filter goes).
            unsafe { (cb.scheduler_commit)(self.0, 0) };
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if let Some(cb) = Callbacks::get() {
            // SAFETY: made by scheduler_new, deleted once.
            unsafe { (cb.scheduler_delete)(self.0) };
        }
    }
}

/// What the filter knows about its connection for the Python service (the stream's
/// initial metadata, as Envoy's ext_proc filter sends it on the ext_proc path).
#[derive(Debug, Default)]
struct ConnectionFacts {
    client: Option<String>,
    local_port: Option<i32>,
    connection_id: u64,
    /// Read at the client's first bytes (the TLS handshake is done by then).
    tls_known: bool,
    tls: bool,
    /// Mutual TLS: the client certificate's subject (RFC 2253) and URI SANs.
    peer_subject: Option<String>,
    peer_uri_sans: Vec<String>,
}

/// The hand-off state of a connection, made on its first hand-off.
struct HandOffs {
    link: Arc<Link>,
    connection: Connection,
}

pub struct Filter {
    /// Handles on this connection's labelled series (with the configuration's exporter).
    counters: Option<ConnectionCounters>,
    config: Arc<Config>,
    session: Session<Policy>,
    own_listener: Option<Endpoint>,
    facts: ConnectionFacts,
    handoffs: Option<HandOffs>,
    /// The client's (read) or broker's (write) end of stream, held until what waits
    /// behind hand-offs in that direction has left.
    read_end: bool,
    write_end: bool,
    read_paused: bool,
    /// The session left bytes of the client's in Envoy's buffer (past the hand-off
    /// window): Envoy hands them over again when reading resumes.
    left_unread: bool,
    closed: bool,
    held: usize,
    handoff_held: usize,
    chunks: Vec<EnvoyBuffer>,
    outputs: Vec<Output>,
    scratch: Vec<u8>,
}

impl Drop for Filter {
    fn drop(&mut self) {
        if let Some(h) = &self.handoffs {
            h.link.close();
        }
        HELD_BYTES.fetch_sub(self.held, Ordering::Relaxed);
        HANDOFF_BYTES.fetch_sub(self.handoff_held, Ordering::Relaxed);
    }
}

fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn define_counters(envoy: ConfigEnvoyPtr) -> CounterIds {
    let Some(cb) = Callbacks::get() else { return CounterIds::default() };
    let define = |name: String| -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: `envoy` is the config Envoy handed to config_new; Envoy copies the name.
        let result = unsafe { (cb.define_counter)(envoy, ModuleBuffer::from_slice(name.as_bytes()), &mut id) };
        (result == abi::METRICS_SUCCESS).then_some(id)
    };
    let mut ids = CounterIds { api: vec![[None; 3]; OTHER_API + 1], ..Default::default() };
    let mut apis: Vec<(usize, String)> = ApiKey::iter().map(|k| (k as usize, snake(&format!("{k:?}")))).collect();
    apis.push((OTHER_API, "other".to_string()));
    for (slot, name) in apis {
        for counter in API_COUNTERS {
            let kind = match counter {
                ApiCounter::Requests => "requests",
                ApiCounter::RequestBytes => "request_bytes",
                ApiCounter::ResponseBytes => "response_bytes",
            };
            ids.api[slot][counter as usize] = define(format!("keg_kafka.api.{name}.{kind}"));
        }
    }
    ids.counters = COUNTERS.iter().map(|c| define(format!("keg_kafka.{}", snake(&format!("{c:?}"))))).collect();
    for (i, name) in FAULT_NAMES.iter().enumerate() {
        ids.faults[i] = define(format!("keg_kafka.{name}"));
    }
    for (i, name) in EVENT_NAMES.iter().enumerate() {
        ids.events[i] = define(format!("keg_kafka.{name}"));
    }
    ids
}

// -- module --------------------------------------------------------------------------

/// Resolves Envoy's callbacks; a host without them (another Envoy version) refuses the
/// module here instead of crashing later.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    let resolved = catch_unwind(Callbacks::resolve);
    match resolved {
        Ok(Ok(callbacks)) => {
            Callbacks::install(callbacks);
            abi::ABI_VERSION.as_ptr()
        }
        Ok(Err(missing)) => {
            eprintln!("keg_kafka_filter: this Envoy lacks {missing:?}: built for Envoy {} (ABI {:?})",
                      abi::ENVOY_VERSION, abi::ABI_VERSION);
            std::ptr::null()
        }
        Err(_) => std::ptr::null(),
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_new(
    config_envoy: ConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ConfigModulePtr {
    let made = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Envoy guarantees the config bytes for the duration of this call.
        let json = unsafe { config.as_slice() };
        match FilterConfig::load(json) {
            Ok(settings) => {
                let ids = define_counters(config_envoy);
                let interest = settings.current_interest();
                abi::log(abi::LOG_INFO, &format!(
                    "keg_kafka_filter: table {:?}: {} routes, interest version {:?}{}",
                    settings.route_table, settings.current_routes().gateway.len(), interest.version,
                    if interest.wants_any() { format!(", hand-offs to {}", interest.endpoints.join(",")) } else { String::new() }));
                for warning in interest.warnings.iter().chain(&settings.warnings) {
                    abi::log(abi::LOG_WARN, &format!("keg_kafka_filter: {warning}"));
                }
                Arc::into_raw(Arc::new(Config { settings, ids })).cast::<c_void>()
            }
            Err(err) => {
                abi::log(abi::LOG_ERROR, &format!("keg_kafka_filter: {err}"));
                std::ptr::null()
            }
        }
    }));
    made.unwrap_or(std::ptr::null())
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_destroy(config: ConfigModulePtr) {
    if !config.is_null() {
        // SAFETY: made by Arc::into_raw in config_new; Envoy destroys it once.
        let _ = catch_unwind(|| drop(unsafe { Arc::from_raw(config.cast::<Config>()) }));
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new(
    config: ConfigModulePtr,
    _filter_envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    if config.is_null() {
        return std::ptr::null();
    }
    let made = catch_unwind(|| {
        // SAFETY: the config outlives this call; we take our own reference to it.
        let config = unsafe {
            Arc::increment_strong_count(config.cast::<Config>());
            Arc::from_raw(config.cast::<Config>())
        };
        let policy = InterestPolicy { table: config.settings.table.clone() };
        let filter = Filter::new(config, Box::new(policy));
        Box::into_raw(Box::new(filter)).cast::<c_void>().cast_const()
    });
    made.unwrap_or(std::ptr::null())
}

impl Filter {
    fn new(config: Arc<Config>, policy: Policy) -> Filter {
        let limits = config.settings.limits;
        let mut session = Session::with_policy(limits, policy);
        session.identity = Identity::with_oauth_claim(Arc::clone(&config.settings.oauth_principal_claim));
        session.meter = config.settings.metrics.as_ref().map(|exporter| Meter::new(exporter.config().topics));
        let counters = config.settings.metrics.clone().map(ConnectionCounters::new);
        Filter {
            counters,
            config,
            session,
            own_listener: None,
            facts: ConnectionFacts::default(),
            handoffs: None,
            read_end: false,
            write_end: false,
            read_paused: false,
            left_unread: false,
            closed: false,
            held: 0,
            handoff_held: 0,
            chunks: Vec::new(),
            outputs: Vec::new(),
            scratch: Vec::new(),
        }
    }
}

/// # Safety
/// `module` must be a pointer made by `envoy_dynamic_module_on_network_filter_new`.
unsafe fn filter<'a>(module: FilterModulePtr) -> Option<&'a mut Filter> {
    (module as *mut Filter).as_mut()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_destroy(module: FilterModulePtr) {
    if module.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: made by Box::into_raw in filter_new; Envoy destroys it once. Its Drop
        // closes the link (answers still to come are dropped) and deletes the scheduler.
        drop(unsafe { Box::from_raw(module as *mut Filter) });
    });
}

/// Runs one hook for one connection: errors and panics close it, never Envoy.
fn guard(envoy: FilterEnvoyPtr, module: FilterModulePtr, hook: impl FnOnce(&mut Filter, &Callbacks) -> Result<u32, ProtocolError>) -> u32 {
    // SAFETY: Envoy passes the pointer filter_new returned, alive until destroy.
    let Some(filter) = (unsafe { filter(module) }) else { return abi::STATUS_STOP_ITERATION };
    let Some(cb) = Callbacks::get() else { return abi::STATUS_STOP_ITERATION };
    if filter.closed {
        return abi::STATUS_STOP_ITERATION;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let status = hook(filter, cb);
        filter.flush_stats(envoy, cb);
        status
    }));
    let failure = match outcome {
        Ok(Ok(status)) => match filter.account_held() {
            Ok(()) => {
                filter.flow_control(envoy, cb);
                return status;
            }
            Err(()) => Fault::HeldLimit,
        },
        Ok(Err(err)) => {
            abi::log(abi::LOG_WARN, &format!("keg_kafka_filter: closing the connection: {err}"));
            match err {
                ProtocolError::Refused(_) => Fault::CertificateRefused,
                _ => Fault::ProtocolErrors,
            }
        }
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".to_string());
            abi::log(abi::LOG_ERROR, &format!("keg_kafka_filter: panic, closing the connection: {what}"));
            Fault::Panics
        }
    };
    filter.closed = true;
    // Never touch the session again: after a panic its state is unknown.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(id) = filter.config.ids.faults[failure as usize] {
            // SAFETY: a live filter's Envoy pointer and a counter id of its config.
            unsafe { (cb.increment_counter)(envoy, id, 1) };
        }
        filter.close_now(envoy, cb);
    }));
    abi::STATUS_STOP_ITERATION
}

impl Filter {
    fn flush_stats(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) {
        let ids = &self.config.ids;
        self.session.stats.drain(
            |slot, counter, value| {
                if let Some(id) = ids.api.get(slot).and_then(|c| c[counter as usize]) {
                    // SAFETY: live filter, id defined on its config.
                    unsafe { (cb.increment_counter)(envoy, id, value) };
                }
            },
            |counter, value| {
                if let Some(Some(id)) = ids.counters.get(counter as usize) {
                    // SAFETY: as above.
                    unsafe { (cb.increment_counter)(envoy, *id, value) };
                }
            },
        );
        if let (Some(meter), Some(counters)) = (&mut self.session.meter, &mut self.counters) {
            if !meter.is_empty() {
                meter.drain(counters);
            }
        }
    }

    fn count(&self, envoy: FilterEnvoyPtr, cb: &Callbacks, event: Event, value: u64) {
        if let Some(id) = self.config.ids.events[event as usize] {
            // SAFETY: live filter, id defined on its config.
            unsafe { (cb.increment_counter)(envoy, id, value) };
        }
    }

    /// Keeps the process-wide count of hand-off bytes and pauses reading from the
    /// client while this connection has more than its bound in flight, in bytes or in
    /// frames (resumes at half: `core::handoff::reading_paused`).
    /// Only bytes that answers release count for the pause: a frame still being read
    /// (larger than the bound, say) completes only by reading on, and pausing then
    /// would stall the connection for good. That frame is bounded by the maximum frame
    /// size and the process-wide held-bytes budget instead.
    fn flow_control(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) {
        let now = self.session.handoff_bytes();
        if now > self.handoff_held {
            HANDOFF_BYTES.fetch_add(now - self.handoff_held, Ordering::Relaxed);
        } else {
            HANDOFF_BYTES.fetch_sub(self.handoff_held - now, Ordering::Relaxed);
        }
        self.handoff_held = now;
        let Some(bound) = self.read_bound() else { return };
        let awaiting = self.session.handoff_bytes_awaiting_answers();
        let paused = reading_paused(self.read_paused, awaiting, self.session.pending_handoffs(),
                                    bound.max_bytes, bound.max_frames);
        if paused && !self.read_paused {
            self.read_paused = true;
            self.count(envoy, cb, Event::ReadPaused, 1);
            // SAFETY: a live filter on its worker thread.
            unsafe { (cb.read_disable)(envoy, true) };
        } else if !paused && self.read_paused {
            self.read_paused = false;
            // SAFETY: as above. Envoy then reads again, bytes it holds first.
            unsafe { (cb.read_disable)(envoy, false) };
        } else if !paused && self.left_unread {
            // Bytes were left, yet reading goes on (the hand-offs failed at once, say):
            // a pause and resume makes Envoy hand them over again, as no new byte may come.
            // SAFETY: as above.
            unsafe {
                (cb.read_disable)(envoy, true);
                (cb.read_disable)(envoy, false);
            }
        }
        self.left_unread = false;
    }

    /// What may await answers before the filter stops reading from its client (None:
    /// the connection is closed). The session stops taking
    /// requests at the same bound, so bytes it leaves in Envoy's buffer always have
    /// reading stopped, and come again when it resumes.
    fn read_bound(&self) -> Option<ReadBound> {
        if self.closed {
            return None;
        }
        // Before the first hand-off there is no link yet: a new connection's first read
        // is bounded too (it held all 20,000 requests a client had sent at once).
        let throttled = self.handoffs.as_ref().is_some_and(|h| h.link.throttled() > 0);
        Some(ReadBound {
            max_bytes: self.config.settings.current_interest().max_bytes_per_connection,
            max_frames: if throttled { MAX_HELD_PER_CONNECTION } else { MAX_PENDING_PER_CONNECTION },
        })
    }

    /// The hand-off state, made on the first hand-off: a scheduler, a link and the
    /// connection's task on the hand-off thread. None when any of them cannot be had.
    fn handoff_state(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> Option<&HandOffs> {
        if self.handoffs.is_none() {
            let runtime = match handoff::Runtime::get() {
                Ok(runtime) => runtime,
                Err(err) => {
                    abi::log(abi::LOG_ERROR, &format!("keg_kafka_filter: {err}"));
                    return None;
                }
            };
            // SAFETY: a live filter inside one of its hooks, on its worker thread.
            let scheduler = unsafe { (cb.scheduler_new)(envoy) };
            if scheduler.is_null() {
                return None;
            }
            let link = Link::new(Box::new(Scheduler(scheduler)));
            let table = self.config.settings.table.clone();
            let current: handoff::Current = Arc::new(move || table.read().unwrap_or_else(|e| e.into_inner()).interest.clone());
            let hash = self.facts.connection_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17;
            let connection = runtime.connect(link.clone(), self.stream_metadata(), hash, current);
            self.handoffs = Some(HandOffs { link, connection });
        }
        self.handoffs.as_ref()
    }

    /// What TLS tells about the client, read once, at its first bytes (after the
    /// handshake: the certificate is known). With mutual TLS the certificate names the
    /// principal; one no mapping rule applies to refuses the client, as a broker would.
    fn learn_tls(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> Result<(), ProtocolError> {
        self.facts.tls_known = true;
        // SAFETY: a live filter inside one of its hooks.
        if !unsafe { (cb.is_ssl)(envoy) } {
            return Ok(());
        }
        self.facts.tls = true;
        let mut principal = None;
        if let Some(mapping) = self.config.settings.certificates.clone() {
            self.facts.peer_subject = ssl_subject(envoy, cb);
            self.facts.peer_uri_sans = ssl_uri_sans(envoy, cb);
            let name = certificate_name(self.facts.peer_subject.as_deref(), &self.facts.peer_uri_sans, &mapping.from);
            if let Some(name) = name {
                principal = Some(mapping.mapper.principal(&name).map_err(ProtocolError::Refused)?);
            }
        }
        self.session.identity.on_tls(principal);
        Ok(())
    }

    /// The stream's initial metadata: what Envoy's ext_proc filter sends on that path.
    fn stream_metadata(&self) -> Vec<(String, String)> {
        let routes = self.view();
        let mut metadata = vec![
            (CONNECTION_ID.to_string(), self.facts.connection_id.to_string()),
            (MODE.to_string(), "frames".to_string()),
            (DEFER.to_string(), "1".to_string()),
        ];
        if let Some(client) = &self.facts.client {
            metadata.push((CLIENT_ADDRESS.to_string(), client.clone()));
        }
        if let Some(listener) = &self.session.peer.listener {
            // The name rules match listeners by (core::who reads the same).
            metadata.push((GATEWAY_ADDRESS.to_string(), listener.clone()));
        }
        let port = self.facts.local_port;
        if let Some((node, _)) = routes.gateway.iter().find(|(_, e)| Some(e.port) == port) {
            metadata.push((BROKER_ID.to_string(), node.to_string()));
        }
        let mut nodes: Vec<_> = routes.gateway.iter().collect();
        nodes.sort_by_key(|(node, _)| **node);
        let formatted: Vec<String> = nodes.iter().map(|(node, e)| format!("{node}={}:{}", e.host, e.port)).collect();
        metadata.push((BROKER_ROUTES.to_string(), formatted.join(",")));
        if self.facts.tls {
            metadata.push((TLS.to_string(), "1".to_string()));
        }
        if let (true, Some(mapping)) = (self.facts.tls, &self.config.settings.certificates) {
            metadata.extend([
                (PEER_SUBJECT.to_string(), self.facts.peer_subject.clone().unwrap_or_default()),
                (PEER_URI_SAN.to_string(), self.facts.peer_uri_sans.join(",")),
                (PRINCIPAL_RULES.to_string(), URL_SAFE.encode(mapping.rules.as_bytes())),
                (PRINCIPAL_FROM.to_string(), mapping.from.clone()),
            ]);
        }
        metadata
    }

    /// Sends the hand-offs the last feed made; one that cannot be sent (process bound,
    /// no runtime) fails at once. Returns whether any was resolved here.
    fn dispatch(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> Result<bool, ProtocolError> {
        let mut resolved = false;
        // A hand-off failed here may make others (requests that waited for its answer).
        while self.dispatch_made(envoy, cb)? {
            resolved = true;
        }
        Ok(resolved)
    }

    fn dispatch_made(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> Result<bool, ProtocolError> {
        let handoffs = self.session.take_handoffs();
        if handoffs.is_empty() {
            return Ok(false);
        }
        let interest: Arc<Interest> = self.config.settings.current_interest();
        let mut resolved = false;
        // The process's bytes in flight, this connection's as they are now.
        let total = HANDOFF_BYTES.load(Ordering::Relaxed).saturating_sub(self.handoff_held)
            + self.session.handoff_bytes();
        for h in handoffs {
            let failure = if total > interest.max_bytes {
                Some(Failure::Overloaded)
            } else {
                let outgoing = Outgoing { id: h.id, direction: h.direction, message: proto::message(&h) };
                let sent = self.handoff_state(envoy, cb).is_some_and(|state| state.connection.send(outgoing));
                (!sent).then_some(Failure::Unavailable)
            };
            if let Some(failure) = failure {
                self.session.resolve(h.id, Resolution::Failed(failure))?;
                resolved = true;
            }
        }
        Ok(resolved)
    }

    /// Applies the answers that came back and injects what may leave now.
    fn answers(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> Result<(), ProtocolError> {
        if self.read_end && self.drop_throttled(envoy, cb) {
            return Ok(());
        }
        let Some(h) = &self.handoffs else { return Ok(()) };
        let answers = h.link.take();
        for (id, resolution) in answers {
            self.session.resolve(id, resolution)?;
        }
        // An answer may make a hand-off (the broker's answer to a replayed request).
        self.dispatch(envoy, cb)?;
        let late = handoff::LATE_ANSWERS.swap(0, Ordering::Relaxed);
        if late > 0 {
            self.count(envoy, cb, Event::LateAnswers, late);
        }
        self.inject_ready(envoy, cb);
        Ok(())
    }

    /// The client ended its connection while a throttle holds some of its requests
    /// back: they go nowhere, and the connection is closed (true). Kafka's clients count
    /// such requests failed and send them again on a new connection; forwarded after
    /// the mute, they were stored twice, and kept reaching the broker long after the
    /// client had gone (a non-idempotent librdkafka producer under a
    /// `requests_per_second` rule stored records up to 2.7 times, for 80 s after it
    /// exited). A broker does not read a muted channel's requests either.
    fn drop_throttled(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) -> bool {
        let Some(h) = &self.handoffs else { return false };
        let throttled = h.link.throttled();
        if throttled == 0 {
            return false;
        }
        self.count(envoy, cb, Event::ThrottledDropped, throttled as u64);
        self.close_now(envoy, cb);
        true
    }

    /// Closes the connection without flushing what waits to be written; the hand-off
    /// answers still to come are dropped, and no hook touches the session again.
    fn close_now(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) {
        self.closed = true;
        if let Some(h) = &self.handoffs {
            h.link.close();
        }
        // SAFETY: a live filter inside one of its hooks.
        unsafe { (cb.close)(envoy, abi::CLOSE_NO_FLUSH) };
    }

    /// Injects what waited behind hand-offs and may leave now, both directions, with
    /// a held end of stream once nothing waits before it.
    fn inject_ready(&mut self, envoy: FilterEnvoyPtr, cb: &Callbacks) {
        let mut out = Output::default();
        self.session.ready_requests(&mut out);
        let end = self.read_end && !self.session.requests_waiting();
        self.read_end &= !end;
        inject(envoy, cb, cb.inject_read, &out, end);
        let mut out = Output::default();
        self.session.ready_responses(&mut out);
        let end = self.write_end && !self.session.responses_waiting();
        self.write_end &= !end;
        inject(envoy, cb, cb.inject_write, &out, end);
    }

    /// Keeps the process-wide count of held bytes; Err when this connection grew past it.
    fn account_held(&mut self) -> Result<(), ()> {
        let now = self.session.held_bytes();
        if now > self.held {
            let total = HELD_BYTES.fetch_add(now - self.held, Ordering::Relaxed) + now - self.held;
            self.held = now;
            if total > self.config.settings.max_held_bytes {
                return Err(());
            }
        } else if now < self.held {
            HELD_BYTES.fetch_sub(self.held - now, Ordering::Relaxed);
            self.held = now;
        }
        Ok(())
    }

    fn view(&self) -> Arc<crate::core::rewrite::Routes> {
        self.config.settings.current_routes()
    }
}

// Initial metadata keys of the stream (ext_proc/connection.py has the same).
const CLIENT_ADDRESS: &str = "x-keg-client-address";
const GATEWAY_ADDRESS: &str = "x-keg-gateway-address";
const CONNECTION_ID: &str = "x-keg-connection-id";
const BROKER_ID: &str = "x-keg-broker-id";
const BROKER_ROUTES: &str = "x-keg-broker-routes";
const MODE: &str = "x-keg-mode";
const TLS: &str = "x-keg-tls";
/// This module sends a request again when the service defers it (`keg.defer_ms`).
const DEFER: &str = "x-keg-defer";
const PEER_SUBJECT: &str = "x-keg-peer-subject";
const PEER_URI_SAN: &str = "x-keg-peer-uri-san";
/// Kafka's rule text, base64url (padded, as Python's `urlsafe_b64encode`).
const PRINCIPAL_RULES: &str = "x-keg-principal-rules";
const PRINCIPAL_FROM: &str = "x-keg-principal-from";

/// Injects `out` (bytes the core owns) and an end of stream, if there is either.
fn inject(envoy: FilterEnvoyPtr, cb: &Callbacks, how: abi::Inject, out: &Output, end: bool) {
    if (out.is_empty() && !end) || !is_open(envoy, cb) {
        return;
    }
    let mut bytes = Vec::with_capacity(out.len());
    out.write_to(&[], &mut bytes);
    // SAFETY: a live filter on its worker thread; Envoy copies the bytes.
    unsafe { how(envoy, ModuleBuffer::from_slice(&bytes), end) };
}

/// Whether the connection still takes bytes. Envoy writes injected bytes to the
/// connection's socket, and a closed connection has none: injecting into one took the
/// whole Envoy down. It may close inside a hook (the filters after this one can close
/// it while taking what was injected) as well as between hooks.
fn is_open(envoy: FilterEnvoyPtr, cb: &Callbacks) -> bool {
    // SAFETY: a live filter on its worker thread.
    unsafe { (cb.connection_state)(envoy) == abi::CONNECTION_OPEN }
}

/// An address Envoy reports (local or remote), copied.
fn address(envoy: FilterEnvoyPtr, get: unsafe extern "C" fn(FilterEnvoyPtr, *mut EnvoyBuffer, *mut u32) -> bool) -> Option<(String, u32)> {
    let mut buffer = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
    let mut port = 0u32;
    // SAFETY: a live filter; Envoy fills the out-parameters with a string valid during
    // this hook, copied here.
    unsafe { get(envoy, &mut buffer, &mut port) }
        .then(|| (String::from_utf8_lossy(unsafe { buffer.as_slice() }).into_owned(), port))
}

/// The client certificate's subject, copied; None without TLS or without a certificate.
fn ssl_subject(envoy: FilterEnvoyPtr, cb: &Callbacks) -> Option<String> {
    let mut buffer = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
    // SAFETY: a live filter; Envoy's string is valid during this hook, copied here.
    let found = unsafe { (cb.ssl_subject)(envoy, &mut buffer) };
    let subject = String::from_utf8_lossy(unsafe { buffer.as_slice() }).into_owned();
    (found && !subject.is_empty()).then_some(subject)
}

/// The client certificate's URI SANs, copied.
fn ssl_uri_sans(envoy: FilterEnvoyPtr, cb: &Callbacks) -> Vec<String> {
    // SAFETY: a live filter; the array is sized as Envoy says, its strings copied here.
    let count = unsafe { (cb.ssl_uri_sans_size)(envoy) };
    if count == 0 {
        return Vec::new();
    }
    let mut buffers = vec![EnvoyBuffer { ptr: std::ptr::null(), length: 0 }; count];
    if !unsafe { (cb.ssl_uri_sans)(envoy, buffers.as_mut_ptr()) } {
        return Vec::new();
    }
    buffers.iter().map(|b| String::from_utf8_lossy(unsafe { b.as_slice() }).into_owned()).collect()
}

/// What [`feed_chunks`] made of Envoy's buffer.
struct Fed {
    /// Every slice's output is the slice itself.
    whole: bool,
    /// The bytes Envoy holds.
    total: usize,
    /// The bytes the session took: less than `total` when it stopped reading (the rest
    /// stays in Envoy's buffer, which Envoy hands over again once reading resumes).
    taken: usize,
}

impl Fed {
    fn all(&self) -> bool {
        self.taken == self.total
    }
}

/// Reads Envoy's buffer as slices and feeds each to `feed`, which says how much of it
/// it took; after a slice it did not take whole, the rest is not fed.
fn feed_chunks(
    filter: &mut Filter,
    count: usize,
    fill: impl FnOnce(*mut EnvoyBuffer) -> bool,
    mut feed: impl FnMut(&mut Session<Policy>, &[u8], &mut Output) -> Result<usize, ProtocolError>,
) -> Result<Fed, ProtocolError> {
    filter.chunks.clear();
    filter.chunks.resize(count, EnvoyBuffer { ptr: std::ptr::null(), length: 0 });
    if count > 0 && !fill(filter.chunks.as_mut_ptr()) {
        filter.chunks.clear();
    }
    if filter.outputs.len() < filter.chunks.len() {
        filter.outputs.resize_with(filter.chunks.len(), Output::default);
    }
    let mut fed = Fed { whole: true, total: 0, taken: 0 };
    for (chunk, out) in filter.chunks.iter().zip(filter.outputs.iter_mut()) {
        out.clear();
        // SAFETY: Envoy's chunks stay valid until this hook returns (no drain yet).
        let slice = unsafe { chunk.as_slice() };
        let stopped = !fed.all();
        fed.total += slice.len();
        if stopped {
            continue;
        }
        let taken = feed(&mut filter.session, slice, out)?;
        fed.taken += taken;
        fed.whole &= taken == slice.len() && out.is_whole(slice.len());
    }
    Ok(fed)
}

/// The output of every chunk, copied into the filter's scratch buffer.
fn gather(filter: &mut Filter) -> Vec<u8> {
    let mut bytes = std::mem::take(&mut filter.scratch);
    bytes.clear();
    for (chunk, out) in filter.chunks.iter().zip(filter.outputs.iter()) {
        // SAFETY: still inside the hook, before the drain.
        out.write_to(unsafe { chunk.as_slice() }, &mut bytes);
    }
    bytes
}

/// Replaces the first `total` bytes Envoy holds in one direction (what the session
/// took) with the chunks' output and the frames `ready` adds behind them (it says
/// whether frames still wait behind a hand-off). The end of stream goes along unless
/// frames wait: then it is held, and the result says so. A caller that leaves bytes in
/// Envoy's buffer passes no end of stream: Envoy gives it again with them.
fn replace_chunks(
    envoy: FilterEnvoyPtr,
    filter: &mut Filter,
    total: usize,
    end_stream: bool,
    (drain, inject): (abi::Drain, abi::Inject),
    open: impl FnOnce() -> bool,
    ready: impl FnOnce(&mut Session<Policy>, &mut Output) -> bool,
) -> bool {
    let mut bytes = gather(filter);
    let mut frames = Output::default();
    let waiting = ready(&mut filter.session, &mut frames);
    frames.write_to(&[], &mut bytes);
    let end = end_stream && !waiting;
    // SAFETY: a live filter; the injected bytes are copied by Envoy.
    unsafe {
        drain(envoy, total);
        if (!bytes.is_empty() || end) && open() {
            inject(envoy, ModuleBuffer::from_slice(&bytes), end);
        }
    }
    filter.scratch = bytes;
    end_stream && !end
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(envoy: FilterEnvoyPtr, module: FilterModulePtr) -> u32 {
    guard(envoy, module, |filter, cb| {
        if let Some((host, port)) = address(envoy, cb.local_address) {
            let port = port as i32;
            let routes = filter.view();
            // The listener the client is on: the route of that port if there is one.
            filter.own_listener = routes.gateway.values().find(|e| e.port == port).cloned()
                .or(Some(Endpoint { host, port }));
            filter.facts.local_port = Some(port);
        }
        let client = address(envoy, cb.remote_address);
        let listener = filter.own_listener.as_ref().map(|own| format!("{}:{}", own.host, own.port));
        filter.session.peer = Peer::new(client.as_ref().map(|(host, _)| host.as_str()), listener);
        filter.facts.client = client
            .map(|(host, port)| if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") });
        // SAFETY: a live filter.
        filter.facts.connection_id = unsafe { (cb.connection_id)(envoy) };
        Ok(abi::STATUS_CONTINUE)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_read(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    _data_length: usize,
    end_stream: bool,
) -> u32 {
    guard(envoy, module, |filter, cb| {
        if end_stream && filter.drop_throttled(envoy, cb) {
            return Ok(abi::STATUS_STOP_ITERATION);
        }
        if !filter.facts.tls_known {
            filter.learn_tls(envoy, cb)?;
        }
        // SAFETY: a live filter inside its read hook.
        let count = unsafe { (cb.read_chunks_size)(envoy) };
        // Envoy raises a connection's end of stream once and hands over nothing after
        // it: with the end, every byte is taken (what Envoy buffered, within its limit),
        // as a broker answers every request it read before a client's half-close.
        let bound = if end_stream { None } else { filter.read_bound() };
        let fed = feed_chunks(filter, count, |dst| unsafe { (cb.read_chunks)(envoy, dst) },
                              |session, slice, out| session.feed_requests_within(slice, out, bound))?;
        let resolved = filter.dispatch(envoy, cb)?;
        // The client's end of stream waits for the requests queued behind a hand-off.
        filter.left_unread = !fed.all();
        debug_assert!(fed.all() || !end_stream, "bytes left at the end of stream never come again");
        let hold_end = end_stream && filter.session.requests_waiting();
        let status = if fed.whole && !resolved && !hold_end {
            abi::STATUS_CONTINUE
        } else {
            let held = replace_chunks(envoy, filter, fed.taken, end_stream, (cb.drain_read, cb.inject_read), || is_open(envoy, cb), |session, out| {
                session.ready_requests(out);
                session.requests_waiting()
            });
            filter.read_end |= held;
            abi::STATUS_STOP_ITERATION
        };
        // The gateway's own answers that are due now (and answers to hand-offs resolved
        // here) go to the client.
        let mut local = Output::default();
        filter.session.ready_responses(&mut local);
        inject(envoy, cb, cb.inject_write, &local, false);
        Ok(status)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_write(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    _data_length: usize,
    end_stream: bool,
) -> u32 {
    guard(envoy, module, |filter, cb| {
        let routes = filter.view();
        let own = filter.own_listener.clone();
        let view = RouteView { routes: &routes, own_listener: own.as_ref() };
        // SAFETY: a live filter inside its write hook.
        let count = unsafe { (cb.write_chunks_size)(envoy) };
        let fed = feed_chunks(filter, count, |dst| unsafe { (cb.write_chunks)(envoy, dst) },
                              |session, slice, out| session.feed_responses(slice, view, out).map(|()| slice.len()))?;
        let resolved = filter.dispatch(envoy, cb)?;
        let hold_end = end_stream && filter.session.responses_waiting();
        if fed.whole && !resolved && !hold_end {
            return Ok(abi::STATUS_CONTINUE);
        }
        let held = replace_chunks(envoy, filter, fed.taken, end_stream, (cb.drain_write, cb.inject_write), || is_open(envoy, cb), |session, out| {
            session.ready_responses(out);
            session.responses_waiting()
        });
        filter.write_end |= held;
        Ok(abi::STATUS_STOP_ITERATION)
    })
}

/// The connection closed (either end): nothing of this filter touches it again. An
/// answer from the hand-off thread may already be on its way as a scheduled event,
/// which Envoy runs while the filter lives (until the connection's deferred deletion):
/// the link is closed so it brings nothing, and every later hook returns at once.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_event(_: FilterEnvoyPtr, module: FilterModulePtr, event: u32) {
    if event != abi::EVENT_REMOTE_CLOSE && event != abi::EVENT_LOCAL_CLOSE {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Envoy passes the pointer filter_new returned, alive until destroy.
        if let Some(filter) = unsafe { filter(module) } {
            filter.closed = true;
            if let Some(h) = &filter.handoffs {
                h.link.close(); // answers still to come are dropped
            }
        }
    }));
}

/// Answers from the hand-off thread are ready (the scheduler committed).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_scheduled(envoy: FilterEnvoyPtr, module: FilterModulePtr, _event_id: u64) {
    guard(envoy, module, |filter, cb| {
        filter.answers(envoy, cb)?;
        Ok(abi::STATUS_CONTINUE)
    });
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_scheduled(_: ConfigModulePtr, _event_id: u64) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_above_write_buffer_high_watermark(_: FilterEnvoyPtr, _: FilterModulePtr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_below_write_buffer_low_watermark(_: FilterEnvoyPtr, _: FilterModulePtr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_http_callout_done(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *const c_void,
    _headers_size: usize,
    _body_chunks: *const EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[cfg(test)]
mod tests;
