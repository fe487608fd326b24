//! rpcedge-replay: an Ethereum JSON-RPC "node" that answers with recorded real responses.
//! See README.md for the command line, the routes and the `X-Replay-*` headers.

use rpcedge_corpus::{beacon, cache, corpus};
use rpcedge_replay::{delivery, generated, head, server};
use rpcedge_replay::hashes::Hashes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::net::TcpSocket;
use tokio::signal::unix::{signal, SignalKind};

use cache::Cache;
use corpus::Corpus;
use delivery::{Delivery, Mode};

/// Serve recorded Ethereum JSON-RPC responses over HTTP/1.1.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18545")]
    listen: SocketAddr,
    /// Corpus directory (the `rpc/` folder of a corpus, or your own recordings) [default:
    /// ../shared/corpus/rpc where it exists, else the repository's sample, corpus-sample/rpc].
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Keep the parsed recordings here, so that the next start skips decompressing and
    /// parsing (entries follow the recordings' size and mtime; delete the directory freely).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Worker threads of the server runtime.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Body framing: Content-Length or chunked (request header X-Replay-Mode).
    #[arg(long, value_enum, default_value_t = Mode::Length)]
    mode: Mode,
    /// Body frame size in bytes [default: 16384 in chunked mode, whole segments in length
    /// mode] (request header X-Replay-Chunk-Size).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    chunk_size: Option<u64>,
    /// Pause between body frames, in milliseconds (request header X-Replay-Chunk-Delay-Ms).
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Send `X-Accel-Buffering: no` so nginx forwards every chunk at once (request header
    /// X-Replay-Flush: 1).
    #[arg(long)]
    flush: bool,
    /// Answer `eth_getBlockByNumber("finalized")` on /<network> with this block, as
    /// NETWORK=NUMBER; repeat per network (tests move it with PUT /head/<network>/finalized).
    /// `beacon=SLOT`: the finalized slot `GET /eth/v1/beacon/headers/finalized` answers with.
    #[arg(long, value_parser = head::parse_setting)]
    finalized: Vec<(String, u64)>,
    /// The same for `latest`.
    #[arg(long, value_parser = head::parse_setting)]
    latest: Vec<(String, u64)>,
    /// Answer `eth_getBlockByNumber(N, false)` on /<network>, where no recording answers it,
    /// with block N's number and hash as the recordings under this directory name them
    /// [default: the --corpus ones].
    #[arg(long)]
    hashes_from: Option<PathBuf>,
    /// Execution witnesses to answer `debug_executionWitness` with (ethrex-replay's
    /// `cache_<network>_<block>.json`); skipped when the directory does not exist [default:
    /// witness/ethrex-replay of the corpus that --corpus defaults to].
    #[arg(long)]
    witnesses: Option<PathBuf>,
    /// The SSZ examples that the Beacon-API routes answer from (ssz_static cases and real
    /// objects) [default: ssz/ of the corpus that --corpus defaults to].
    #[arg(long)]
    ssz_dir: Option<PathBuf>,
    /// Answer Beacon-API requests in SSZ when their Accept asks for it; by default always JSON
    /// (request header X-Replay-Ssz: 1|0).
    #[arg(long)]
    ssz: bool,
    /// Time each JSON-RPC call takes, in milliseconds, as a real node's work; a batch's calls
    /// one after another (request header X-Replay-Call-Delay-Ms).
    #[arg(long, default_value_t = 0)]
    call_delay_ms: u64,
    /// Gzip JSON-RPC answers for requests that accept gzip, chunked, as geth and erigon do
    /// (counted as `gzip_answers` in GET /stats).
    #[arg(long)]
    gzip_when_asked: bool,
}

/// The shared corpus beside the repository where it is there (tests and benchmarks), else the
/// sample that ships inside it (a clone on its own, the Docker image), relative to the current
/// directory as run from the repository's root.
fn default_corpus_root() -> PathBuf {
    let shared = PathBuf::from("../shared/corpus");
    if shared.is_dir() {
        shared
    } else {
        PathBuf::from("corpus-sample")
    }
}

/// Live requests are parsed recursively (up to the parser's nesting bound).
const WORKER_STACK: usize = 8 * 1024 * 1024;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.into())
        .thread_stack_size(WORKER_STACK)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => Err(format!("cannot start the runtime: {error}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rpcedge-replay: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    // Bind before the long load so that a busy address fails at once, but listen only after
    // it: until then connections are refused rather than left waiting.
    let socket = if cli.listen.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    };
    let socket = socket.map_err(|e| format!("cannot create a socket: {e}"))?;
    socket
        .set_reuseaddr(true)
        .map_err(|e| format!("cannot set SO_REUSEADDR: {e}"))?;
    socket
        .bind(cli.listen)
        .map_err(|e| format!("cannot bind {}: {e}", cli.listen))?;

    let root = default_corpus_root();
    let corpus_path = cli.corpus.unwrap_or_else(|| root.join("rpc"));
    let witness_dir = cli.witnesses.unwrap_or_else(|| root.join("witness/ethrex-replay"));
    let ssz_dir = cli.ssz_dir.unwrap_or_else(|| root.join("ssz"));

    let started = Instant::now();
    let corpus_dir = corpus_path.clone();
    let loader_threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let cache = cli.cache_dir.clone().map(Cache::new);
    let hashes_from = cli.hashes_from.clone();
    let (corpus, hashes) = tokio::task::spawn_blocking(move || {
        let mut corpus = Corpus::load(&corpus_dir, loader_threads, cache.as_ref())?;
        if witness_dir.is_dir() {
            corpus.add_witnesses(&witness_dir)?;
        }
        let hashes = match hashes_from {
            Some(dir) => Hashes::of(&Corpus::load(&dir, loader_threads, cache.as_ref())?),
            None => Hashes::of(&corpus),
        };
        Ok::<_, String>((corpus, hashes))
    })
    .await
    .map_err(|e| format!("loading the corpus failed: {e}"))??;
    let load_time = started.elapsed();

    let listener = socket
        .listen(1024)
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let stats = &corpus.stats;
    let mut notes = Vec::new();
    if stats.failed_files > 0 {
        notes.push(format!(", {} unreadable files", stats.failed_files));
    }
    if cli.cache_dir.is_some() {
        notes.push(format!(", {} files from cache", stats.cached_files));
    }
    let notes = notes.concat();
    println!(
        "rpcedge-replay: {} pairs ({} skipped placeholders, {} duplicate keys{notes}) from {} in {:.1} s, listening on {address}",
        stats.pairs,
        stats.placeholders,
        stats.duplicate_keys,
        corpus_path.display(),
        load_time.as_secs_f64(),
    );

    let chunk_size = cli
        .chunk_size
        .map(|size| usize::try_from(size).unwrap_or(usize::MAX));
    let mut defaults = Delivery::new(
        cli.mode,
        chunk_size,
        Duration::from_millis(cli.chunk_delay_ms),
        cli.flush,
    );
    defaults.ssz = cli.ssz;
    defaults.call_delay = Duration::from_millis(cli.call_delay_ms);
    defaults.gzip_when_asked = cli.gzip_when_asked;
    let heads = head::Heads::default();
    for (settings, tag) in [(&cli.finalized, head::Tag::Finalized), (&cli.latest, head::Tag::Latest)] {
        for (network, number) in settings {
            heads.set(network, tag, *number);
        }
    }
    let beacon = beacon::BeaconRoutes::new(ssz_dir);
    let witnesses = generated::WitnessMaker::new(&corpus.witness_items).map(Arc::new);
    let state = server::State {
        witnesses,
        corpus,
        defaults,
        heads,
        hashes,
        beacon,
        rpc_requests: Default::default(),
        rpc_calls: Default::default(),
        beacon_requests: Default::default(),
        gzip_answers: Default::default(),
    };
    // SIGTERM as SIGINT: the replay may be a container's first process, which has no default
    // action for either
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::select! {
        () = server::serve(listener, Arc::new(state)) => {}
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}
