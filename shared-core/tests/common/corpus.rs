//! The recorded response bodies of the shared corpus, read with the replay's own loader.

use std::path::{Path, PathBuf};

use rpcedge_corpus::cache::Cache;
use rpcedge_corpus::corpus::Corpus;

/// A recorded response body and where it came from.
pub struct Body {
    pub origin: String,
    pub bytes: Vec<u8>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Every non-placeholder response body, compact, as the replay serves it. The corpus is
/// `$RPCEDGE_CORPUS` or `../shared/corpus/rpc` beside the repository; parsed files are cached
/// where the replay caches them (`$RPCEDGE_REPLAY_CACHE`, default `target/replay-cache`).
pub fn bodies() -> Vec<Body> {
    let root = std::env::var_os("RPCEDGE_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("../shared/corpus/rpc"));
    let cache_dir = std::env::var_os("RPCEDGE_REPLAY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/replay-cache"));
    let cache = (!cache_dir.as_os_str().is_empty()).then(|| Cache::new(cache_dir));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let corpus = Corpus::load(&root, threads, cache.as_ref()).expect("corpus loads");
    corpus
        .pairs()
        .filter(|pair| !pair.placeholder)
        .map(|pair| Body { origin: pair.origin.clone(), bytes: pair.template.recorded_body().concat() })
        .collect()
}
