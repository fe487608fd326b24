//! Safe calls into Envoy for one HTTP filter, during one of its hooks.

use std::ffi::c_void;

use rpcedge_core::proxy::cache::DaemonCall;

use crate::abi::{self, BodyType, EnvoyBuffer, EnvoyHeader, FilterEnvoy, HeaderType, LogLevel, ModuleBuffer, ModuleHeader};

/// Envoy's side of one HTTP filter (its `DynamicModuleHttpFilter`). The pointer is valid from
/// `on_http_filter_new` until `on_http_filter_destroy`; what it hands out (headers, body chunks)
/// only until the current hook returns, which the lifetimes below cannot say: callers use such
/// borrows within the hook.
#[derive(Clone, Copy)]
pub struct Host(pub FilterEnvoy);

impl Host {
    /// A header map as Envoy holds it (names in lower case).
    pub fn headers<'hook>(self, kind: HeaderType) -> Vec<(&'hook [u8], &'hook [u8])> {
        // SAFETY: the filter is alive during the hook; Envoy fills exactly `size` entries, whose
        // bytes stay valid until the hook returns or a header is set.
        unsafe {
            let size = abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, kind);
            let mut headers = vec![EnvoyHeader { key: EnvoyBuffer::EMPTY, value: EnvoyBuffer::EMPTY }; size];
            if size == 0 || !abi::envoy_dynamic_module_callback_http_get_headers(self.0, kind, headers.as_mut_ptr()) {
                return Vec::new();
            }
            headers.into_iter().map(|h| (h.key.bytes(), h.value.bytes())).collect()
        }
    }

    /// Whether Envoy has a header map of this kind, with a header in it.
    pub fn has_headers(self, kind: HeaderType) -> bool {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, kind) > 0 }
    }

    /// Sets a header, replacing any values it had; `None` removes it.
    pub fn set_header(self, kind: HeaderType, name: &str, value: Option<&[u8]>) {
        let value = value.map_or(ModuleBuffer::NONE, ModuleBuffer::from);
        // SAFETY: the buffers outlive the call, which copies them.
        unsafe { abi::envoy_dynamic_module_callback_http_set_header(self.0, kind, name.into(), value) };
    }

    /// Adds a value beside the header's others.
    pub fn add_header(self, kind: HeaderType, name: &str, value: &str) {
        // SAFETY: as in `set_header`.
        unsafe { abi::envoy_dynamic_module_callback_http_add_header(self.0, kind, name.into(), value.into()) };
    }

    /// A string in the metadata of the route the request took, under `namespace` and `key`.
    pub fn route_metadata<'hook>(self, namespace: &str, key: &str) -> Option<&'hook [u8]> {
        let mut value = EnvoyBuffer::EMPTY;
        // SAFETY: the filter is alive during the hook; the buffers outlive the call; Envoy's
        // bytes stay valid until the hook returns.
        unsafe {
            let found = abi::envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                abi::MetadataSource::Route,
                namespace.into(),
                key.into(),
                &mut value,
            );
            found.then(|| value.bytes())
        }
    }

    /// A body's slices as Envoy holds them.
    pub fn body<'hook>(self, kind: BodyType) -> Vec<&'hook [u8]> {
        // SAFETY: as in `headers`, for body slices.
        unsafe {
            let count = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, kind);
            let mut chunks = vec![EnvoyBuffer::EMPTY; count];
            if count == 0 || !abi::envoy_dynamic_module_callback_http_get_body_chunks(self.0, kind, chunks.as_mut_ptr()) {
                return Vec::new();
            }
            chunks.into_iter().map(|chunk| chunk.bytes()).collect()
        }
    }

    pub fn body_size(self, kind: BodyType) -> usize {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(self.0, kind) }
    }

    /// Appends to a body: the received one goes on from this hook; the buffered one (created if
    /// there is none) goes on when Envoy continues past this filter.
    pub fn append_body(self, kind: BodyType, data: &[u8]) {
        // SAFETY: Envoy copies the bytes.
        unsafe { abi::envoy_dynamic_module_callback_http_append_body(self.0, kind, data.into()) };
    }

    pub fn drain_body(self, kind: BodyType, length: usize) {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_drain_body(self.0, kind, length) };
    }

    /// Answers the request with Envoy's local reply (Envoy sets its Content-Length).
    pub fn send_response(self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        let headers: Vec<ModuleHeader> = headers.iter().map(|(name, value)| ModuleHeader::new(name, value)).collect();
        // SAFETY: Envoy copies the headers and body before returning.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                u32::from(status),
                headers.as_ptr(),
                headers.len(),
                body.into(),
                "rpcedge".into(),
            )
        };
    }

    /// Resets the stream: the client sees a broken response, never a truncated one that looks whole.
    pub fn reset(self) {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_reset_stream(self.0, abi::LOCAL_RESET, "rpcedge".into()) };
    }

    pub fn continue_request(self) {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) };
    }

    pub fn continue_response(self) {
        // SAFETY: the filter is alive during the hook.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_encoding(self.0) };
    }

    pub fn increment(self, counter: usize, amount: u64) {
        // SAFETY: the id was defined on this filter's config.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_increment_counter(self.0, counter, std::ptr::null(), 0, amount) };
    }

    pub fn record(self, histogram: usize, value: u64) {
        // SAFETY: the id was defined on this filter's config.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_record_histogram_value(self.0, histogram, std::ptr::null(), 0, value)
        };
    }

    /// A scheduler for this filter: its commits, from any thread, become `on_http_filter_scheduled`
    /// on the filter's worker. Deleted with `Scheduler::delete`.
    pub fn scheduler(self) -> Scheduler {
        // SAFETY: the filter is alive during the hook.
        Scheduler(unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) })
    }
}

impl Host {
    /// Calls the daemon for this stream (Envoy cancels the call with the stream): the call's id,
    /// answered in `on_http_filter_http_callout_done`, or none when Envoy could not make it.
    pub fn call(self, call: &DaemonCall) -> Option<u64> {
        let headers = module_headers(call);
        let mut id = 0;
        // SAFETY: Envoy copies the request before returning.
        let started = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_http_callout(
                self.0,
                &mut id,
                call.cluster.as_str().into(),
                headers.as_ptr(),
                headers.len(),
                call.body.as_slice().into(),
                call.timeout_ms,
            )
        };
        (started == abi::CALLOUT_STARTED).then_some(id)
    }
}

/// A daemon call's headers, lent to Envoy.
pub fn module_headers(call: &DaemonCall) -> Vec<ModuleHeader> {
    call.headers.iter().map(|(name, value)| ModuleHeader::new(name, value)).collect()
}

/// A filter's scheduler, which any thread may commit to (Envoy posts the event to the filter's
/// worker and drops it once the filter is gone).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Scheduler(*mut c_void);

// SAFETY: Envoy's scheduler commit is thread-safe; deletion is the owning filter's, on its worker,
// after the timer has let go of it (`timer::disarm`).
unsafe impl Send for Scheduler {}

impl Scheduler {
    pub fn commit(self, event: u64) {
        // SAFETY: alive until `delete`, which the owner calls only once no one commits any more.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event) };
    }

    pub fn delete(self) {
        // SAFETY: as in `commit`.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) };
    }
}

/// A line in Envoy's log, under its `dynamic_modules` logger.
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: Envoy copies the message.
    unsafe { abi::envoy_dynamic_module_callback_log(level, message.into()) };
}
