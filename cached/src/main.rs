//! rpcedge-cached: the response cache's store, one per host, shared by nginx and Envoy.
//! See README.md beside this crate for the API, the store's layout and what a crash loses.

mod api;
mod finality;
mod finality_hold;
mod fleet;
mod flights;
mod read_through;
mod state;
mod store;
mod units;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rpcedge_core::cache::entry_bound;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;

use finality::{Chain, Finality, Upstream};
use store::{Store, StoreOptions};
use units::{parse_duration, parse_duration_or_zero, parse_size};

/// The response cache daemon of rpcedge.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Loopback TCP address of the HTTP API, or `none` for the Unix socket alone.
    #[arg(long, default_value = "127.0.0.1:18090", value_parser = parse_listen)]
    listen: Listen,
    /// Also (or, with `--listen none`, only) serve the API on this Unix socket, mode 0660.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Allow a `--listen` address that is not loopback (the API has no authentication).
    #[arg(long)]
    allow_remote: bool,
    /// The RocksDB directory.
    #[arg(long, default_value = "rpcedge-cache")]
    db: PathBuf,
    /// Bound on the store's files, e.g. 1GiB; the oldest entries go first.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    max_disk: u64,
    /// The share of the store (per cent, of what entries with a TTL leave) for entries asked for
    /// again after they were stored: a scan of keys asked once goes through the rest without
    /// pushing them out. 0: every entry goes first in, first out.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=95))]
    protected_share: u8,
    /// Flush the memtables this often (and on SIGTERM/SIGINT): a crash loses at most this tail.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    flush_interval: Duration,
    /// Entries with a TTL live at most this long.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    max_ttl: Duration,
    /// Size of each column family's memtable.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    memtable_size: u64,
    /// The hosts' `max_entry`, the largest answer they store: a PUT may be that plus the entry's
    /// envelope (`entry_bound`), so that no store a host makes is refused for its size.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    max_entry: u64,
    /// The node that says what is final in a namespace, as NAMESPACE=http://host:port/path;
    /// repeat per namespace. Several for one namespace are several sources: what is final is the
    /// lowest of what they say, once each has answered.
    #[arg(long = "finality-upstream", value_parser = parse_upstream)]
    finality_upstreams: Vec<(String, Upstream)>,
    /// The beacon node that says which slots are final in a namespace of Beacon-API reads, as
    /// NAMESPACE=http://host:port/path (its `eth/v1/beacon/headers/finalized`); repeat per
    /// namespace, and within one as for `--finality-upstream`.
    #[arg(long = "beacon-upstream", value_parser = parse_upstream)]
    beacon_upstreams: Vec<(String, Upstream)>,
    /// How often to ask each namespace's nodes for their finalized block (or slot).
    #[arg(long, default_value = "12s", value_parser = parse_duration)]
    finality_poll: Duration,
    /// How long a source must keep saying more is final before it is believed: the lowest it
    /// said over this time counts, so a jump it takes back sooner (a lie, a backend ahead of the
    /// others behind its address) never makes anything final. Its first word counts at once;
    /// `0s`: every word at once.
    #[arg(long, default_value = "1m", value_parser = parse_duration_or_zero)]
    finality_hold: Duration,
    /// Connections served at once; more wait to be accepted.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Write the WAL too (for measuring what leaving it out saves; not for production).
    #[arg(long)]
    wal: bool,
    /// Flush the column families one by one (for the crash test's comparison only).
    #[arg(long)]
    no_atomic_flush: bool,
    #[command(flatten)]
    fleet: fleet::FleetArgs,
}

/// Where the API listens on TCP: an address, or nowhere (`--listen none`: the Unix socket alone).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Listen {
    Tcp(SocketAddr),
    None,
}

fn parse_listen(text: &str) -> Result<Listen, String> {
    if text == "none" {
        return Ok(Listen::None);
    }
    text.parse()
        .map(Listen::Tcp)
        .map_err(|e| format!("{text:?}: expected an address such as 127.0.0.1:18090, or none ({e})"))
}

fn parse_upstream(text: &str) -> Result<(String, Upstream), String> {
    let (namespace, url) = text.split_once('=').ok_or(format!("{text:?}: expected NAMESPACE=URL"))?;
    Ok((namespace.to_string(), url.parse()?))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => Err(format!("cannot start the runtime: {error}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rpcedge-cached: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let tcp_address = match cli.listen {
        Listen::Tcp(address) => Some(address),
        Listen::None => None,
    };
    match tcp_address {
        None if cli.socket.is_none() => {
            return Err("--listen none needs --socket PATH: there would be nothing to listen on".to_string());
        }
        Some(address) if !address.ip().is_loopback() && !cli.allow_remote => {
            return Err(format!("{address} is not a loopback address: the API has no authentication (--allow-remote)"));
        }
        _ => {}
    }
    let fleet_settings = cli.fleet.settings()?;
    let store = Store::open(
        &cli.db,
        &StoreOptions {
            max_disk: cli.max_disk,
            protected_percent: cli.protected_share,
            max_ttl_s: cli.max_ttl.as_secs().max(1),
            memtable_size: usize::try_from(cli.memtable_size).map_err(|_| "--memtable-size: too large")?,
            wal: cli.wal,
            atomic_flush: !cli.no_atomic_flush,
        },
    )?;
    let execution = cli.finality_upstreams.into_iter().map(|(ns, up)| (ns, Chain::Execution, up));
    let beacon = cli.beacon_upstreams.into_iter().map(|(ns, up)| (ns, Chain::Beacon, up));
    let finality = Arc::new(Finality::new(execution.chain(beacon).collect(), cli.finality_hold));
    let fleet = match fleet_settings {
        Some(settings) => Some(fleet::Fleet::start(settings).await?),
        None => None,
    };
    let state = Arc::new(state::State {
        store,
        fleet,
        finality: finality.clone(),
        max_body: usize::try_from(entry_bound(cli.max_entry)).unwrap_or(usize::MAX),
        refusals: state::Refusals::default(),
        flights: flights::Flights::default(),
    });
    let connections = Arc::new(Semaphore::new(cli.max_connections.max(1)));

    let mut listening = Vec::new();
    if let Some(address) = tcp_address {
        let tcp = TcpListener::bind(address).await.map_err(|e| format!("cannot listen on {address}: {e}"))?;
        tokio::spawn(serve_tcp(tcp, state.clone(), connections.clone()));
        listening.push(address.to_string());
    }
    if let Some(path) = &cli.socket {
        // A socket left by a killed daemon would make the bind fail.
        let _ = std::fs::remove_file(path);
        let unix = bind_unix(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        tokio::spawn(serve_unix(unix, state.clone(), connections.clone()));
        listening.push(path.display().to_string());
    }
    tokio::spawn(finality.poll(cli.finality_poll));
    tokio::spawn(flush_every(state.clone(), cli.flush_interval));
    tokio::spawn(sweep_flights(state.clone()));
    println!("rpcedge-cached: store at {}, listening on {}", cli.db.display(), listening.join(" and "));

    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let flushed = tokio::task::spawn_blocking(move || state.store.flush().map_err(|failure| failure.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    if let Some(path) = &cli.socket {
        let _ = std::fs::remove_file(path);
    }
    flushed.map_err(|e| format!("the last flush failed: {e}"))
}

/// Binds and listens on the Unix socket at `path`, created with mode 0660 whatever the umask (the
/// API has no authentication: the socket's owner and group are who may use the cache). The mode is
/// the file's from its creation on, never wider for a moment: bind(2) creates it as 0777 less the
/// umask, set to 0117 around it. The umask is the process's; the only threads that could create a
/// file meanwhile are RocksDB's, and such a file would come out at most less readable (0640).
fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    // SAFETY: umask(2) cannot fail and touches no memory.
    let previous = unsafe { libc::umask(0o117) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(previous) };
    bound
}

async fn flush_every(state: Arc<state::State>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let state = state.clone();
        let flushed = tokio::task::spawn_blocking(move || {
            state.store.flush().map_err(|failure| match failure.stopped.then(|| state.store.reopen_when_room()) {
                None => failure.to_string(),
                Some(Ok(true)) => format!("{failure}; the store was opened again, its memtables lost"),
                Some(Ok(false)) => format!("{failure}; the disk has no room to open the store again yet"),
                Some(Err(reopening)) => format!("{failure}; opening the store again failed: {reopening}"),
            })
        });
        match flushed.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("rpcedge-cached: flush failed: {error}"),
            Err(error) => eprintln!("rpcedge-cached: flush failed: {error}"),
        }
    }
}

/// Drops the locks whose holders never answered (gone, or slower than their lock).
async fn sweep_flights(state: Arc<state::State>) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticks.tick().await;
        state.flights.sweep();
    }
}

async fn serve_tcp(listener: TcpListener, state: Arc<state::State>, connections: Arc<Semaphore>) {
    loop {
        let permit = connections.clone().acquire_owned().await.expect("never closed");
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, state.clone(), permit));
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

async fn serve_unix(listener: UnixListener, state: Arc<state::State>, connections: Arc<Semaphore>) {
    loop {
        let permit = connections.clone().acquire_owned().await.expect("never closed");
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(stream, state.clone(), permit));
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

async fn accept_failed(error: std::io::Error) {
    // Typically out of file descriptors: back off instead of spinning.
    eprintln!("rpcedge-cached: accept failed: {error}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

async fn serve_connection<S>(stream: S, state: Arc<state::State>, _permit: tokio::sync::OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| api::handle(request, state.clone()));
    // Errors here are clients going away or sending garbage (hyper answers 400 itself).
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_an_address_or_none() {
        assert_eq!(parse_listen("127.0.0.1:18090"), Ok(Listen::Tcp(SocketAddr::from(([127, 0, 0, 1], 18090)))));
        assert_eq!(parse_listen("[::1]:80"), Ok(Listen::Tcp("[::1]:80".parse().unwrap())));
        assert_eq!(parse_listen("none"), Ok(Listen::None));
        assert!(parse_listen("").is_err() && parse_listen("None").is_err() && parse_listen("localhost:1").is_err());
    }
}
