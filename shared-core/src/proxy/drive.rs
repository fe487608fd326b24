//! The steps a proxy takes at the core's word, written once for both Envoy adapters: each
//! implements [`Host`], the calls into its own API that an exchange's steps need, and calls these
//! functions from its hooks. What stays in an adapter is where Envoy's two ABIs differ: how it
//! reads a hook's data, when it may write a body, resume or wake at a deadline.

use super::cache::DaemonCall;
use super::{Failed, ProxyExchange, RequestStep};
use crate::cache::HotRegion;
use crate::edits::HeaderOp;
use crate::exchange::Failure;
use crate::metrics::Counter;

/// One proxy's calls, during one of its hooks.
pub trait Host {
    /// Sets a header of the request as the node gets it (`None`: removes it).
    fn set_request_header(&mut self, name: &str, value: Option<&[u8]>);
    /// Puts `body` in place of the request body the proxy holds for this filter.
    fn replace_request_body(&mut self, body: &[u8]);
    /// Changes the response's headers.
    fn edit_response_header(&mut self, op: HeaderOp<'_>);
    /// Sends a lookup to the daemon: the token its answer will carry, or `None` where the proxy
    /// cannot make the call.
    fn call_daemon(&mut self, call: &DaemonCall) -> Option<u64>;
    /// Answers the client (the node never sees the request): false where the proxy refused.
    fn send_reply(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool;
    /// Resets the response.
    fn reset(&mut self);
    fn count(&mut self, counter: Counter, amount: u64);
    /// One exchange's compression time.
    fn record_compress_us(&mut self, us: u64);
    /// A store (or the release of a held key) to make after this hook: a call made for the
    /// stream would end with it.
    fn queue_store(&mut self, call: DaemonCall);
    fn warn(&mut self, line: &str);
}

/// Where the request stands after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// On to the node.
    Continue,
    /// Held here for more of its body.
    Wait,
    /// Held here for the daemon's answer that carries this token ([`lookup_answer`]).
    Lookup(u64),
    /// Answered here.
    Replied,
}

/// The response's head, after the core saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadStep {
    Continue,
    /// Held here until the core releases it with the body.
    Hold,
    /// The exchange failed: the response is being answered or reset.
    Failed,
}

/// The request's headers: see [`ProxyExchange::on_request_headers`].
pub fn request_headers<N, V, R>(
    exchange: &mut ProxyExchange,
    host: &mut impl Host,
    headers: &[(N, V)],
    end_of_stream: bool,
    route_namespace: impl FnOnce() -> Option<R>,
    hot: Option<&dyn HotRegion>,
) -> Step
where
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
    R: AsRef<[u8]>,
{
    let head = exchange.on_request_headers(headers, end_of_stream, route_namespace, hot);
    if head.node_identity {
        host.set_request_header("accept-encoding", None);
    }
    ask_upstream(host, head.upstream_accept);
    // a Beacon-API read is looked up (or answered) here: it has no body
    request_step(exchange, host, head.step)
}

/// A request body callback: see [`ProxyExchange::on_request_body`].
pub fn request_body(
    exchange: &mut ProxyExchange,
    host: &mut impl Host,
    body_size: usize,
    end_of_stream: bool,
    body: impl FnOnce() -> Vec<u8>,
    hot: Option<&dyn HotRegion>,
) -> Step {
    let after = exchange.on_request_body(body_size, end_of_stream, body, hot);
    ask_upstream(host, after.upstream_accept);
    request_step(exchange, host, after.step)
}

/// The daemon's answer to the lookup the request waits for (no `:status`: it failed, or came
/// too late).
pub fn lookup_answer<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    exchange: &mut ProxyExchange,
    host: &mut impl Host,
    headers: &[(N, V)],
    body: &[u8],
    hot: Option<&dyn HotRegion>,
) -> Step {
    let step = exchange.on_lookup_answer(headers, body, hot);
    request_step(exchange, host, step)
}

fn request_step(exchange: &mut ProxyExchange, host: &mut impl Host, step: RequestStep) -> Step {
    match step {
        RequestStep::Continue => Step::Continue,
        RequestStep::Forward(body) => {
            host.replace_request_body(&body);
            host.set_request_header("content-length", Some(body.len().to_string().as_bytes()));
            Step::Continue
        }
        RequestStep::Wait => Step::Wait,
        RequestStep::Reply(reply) => {
            // The request as the proxy keeps it (its access log) is the client's again: the
            // proxy may let a filter write it only while the filter holds it, as here.
            restore_client_headers(exchange, host);
            match host.send_reply(reply.status(), &reply.headers(), reply.body()) {
                true => Step::Replied,
                false => Step::Continue,
            }
        }
        RequestStep::Lookup(call) => match host.call_daemon(&call) {
            Some(token) => Step::Lookup(token),
            None => {
                host.warn(&format!("rpcedge cache: cannot call {}", call.cluster));
                let step = exchange.lookup_failed();
                request_step(exchange, host, step)
            }
        },
    }
}

/// Asks the node for SSZ where the core says so (the request's head asked for identity).
fn ask_upstream(host: &mut impl Host, accept: Option<&str>) {
    if let Some(accept) = accept {
        host.set_request_header("accept", Some(accept.as_bytes()));
    }
}

/// Puts the request headers changed for the node back as the client sent them, once the node
/// has the request: what reads it later (the access log, filters that read it with the response)
/// reads the client's.
pub fn restore_client_headers(exchange: &mut ProxyExchange, host: &mut impl Host) {
    for (name, value) in exchange.take_client_headers() {
        host.set_request_header(name, value.as_deref());
    }
}

/// The response's headers: see [`ProxyExchange::on_response_headers`].
pub fn response_headers<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    exchange: &mut ProxyExchange,
    host: &mut impl Host,
    headers: &[(N, V)],
    end_of_stream: bool,
) -> HeadStep {
    match exchange.on_response_headers(headers, end_of_stream) {
        Ok(head) => {
            let hold = head.hold;
            head.edits.into_iter().for_each(|op| host.edit_response_header(op));
            if hold {
                HeadStep::Hold
            } else {
                HeadStep::Continue
            }
        }
        Err(failed) => {
            fail(host, failed);
            HeadStep::Failed
        }
    }
}

/// Feeds the core a chunk of the node's body (see [`ProxyExchange::on_body`]) and applies the
/// headers it releases; its bytes gather in its output. `Some(whether the headers went out with
/// this feed)`, or `None` when the exchange failed (and the response is being answered or reset).
pub fn feed(exchange: &mut ProxyExchange, host: &mut impl Host, chunk: &[u8], end: bool, flush: bool) -> Option<bool> {
    match exchange.on_body(chunk, end, flush) {
        Ok(Some(edits)) => {
            edits.into_iter().for_each(|op| host.edit_response_header(op));
            Some(true)
        }
        Ok(None) => Some(false),
        Err(failed) => {
            fail(host, failed);
            None
        }
    }
}

/// Hands the core's output to `write` (see [`ProxyExchange::write_output`]); false when the
/// exchange failed (and the response is being reset).
pub fn write_output(exchange: &mut ProxyExchange, host: &mut impl Host, write: impl FnMut(&[u8])) -> bool {
    exchange.write_output(write).map_err(|failed| fail(host, failed)).is_ok()
}

/// Does what the core says a failure calls for.
pub fn fail(host: &mut impl Host, failed: Failed) {
    match failed.failure {
        Failure::Respond(status) => {
            host.warn(&format!("answering {status}: {}", failed.why));
            host.send_reply(status, &[], &[]);
        }
        Failure::Reset => {
            host.warn(&format!("resetting the response: {}", failed.why));
            host.reset();
        }
    }
}

/// Adds what the exchange counted to the proxy's stats, and hands on its stores and its warning:
/// after each hook.
pub fn account(exchange: &mut ProxyExchange, host: &mut impl Host) {
    let (counters, compress_us) = exchange.take_counters();
    for (counter, amount) in counters {
        host.count(counter, amount);
    }
    if let Some(us) = compress_us {
        host.record_compress_us(us);
    }
    for store in exchange.take_stores() {
        host.queue_store(store);
    }
    if let Some(warning) = exchange.take_warning() {
        host.warn(&warning);
    }
}
