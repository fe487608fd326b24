//! The part of Envoy's dynamic-modules ABI this module uses, written from
//! `source/extensions/dynamic_modules/abi/abi.h` (ABI version `v0.2.0`, Envoy 1.40): the C types,
//! the callbacks it imports from Envoy and the event hooks' status codes. The hooks it exports
//! are in `lib.rs`. Each imported symbol is checked against the Envoy binary by
//! `tests/test_envoy.py::test_the_native_module_imports_only_what_envoy_exports`.
//!
//! A `{ptr, length}` buffer passed by value is two integer registers under the x86-64 and AArch64
//! C calling conventions, so the structs below match the ABI's earlier `(ptr, length)` pairs too.

#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// The ABI version this module is written against, returned from `on_program_init`.
pub const ABI_VERSION: &std::ffi::CStr = c"v0.2.0";

pub type FilterConfigEnvoy = *mut c_void;
pub type FilterEnvoy = *mut c_void;
pub type Scheduler = *mut c_void;
pub type ConfigScheduler = *mut c_void;

/// Bytes Envoy owns, valid until the current hook returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };

    /// # Safety
    /// Envoy's bytes, alive for the current hook.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr, self.length)
        }
    }
}

/// Bytes this module owns, lent to Envoy for one call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    /// No value at all (a null pointer): `set_header` removes the header.
    pub const NONE: ModuleBuffer = ModuleBuffer { ptr: std::ptr::null(), length: 0 };
}

impl From<&[u8]> for ModuleBuffer {
    fn from(bytes: &[u8]) -> Self {
        ModuleBuffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }
}

impl From<&str> for ModuleBuffer {
    fn from(text: &str) -> Self {
        text.as_bytes().into()
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key: EnvoyBuffer,
    pub value: EnvoyBuffer,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHeader {
    pub key: ModuleBuffer,
    pub value: ModuleBuffer,
}

impl ModuleHeader {
    pub fn new(key: &str, value: &str) -> Self {
        ModuleHeader { key: key.into(), value: value.into() }
    }
}

#[repr(u32)]
#[derive(Clone, Copy)]
pub enum HeaderType {
    Request = 0,
    Response = 2,
    ResponseTrailer = 3,
}

#[repr(u32)]
#[derive(Clone, Copy)]
pub enum BodyType {
    ReceivedRequest = 0,
    BufferedRequest = 1,
    ReceivedResponse = 2,
    BufferedResponse = 3,
}

#[repr(u32)]
#[derive(Clone, Copy)]
pub enum LogLevel {
    Warn = 3,
    Error = 4,
}

/// `envoy_dynamic_module_type_metadata_source`: where metadata is read from.
#[repr(u32)]
#[derive(Clone, Copy)]
pub enum MetadataSource {
    Route = 1,
}

/// `FilterHeadersStatus`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersStatus {
    Continue = 0,
    StopIteration = 1,
}

/// `FilterDataStatus`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyStatus {
    Continue = 0,
    StopIterationAndBuffer = 1,
    StopIterationNoBuffer = 3,
}

/// `FilterTrailersStatus`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrailersStatus {
    Continue = 0,
    StopIteration = 1,
}

/// `envoy_dynamic_module_type_http_callout_init_result`: 0 is success.
pub type CalloutInit = u32;
pub const CALLOUT_STARTED: CalloutInit = 0;
/// `envoy_dynamic_module_type_http_callout_result`: 0 is success.
pub type CalloutResult = u32;
pub const CALLOUT_SUCCESS: CalloutResult = 0;
/// `envoy_dynamic_module_type_metrics_result`: 0 is success.
pub type MetricsResult = u32;
pub const METRICS_SUCCESS: MetricsResult = 0;
/// `envoy_dynamic_module_type_http_filter_stream_reset_reason_LocalReset`.
pub const LOCAL_RESET: u32 = 0;

extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);

    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: FilterConfigEnvoy,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: FilterConfigEnvoy,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoy,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: FilterEnvoy,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: FilterConfigEnvoy,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    pub fn envoy_dynamic_module_callback_http_get_headers_size(filter: FilterEnvoy, kind: HeaderType) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoy,
        kind: HeaderType,
        headers: *mut EnvoyHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoy,
        kind: HeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterEnvoy,
        kind: HeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterEnvoy,
        source: MetadataSource,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: FilterEnvoy, kind: BodyType) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoy,
        kind: BodyType,
        chunks: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_body_size(filter: FilterEnvoy, kind: BodyType) -> usize;
    pub fn envoy_dynamic_module_callback_http_append_body(filter: FilterEnvoy, kind: BodyType, data: ModuleBuffer)
        -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(filter: FilterEnvoy, kind: BodyType, length: usize) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoy,
        status: u32,
        headers: *const ModuleHeader,
        headers_length: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub fn envoy_dynamic_module_callback_http_filter_reset_stream(filter: FilterEnvoy, reason: u32, details: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoy);
    pub fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: FilterEnvoy);

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: FilterEnvoy) -> Scheduler;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: Scheduler, event: u64);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: Scheduler);
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(config: FilterConfigEnvoy) -> ConfigScheduler;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler: ConfigScheduler, event: u64);
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: ConfigScheduler);

    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoy,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_length: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> CalloutInit;
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: FilterConfigEnvoy,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_length: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> CalloutInit;

}
