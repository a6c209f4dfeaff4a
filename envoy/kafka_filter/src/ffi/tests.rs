//! The FFI layer against a fake Envoy: callbacks that record what the module asks for.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use super::*;
use crate::core::head::RequestHead;
use crate::core::Disposition;

#[derive(Default)]
struct FakeConnection {
    read: Vec<u8>,
    write: Vec<u8>,
    to_broker: Vec<u8>,
    to_client: Vec<u8>,
    closed: Option<u32>,
    counters: HashMap<usize, u64>,
}

static COUNTER_NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn conn<'a>(envoy: FilterEnvoyPtr) -> &'a mut FakeConnection {
    // SAFETY: the tests pass a pointer to a live FakeConnection as the Envoy filter.
    unsafe { &mut *(envoy as *mut FakeConnection) }
}

fn chunk(data: &[u8], out: *mut EnvoyBuffer) -> bool {
    // SAFETY: the module sized the array from *_chunks_size (1 when there is data).
    unsafe { *out = EnvoyBuffer { ptr: data.as_ptr().cast(), length: data.len() } };
    true
}

unsafe extern "C" fn read_chunks_size(e: FilterEnvoyPtr) -> usize { usize::from(!conn(e).read.is_empty()) }
unsafe extern "C" fn read_chunks(e: FilterEnvoyPtr, out: *mut EnvoyBuffer) -> bool { chunk(&conn(e).read, out) }
unsafe extern "C" fn drain_read(e: FilterEnvoyPtr, n: usize) -> bool { conn(e).read.drain(..n); true }
unsafe extern "C" fn inject_read(e: FilterEnvoyPtr, data: ModuleBuffer, _end: bool) {
    conn(e).to_broker.extend_from_slice(std::slice::from_raw_parts(data.ptr.cast(), data.length));
}
unsafe extern "C" fn write_chunks_size(e: FilterEnvoyPtr) -> usize { usize::from(!conn(e).write.is_empty()) }
unsafe extern "C" fn write_chunks(e: FilterEnvoyPtr, out: *mut EnvoyBuffer) -> bool { chunk(&conn(e).write, out) }
unsafe extern "C" fn drain_write(e: FilterEnvoyPtr, n: usize) -> bool { conn(e).write.drain(..n); true }
unsafe extern "C" fn inject_write(e: FilterEnvoyPtr, data: ModuleBuffer, _end: bool) {
    conn(e).to_client.extend_from_slice(std::slice::from_raw_parts(data.ptr.cast(), data.length));
}
unsafe extern "C" fn close(e: FilterEnvoyPtr, how: u32) { conn(e).closed = Some(how); }
unsafe extern "C" fn define_counter(_: ConfigEnvoyPtr, name: ModuleBuffer, id: *mut usize) -> u32 {
    let name = String::from_utf8_lossy(std::slice::from_raw_parts(name.ptr.cast(), name.length)).into_owned();
    let mut names = COUNTER_NAMES.lock().unwrap();
    *id = names.len();
    names.push(name);
    abi::METRICS_SUCCESS
}
unsafe extern "C" fn increment_counter(e: FilterEnvoyPtr, id: usize, value: u64) -> u32 {
    *conn(e).counters.entry(id).or_default() += value;
    abi::METRICS_SUCCESS
}
unsafe extern "C" fn log(_: u32, _: ModuleBuffer) {}
unsafe extern "C" fn local_address(_: FilterEnvoyPtr, _: *mut EnvoyBuffer, _: *mut u32) -> bool { false }

fn install_fake_envoy() {
    Callbacks::install(Callbacks {
        read_chunks_size, read_chunks, drain_read, inject_read,
        write_chunks_size, write_chunks, drain_write, inject_write,
        close, define_counter, increment_counter, log, local_address,
    });
}

fn counter(c: &FakeConnection, name: &str) -> u64 {
    let names = COUNTER_NAMES.lock().unwrap();
    names.iter().enumerate().filter(|(_, n)| n.as_str() == name).map(|(id, _)| c.counters.get(&id).copied().unwrap_or(0)).sum()
}

fn new_config() -> ConfigModulePtr {
    install_fake_envoy();
    let json = br#"{"route_table": "ffi-tests", "routes": [{"node_id": 1, "gateway": "gw:19092"}]}"#;
    let config = envoy_dynamic_module_on_network_filter_config_new(
        std::ptr::null_mut(),
        EnvoyBuffer { ptr: std::ptr::null(), length: 0 },
        EnvoyBuffer { ptr: json.as_ptr().cast(), length: json.len() },
    );
    assert!(!config.is_null());
    config
}

fn read(c: &mut FakeConnection, module: FilterModulePtr, bytes: &[u8]) -> u32 {
    c.read.extend_from_slice(bytes);
    let envoy = (c as *mut FakeConnection).cast::<c_void>();
    let status = envoy_dynamic_module_on_network_filter_read(envoy, module, c.read.len(), false);
    if status == abi::STATUS_CONTINUE {
        let passed: Vec<u8> = c.read.drain(..).collect();
        c.to_broker.extend(passed);
    }
    status
}

fn write(c: &mut FakeConnection, module: FilterModulePtr, bytes: &[u8]) -> u32 {
    c.write.extend_from_slice(bytes);
    let envoy = (c as *mut FakeConnection).cast::<c_void>();
    let status = envoy_dynamic_module_on_network_filter_write(envoy, module, c.write.len(), false);
    if status == abi::STATUS_CONTINUE {
        let passed: Vec<u8> = c.write.drain(..).collect();
        c.to_client.extend(passed);
    }
    status
}

fn request(api_key: i16, version: i16, correlation_id: i32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(api_key.to_be_bytes());
    body.extend(version.to_be_bytes());
    body.extend(correlation_id.to_be_bytes());
    body.extend((-1i16).to_be_bytes());
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend(body);
    frame
}

#[test]
fn pass_through_stays_in_envoys_buffers() {
    let config = new_config();
    let mut c = FakeConnection::default();
    let envoy = (&mut c as *mut FakeConnection).cast::<c_void>();
    let module = envoy_dynamic_module_on_network_filter_new(config, envoy);
    let frame = request(18, 3, 1);
    assert_eq!(read(&mut c, module, &frame), abi::STATUS_CONTINUE);
    assert_eq!(c.to_broker, frame);
    let response = [0, 0, 0, 6, 0, 0, 0, 1, 0, 0];
    assert_eq!(write(&mut c, module, &response), abi::STATUS_CONTINUE);
    assert_eq!(c.to_client, response);
    // A head split across reads is kept by the core (Envoy's buffer is drained) and
    // the frame goes on once its head is complete.
    let second = request(18, 3, 2);
    assert_eq!(read(&mut c, module, &second[..5]), abi::STATUS_STOP_ITERATION);
    assert!(c.read.is_empty());
    assert_eq!(read(&mut c, module, &second[5..]), abi::STATUS_STOP_ITERATION);
    assert_eq!(c.to_broker, [frame.clone(), second].concat());
    assert_eq!(counter(&c, "keg_kafka.api.api_versions.requests"), 2);
    assert_eq!(counter(&c, "keg_kafka.api.api_versions.response_bytes"), 10);
    assert_eq!(c.closed, None);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

struct PanicOnMetadata;

impl RequestPolicy for PanicOnMetadata {
    fn decide(&mut self, head: &RequestHead) -> Disposition {
        assert_ne!(head.api_key, 3, "a bug in the core");
        Disposition::Forward
    }
}

#[test]
fn a_panic_in_the_core_closes_that_connection_only() {
    let config = new_config();
    let shared = {
        // SAFETY: `config` came from config_new; take a reference of our own.
        unsafe { Arc::increment_strong_count(config.cast::<Config>()) };
        unsafe { Arc::from_raw(config.cast::<Config>()) }
    };
    let mut c = FakeConnection::default();
    let module = Box::into_raw(Box::new(Filter::new(shared, Box::new(PanicOnMetadata)))).cast::<c_void>().cast_const();
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the expected panic need not print
    assert_eq!(read(&mut c, module, &request(18, 3, 1)), abi::STATUS_CONTINUE);
    assert_eq!(read(&mut c, module, &request(3, 12, 2)), abi::STATUS_STOP_ITERATION);
    std::panic::set_hook(previous_hook);
    assert_eq!(c.closed, Some(abi::CLOSE_NO_FLUSH));
    assert_eq!(counter(&c, "keg_kafka.panics"), 1);
    // After the panic the connection's hooks do nothing (its state is unknown).
    c.closed = None;
    assert_eq!(read(&mut c, module, &request(18, 3, 3)), abi::STATUS_STOP_ITERATION);
    assert_eq!(c.closed, None);
    envoy_dynamic_module_on_network_filter_destroy(module);
    // Another connection of the same configuration is unaffected.
    let mut other = FakeConnection::default();
    let envoy = (&mut other as *mut FakeConnection).cast::<c_void>();
    let module = envoy_dynamic_module_on_network_filter_new(config, envoy);
    assert_eq!(read(&mut other, module, &request(3, 12, 1)), abi::STATUS_CONTINUE);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_protocol_error_closes_the_connection() {
    let config = new_config();
    let mut c = FakeConnection::default();
    let envoy = (&mut c as *mut FakeConnection).cast::<c_void>();
    let module = envoy_dynamic_module_on_network_filter_new(config, envoy);
    assert_eq!(read(&mut c, module, &[0xff, 0xff, 0xff, 0xff]), abi::STATUS_STOP_ITERATION);
    assert_eq!(c.closed, Some(abi::CLOSE_NO_FLUSH));
    assert_eq!(counter(&c, "keg_kafka.protocol_errors"), 1);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_bad_config_is_refused_not_a_crash() {
    install_fake_envoy();
    let json = br#"{"routes": 7}"#;
    let config = envoy_dynamic_module_on_network_filter_config_new(
        std::ptr::null_mut(),
        EnvoyBuffer { ptr: std::ptr::null(), length: 0 },
        EnvoyBuffer { ptr: json.as_ptr().cast(), length: json.len() },
    );
    assert!(config.is_null());
}
