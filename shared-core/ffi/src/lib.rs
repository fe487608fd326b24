//! The C ABI for the nginx module and the Lua binding.
//!
//! Handle-based: settings are made once per configuration and shared; an exchange is made per
//! request from them and freed by the host (nginx registers the free as a pool cleanup). No panic
//! crosses this boundary: each entry point catches it and reports a failure instead.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::slice;

use rpcedge_core::config::ConfigError;

mod cache;
mod dictionary;
mod exchange;
mod metrics;
mod settings;
#[cfg(test)]
mod tests;

pub use cache::*;
pub use dictionary::*;
pub use exchange::*;
pub use settings::*;

/// A byte string: given by the caller, who owns it (e.g. one of nginx's `ngx_str_t`
/// rearranged), or given back, owned by the core (a static name, or bytes that live as long as
/// the handle they came from). Not NUL-terminated.
#[repr(C)]
pub struct RpcedgeStr {
    pub data: *const u8,
    pub len: usize,
}

impl RpcedgeStr {
    /// None: NULL data, no length.
    const NONE: RpcedgeStr = RpcedgeStr { data: ptr::null(), len: 0 };

    fn of(bytes: &[u8]) -> RpcedgeStr {
        RpcedgeStr { data: bytes.as_ptr(), len: bytes.len() }
    }
}

/// Where a configuration error is written: the field's name and a message, NUL-terminated and
/// cut to fit.
#[repr(C)]
pub struct RpcedgeError {
    pub field: [c_char; 32],
    pub message: [c_char; 224],
}

/// A header as a name and a value, in a list one side lends the other: each call that takes or
/// gives one says how long it lives.
#[repr(C)]
pub struct RpcedgeHeader {
    pub name: *const u8,
    pub name_len: usize,
    pub value: *const u8,
    pub value_len: usize,
}

fn write_error(out: *mut RpcedgeError, error: &ConfigError) {
    fn copy(dst: &mut [c_char], src: &str) {
        let n = src.len().min(dst.len() - 1);
        for (d, s) in dst.iter_mut().zip(&src.as_bytes()[..n]) {
            *d = *s as c_char;
        }
        dst[n] = 0;
    }
    if let Some(out) = unsafe { out.as_mut() } {
        copy(&mut out.field, &error.field);
        copy(&mut out.message, &error.message);
    }
}

unsafe fn bytes<'a>(data: *const u8, len: usize) -> &'a [u8] {
    if data.is_null() || len == 0 {
        &[]
    } else {
        slice::from_raw_parts(data, len)
    }
}

#[cfg(test)]
thread_local! {
    /// Makes the next guarded call panic, to test every entry point's fallback.
    static PANIC_NEXT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into `fallback`: no panic unwinds into C.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(|| {
        #[cfg(test)]
        if PANIC_NEXT.take() {
            panic!("injected by a test");
        }
        f()
    }))
    .unwrap_or(fallback)
}

/// Writes `value` where `out` points, when it points anywhere.
unsafe fn put<T>(out: *mut T, value: T) {
    if let Some(out) = out.as_mut() {
        *out = value;
    }
}

fn panicked() -> ConfigError {
    ConfigError { field: "config".into(), message: "internal error".into() }
}
