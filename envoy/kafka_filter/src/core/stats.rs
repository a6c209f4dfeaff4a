//! Counters a session accumulates; the FFI layer drains them into Envoy stats after each
//! callback (cardinality is bounded: API keys above [`MAX_API_KEY`] count as "other").

pub const MAX_API_KEY: usize = 127;
pub const OTHER_API: usize = MAX_API_KEY + 1;

/// Per-API counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiCounter {
    Requests,
    RequestBytes,
    ResponseBytes,
}

pub const API_COUNTERS: [ApiCounter; 3] =
    [ApiCounter::Requests, ApiCounter::RequestBytes, ApiCounter::ResponseBytes];

/// Connection-level counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Broker addresses rewritten to gateway listeners.
    AddressesRewritten,
    /// Addresses of brokers without a route, sent to the client's own listener.
    UnknownBrokers,
    /// Controller/inter-broker endpoints removed from answers.
    EndpointsRedacted,
    /// Responses held whole to be examined (Metadata, Fetch v16+, ...).
    ResponsesExamined,
    /// Of those, responses that went on as the bytes that arrived.
    ResponsesUntouched,
    /// Address-carrying responses of a version this module cannot read (passed as is).
    UnreadableVersions,
    /// Requests answered by the gateway itself.
    LocalAnswers,
    /// Requests handed to the Python service.
    HandoffRequests,
    /// Responses handed to the Python service (its reply to the request asked for them).
    HandoffResponses,
    /// Requests the Python service answered itself (the broker never saw them).
    HandoffAnswers,
    /// Hand-offs without an answer (timeout, service down, overload).
    HandoffFailures,
    /// Of those, frames forwarded as they were (fail-open).
    HandoffFailedOpen,
    /// Of those, requests answered with a retriable error (fail-closed).
    HandoffRetriableErrors,
    /// Requests of a range with a topic selector that named no selected topic (passed
    /// natively, see `core::topics`).
    HandoffNotSelected,
    /// Produce requests and Fetch answers a rule selected that went on without a
    /// hand-off: every record carried a schema id the service vouched for (`core::vouch`).
    HandoffVouched,
    /// Of those, Fetch answers cut short at a batch boundary: past what one frame may
    /// validate, the rest of the records go in later answers (`core::vouch::fetch_verdict`).
    HandoffVouchedCut,
    /// Incremental Fetch requests naming no selected topic, forwarded with their answer
    /// to be read for topics (`core::topics::Selection::ByAnswer`).
    HandoffByAnswer,
    /// Of their answers, those naming no selected topic (they went on as they came).
    HandoffAnswerNotSelected,
    /// Produce requests only safeguards may act on that kept every check and went on
    /// without a hand-off (`core::safeguard`).
    HandoffSafeguardsKept,
    /// Fetch requests whose answer the service may read, their `max_bytes` lowered to
    /// what one hand-off can carry in time (`core::topics::cap_fetch_max_bytes`).
    HandoffFetchCapped,
}

pub const COUNTERS: [Counter; 20] = [
    Counter::AddressesRewritten,
    Counter::UnknownBrokers,
    Counter::EndpointsRedacted,
    Counter::ResponsesExamined,
    Counter::ResponsesUntouched,
    Counter::UnreadableVersions,
    Counter::LocalAnswers,
    Counter::HandoffRequests,
    Counter::HandoffResponses,
    Counter::HandoffAnswers,
    Counter::HandoffFailures,
    Counter::HandoffFailedOpen,
    Counter::HandoffRetriableErrors,
    Counter::HandoffNotSelected,
    Counter::HandoffVouched,
    Counter::HandoffVouchedCut,
    Counter::HandoffByAnswer,
    Counter::HandoffAnswerNotSelected,
    Counter::HandoffSafeguardsKept,
    Counter::HandoffFetchCapped,
];

#[derive(Debug, Clone)]
pub struct Stats {
    api: Vec<[u64; 3]>,
    counters: [u64; COUNTERS.len()],
    dirty_apis: Vec<u16>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats { api: vec![[0; 3]; OTHER_API + 1], counters: [0; COUNTERS.len()], dirty_apis: Vec::new() }
    }
}

pub fn api_slot(api_key: i16) -> usize {
    if (0..=MAX_API_KEY as i16).contains(&api_key) {
        api_key as usize
    } else {
        OTHER_API
    }
}

impl Stats {
    pub fn api(&mut self, api_key: i16, counter: ApiCounter, value: u64) {
        let slot = api_slot(api_key);
        let entry = &mut self.api[slot];
        if *entry == [0; 3] {
            self.dirty_apis.push(slot as u16);
        }
        entry[counter as usize] += value;
    }

    pub fn add(&mut self, counter: Counter, value: u64) {
        self.counters[counter as usize] += value;
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.counters[counter as usize]
    }

    /// Hands every non-zero delta to `sink` (API slot or None for connection counters)
    /// and resets them.
    pub fn drain(&mut self, mut api_sink: impl FnMut(usize, ApiCounter, u64), mut sink: impl FnMut(Counter, u64)) {
        for slot in self.dirty_apis.drain(..) {
            let entry = &mut self.api[slot as usize];
            for counter in API_COUNTERS {
                let value = entry[counter as usize];
                if value != 0 {
                    api_sink(slot as usize, counter, value);
                }
            }
            *entry = [0; 3];
        }
        for counter in COUNTERS {
            let value = std::mem::take(&mut self.counters[counter as usize]);
            if value != 0 {
                sink(counter, value);
            }
        }
    }
}
