//! The FFI layer against a fake Envoy: callbacks that record what the module asks for.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::*;
use crate::core::head::RequestHead;
use crate::core::Disposition;

#[derive(Default)]
struct FakeConnection {
    read: Vec<u8>,
    write: Vec<u8>,
    to_broker: Vec<u8>,
    to_client: Vec<u8>,
    broker_end: bool,
    client_end: bool,
    closed: Option<u32>,
    counters: HashMap<usize, u64>,
    read_disabled: Vec<bool>,
    scheduler: Option<&'static FakeScheduler>,
    /// TLS: None is a plaintext connection; Some((subject, URI SANs)) a TLS one.
    tls: Option<(String, Vec<String>)>,
    /// Envoy's connection state (0: open); bytes injected into a closed connection are
    /// counted here, where the real Envoy crashed.
    state: u32,
    injected_after_close: usize,
}

/// Envoy's scheduler, faked: counts commits (each would post an event to the worker).
#[derive(Default)]
struct FakeScheduler {
    commits: Mutex<usize>,
    committed: Condvar,
    deleted: AtomicBool,
    commits_after_delete: AtomicUsize,
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
unsafe extern "C" fn inject_read(e: FilterEnvoyPtr, data: ModuleBuffer, end: bool) {
    if conn(e).state != abi::CONNECTION_OPEN {
        conn(e).injected_after_close += 1;
    }
    if data.length > 0 {
        conn(e).to_broker.extend_from_slice(std::slice::from_raw_parts(data.ptr.cast(), data.length));
    }
    conn(e).broker_end |= end;
}
unsafe extern "C" fn write_chunks_size(e: FilterEnvoyPtr) -> usize { usize::from(!conn(e).write.is_empty()) }
unsafe extern "C" fn write_chunks(e: FilterEnvoyPtr, out: *mut EnvoyBuffer) -> bool { chunk(&conn(e).write, out) }
unsafe extern "C" fn drain_write(e: FilterEnvoyPtr, n: usize) -> bool { conn(e).write.drain(..n); true }
unsafe extern "C" fn inject_write(e: FilterEnvoyPtr, data: ModuleBuffer, end: bool) {
    if conn(e).state != abi::CONNECTION_OPEN {
        conn(e).injected_after_close += 1;
    }
    if data.length > 0 {
        conn(e).to_client.extend_from_slice(std::slice::from_raw_parts(data.ptr.cast(), data.length));
    }
    conn(e).client_end |= end;
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
unsafe extern "C" fn remote_address(_: FilterEnvoyPtr, out: *mut EnvoyBuffer, port: *mut u32) -> bool {
    const CLIENT: &str = "10.0.0.7";
    *out = EnvoyBuffer { ptr: CLIENT.as_ptr().cast(), length: CLIENT.len() };
    *port = 40001;
    true
}
unsafe extern "C" fn connection_id(_: FilterEnvoyPtr) -> u64 { 42 }
unsafe extern "C" fn scheduler_new(e: FilterEnvoyPtr) -> SchedulerPtr {
    let scheduler: &'static FakeScheduler = Box::leak(Box::default());
    conn(e).scheduler = Some(scheduler);
    (scheduler as *const FakeScheduler).cast_mut().cast()
}
unsafe extern "C" fn scheduler_commit(s: SchedulerPtr, _event: u64) {
    let scheduler = &*(s as *const FakeScheduler);
    if scheduler.deleted.load(Ordering::SeqCst) {
        scheduler.commits_after_delete.fetch_add(1, Ordering::SeqCst);
    }
    *scheduler.commits.lock().unwrap() += 1;
    scheduler.committed.notify_all();
}
unsafe extern "C" fn scheduler_delete(s: SchedulerPtr) {
    (*(s as *const FakeScheduler)).deleted.store(true, Ordering::SeqCst);
}
unsafe extern "C" fn read_disable(e: FilterEnvoyPtr, disable: bool) -> u32 {
    conn(e).read_disabled.push(disable);
    0
}

unsafe extern "C" fn is_ssl(e: FilterEnvoyPtr) -> bool { conn(e).tls.is_some() }
unsafe extern "C" fn connection_state(e: FilterEnvoyPtr) -> u32 { conn(e).state }
unsafe extern "C" fn ssl_subject(e: FilterEnvoyPtr, out: *mut EnvoyBuffer) -> bool {
    let Some((subject, _)) = &conn(e).tls else { return false };
    *out = EnvoyBuffer { ptr: subject.as_ptr().cast(), length: subject.len() };
    true
}
unsafe extern "C" fn ssl_uri_sans_size(e: FilterEnvoyPtr) -> usize { conn(e).tls.as_ref().map_or(0, |(_, sans)| sans.len()) }
unsafe extern "C" fn ssl_uri_sans(e: FilterEnvoyPtr, out: *mut EnvoyBuffer) -> bool {
    let Some((_, sans)) = &conn(e).tls else { return false };
    for (i, san) in sans.iter().enumerate() {
        *out.add(i) = EnvoyBuffer { ptr: san.as_ptr().cast(), length: san.len() };
    }
    true
}

fn install_fake_envoy() {
    Callbacks::install(Callbacks {
        read_chunks_size, read_chunks, drain_read, inject_read,
        write_chunks_size, write_chunks, drain_write, inject_write,
        close, define_counter, increment_counter, log, local_address,
        remote_address, connection_id, scheduler_new, scheduler_commit, scheduler_delete, read_disable,
        is_ssl, ssl_subject, ssl_uri_sans_size, ssl_uri_sans, connection_state,
    });
    crate::handoff::install_connector(fake_service().clone());
}

/// The fake Python service every hand-off of these tests goes to.
fn fake_service() -> &'static Arc<crate::handoff::tests::FakeService> {
    static SERVICE: std::sync::OnceLock<Arc<crate::handoff::tests::FakeService>> = std::sync::OnceLock::new();
    SERVICE.get_or_init(Default::default)
}

fn counter(c: &FakeConnection, name: &str) -> u64 {
    let names = COUNTER_NAMES.lock().unwrap();
    names.iter().enumerate().filter(|(_, n)| n.as_str() == name).map(|(id, _)| c.counters.get(&id).copied().unwrap_or(0)).sum()
}

fn new_config() -> ConfigModulePtr {
    config_of(br#"{"route_table": "ffi-tests", "routes": [{"node_id": 1, "gateway": "gw:19092"}]}"#)
}

fn config_of(json: &[u8]) -> ConfigModulePtr {
    install_fake_envoy();
    let config = envoy_dynamic_module_on_network_filter_config_new(
        std::ptr::null_mut(),
        EnvoyBuffer { ptr: std::ptr::null(), length: 0 },
        EnvoyBuffer { ptr: json.as_ptr().cast(), length: json.len() },
    );
    assert!(!config.is_null());
    config
}

fn read(c: &mut FakeConnection, module: FilterModulePtr, bytes: &[u8]) -> u32 {
    read_end(c, module, bytes, false)
}

fn read_end(c: &mut FakeConnection, module: FilterModulePtr, bytes: &[u8], end: bool) -> u32 {
    c.read.extend_from_slice(bytes);
    let envoy = (c as *mut FakeConnection).cast::<c_void>();
    let status = envoy_dynamic_module_on_network_filter_read(envoy, module, c.read.len(), end);
    if status == abi::STATUS_CONTINUE {
        let passed: Vec<u8> = c.read.drain(..).collect();
        c.to_broker.extend(passed);
        c.broker_end |= end;
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
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
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

// -- hand-offs through the fake Envoy to the fake service (handoff::tests) -----------

fn handoff_config(table: &str, endpoint: &str, fail_open: bool, timeout_ms: u64, per_connection: usize) -> ConfigModulePtr {
    bounded_config(table, endpoint, fail_open, timeout_ms, per_connection, 1 << 30)
}

fn bounded_config(table: &str, endpoint: &str, fail_open: bool, timeout_ms: u64, per_connection: usize,
                  process: usize) -> ConfigModulePtr {
    let json = format!(r#"{{"route_table": "{table}", "routes": [{{"node_id": 1, "gateway": "gw:19092"}}],
        "interest": {{"version": "1", "requests": [[0, 0, 32767]], "endpoints": ["{endpoint}"],
                      "failure_mode_allow": {fail_open}, "handoff_timeout_ms": {timeout_ms},
                      "max_bytes_per_connection": {per_connection}, "max_bytes": {process}}}}}"#);
    config_of(json.as_bytes())
}

fn connect(config: ConfigModulePtr, c: &mut FakeConnection) -> FilterModulePtr {
    let envoy = (c as *mut FakeConnection).cast::<c_void>();
    let module = envoy_dynamic_module_on_network_filter_new(config, envoy);
    assert_eq!(envoy_dynamic_module_on_network_filter_new_connection(envoy, module), abi::STATUS_CONTINUE);
    module
}

/// Waits for the hand-off thread to commit `n` events in all, then runs the scheduled
/// hook as Envoy's dispatcher would (on "the worker thread": this one).
fn run_scheduled(c: &mut FakeConnection, module: FilterModulePtr, n: usize) {
    wait_for_commits(c, n);
    let envoy = (c as *mut FakeConnection).cast::<c_void>();
    envoy_dynamic_module_on_network_filter_scheduled(envoy, module, 0);
}

/// Waits for the hand-off thread to commit `n` events in all (answers are ready).
fn wait_for_commits(c: &FakeConnection, n: usize) {
    let scheduler = c.scheduler.expect("a scheduler was made on the first hand-off");
    let mut commits = scheduler.commits.lock().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while *commits < n && std::time::Instant::now() < deadline {
        commits = scheduler.committed.wait_timeout(commits, Duration::from_millis(20)).unwrap().0;
    }
    assert!(*commits >= n, "{} commits, {n} expected", *commits);
}

/// A Produce request (v9) kafka-protocol can read: the fail-closed answer needs one.
fn produce(correlation_id: i32) -> Vec<u8> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, RequestHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default().with_request_api_key(0).with_request_api_version(9).with_correlation_id(correlation_id)
        .encode(&mut buf, 2).unwrap();
    ProduceRequest::default().with_acks(1).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0)])])
        .encode(&mut buf, 9).unwrap();
    let mut frame = (buf.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

#[test]
fn a_handed_off_request_goes_on_when_its_answer_is_scheduled_and_nothing_overtakes_it() {
    let config = handoff_config("ffi-handoff", "echo:1", false, 2000, 1 << 20);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let (p, metadata) = (produce(1), request(3, 12, 2));
    // The client's end of stream comes with them: it waits too.
    assert_eq!(read_end(&mut c, module, &[p.clone(), metadata.clone()].concat(), true), abi::STATUS_STOP_ITERATION);
    assert!(c.to_broker.is_empty(), "the Metadata request waits behind the Produce");
    assert!(!c.broker_end, "and so does the end of stream");
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.to_broker, [p, metadata].concat(), "the service's answer (an echo), then what waited");
    assert!(c.broker_end);
    assert_eq!(counter(&c, "keg_kafka.handoff_requests"), 1);
    envoy_dynamic_module_on_network_filter_destroy(module);
    assert!(c.scheduler.unwrap().deleted.load(Ordering::SeqCst), "the scheduler goes with the filter");
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_timeout_fails_closed_with_a_retriable_error_for_the_client() {
    let config = handoff_config("ffi-timeout", "silent:1", false, 50, 1 << 20);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let p = produce(9);
    read(&mut c, module, &p);
    run_scheduled(&mut c, module, 1);
    assert!(c.to_broker.is_empty(), "fail-closed: the frame never reaches the broker");
    // Produce v9 response: size, correlation id, 1 topic "t", partition 0, REQUEST_TIMED_OUT.
    assert_eq!(&c.to_client[4..8], &9i32.to_be_bytes());
    assert_eq!(counter(&c, "keg_kafka.handoff_retriable_errors"), 1);
    assert_eq!(c.closed, None);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_dead_service_fails_open_when_the_table_says_so() {
    let config = handoff_config("ffi-open", "dead:1", true, 2000, 1 << 20);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let p = produce(3);
    read(&mut c, module, &p);
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.to_broker, p, "forwarded as it was");
    assert_eq!(counter(&c, "keg_kafka.handoff_failed_open"), 1);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_connection_closed_with_a_handoff_pending_never_hears_of_it_again() {
    let config = handoff_config("ffi-late", "slow:1", false, 2000, 1 << 20);
    let (mut closing, mut witness) = (FakeConnection::default(), FakeConnection::default());
    let (closing_module, witness_module) = (connect(config, &mut closing), connect(config, &mut witness));
    read(&mut closing, closing_module, &produce(1));
    read(&mut witness, witness_module, &produce(1));
    let scheduler = closing.scheduler.unwrap();
    envoy_dynamic_module_on_network_filter_destroy(closing_module);
    assert!(scheduler.deleted.load(Ordering::SeqCst), "the scheduler goes with the filter");
    // The same slow service answers the other connection, handed off after: by then the
    // closed one's answer was due too.
    run_scheduled(&mut witness, witness_module, 1);
    assert_eq!(witness.to_broker, produce(1));
    assert_eq!(*scheduler.commits.lock().unwrap(), 0, "no event for a destroyed filter");
    assert_eq!(scheduler.commits_after_delete.load(Ordering::SeqCst), 0);
    envoy_dynamic_module_on_network_filter_destroy(witness_module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

/// Envoy closed the connection (the client reset it) while a hand-off was with the
/// service; its answer came as a scheduled event before the filter was destroyed and
/// was injected into the closed connection: the real Envoy died of a segmentation fault.
#[test]
fn an_answer_for_a_connection_envoy_closed_is_dropped_not_injected() {
    const CONNECTION_CLOSED: u32 = 2;
    let config = handoff_config("ffi-closed", "echo:1", false, 2000, 1 << 20);
    for event in [abi::EVENT_REMOTE_CLOSE, abi::EVENT_LOCAL_CLOSE] {
        let mut c = FakeConnection::default();
        let module = connect(config, &mut c);
        read(&mut c, module, &[produce(1), request(3, 12, 2)].concat());
        wait_for_commits(&c, 1); // the answer is on its way
        c.state = CONNECTION_CLOSED;
        let envoy = (&mut c as *mut FakeConnection).cast::<c_void>();
        envoy_dynamic_module_on_network_filter_event(envoy, module, event);
        envoy_dynamic_module_on_network_filter_scheduled(envoy, module, 0);
        assert_eq!(c.injected_after_close, 0);
        assert!(c.to_broker.is_empty() && c.to_client.is_empty());
        envoy_dynamic_module_on_network_filter_destroy(module);
    }
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

/// The connection closed without the filter hearing of it yet (inside a hook, by a
/// filter after this one): what is ready is not injected either.
#[test]
fn nothing_is_injected_into_a_connection_that_is_no_longer_open() {
    let config = handoff_config("ffi-closing", "echo:1", false, 2000, 1 << 20);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    read(&mut c, module, &[produce(1), request(3, 12, 2)].concat());
    c.state = 1; // closing: its last bytes are being written
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.injected_after_close, 0);
    assert!(c.to_broker.is_empty());
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

/// Events that do not end the connection change nothing.
#[test]
fn a_connected_event_leaves_the_connection_working() {
    let config = handoff_config("ffi-connected", "echo:1", false, 2000, 1 << 20);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let envoy = (&mut c as *mut FakeConnection).cast::<c_void>();
    envoy_dynamic_module_on_network_filter_event(envoy, module, 2); // Connected
    let p = produce(1);
    read(&mut c, module, &p);
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.to_broker, p);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn reading_pauses_beyond_the_per_connection_bound_and_resumes_when_answered() {
    let config = handoff_config("ffi-bound", "echo:1", false, 2000, 16);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let p = produce(1);
    read(&mut c, module, &p);
    assert_eq!(c.read_disabled, [true], "more than 16 bytes in flight");
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.read_disabled, [true, false]);
    assert_eq!(c.to_broker, p);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn with_the_end_of_stream_every_byte_is_taken_whatever_awaits_answers() {
    // Envoy raises a connection's end of stream once and hands over nothing after it:
    // bytes left in its buffer then would never reach the broker (a client that
    // half-closed after pipelining got 65 answers of 2,000, then nothing).
    let config = handoff_config("ffi-end-past-bound", "echo:1", false, 2000, 16);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let frames: Vec<Vec<u8>> = (1..=3).map(produce).collect();
    assert_eq!(read_end(&mut c, module, &frames.concat(), true), abi::STATUS_STOP_ITERATION);
    assert!(c.read.is_empty(), "{} bytes left in Envoy's buffer at its end of stream", c.read.len());
    // The thread may bring several answers in one commit: run the hook until all are in.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c.to_broker.len() < frames.concat().len() && std::time::Instant::now() < deadline {
        run_scheduled(&mut c, module, 1);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.to_broker, frames.concat(), "all three, in order");
    assert!(c.broker_end, "then the end of stream");
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_frame_larger_than_the_per_connection_bound_is_read_whole_after_a_handoff() {
    // Pausing while such a frame is still being collected would stall the connection
    // for good: only more reading completes it.
    let config = handoff_config("ffi-big-frame", "echo:1", false, 2000, 16);
    let mut c = FakeConnection::default();
    let module = connect(config, &mut c);
    let (first, big) = (produce(1), produce(2));
    read(&mut c, module, &first);
    run_scheduled(&mut c, module, 1);
    assert_eq!(c.read_disabled, [true, false], "paused while the first was in flight, then resumed");
    let half = big.len() - 4; // the head read, the frame collecting: more than 16 bytes
    read(&mut c, module, &big[..half]);
    assert_eq!(c.read_disabled, [true, false], "not paused with a frame half read");
    read(&mut c, module, &big[half..]);
    run_scheduled(&mut c, module, 2);
    assert_eq!(c.to_broker, [first, big].concat());
    assert_eq!(c.read_disabled.last(), Some(&false), "reading on once answered");
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn beyond_the_process_bound_a_handoff_fails_at_once() {
    for fail_open in [false, true] {
        // A bound of 0 bytes: every frame is beyond it; the service is never asked.
        let config = bounded_config(&format!("ffi-process-{fail_open}"), "silent:1", fail_open, 60_000, 1 << 20, 0);
        let mut c = FakeConnection::default();
        let module = connect(config, &mut c);
        let p = produce(4);
        read(&mut c, module, &p);
        assert!(c.scheduler.is_none(), "no stream was opened");
        if fail_open {
            assert_eq!(c.to_broker, p, "forwarded at once");
        } else {
            assert!(c.to_broker.is_empty());
            assert_eq!(&c.to_client[4..8], &4i32.to_be_bytes(), "REQUEST_TIMED_OUT at once");
        }
        assert_eq!(counter(&c, "keg_kafka.handoff_failures"), 1);
        envoy_dynamic_module_on_network_filter_destroy(module);
        envoy_dynamic_module_on_network_filter_config_destroy(config);
    }
}

// -- TLS ------------------------------------------------------------------------------

fn mtls_config(table: &str, endpoint: &str, from: &str) -> ConfigModulePtr {
    let json = format!(r#"{{"route_table": "{table}", "routes": [{{"node_id": 1, "gateway": "gw:19092"}}],
        "interest": {{"version": "1", "requests": [[0, 0, 32767]], "endpoints": ["{endpoint}"]}},
        "principal_mapping_rules": "RULE:^CN=(.*?),OU=people,.*$/$1/L, RULE:^spiffe:\\/\\/keg\\/sa\\/(.*)$/$1/",
        "principal_from": "{from}"}}"#);
    config_of(json.as_bytes())
}

fn tls_connection(subject: &str, sans: &[&str]) -> FakeConnection {
    FakeConnection { tls: Some((subject.to_string(), sans.iter().map(|s| s.to_string()).collect())), ..Default::default() }
}

fn identity_of(module: FilterModulePtr) -> &'static crate::core::identity::Identity {
    // SAFETY: a live filter made by the test.
    &unsafe { filter(module) }.unwrap().session.identity
}

#[test]
fn a_client_certificate_names_the_principal_the_handoff_carries() {
    let config = mtls_config("ffi-mtls", "echo:mtls", "subject");
    let mut c = tls_connection("CN=Alice,OU=people,O=keg", &["spiffe://keg/sa/x"]);
    let module = connect(config, &mut c);
    assert_eq!(read(&mut c, module, &produce(1)), abi::STATUS_STOP_ITERATION);
    assert_eq!(identity_of(module).principal(), "User:alice");
    assert_eq!(identity_of(module).security_protocol(), "SSL");
    run_scheduled(&mut c, module, 1);
    let opened = fake_service().opened.lock().unwrap().iter().find(|(e, _)| e == "echo:mtls").cloned().unwrap();
    let metadata: HashMap<_, _> = opened.1.into_iter().collect();
    assert_eq!(metadata["x-keg-tls"], "1");
    assert_eq!(metadata["x-keg-peer-subject"], "CN=Alice,OU=people,O=keg");
    assert_eq!(metadata["x-keg-peer-uri-san"], "spiffe://keg/sa/x");
    assert_eq!(metadata["x-keg-principal-from"], "subject");
    let rules = base64::engine::general_purpose::URL_SAFE.decode(&metadata["x-keg-principal-rules"]).unwrap();
    assert!(rules.starts_with(b"RULE:^CN=(.*?),OU=people"));
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn the_first_uri_san_can_name_the_principal() {
    let config = mtls_config("ffi-mtls-san", "echo:mtls-san", "uri_san");
    let mut c = tls_connection("CN=Alice,OU=people,O=keg", &["spiffe://keg/sa/bob", "spiffe://keg/sa/carol"]);
    let module = connect(config, &mut c);
    read(&mut c, module, &request(3, 12, 1));
    assert_eq!(identity_of(module).principal(), "User:bob");
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn a_certificate_no_rule_maps_is_refused_like_a_broker_refuses_it() {
    let config = mtls_config("ffi-mtls-refused", "echo:mtls-refused", "subject");
    let mut c = tls_connection("CN=Mallory,OU=robots,O=keg", &[]);
    let module = connect(config, &mut c);
    let metadata = request(3, 12, 1);
    assert_eq!(read(&mut c, module, &metadata), abi::STATUS_STOP_ITERATION);
    assert_eq!(c.closed, Some(abi::CLOSE_NO_FLUSH));
    assert!(c.to_broker.is_empty(), "not one byte of the refused client reaches the broker");
    assert_eq!(counter(&c, "keg_kafka.certificate_refused"), 1);
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}

#[test]
fn tls_without_a_mapping_is_ssl_and_plaintext_is_plaintext() {
    let config = new_config();
    let mut tls = tls_connection("", &[]);
    let module = connect(config, &mut tls);
    read(&mut tls, module, &request(3, 12, 1));
    assert_eq!((identity_of(module).security_protocol(), identity_of(module).principal().as_str()), ("SSL", "User:ANONYMOUS"));
    envoy_dynamic_module_on_network_filter_destroy(module);
    let mut plain = FakeConnection::default();
    let module = connect(config, &mut plain);
    read(&mut plain, module, &request(3, 12, 1));
    assert_eq!(identity_of(module).security_protocol(), "PLAINTEXT");
    envoy_dynamic_module_on_network_filter_destroy(module);
    envoy_dynamic_module_on_network_filter_config_destroy(config);
}
