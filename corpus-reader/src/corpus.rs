//! Loading the recorded request/response pairs and looking them up.
//!
//! Recording files (relative to the corpus directory, any depth):
//! - `*.json`: a JSON array of `{"request": ..., "response": ...}` objects (erigon rpc-tests);
//! - `*.tar`: a tar (bzip2-compressed or plain) holding one such `.json`;
//! - `*.io`: `>> request` / `<< response` lines, `//` comments (execution-apis).
//!
//! `index.jsonl`, when present, flags pairs whose recorded response is an empty stand-in
//! (`placeholder_response`); those are kept for `/corpus/...` but never answer a request.
//! The network of a file is the middle part of a `<source>__<network>__<name>` file name.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::cache::{Cache, SourceStamp};
use crate::json::{self, Json};
use crate::rpc::RequestKey;
use crate::template::Template;

pub struct Recording {
    pub template: Template,
    /// `<relative path>#<pair index>`, to tell clients what was replayed.
    pub origin: String,
    /// The recorded response is an empty stand-in (index.jsonl's `placeholder_response`).
    pub placeholder: bool,
}

pub type RecordingTable = HashMap<RequestKey, Arc<Recording>>;

#[derive(Debug, Default)]
pub struct LoadStats {
    /// Pairs that answer requests (duplicates included).
    pub pairs: usize,
    pub placeholders: usize,
    /// Pairs whose key an earlier file of the same network already recorded.
    pub duplicate_keys: usize,
    pub failed_files: usize,
    /// Files read back from the cache instead of parsed.
    pub cached_files: usize,
}

pub struct Corpus {
    /// Every pair of every file, placeholders included, by relative path.
    files: HashMap<String, Vec<Arc<Recording>>>,
    all: RecordingTable,
    by_network: HashMap<String, RecordingTable>,
    pub stats: LoadStats,
    /// The sizes of the witnesses' elements, for witnesses made up at the real ones' proportions.
    pub witness_items: WitnessItems,
}

/// The byte lengths of the elements of every witness added, by field, and the most headers one
/// witness has.
#[derive(Debug, Default)]
pub struct WitnessItems {
    pub state: Vec<u32>,
    pub codes: Vec<u32>,
    pub keys: Vec<u32>,
    pub headers: Vec<u32>,
    pub most_headers: usize,
}

impl WitnessItems {
    fn add(&mut self, witness: &Json) {
        let lengths = |field: &str| -> Vec<u32> {
            let items: Vec<&Json> = match witness.get(field) {
                Some(Json::Array(items)) => items.iter().collect(),
                Some(Json::Object(members)) => members.iter().map(|(_, item)| item).collect(),
                _ => Vec::new(),
            };
            // 0x-hex strings: their bytes (headers given as objects are not counted)
            items.iter().filter_map(|item| item.as_str()).map(|hex| (hex.len().saturating_sub(2) / 2) as u32).collect()
        };
        self.state.extend(lengths("state"));
        self.codes.extend(lengths("codes"));
        self.keys.extend(lengths("keys"));
        let headers = lengths("headers");
        self.most_headers = self.most_headers.max(headers.len());
        self.headers.extend(headers);
    }
}

/// Bzip2 inflates these JSON files about sixty-fold: the factor that makes a tar's file size
/// comparable to a plain file's when ordering the work.
const TAR_EXPANSION: u64 = 60;

/// Loader threads recurse as deep as the JSON nests.
const LOADER_STACK: usize = 16 * 1024 * 1024;

impl Corpus {
    /// Loads every recording under `root` on `threads` threads, through `cache` if given.
    /// Files that cannot be read are reported on stderr and skipped.
    pub fn load(root: &Path, threads: usize, cache: Option<&Cache>) -> Result<Corpus, String> {
        let mut paths = Vec::new();
        list_recording_files(root, root, &mut paths)?;
        if paths.is_empty() {
            return Err(format!(
                "no recordings (*.json, *.tar, *.io) under {}",
                root.display()
            ));
        }
        paths.sort();
        let placeholders = read_placeholder_index(root)?;
        let loaded = load_in_parallel(root, &paths, threads, cache);

        let mut corpus = Corpus {
            files: HashMap::new(),
            all: HashMap::new(),
            by_network: HashMap::new(),
            stats: LoadStats::default(),
            witness_items: WitnessItems::default(),
        };
        for (path, result) in paths.into_iter().zip(loaded) {
            match result {
                Ok(Loaded { pairs, from_cache }) => {
                    corpus.stats.cached_files += usize::from(from_cache);
                    let network = network_of(&path).to_string();
                    corpus.add_file(path, &network, pairs, placeholders.as_ref());
                }
                Err(error) => {
                    eprintln!("rpcedge-replay: skipping {path}: {error}");
                    corpus.stats.failed_files += 1;
                }
            }
        }
        Ok(corpus)
    }

    /// Files must be added in sorted path order: the first recording of a key wins.
    fn add_file(
        &mut self,
        path: String,
        network: &str,
        pairs: Vec<(RequestKey, Template)>,
        placeholders: Option<&HashMap<String, Vec<bool>>>,
    ) {
        let flags = placeholders.and_then(|index| index.get(&path));
        if let Some(flags) = flags.filter(|flags| flags.len() != pairs.len()) {
            eprintln!(
                "rpcedge-replay: {path}: index.jsonl lists {} pairs, the file has {}",
                flags.len(),
                pairs.len()
            );
        }
        let network_table = self.by_network.entry(network.to_string()).or_default();
        let mut recordings = Vec::with_capacity(pairs.len());
        for (i, (key, template)) in pairs.into_iter().enumerate() {
            let placeholder = flags
                .and_then(|flags| flags.get(i))
                .copied()
                .unwrap_or(false);
            let recording = Arc::new(Recording {
                template,
                origin: format!("{path}#{i}"),
                placeholder,
            });
            recordings.push(recording.clone());
            if placeholder {
                self.stats.placeholders += 1;
                continue;
            }
            self.stats.pairs += 1;
            match network_table.entry(key.clone()) {
                Entry::Occupied(_) => self.stats.duplicate_keys += 1,
                Entry::Vacant(slot) => {
                    slot.insert(recording.clone());
                }
            }
            self.all.entry(key).or_insert(recording);
        }
        self.files.insert(path, recordings);
    }

    /// Adds each execution witness in `dir` (ethrex-replay's `cache_<network>_<block>.json`:
    /// `{blocks, witness, network}`) as the answer to `debug_executionWitness` with that block's
    /// number in hex, on `/<network>` and `/`. Returns how many.
    pub fn add_witnesses(&mut self, dir: &Path) -> Result<usize, String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with("cache_") && name.ends_with(".json"))
            .collect();
        names.sort();
        for name in &names {
            let path = dir.join(name);
            let (network, block) = name["cache_".len()..name.len() - ".json".len()]
                .rsplit_once('_')
                .and_then(|(network, block)| Some((network, block.parse::<u64>().ok()?)))
                .ok_or_else(|| format!("{name}: not cache_<network>_<block>.json"))?;
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let file = json::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let witness = file.get("witness").ok_or_else(|| format!("{}: no \"witness\"", path.display()))?;
            self.witness_items.add(witness);
            let request_text =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["{block:#x}"]}}"#);
            let request = json::parse(&request_text).expect("well-formed");
            let mut response_text = br#"{"jsonrpc":"2.0","id":1,"result":"#.to_vec();
            witness.write_compact(&mut response_text);
            response_text.push(b'}');
            let response_text = String::from_utf8(response_text).map_err(|e| e.to_string())?;
            let response = json::parse(&response_text).expect("compact JSON of a parsed value");
            let pair = (RequestKey::of(&request), Template::build(&request, &response));
            self.add_file(format!("witness/{name}"), network, vec![pair], None);
        }
        Ok(names.len())
    }

    /// The recordings of all networks together.
    pub fn all(&self) -> &RecordingTable {
        &self.all
    }

    pub fn network(&self, name: &str) -> Option<&RecordingTable> {
        self.by_network.get(name).filter(|_| !name.is_empty())
    }

    pub fn network_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .by_network
            .keys()
            .map(String::as_str)
            .filter(|name| !name.is_empty())
            .collect();
        names.sort_unstable();
        names
    }

    /// Every pair of every file, placeholders included, in sorted path order.
    pub fn pairs(&self) -> impl Iterator<Item = &Recording> {
        let mut paths: Vec<&String> = self.files.keys().collect();
        paths.sort_unstable();
        paths.into_iter().flat_map(|path| self.files[path].iter().map(Arc::as_ref))
    }

    /// Pair `index` of the file at `path` (relative to the corpus directory).
    pub fn pair(&self, path: &str, index: usize) -> Option<&Recording> {
        self.files.get(path)?.get(index).map(Arc::as_ref)
    }
}

/// `<source>__<network>__<name>` gives `network`; other names give "" (served on `/` only).
fn network_of(path: &str) -> &str {
    let file_name = path.rsplit('/').next().unwrap_or(path);
    let mut parts = file_name.split("__");
    match (parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(network), Some(_)) => network,
        _ => "",
    }
}

fn list_recording_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
        if file_type.is_dir() {
            list_recording_files(root, &path, out)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("json" | "tar" | "io")
        ) {
            match path.strip_prefix(root).ok().and_then(Path::to_str) {
                Some(relative) => out.push(relative.to_string()),
                None => eprintln!(
                    "rpcedge-replay: skipping {} (name is not UTF-8)",
                    path.display()
                ),
            }
        }
    }
    Ok(())
}

/// Per file, which pairs are placeholders; `None` without an `index.jsonl` (every pair real).
fn read_placeholder_index(root: &Path) -> Result<Option<HashMap<String, Vec<bool>>>, String> {
    let index_path = root.join("index.jsonl");
    let text = match std::fs::read_to_string(&index_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", index_path.display())),
    };
    let mut index = HashMap::new();
    for (line_number, line) in text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
    {
        let bad_line = |why: &str| format!("{}:{}: {why}", index_path.display(), line_number + 1);
        let entry = json::parse(line).map_err(|e| bad_line(&e.to_string()))?;
        let path = entry
            .get("path")
            .and_then(Json::as_str)
            .ok_or_else(|| bad_line("no \"path\""))?;
        let flags = match entry.get("pairs") {
            Some(Json::Array(pairs)) => pairs
                .iter()
                .map(|pair| {
                    pair.get("placeholder_response")
                        .and_then(Json::as_bool)
                        .unwrap_or(false)
                })
                .collect(),
            _ => return Err(bad_line("no \"pairs\" array")),
        };
        index.insert(path.to_string(), flags);
    }
    Ok(Some(index))
}

type FileResult = Result<Vec<(RequestKey, Template)>, String>;

struct Loaded {
    pairs: Vec<(RequestKey, Template)>,
    from_cache: bool,
}

/// Loads the files on `threads` threads, biggest first so that no thread is left with a
/// large file at the end; results come back in the order of `paths`.
fn load_in_parallel(
    root: &Path,
    paths: &[String],
    threads: usize,
    cache: Option<&Cache>,
) -> Vec<Result<Loaded, String>> {
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order.sort_by_cached_key(|&i| std::cmp::Reverse(estimated_cost(&root.join(&paths[i]))));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Loaded, String>>>> =
        Mutex::new((0..paths.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            let worker = || {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let result = load_through_cache(root, &paths[i], cache);
                    results
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())[i] = Some(result);
                }
            };
            // Files a missing thread never takes are reported as failed below.
            if let Err(error) = std::thread::Builder::new()
                .name("corpus-loader".into())
                .stack_size(LOADER_STACK)
                .spawn_scoped(scope, worker)
            {
                eprintln!("rpcedge-replay: cannot start a loader thread: {error}");
            }
        }
    });
    let results = results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err("loader thread failed".to_string())))
        .collect()
}

fn load_through_cache(
    root: &Path,
    relative: &str,
    cache: Option<&Cache>,
) -> Result<Loaded, String> {
    let path = root.join(relative);
    let Some(cache) = cache else {
        return load_file(&path).map(|pairs| Loaded {
            pairs,
            from_cache: false,
        });
    };
    let stamp = SourceStamp::of(&std::fs::metadata(&path).map_err(|e| e.to_string())?);
    if let Some(pairs) = cache.read(relative, stamp) {
        return Ok(Loaded {
            pairs,
            from_cache: true,
        });
    }
    let pairs = load_file(&path)?;
    if let Err(error) = cache.write(relative, stamp, &pairs) {
        eprintln!(
            "rpcedge-replay: cannot cache {relative} in {}: {error}",
            cache.dir().display()
        );
    }
    Ok(Loaded {
        pairs,
        from_cache: false,
    })
}

fn estimated_cost(path: &Path) -> u64 {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    match path.extension().and_then(|e| e.to_str()) {
        Some("tar") => size * TAR_EXPANSION,
        _ => size,
    }
}

fn load_file(path: &Path) -> FileResult {
    match path.extension().and_then(|e| e.to_str()) {
        Some("io") => {
            let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            io_pairs(&text)
        }
        Some("tar") => json_pairs(&read_json_from_tar(path)?),
        _ => json_pairs(&std::fs::read_to_string(path).map_err(|e| e.to_string())?),
    }
}

/// The `.json` member of a tar, decompressing bzip2 when the file starts with its magic.
fn read_json_from_tar(path: &Path) -> Result<String, String> {
    let mut file = BufReader::new(File::open(path).map_err(|e| e.to_string())?);
    let mut magic = [0u8; 3];
    file.read_exact(&mut magic).map_err(|e| e.to_string())?;
    let reader = std::io::Cursor::new(magic).chain(file);
    let tar: Box<dyn Read> = if &magic == b"BZh" {
        Box::new(bzip2::read::MultiBzDecoder::new(reader))
    } else {
        Box::new(reader)
    };
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let is_json = entry
            .path()
            .map(|p| p.extension().is_some_and(|e| e == "json"))
            .unwrap_or(false);
        if entry.header().entry_type().is_file() && is_json {
            let mut text = String::with_capacity(entry.size() as usize);
            entry.read_to_string(&mut text).map_err(|e| e.to_string())?;
            return Ok(text);
        }
    }
    Err("no .json member in the tar".to_string())
}

fn json_pairs(text: &str) -> FileResult {
    let Json::Array(tests) = json::parse(text).map_err(|e| e.to_string())? else {
        return Err("expected a JSON array of {request, response} objects".to_string());
    };
    tests
        .iter()
        .enumerate()
        .map(
            |(i, test)| match (test.get("request"), test.get("response")) {
                (Some(request), Some(response)) => {
                    Ok((RequestKey::of(request), Template::build(request, response)))
                }
                _ => Err(format!("element {i} lacks \"request\" or \"response\"")),
            },
        )
        .collect()
}

fn io_pairs(text: &str) -> FileResult {
    let mut pairs = Vec::new();
    let mut request: Option<Json> = None;
    for (line_number, line) in text.lines().enumerate() {
        let at_line = |what: String| format!("line {}: {what}", line_number + 1);
        if let Some(request_text) = line.strip_prefix(">>") {
            request = Some(json::parse(request_text.trim()).map_err(|e| at_line(e.to_string()))?);
        } else if let Some(response_text) = line.strip_prefix("<<") {
            let request = request
                .take()
                .ok_or_else(|| at_line("response without a request".to_string()))?;
            let response = json::parse(response_text.trim()).map_err(|e| at_line(e.to_string()))?;
            pairs.push((
                RequestKey::of(&request),
                Template::build(&request, &response),
            ));
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_comes_from_the_file_name() {
        assert_eq!(
            network_of("eth_call/erigon-rpc-tests__mainnet__test_01.json"),
            "mainnet"
        );
        assert_eq!(
            network_of("eth_call/execution-apis__hive-testchain__call-x.io"),
            "hive-testchain"
        );
        assert_eq!(network_of("mine/recording.json"), "");
    }

    #[test]
    fn io_files_pair_each_response_with_the_request_before_it() {
        let text = "// comment\n>> {\"id\":1,\"method\":\"a\"}\n<< {\"id\":1,\"result\":1}\n>> {\"id\":2,\"method\":\"b\"}\n<< {\"id\":2,\"result\":2}\n";
        let pairs = io_pairs(text).unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(
            pairs[1].0,
            RequestKey::of(&json::parse(r#"{"method":"b"}"#).unwrap())
        );
        assert!(io_pairs("<< {}").is_err());
    }
}
