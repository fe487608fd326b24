//! On-disk cache of loaded recording files: a restart reads the compact templates back
//! instead of decompressing and parsing again (about 30 s of CPU for the shared corpus, most
//! of it bzip2).
//!
//! Each recording file gets one cache file at the same relative path plus `.replay-cache`.
//! It is used only while the recording's size and modification time are unchanged and the
//! format version matches; anything unreadable is a miss and gets rewritten.

use std::fs::{self, File, Metadata};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use bytes::Bytes;

use crate::rpc::RequestKey;
use crate::template::{IdSpan, Template};

const MAGIC: &[u8; 16] = b"rpcedge-replay\n\x00";
/// Bump whenever the layout below, the request key or the template format changes.
const FORMAT_VERSION: u32 = 1;
const EXTENSION: &str = "replay-cache";

pub struct Cache {
    dir: PathBuf,
}

/// What identifies one version of a recording file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceStamp {
    len: u64,
    modified_secs: u64,
    modified_nanos: u32,
}

impl SourceStamp {
    pub fn of(metadata: &Metadata) -> SourceStamp {
        let modified = metadata
            .modified()
            .ok()
            .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default();
        SourceStamp {
            len: metadata.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        }
    }
}

impl Cache {
    pub fn new(dir: PathBuf) -> Cache {
        Cache { dir }
    }

    fn path_for(&self, relative: &str) -> PathBuf {
        self.dir.join(format!("{relative}.{EXTENSION}"))
    }

    /// The pairs cached for this version of the file, if any.
    pub fn read(&self, relative: &str, stamp: SourceStamp) -> Option<Vec<(RequestKey, Template)>> {
        let data = Bytes::from(fs::read(self.path_for(relative)).ok()?);
        let mut reader = Reader { data, at: 0 };
        if reader.take(MAGIC.len())? != MAGIC[..] || reader.u32()? != FORMAT_VERSION {
            return None;
        }
        let cached_stamp = SourceStamp {
            len: reader.u64()?,
            modified_secs: reader.u64()?,
            modified_nanos: reader.u32()?,
        };
        if cached_stamp != stamp {
            return None;
        }
        let count = reader.u32()?;
        let mut pairs = Vec::with_capacity(count.min(1 << 16) as usize);
        for _ in 0..count {
            let key_len = reader.u32()? as usize;
            let key = RequestKey::from_bytes(reader.take(key_len)?.to_vec());
            let body_len = usize::try_from(reader.u64()?).ok()?;
            let body = reader.take(body_len)?;
            let span_count = reader.u32()?;
            let mut ids = Vec::with_capacity(span_count.min(1 << 16) as usize);
            for _ in 0..span_count {
                let start = usize::try_from(reader.u64()?).ok()?;
                let end = usize::try_from(reader.u64()?).ok()?;
                ids.push(IdSpan {
                    range: start..end,
                    call: reader.u32()? as usize,
                });
            }
            pairs.push((key, Template::from_parts(body, ids)?));
        }
        (reader.at == reader.data.len()).then_some(pairs)
    }

    /// Stores the pairs of this version of the file (written aside, then renamed into place,
    /// so a concurrent or interrupted run never sees half a file).
    pub fn write(
        &self,
        relative: &str,
        stamp: SourceStamp,
        pairs: &[(RequestKey, Template)],
    ) -> io::Result<()> {
        let path = self.path_for(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let temporary = path.with_extension(format!("{EXTENSION}.{}.tmp", std::process::id()));
        let mut out = BufWriter::new(File::create(&temporary)?);
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&stamp.len.to_le_bytes())?;
        out.write_all(&stamp.modified_secs.to_le_bytes())?;
        out.write_all(&stamp.modified_nanos.to_le_bytes())?;
        out.write_all(&count(pairs.len())?.to_le_bytes())?;
        for (key, template) in pairs {
            let (body, ids) = template.parts();
            out.write_all(&count(key.as_bytes().len())?.to_le_bytes())?;
            out.write_all(key.as_bytes())?;
            out.write_all(&(body.len() as u64).to_le_bytes())?;
            out.write_all(body)?;
            out.write_all(&count(ids.len())?.to_le_bytes())?;
            for span in ids {
                out.write_all(&(span.range.start as u64).to_le_bytes())?;
                out.write_all(&(span.range.end as u64).to_le_bytes())?;
                out.write_all(&count(span.call)?.to_le_bytes())?;
            }
        }
        out.flush()?;
        drop(out);
        fs::rename(&temporary, &path)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn count(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::other("count too large for the cache format"))
}

/// Bounds-checked reading of the little-endian layout; slices share the file's buffer.
struct Reader {
    data: Bytes,
    at: usize,
}

impl Reader {
    fn take(&mut self, len: usize) -> Option<Bytes> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.data.len())?;
        let slice = self.data.slice(self.at..end);
        self.at = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?[..].try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?[..].try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    #[test]
    fn round_trips_and_rejects_other_versions_of_the_source() {
        let dir =
            std::env::temp_dir().join(format!("rpcedge-replay-cache-test-{}", std::process::id()));
        let cache = Cache::new(dir.clone());
        let request = parse(r#"[{"id":1,"method":"a"},{"id":2,"method":"b"}]"#).unwrap();
        let response = parse(r#"[{"id":2,"result":"b"},{"id":1,"result":"a"}]"#).unwrap();
        let pairs = vec![(
            RequestKey::of(&request),
            Template::build(&request, &response),
        )];
        let stamp = SourceStamp {
            len: 10,
            modified_secs: 20,
            modified_nanos: 30,
        };
        cache.write("m/file.json", stamp, &pairs).unwrap();

        let read = cache.read("m/file.json", stamp).unwrap();
        assert_eq!(read[0].0, pairs[0].0);
        let live = [Bytes::from_static(b"\"x\""), Bytes::from_static(b"\"y\"")];
        assert_eq!(read[0].1.live_body(&live), pairs[0].1.live_body(&live));
        assert!(cache
            .read("m/file.json", SourceStamp { len: 11, ..stamp })
            .is_none());

        let path = cache.path_for("m/file.json");
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(cache.read("m/file.json", stamp).is_none());
        fs::remove_dir_all(dir).unwrap();
    }
}
