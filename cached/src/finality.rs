//! The last finalized block per namespace, polled from each namespace's execution node, and the
//! last finalized slot, from its beacon node.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper::{header, Method, Request};
use hyper_util::rt::TokioIo;
use rpcedge_core::cache;
use tokio::net::TcpStream;

use crate::finality_hold::Hold;

const QUERY: &str = r#"{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["finalized",false]}"#;
/// The finalized block's header, whose slot is the last finalized one (the checkpoint's epoch
/// may start with empty slots): any slot up to it is final.
const BEACON_QUERY: &str = "eth/v1/beacon/headers/finalized";
/// A block header is a few KiB, a receipt at most a few MiB (its logs); a node that sends more is
/// not answering the question.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// A node to ask: `http://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    authority: String,
    path: String,
}

impl std::str::FromStr for Upstream {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
        let (authority, path) = rest.find('/').map_or((rest, "/"), |at| rest.split_at(at));
        if authority.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        Ok(Upstream { authority: authority.to_string(), path: path.to_string() })
    }
}

/// Which chain a node speaks for: its finality is a block number, or a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Chain {
    /// An execution node (JSON-RPC): the finalized block.
    Execution,
    /// A beacon node (Beacon-API): the finalized block's slot.
    Beacon,
}

impl Chain {
    /// As a metric's label names it.
    pub fn name(self) -> &'static str {
        match self {
            Chain::Execution => "execution",
            Chain::Beacon => "beacon",
        }
    }

    /// As the metrics name what is final.
    pub fn finalized_name(self) -> &'static str {
        match self {
            Chain::Execution => "finalized_block",
            Chain::Beacon => "finalized_slot",
        }
    }
}

/// A node that says what is final, with what it last said and when.
struct Source {
    upstream: Upstream,
    /// What it is believed to call finalized (`Hold`), plus one (0: not heard yet).
    heard: AtomicU64,
    /// What it last called finalized, plus one (0: not heard yet).
    said: AtomicU64,
    /// Times it called finalized less than it had before.
    rewinds: AtomicU64,
    hold: Mutex<Hold>,
    /// When it last answered, in milliseconds since the daemon began polling, plus one (0: never).
    answered_ms: AtomicU64,
}

/// One finality source, as [`Finality::sources`] gives it.
pub struct SourceFigures<'a> {
    pub namespace: &'a str,
    pub chain: Chain,
    pub place: usize,
    pub host: &'a str,
    pub answered: bool,
    pub silent_s: u64,
    /// What it last called final, if it has answered.
    pub said: Option<u64>,
    pub rewinds: u64,
}

/// Per namespace and chain, the nodes that say what is final.
pub struct Finality {
    upstreams: HashMap<(String, Chain), Vec<Source>>,
    started: Instant,
    /// The hashes of final blocks the nodes agreed on, which never change.
    hashes: Mutex<KnownHashes>,
    /// The blocks whose hashes are being asked for, each with the answer its askers share.
    asking: Mutex<HashMap<(String, u64), Arc<tokio::sync::OnceCell<Result<String, String>>>>>,
}

/// Block hashes by namespace and number, the oldest forgotten past [`KNOWN_HASHES`]: a bound
/// rather than a policy, since the entries of one block are stored close together (a block, its
/// receipts, its transactions) and a scan asks for each block once.
#[derive(Default)]
struct KnownHashes {
    by_block: HashMap<(String, u64), String>,
    order: VecDeque<(String, u64)>,
}

const KNOWN_HASHES: usize = 4096;

impl KnownHashes {
    fn get(&self, namespace: &str, number: u64) -> Option<&String> {
        self.by_block.get(&(namespace.to_string(), number))
    }

    fn insert(&mut self, namespace: &str, number: u64, hash: String) {
        let block = (namespace.to_string(), number);
        if self.by_block.insert(block.clone(), hash).is_none() {
            self.order.push_back(block);
        }
        while self.order.len() > KNOWN_HASHES {
            if let Some(oldest) = self.order.pop_front() {
                self.by_block.remove(&oldest);
            }
        }
    }
}

impl Finality {
    /// Several nodes for one namespace and chain are several sources, which all have to agree:
    /// what is final is the lowest of what they say. Each is held to what it said over the last
    /// `hold` (`Hold`).
    pub fn new(upstreams: Vec<(String, Chain, Upstream)>, hold: Duration) -> Finality {
        let hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        let mut grouped: HashMap<(String, Chain), Vec<Source>> = HashMap::new();
        for (namespace, chain, upstream) in upstreams {
            let source = Source {
                upstream,
                heard: AtomicU64::new(0),
                said: AtomicU64::new(0),
                rewinds: AtomicU64::new(0),
                hold: Mutex::new(Hold::new(hold_ms)),
                answered_ms: AtomicU64::new(0),
            };
            grouped.entry((namespace, chain)).or_default().push(source);
        }
        Finality { upstreams: grouped, started: Instant::now(), hashes: Mutex::default(), asking: Mutex::default() }
    }

    /// The last finalized block (or slot) of `namespace`: the lowest of what its nodes are
    /// believed to call final, once every one of them has answered. So a node that says too much (misconfigured, on a
    /// minority fork, another backend behind the same address) makes nothing final that its
    /// peers do not call final too; a node that says too little only keeps answers out.
    pub fn finalized(&self, namespace: &str, chain: Chain) -> Option<u64> {
        let sources = self.upstreams.get(&(namespace.to_string(), chain))?;
        let mut said = sources.iter().map(|source| source.heard.load(Ordering::Relaxed).checked_sub(1));
        said.try_fold(u64::MAX, |lowest, said| Some(lowest.min(said?)))
    }

    pub fn namespaces(&self) -> impl Iterator<Item = (&str, Chain, Option<u64>)> {
        self.upstreams.keys().map(|(ns, chain)| (ns.as_str(), *chain, self.finalized(ns, *chain)))
    }

    /// Every source, as the metrics name it: its namespace, chain, place among the namespace's
    /// sources (from 1, as configured) and host (`host:port`: a path or a user may hold a key),
    /// and whether it has answered, with the seconds since it last did (or since the daemon
    /// began asking). A source that stops answering keeps its word, so what is final waits
    /// for it: this is where an operator sees why.
    pub fn sources(&self) -> impl Iterator<Item = SourceFigures<'_>> {
        let now_ms = self.started.elapsed().as_millis() as u64;
        self.upstreams.iter().flat_map(move |((namespace, chain), sources)| {
            sources.iter().enumerate().map(move |(at, source)| {
                let answered_ms = source.answered_ms.load(Ordering::Relaxed).checked_sub(1);
                let authority = &source.upstream.authority;
                SourceFigures {
                    namespace,
                    chain: *chain,
                    place: at + 1,
                    host: authority.rsplit_once('@').map_or(authority.as_str(), |(_, host)| host),
                    answered: answered_ms.is_some(),
                    silent_s: now_ms.saturating_sub(answered_ms.unwrap_or(0)) / 1000,
                    said: source.said.load(Ordering::Relaxed).checked_sub(1),
                    rewinds: source.rewinds.load(Ordering::Relaxed),
                }
            })
        })
    }

    /// Polls every namespace's nodes every `every`, for ever.
    pub async fn poll(self: Arc<Self>, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.poll_once(every).await;
        }
    }

    /// Asks every namespace's nodes once, all at once, each within `timeout`: one that does not
    /// answer holds up no other. A node's word stands until it gives another: a lower one at
    /// once, so a node that lost its finality (a restart, a different backend) keeps answers out
    /// until it has it again, rather than being outvoted by what it said before; a higher one
    /// once held (`Hold`). A node that does not answer keeps its word.
    async fn poll_once(&self, timeout: Duration) {
        let sources = self.upstreams.iter().flat_map(|(key, sources)| sources.iter().map(move |source| (key, source)));
        join_all(sources.map(|((namespace, chain), source)| async move {
            let asked = match chain {
                Chain::Execution => tokio::time::timeout(timeout, finalized_block(&source.upstream)).await,
                Chain::Beacon => tokio::time::timeout(timeout, finalized_slot(&source.upstream)).await,
            };
            let node = &source.upstream.authority;
            match asked {
                Ok(Ok(number)) => {
                    let now_ms = self.started.elapsed().as_millis() as u64;
                    let believed = source.hold.lock().unwrap_or_else(PoisonError::into_inner).hear(now_ms, number);
                    source.heard.store(believed.saturating_add(1), Ordering::Relaxed);
                    let before = source.said.swap(number.saturating_add(1), Ordering::Relaxed);
                    if before > number.saturating_add(1) {
                        source.rewinds.fetch_add(1, Ordering::Relaxed);
                    }
                    source.answered_ms.store(now_ms.saturating_add(1), Ordering::Relaxed);
                }
                Ok(Err(error)) => eprintln!("rpcedge-cached: {chain:?} finality of {namespace} from {node}: {error}"),
                Err(_) => {
                    eprintln!("rpcedge-cached: {chain:?} finality of {namespace} from {node}: no answer within {timeout:?}")
                }
            }
        }))
        .await;
    }

    /// The block of the transaction `hash` (lower case), by the receipts `namespace`'s nodes
    /// give, all asked at once: `Ok(None)` when one names none (unknown, pending, or the receipt
    /// of another one), or when they name different blocks: as for finality, one node's word
    /// places nothing alone.
    pub async fn transaction_block(&self, namespace: &str, hash: &str) -> Result<Option<u64>, String> {
        let sources = self
            .upstreams
            .get(&(namespace.to_string(), Chain::Execution))
            .ok_or_else(|| format!("{namespace}: no finality upstream"))?;
        let query = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": cache::RECEIPT, "params": [hash]}).to_string();
        let mut answers: FuturesUnordered<_> = sources.iter().map(|source| ask(&source.upstream, Some(query.clone()))).collect();
        let mut placed = None;
        // the first that fails, names none or names another block decides, without the rest
        while let Some(answer) = answers.next().await {
            match (cache::receipt_block(&answer?, hash), placed) {
                (None, _) => return Ok(None),
                (Some(block), Some(other)) if block != other => return Ok(None),
                (block, _) => placed = block,
            }
        }
        Ok(placed)
    }

    /// The hash of block `number` (final), by `namespace`'s nodes, all asked at once: an error
    /// when one gives none, does not call the block final in the same answer, or they give
    /// different ones: as for finality, one node's word pins nothing. A final block's hash never
    /// changes, so each is remembered; and the stores of a block's entries (its receipts, its
    /// transactions) that come together share one question and its answer, whatever it is.
    pub async fn block_hash(&self, namespace: &str, number: u64) -> Result<String, String> {
        if let Some(hash) = self.hashes.lock().unwrap_or_else(PoisonError::into_inner).get(namespace, number) {
            return Ok(hash.clone());
        }
        let block = (namespace.to_string(), number);
        let asking = self.asking.lock().unwrap_or_else(PoisonError::into_inner).entry(block.clone()).or_default().clone();
        let answer = asking.get_or_init(|| self.ask_block_hash(namespace, number)).await.clone();
        // answered: the next store of the block takes the remembered hash, or asks again
        let mut all = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
        if all.get(&block).is_some_and(|current| Arc::ptr_eq(current, &asking)) {
            all.remove(&block);
        }
        answer
    }

    async fn ask_block_hash(&self, namespace: &str, number: u64) -> Result<String, String> {
        let sources = self
            .upstreams
            .get(&(namespace.to_string(), Chain::Execution))
            .ok_or_else(|| format!("{namespace}: no finality upstream"))?;
        let query = header_query(number);
        let asked = sources.iter().map(|source| async {
            let answer = ask(&source.upstream, Some(query.clone())).await?;
            final_header_hash(&answer, number).map_err(|why| format!("{}: {why}", source.upstream.authority))
        });
        let mut answers: FuturesUnordered<_> = asked.collect();
        let mut agreed: Option<String> = None;
        while let Some(answer) = answers.next().await {
            match (answer?, &agreed) {
                (hash, Some(other)) if hash != *other => return Err(format!("the nodes give block {number} different hashes")),
                (hash, _) => agreed = Some(hash),
            }
        }
        let hash = agreed.ok_or_else(|| format!("{namespace}: no finality upstream"))?;
        self.hashes.lock().unwrap_or_else(PoisonError::into_inner).insert(namespace, number, hash.clone());
        Ok(hash)
    }
}

/// The finalized block and block `number`, in one batch: behind a load balancer, two requests
/// may reach two backends, one of them behind or on another fork; one batch reaches one.
fn header_query(number: u64) -> String {
    let header = |id: u64, block: String| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "eth_getBlockByNumber", "params": [block, false]});
    serde_json::json!([header(1, "finalized".into()), header(2, format!("{number:#x}"))]).to_string()
}

/// Block `number`'s hash (lower case) from the answer to [`header_query`], where the same answer
/// calls it final; why not, otherwise (a node must take a batch).
fn final_header_hash(body: &[u8], number: u64) -> Result<String, String> {
    let answers: Vec<serde_json::Value> = serde_json::from_slice(body)
        .map_err(|_| format!("no batch's answer: {}", String::from_utf8_lossy(&body[..body.len().min(200)])))?;
    let by_id = |id: u64| {
        let answer = answers.iter().find(|answer| answer.get("id").and_then(|id| id.as_u64()) == Some(id));
        answer.ok_or_else(|| format!("no answer of id {id} in the batch's"))
    };
    let finalized = number_of(by_id(1)?)?;
    if finalized < number {
        return Err(format!("calls block {finalized} final, not {number}"));
    }
    let header = by_id(2)?;
    let hash = header.pointer("/result/hash").and_then(|hash| hash.as_str()).filter(|hash| cache::is_hash_hex(hash));
    match (number_of(header)?, hash) {
        (at, Some(hash)) if at == number => Ok(hash.to_ascii_lowercase()),
        _ => Err(format!("no hash of block {number}")),
    }
}

async fn finalized_block(upstream: &Upstream) -> Result<u64, String> {
    block_number(&ask(upstream, Some(QUERY.to_string())).await?)
}

async fn finalized_slot(upstream: &Upstream) -> Result<u64, String> {
    let path = format!("{}/{BEACON_QUERY}", upstream.path.trim_end_matches('/'));
    header_slot(&ask(&Upstream { path, ..upstream.clone() }, None).await?)
}

/// A JSON-RPC call (`query`) to `upstream`, or a GET of it: its answer's body.
async fn ask(upstream: &Upstream, query: Option<String>) -> Result<Bytes, String> {
    let stream = TcpStream::connect(&upstream.authority).await.map_err(|e| format!("{}: {e}", upstream.authority))?;
    let (mut sender, connection) =
        http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    let (method, body) = match query {
        Some(query) => (Method::POST, Bytes::from(query)),
        None => (Method::GET, Bytes::new()),
    };
    let request = Request::builder()
        .method(method)
        .uri(&upstream.path)
        .header(header::HOST, &upstream.authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    Ok(Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| e.to_string())?.to_bytes())
}

/// `result.number` of an `eth_getBlockByNumber` answer.
fn block_number(body: &[u8]) -> Result<u64, String> {
    let answer: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    number_of(&answer).map_err(|e| format!("{e} in {}", String::from_utf8_lossy(&body[..body.len().min(200)])))
}

/// `result.number` of an `eth_getBlockByNumber` answer, read.
fn number_of(answer: &serde_json::Value) -> Result<u64, String> {
    let number = answer
        .pointer("/result/number")
        .and_then(|n| n.as_str())
        .ok_or("no result.number")?;
    let digits = number.strip_prefix("0x").ok_or_else(|| format!("{number:?} is not a hex quantity"))?;
    u64::from_str_radix(digits, 16).map_err(|_| format!("{number:?} is not a hex quantity"))
}

/// `data.header.message.slot` of a Beacon-API block header answer (a decimal string).
fn header_slot(body: &[u8]) -> Result<u64, String> {
    let answer: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let slot = answer
        .pointer("/data/header/message/slot")
        .and_then(|n| n.as_str())
        .ok_or_else(|| format!("no data.header.message.slot in {}", String::from_utf8_lossy(&body[..body.len().min(200)])))?;
    slot.parse().map_err(|_| format!("{slot:?} is not a slot"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_is_an_http_url() {
        let upstream: Upstream = "http://127.0.0.1:18545/mainnet".parse().unwrap();
        assert_eq!(upstream, Upstream { authority: "127.0.0.1:18545".into(), path: "/mainnet".into() });
        let bare: Upstream = "http://node:8545".parse().unwrap();
        assert_eq!(bare.path, "/");
        assert!("https://node".parse::<Upstream>().is_err());
        assert!("http:///x".parse::<Upstream>().is_err());
    }

    #[test]
    fn the_number_comes_from_the_result() {
        assert_eq!(block_number(br#"{"jsonrpc":"2.0","id":1,"result":{"number":"0x10","hash":"0x1"}}"#), Ok(16));
        assert!(block_number(br#"{"jsonrpc":"2.0","id":1,"result":null}"#).is_err());
        assert!(block_number(br#"{"jsonrpc":"2.0","id":1,"result":{"number":"16"}}"#).is_err());
        assert!(block_number(b"<html>").is_err());
    }

    #[test]
    fn the_slot_comes_from_the_finalized_header() {
        let answer = br#"{"execution_optimistic":false,"finalized":true,"data":{"root":"0x1","canonical":true,
            "header":{"message":{"slot":"348241","proposer_index":"1"},"signature":"0x2"}}}"#;
        assert_eq!(header_slot(answer), Ok(348_241));
        assert!(header_slot(br#"{"data":{"header":{"message":{"slot":348241}}}}"#).is_err());
        assert!(header_slot(br#"{"code":404,"message":"not found"}"#).is_err());
    }

    /// A node at a local port answering each connection's request with the next of `numbers`
    /// as its finalized block.
    fn node_saying(numbers: Vec<u64>) -> Upstream {
        node_answering(numbers.into_iter().map(|n| format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"number":"{n:#x}"}}}}"#)))
    }

    /// A node at a local port answering each connection's JSON-RPC call with the next of `bodies`.
    fn node_answering(bodies: impl Iterator<Item = String> + Send + 'static) -> Upstream {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        std::thread::spawn(move || {
            for body in bodies {
                let (mut stream, _) = listener.accept().unwrap();
                // the whole request (its JSON body ends it), so that closing sends no reset
                let (mut request, mut chunk) = (Vec::new(), [0; 4096]);
                while !request.ends_with(b"}") && !request.ends_with(b"]") {
                    let n = stream.read(&mut chunk).unwrap();
                    assert!(n > 0, "the request ended early");
                    request.extend_from_slice(&chunk[..n]);
                }
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                stream.write_all((head + &body).as_bytes()).unwrap();
            }
        });
        upstream
    }

    #[tokio::test]
    async fn finality_is_unknown_until_heard_and_follows_the_nodes_last_answer() {
        let node = node_saying(vec![100, 50, 120]);
        let unheard = "http://127.0.0.1:1/".parse().unwrap();
        let finality = Finality::new(vec![("a".into(), Chain::Execution, node), ("a".into(), Chain::Beacon, unheard)], NO_HOLD);
        assert_eq!(finality.finalized("a", Chain::Execution), None);
        let mut heard = Vec::new();
        for _ in 0..3 {
            finality.poll_once(Duration::from_secs(5)).await;
            heard.push(finality.finalized("a", Chain::Execution));
        }
        assert_eq!(heard, [Some(100), Some(50), Some(120)], "a lower answer is believed: it only keeps answers out");
        assert_eq!(finality.finalized("other", Chain::Execution), None);
        assert_eq!(finality.finalized("a", Chain::Beacon), None, "a slot is not a block number");
    }

    const NO_HOLD: Duration = Duration::ZERO;

    #[tokio::test]
    async fn a_lone_node_that_jumps_and_takes_it_back_within_the_hold_is_never_believed() {
        let node = node_saying(vec![100, 1_100, 1_100, 100, 101]);
        let finality = Finality::new(sources(vec![node]), Duration::from_secs(3600));
        let mut believed = Vec::new();
        for _ in 0..5 {
            finality.poll_once(Duration::from_secs(5)).await;
            let source = finality.sources().next().unwrap();
            believed.push((finality.finalized("a", Chain::Execution), source.said, source.rewinds));
        }
        assert_eq!(
            believed,
            [
                (Some(100), Some(100), 0),
                (Some(100), Some(1_100), 0),
                (Some(100), Some(1_100), 0),
                (Some(100), Some(100), 1),
                (Some(100), Some(101), 1),
            ],
            "(final, the node's word, its rewinds)"
        );
    }

    /// `nodes` as the execution sources of namespace "a".
    fn sources(nodes: Vec<Upstream>) -> Vec<(String, Chain, Upstream)> {
        nodes.into_iter().map(|node| ("a".to_string(), Chain::Execution, node)).collect()
    }

    #[tokio::test]
    async fn a_node_that_says_too_much_is_held_to_its_peers() {
        let honest = node_saying(vec![100, 101]);
        let lying = node_saying(vec![900, 901]);
        let finality = Finality::new(sources(vec![lying, honest]), NO_HOLD);
        finality.poll_once(Duration::from_secs(5)).await;
        assert_eq!(finality.finalized("a", Chain::Execution), Some(100), "the lowest of what the nodes say");
        finality.poll_once(Duration::from_secs(5)).await;
        assert_eq!(finality.finalized("a", Chain::Execution), Some(101));

        // a source never heard makes nothing final, whatever the others say
        let silent = "http://127.0.0.1:1/".parse().unwrap();
        let finality = Finality::new(sources(vec![node_saying(vec![900]), silent]), NO_HOLD);
        finality.poll_once(Duration::from_secs(5)).await;
        assert_eq!(finality.finalized("a", Chain::Execution), None);
    }

    /// A node at a local port that takes every connection and never answers.
    fn node_hanging() -> Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        std::thread::spawn(move || listener.incoming().collect::<Vec<_>>());
        upstream
    }

    #[tokio::test]
    async fn a_node_that_does_not_answer_holds_up_no_other_and_shows_how_long_it_has_been_silent() {
        // asked one after the other, the second would wait out the first's minute
        let finality = Arc::new(Finality::new(sources(vec![node_hanging(), node_saying(vec![100])]), NO_HOLD));
        let polling = tokio::spawn({
            let finality = finality.clone();
            async move { finality.poll_once(Duration::from_secs(60)).await }
        });
        let answered = || finality.sources().map(|source| (source.place, source.answered)).collect::<Vec<_>>();
        let heard = tokio::time::timeout(Duration::from_secs(10), async {
            while !answered()[1].1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        heard.await.expect("the answering node heard while the other one hangs");
        assert!(!polling.is_finished(), "the other one still hangs");
        assert_eq!(answered(), [(1, false), (2, true)]);
        assert_eq!(finality.finalized("a", Chain::Execution), None, "what is final waits for every source");
        polling.abort();
    }

    #[tokio::test]
    async fn a_blocks_hash_is_the_one_every_node_gives_it_where_it_calls_it_final_and_is_asked_for_once() {
        const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";
        // the finalized block and the one asked for, in one batch's answer
        let headers = |finalized: u64, number: u64, hash: &str| {
            format!(
                r#"[{{"jsonrpc":"2.0","id":2,"result":{{"number":"{number:#x}","hash":"{hash}"}}}},{{"jsonrpc":"2.0","id":1,"result":{{"number":"{finalized:#x}"}}}}]"#
            )
        };
        let node = |number: u64, hash: &str| node_answering([headers(7, number, hash)].into_iter());
        let upper = HASH.to_ascii_uppercase().replace("0X", "0x");
        let agree = Finality::new(sources(vec![node(7, HASH), node(7, &upper)]), NO_HOLD);
        assert_eq!(agree.block_hash("a", 7).await, Ok(HASH.to_string()));
        // each node answers one connection: a second ask would fail
        assert_eq!(agree.block_hash("a", 7).await, Ok(HASH.to_string()), "known");
        assert!(agree.block_hash("a", 6).await.is_err(), "not known: asked again");
        let refused = |finality: Finality| async move { finality.block_hash("a", 7).await.unwrap_err() };
        let other = HASH.replace("88", "11");
        let differ = refused(Finality::new(sources(vec![node(7, HASH), node(7, &other)]), NO_HOLD)).await;
        assert_eq!(differ, "the nodes give block 7 different hashes", "one node's word pins nothing");
        let another_block = refused(Finality::new(sources(vec![node(8, HASH)]), NO_HOLD)).await;
        assert!(another_block.ends_with("no hash of block 7"), "{another_block}");
        let behind = refused(Finality::new(sources(vec![node_answering([headers(6, 7, HASH)].into_iter())]), NO_HOLD)).await;
        assert!(behind.ends_with("calls block 6 final, not 7"), "the backend that answered: {behind}");
        let no_batch = refused(Finality::new(sources(vec![node_saying(vec![7])]), NO_HOLD)).await;
        assert!(no_batch.contains("no batch's answer"), "{no_batch}");
        assert!(agree.block_hash("b", 7).await.is_err(), "no node for that namespace");

        // the stores of one block's entries at once: one question, its answer for all
        let asked_at_once = |node: Upstream| async move {
            let once = Arc::new(Finality::new(sources(vec![node]), NO_HOLD));
            let asking: Vec<_> = (0..20)
                .map(|_| tokio::spawn({
                    let once = once.clone();
                    async move { once.block_hash("a", 7).await }
                }))
                .collect();
            let mut answers = Vec::new();
            for asked in asking {
                answers.push(asked.await.unwrap());
            }
            answers
        };
        assert!(asked_at_once(node(7, HASH)).await.iter().all(|answer| *answer == Ok(HASH.to_string())));
        // and a failure, shared too: the node answers once, after which it refuses connections
        let answers = asked_at_once(node_answering([headers(6, 7, HASH)].into_iter())).await;
        assert!(answers.iter().all(|answer| answer.as_ref().is_err_and(|why| why.ends_with("calls block 6 final, not 7"))), "{answers:?}");
    }

    #[test]
    fn known_hashes_keep_the_newest() {
        let mut known = KnownHashes::default();
        for number in 0..=KNOWN_HASHES as u64 {
            known.insert("a", number, format!("{number}"));
        }
        assert_eq!(known.get("a", 0), None);
        assert_eq!(known.get("a", 1).map(String::as_str), Some("1"));
        assert_eq!((known.by_block.len(), known.order.len()), (KNOWN_HASHES, KNOWN_HASHES));
    }

    #[tokio::test]
    async fn a_transaction_is_placed_only_where_every_node_names_the_same_block() {
        const HASH: &str = "0xab";
        let receipt = |block: u64| format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"transactionHash":"{HASH}","blockNumber":"{block:#x}"}}}}"#);
        let agree = Finality::new(sources(vec![node_answering([receipt(7)].into_iter()), node_answering([receipt(7)].into_iter())]), NO_HOLD);
        assert_eq!(agree.transaction_block("a", HASH).await, Ok(Some(7)));
        let differ = Finality::new(sources(vec![node_answering([receipt(7)].into_iter()), node_answering([receipt(3)].into_iter())]), NO_HOLD);
        assert_eq!(differ.transaction_block("a", HASH).await, Ok(None), "one node's word places nothing");
        assert!(differ.transaction_block("b", HASH).await.is_err(), "no node for that namespace");
    }
}
