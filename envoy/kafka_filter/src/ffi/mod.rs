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
//! a frame held to be examined) are copied into it: Envoy owns its buffers once the
//! hook returns.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kafka_protocol::messages::ApiKey;

use crate::abi::{self, Callbacks, ConfigEnvoyPtr, ConfigModulePtr, EnvoyBuffer, FilterEnvoyPtr, FilterModulePtr, ModuleBuffer};
use crate::config::FilterConfig;
use crate::core::rewrite::{Endpoint, RouteView};
use crate::core::stats::{ApiCounter, API_COUNTERS, COUNTERS, OTHER_API};
use crate::core::{Output, ProtocolError, RequestPolicy, Session};

/// Bytes held by all connections of the process.
static HELD_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Module-level failures, counted per configuration.
#[derive(Debug, Clone, Copy)]
enum Failure {
    ProtocolErrors = 0,
    Panics = 1,
    HeldLimit = 2,
}

const FAILURE_NAMES: [&str; 3] = ["protocol_errors", "panics", "held_bytes_limit"];

/// Envoy counter ids of one configuration.
#[derive(Debug, Default)]
struct CounterIds {
    api: Vec<[Option<usize>; 3]>,
    counters: Vec<Option<usize>>,
    failures: [Option<usize>; 3],
}

pub struct Config {
    settings: FilterConfig,
    ids: CounterIds,
}

type Policy = Box<dyn RequestPolicy + Send>;

pub struct Filter {
    config: Arc<Config>,
    session: Session<Policy>,
    own_listener: Option<Endpoint>,
    closed: bool,
    held: usize,
    chunks: Vec<EnvoyBuffer>,
    outputs: Vec<Output>,
    scratch: Vec<u8>,
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
    for (i, name) in FAILURE_NAMES.iter().enumerate() {
        ids.failures[i] = define(format!("keg_kafka.{name}"));
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
                abi::log(abi::LOG_INFO, &format!(
                    "keg_kafka_filter: route table {:?} with {} routes",
                    settings.route_table, settings.current_routes().gateway.len()));
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
        let filter = Filter::new(config, Box::new(crate::core::ForwardAll));
        Box::into_raw(Box::new(filter)).cast::<c_void>().cast_const()
    });
    made.unwrap_or(std::ptr::null())
}

impl Filter {
    fn new(config: Arc<Config>, policy: Policy) -> Filter {
        let limits = config.settings.limits;
        Filter {
            config,
            session: Session::with_policy(limits, policy),
            own_listener: None,
            closed: false,
            held: 0,
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
        // SAFETY: made by Box::into_raw in filter_new; Envoy destroys it once.
        let filter = unsafe { Box::from_raw(module as *mut Filter) };
        HELD_BYTES.fetch_sub(filter.held, Ordering::Relaxed);
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
            Ok(()) => return status,
            Err(()) => Failure::HeldLimit,
        },
        Ok(Err(err)) => {
            abi::log(abi::LOG_WARN, &format!("keg_kafka_filter: closing the connection: {err}"));
            Failure::ProtocolErrors
        }
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".to_string());
            abi::log(abi::LOG_ERROR, &format!("keg_kafka_filter: panic, closing the connection: {what}"));
            Failure::Panics
        }
    };
    filter.closed = true;
    // Never touch the session again: after a panic its state is unknown.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(id) = filter.config.ids.failures[failure as usize] {
            // SAFETY: a live filter's Envoy pointer and a counter id of its config.
            unsafe { (cb.increment_counter)(envoy, id, 1) };
        }
        // SAFETY: as above.
        unsafe { (cb.close)(envoy, abi::CLOSE_NO_FLUSH) };
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

/// Reads Envoy's buffer as slices, feeds each to `feed`; returns whether every slice's
/// output was the slice itself.
fn feed_chunks(
    filter: &mut Filter,
    count: usize,
    fill: impl FnOnce(*mut EnvoyBuffer) -> bool,
    mut feed: impl FnMut(&mut Session<Policy>, &[u8], &mut Output) -> Result<(), ProtocolError>,
) -> Result<(bool, usize), ProtocolError> {
    filter.chunks.clear();
    filter.chunks.resize(count, EnvoyBuffer { ptr: std::ptr::null(), length: 0 });
    if count > 0 && !fill(filter.chunks.as_mut_ptr()) {
        filter.chunks.clear();
    }
    if filter.outputs.len() < filter.chunks.len() {
        filter.outputs.resize_with(filter.chunks.len(), Output::default);
    }
    let mut whole = true;
    let mut total = 0;
    for (chunk, out) in filter.chunks.iter().zip(filter.outputs.iter_mut()) {
        out.clear();
        // SAFETY: Envoy's chunks stay valid until this hook returns (no drain yet).
        let slice = unsafe { chunk.as_slice() };
        total += slice.len();
        feed(&mut filter.session, slice, out)?;
        whole &= out.is_whole(slice.len());
    }
    Ok((whole, total))
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(envoy: FilterEnvoyPtr, module: FilterModulePtr) -> u32 {
    guard(envoy, module, |filter, cb| {
        let mut address = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
        let mut port = 0u32;
        // SAFETY: a live filter; Envoy fills the out-parameters.
        if unsafe { (cb.local_address)(envoy, &mut address, &mut port) } {
            // SAFETY: Envoy's address string is valid during this hook.
            let host = String::from_utf8_lossy(unsafe { address.as_slice() }).into_owned();
            let port = port as i32;
            let routes = filter.view();
            // The listener the client is on: the route of that port if there is one.
            filter.own_listener = routes.gateway.values().find(|e| e.port == port).cloned()
                .or(Some(Endpoint { host, port }));
        }
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
        // SAFETY: a live filter inside its read hook.
        let count = unsafe { (cb.read_chunks_size)(envoy) };
        let (whole, total) = feed_chunks(filter, count, |dst| unsafe { (cb.read_chunks)(envoy, dst) },
                                         |session, slice, out| session.feed_requests(slice, out))?;
        let status = if whole {
            abi::STATUS_CONTINUE
        } else {
            let bytes = gather(filter);
            // SAFETY: a live filter; the injected bytes are copied by Envoy.
            unsafe {
                (cb.drain_read)(envoy, total);
                if !bytes.is_empty() || end_stream {
                    (cb.inject_read)(envoy, ModuleBuffer::from_slice(&bytes), end_stream);
                }
            }
            filter.scratch = bytes;
            abi::STATUS_STOP_ITERATION
        };
        // The gateway's own answers that are due now go to the client.
        let mut local = Output::default();
        filter.session.ready_responses(&mut local);
        if !local.is_empty() {
            let mut bytes = Vec::with_capacity(local.len());
            local.write_to(&[], &mut bytes);
            // SAFETY: as above.
            unsafe { (cb.inject_write)(envoy, ModuleBuffer::from_slice(&bytes), false) };
        }
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
        let (whole, total) = feed_chunks(filter, count, |dst| unsafe { (cb.write_chunks)(envoy, dst) },
                                         |session, slice, out| session.feed_responses(slice, view, out))?;
        if whole {
            return Ok(abi::STATUS_CONTINUE);
        }
        let bytes = gather(filter);
        // SAFETY: a live filter; the injected bytes are copied by Envoy.
        unsafe {
            (cb.drain_write)(envoy, total);
            if !bytes.is_empty() || end_stream {
                (cb.inject_write)(envoy, ModuleBuffer::from_slice(&bytes), end_stream);
            }
        }
        filter.scratch = bytes;
        Ok(abi::STATUS_STOP_ITERATION)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_event(_: FilterEnvoyPtr, _: FilterModulePtr, _event: u32) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_scheduled(_: FilterEnvoyPtr, _: FilterModulePtr, _event_id: u64) {}

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
