//! The HTTP/1.1 side: routes, JSON-RPC answers, and the connection plumbing that lets a
//! response abort its own connection.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use rpcedge_corpus::beacon::BeaconRoutes;
use rpcedge_corpus::corpus::{Corpus, RecordingTable};
use crate::delivery::{AbortSignal, Delivery, Mode, ReplayBody};
use crate::generated::{self, WitnessMaker};
use crate::hashes::Hashes;
use crate::head::{self, Heads, Tag};
use rpcedge_corpus::json::{self, Json};
use rpcedge_corpus::rpc::{self, RequestKey};

/// Request bodies larger than this are refused (413); recorded requests are a few KiB.
const MAX_REQUEST_BODY: usize = 16 * 1024 * 1024;

pub struct State {
    pub corpus: Corpus,
    pub defaults: Delivery,
    pub heads: Heads,
    /// Block hashes the recordings name, for headers asked for by number that none answers.
    pub hashes: Hashes,
    pub beacon: BeaconRoutes,
    /// Witnesses made up at any size; `None` without loaded ones to take the proportions from.
    pub witnesses: Option<Arc<WitnessMaker>>,
    /// JSON-RPC requests answered, so that tests can tell what reached the "node".
    pub rpc_requests: AtomicU64,
    /// The calls in them (a batch counts each of its members).
    pub rpc_calls: AtomicU64,
    /// Beacon-API requests answered, likewise.
    pub beacon_requests: AtomicU64,
    /// JSON-RPC answers sent gzip (`--gzip-when-asked`).
    pub gzip_answers: AtomicU64,
}

/// Accepts connections until the process ends.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Typically out of file descriptors: back off instead of spinning.
                eprintln!("rpcedge-replay: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Small answers must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let abort = AbortSignal::default();
            let io = TokioIo::new(AbortableStream {
                stream,
                abort: abort.clone(),
            });
            let service = service_fn(move |request| {
                let state = state.clone();
                let abort = abort.clone();
                async move { Ok::<_, Infallible>(handle(request, &state, &abort).await) }
            });
            // Errors here are clients going away or deliberate aborts: nothing to report.
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(io, service)
                .await;
        });
    }
}

/// A refusal: status and a plain-text reason.
struct Refusal(StatusCode, String);

async fn handle(
    request: Request<Incoming>,
    state: &State,
    abort: &AbortSignal,
) -> Response<ReplayBody> {
    match route(request, state, abort).await {
        Ok(response) => response,
        Err(Refusal(status, reason)) => plain_text(status, format!("rpcedge-replay: {reason}\n")),
    }
}

async fn route(
    request: Request<Incoming>,
    state: &State,
    abort: &AbortSignal,
) -> Result<Response<ReplayBody>, Refusal> {
    let path = request.uri().path();
    let method = request.method();
    let read_only = method == Method::GET || method == Method::HEAD;
    if path == "/healthz" {
        return if read_only {
            Ok(plain_text(StatusCode::OK, "ok".to_string()))
        } else {
            Err(method_not_allowed(method))
        };
    }
    if path == "/stats" {
        return if read_only {
            let requests = state.rpc_requests.load(Ordering::Relaxed);
            let calls = state.rpc_calls.load(Ordering::Relaxed);
            let beacon = state.beacon_requests.load(Ordering::Relaxed);
            let gzip = state.gzip_answers.load(Ordering::Relaxed);
            Ok(json_text(format!(
                "{{\"rpc_requests\":{requests},\"rpc_calls\":{calls},\"beacon_requests\":{beacon},\"gzip_answers\":{gzip}}}\n"
            )))
        } else {
            Err(method_not_allowed(method))
        };
    }
    if let Some(setting) = path.strip_prefix("/head/") {
        if method != Method::PUT {
            return Err(method_not_allowed(method));
        }
        let (network, tag) = setting
            .split_once('/')
            .and_then(|(network, tag)| Some((network, Tag::parse(tag)?)))
            .ok_or_else(|| Refusal(StatusCode::NOT_FOUND, "PUT /head/<network>/latest|finalized".into()))?;
        let network = network.to_string();
        let body = read_body(request).await?;
        let number = std::str::from_utf8(&body)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or_else(|| Refusal(StatusCode::BAD_REQUEST, "the body is a block number".into()))?;
        state.heads.set(&network, tag, number);
        return Ok(plain_text(StatusCode::OK, format!("{number}\n")));
    }
    if let Some(relative) = path.strip_prefix("/corpus/") {
        if !read_only {
            return Err(method_not_allowed(method));
        }
        let index = pair_index(request.uri().query())?;
        let recording = state.corpus.pair(relative, index).ok_or_else(|| {
            Refusal(
                StatusCode::NOT_FOUND,
                format!("no pair {index} in {relative}"),
            )
        })?;
        let delivery = delivery_for(state, &request)?;
        let head = method == Method::HEAD;
        return Ok(deliver(
            recording.template.recorded_body(),
            &delivery,
            Some(&recording.origin),
            &[],
            head,
            abort,
        ));
    }
    if path == "/eth/v1/beacon/headers/finalized" && read_only {
        state.beacon_requests.fetch_add(1, Ordering::Relaxed);
        let header = state.heads.beacon_finalized().ok_or_else(|| {
            Refusal(StatusCode::NOT_FOUND, format!("no finalized slot: PUT /head/{}/finalized", head::BEACON))
        })?;
        return Ok(json_text(String::from_utf8(header).expect("ASCII")));
    }
    // (the routes without an id name their case in the query)
    let target = request.uri().path_and_query().map_or(path, |target| target.as_str());
    if BeaconRoutes::handles(target) && read_only {
        state.beacon_requests.fetch_add(1, Ordering::Relaxed);
        let answer = state.beacon.answer(target).map_err(|reason| Refusal(StatusCode::NOT_FOUND, reason))?;
        let delivery = delivery_for(state, &request)?;
        let ssz = delivery.ssz && accepts_ssz(request.headers());
        let (body, content_type) = if ssz {
            (answer.ssz.clone(), "application/octet-stream")
        } else {
            (answer.json.clone(), "application/json")
        };
        let mut own = vec![(header::CONTENT_TYPE, HeaderValue::from_static(content_type))];
        if let Some(version) = answer.version.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            own.push((HeaderName::from_static("eth-consensus-version"), version));
        }
        return Ok(deliver(vec![body], &delivery, None, &own, method == Method::HEAD, abort));
    }
    if method != Method::POST {
        return Err(method_not_allowed(method));
    }
    if path == "/generated/witness" {
        return generated_witness(request, state, abort).await;
    }
    let network = path.trim_matches('/').to_string();
    // A network with a head set and no recordings answers only for its head.
    let none = RecordingTable::new();
    let table = match recordings_for_path(&state.corpus, path) {
        Err(_) if state.heads.knows(&network) => &none,
        table => table?,
    };
    let delivery = delivery_for(state, &request)?;
    let gzip = delivery.gzip_when_asked && accepts_gzip(request.headers());
    let body = read_body(request).await?;
    state.rpc_requests.fetch_add(1, Ordering::Relaxed);
    let (segments, origin, calls) = answer(table, state, &network, &body);
    state.rpc_calls.fetch_add(calls, Ordering::Relaxed);
    if !delivery.call_delay.is_zero() {
        tokio::time::sleep(delivery.call_delay * u32::try_from(calls).unwrap_or(u32::MAX)).await;
    }
    if gzip {
        state.gzip_answers.fetch_add(1, Ordering::Relaxed);
        return Ok(deliver_gzip(&segments, &delivery, origin, abort));
    }
    Ok(deliver(segments, &delivery, origin, &[], false, abort))
}

/// Whether a request's Accept-Encoding names gzip, as geth reads it (a substring, q-values
/// ignored).
fn accepts_gzip(headers: &hyper::HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().any(|value| value.as_bytes().windows(4).any(|w| w == b"gzip"))
}

/// An answer gzipped whole and sent chunked, without a length, as geth's gzip handler does.
fn deliver_gzip(segments: &[Bytes], delivery: &Delivery, origin: Option<&str>, abort: &AbortSignal) -> Response<ReplayBody> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for segment in segments {
        encoder.write_all(segment).expect("writing to memory");
    }
    let gzipped = Bytes::from(encoder.finish().expect("writing to memory"));
    let chunked = Delivery { mode: Mode::Chunked, ..delivery.clone() };
    let own = [
        (header::CONTENT_ENCODING, HeaderValue::from_static("gzip")),
        (header::VARY, HeaderValue::from_static("Accept-Encoding")),
    ];
    deliver(vec![gzipped], &chunked, origin, &own, false, abort)
}

/// `POST /generated/witness?bytes=N`: a made-up witness of N bytes of content, as the answer to
/// the call in the body (its id).
async fn generated_witness(
    request: Request<Incoming>,
    state: &State,
    abort: &AbortSignal,
) -> Result<Response<ReplayBody>, Refusal> {
    let maker = state.witnesses.clone().ok_or_else(|| {
        Refusal(StatusCode::NOT_FOUND, "no witnesses were loaded to take the proportions from".into())
    })?;
    let bytes = request
        .uri()
        .query()
        .and_then(|query| query.split('&').find_map(|pair| pair.strip_prefix("bytes=")))
        .and_then(|bytes| bytes.parse::<u64>().ok())
        .filter(|&bytes| bytes <= generated::MAX_BYTES)
        .ok_or_else(|| Refusal(StatusCode::BAD_REQUEST, format!("bytes=N, N up to {}", generated::MAX_BYTES)))?;
    let delivery = delivery_for(state, &request)?;
    let body = read_body(request).await?;
    let call = std::str::from_utf8(&body).ok().and_then(|text| json::parse(text).ok());
    let mut id = Vec::new();
    match call.as_ref().and_then(|call| call.get("id")) {
        Some(value) => value.write_compact(&mut id),
        None => id.extend_from_slice(b"null"),
    }
    state.rpc_requests.fetch_add(1, Ordering::Relaxed);
    state.rpc_calls.fetch_add(1, Ordering::Relaxed);
    let result = tokio::task::spawn_blocking(move || maker.result(bytes))
        .await
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, format!("making the witness: {e}")))?;
    Ok(deliver(generated::response(&id, result), &delivery, None, &[], false, abort))
}

/// `/` means every network, `/<network>` that network's recordings only.
fn recordings_for_path<'c>(corpus: &'c Corpus, path: &str) -> Result<&'c RecordingTable, Refusal> {
    let network = path.trim_matches('/');
    if network.is_empty() {
        return Ok(corpus.all());
    }
    corpus.network(network).ok_or_else(|| {
        let known = corpus.network_names().join(", ");
        Refusal(
            StatusCode::NOT_FOUND,
            format!("no recordings for network {network:?} (known: {known})"),
        )
    })
}

/// Whether an Accept header names SSZ (`application/octet-stream`) with a q above 0.
fn accepts_ssz(headers: &header::HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|value| value.to_str().ok()).flat_map(|value| value.split(',')).any(|item| {
        let mut parts = item.split(';').map(str::trim);
        let refused = |param: &str| param.strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()) == Some(0.0);
        parts.next().is_some_and(|media| media.eq_ignore_ascii_case("application/octet-stream")) && !parts.any(refused)
    })
}

fn delivery_for<B>(state: &State, request: &Request<B>) -> Result<Delivery, Refusal> {
    state
        .defaults
        .for_request(request.headers())
        .map_err(|reason| Refusal(StatusCode::BAD_REQUEST, reason))
}

fn pair_index(query: Option<&str>) -> Result<usize, Refusal> {
    let pair = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|param| param.strip_prefix("pair="));
    match pair {
        None => Ok(0),
        Some(text) => text.parse().map_err(|_| {
            Refusal(
                StatusCode::BAD_REQUEST,
                format!("pair: expected a number, got {text:?}"),
            )
        }),
    }
}

fn method_not_allowed(method: &Method) -> Refusal {
    Refusal(StatusCode::METHOD_NOT_ALLOWED, format!("{method} not allowed here (POST /<network> for JSON-RPC, GET /corpus/<path>, GET /eth/... Beacon-API routes, GET /healthz, GET /stats, PUT /head/<network>/<tag>)"))
}

async fn read_body(request: Request<Incoming>) -> Result<Bytes, Refusal> {
    match Limited::new(request.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_REQUEST_BODY} bytes"),
        )),
        Err(error) => Err(Refusal(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {error}"),
        )),
    }
}

/// The body segments for a JSON-RPC request, which recording they come from, if any, and how
/// many calls the request made (a batch's members; 1 otherwise).
fn answer<'t>(
    table: &'t RecordingTable,
    state: &State,
    network: &str,
    body: &[u8],
) -> (Vec<Bytes>, Option<&'t str>, u64) {
    let parsed = std::str::from_utf8(body)
        .map_err(|e| json::ParseError {
            offset: e.valid_up_to(),
            reason: "invalid UTF-8",
        })
        .and_then(json::parse);
    let request = match parsed {
        Ok(request) => request,
        Err(error) => return (vec![Bytes::from(rpc::parse_error_answer(&error))], None, 1),
    };
    let key = RequestKey::of(&request);
    let recorded = table.get(&key);
    let calls = match &request {
        Json::Array(members) => members.len() as u64,
        _ => 1,
    };
    if let (Json::Array(members), None) = (&request, recorded) {
        if !members.is_empty() {
            // Not recorded whole: each call from its own recording, in one array, as a node answers.
            return (rpc::batch_answer(members, |call| call_answer(table, state, network, call)), None, calls);
        }
    }
    if let Some(head) = state.heads.answer(network, &request) {
        return (vec![Bytes::from(head)], None, calls);
    }
    match recorded {
        Some(recording) => (
            recording.template.live_body(&rpc::live_ids(&request)),
            Some(&recording.origin),
            calls,
        ),
        None => {
            let answer = state.hashes.answer(network, &request).unwrap_or_else(|| rpc::no_recording_answer(&request));
            (vec![Bytes::from(answer)], None, calls)
        }
    }
}

/// A single call's answer with its id: the head's block for a set tag, else its recording, else
/// a header by number the recordings name.
fn call_answer(table: &RecordingTable, state: &State, network: &str, call: &Json) -> Option<Vec<Bytes>> {
    if let Some(head) = state.heads.answer(network, call) {
        return Some(vec![Bytes::from(head)]);
    }
    match table.get(&RequestKey::of(call)) {
        Some(recording) => Some(recording.template.live_body(&rpc::live_ids(call))),
        None => Some(vec![Bytes::from(state.hashes.answer(network, call)?)]),
    }
}

/// `own`: the route's headers, replacing the defaults (requested headers replace them in turn).
fn deliver(
    segments: Vec<Bytes>,
    delivery: &Delivery,
    origin: Option<&str>,
    own: &[(HeaderName, HeaderValue)],
    head: bool,
    abort: &AbortSignal,
) -> Response<ReplayBody> {
    let has_body = delivery.status_has_body();
    let length: u64 = segments.iter().map(|segment| segment.len() as u64).sum();
    let mut response = Response::new(if head || !has_body {
        ReplayBody::empty(delivery.mode)
    } else {
        ReplayBody::new(segments, delivery, abort)
    });
    *response.status_mut() = delivery.status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in own {
        headers.insert(name, value.clone());
    }
    if has_body && delivery.mode == Mode::Length {
        // Explicit, so that HEAD announces the same length as GET.
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    if delivery.flush {
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
    if let Some(origin) = origin.and_then(|origin| HeaderValue::from_str(origin).ok()) {
        headers.insert("x-replay-recording", origin);
    }
    // Requested headers replace the replay's own of the same name; repeats add up.
    for (name, _) in &delivery.extra_headers {
        headers.remove(name);
    }
    for (name, value) in &delivery.extra_headers {
        headers.append(name, value.clone());
    }
    response
}

fn json_text(text: String) -> Response<ReplayBody> {
    let mut response = Response::new(ReplayBody::whole(Bytes::from(text)));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn plain_text(status: StatusCode, text: String) -> Response<ReplayBody> {
    let mut response = Response::new(ReplayBody::whole(Bytes::from(text)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The connection's socket, aborted (RST, via `SO_LINGER` 0) at the first flush after a
/// response body raised the abort signal. Hyper only flushes the socket once its own buffer
/// is written out, so every byte the body yielded before the signal reaches the client.
struct AbortableStream {
    stream: TcpStream,
    abort: AbortSignal,
}

impl AsyncRead for AbortableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AbortableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.abort.load(Ordering::Acquire) {
            // Dropping the stream now closes it with a reset instead of a FIN.
            let _ = this.stream.set_zero_linger();
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "X-Replay-Reset-After",
            )));
        }
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
