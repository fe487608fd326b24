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

/// The corpus: the one whose `rpc/` folder `$RPCEDGE_CORPUS` names, else `../shared/corpus`
/// beside the repository.
pub fn dir() -> PathBuf {
    std::env::var_os("RPCEDGE_CORPUS")
        .map(|rpc| PathBuf::from(rpc).join(".."))
        .unwrap_or_else(|| workspace().join("../shared/corpus"))
}

/// The fewest cases a test should find: `full` in the shared corpus, `sample` in the repository's
/// own sample (a clone with nothing beside it), which keeps a few recordings per method.
pub fn least(full: usize, sample: usize) -> usize {
    let is_sample = dir().canonicalize().is_ok_and(|dir| dir.ends_with("corpus-sample"));
    if is_sample {
        sample
    } else {
        full
    }
}

/// Every non-placeholder response body of the corpus's `rpc/`, compact, as the replay serves it;
/// parsed files are cached
/// where the replay caches them (`$RPCEDGE_REPLAY_CACHE`, default `target/replay-cache`).
pub fn bodies() -> Vec<Body> {
    let root = dir().join("rpc");
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
