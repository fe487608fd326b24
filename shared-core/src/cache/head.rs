//! What of the node's response head an entry keeps, as a shared HTTP cache must (RFC 9111): an
//! answer with `Set-Cookie`, or `Cache-Control: no-store`, `private` or `no-cache`, is not kept;
//! one whose `Vary` is `*` neither; one that varies on request headers (other than
//! Accept-Encoding, which rpcedge answers itself) is kept with the values the request had, and a
//! hit is only for a request with the same values; the node's other end-to-end headers (CORS
//! among them) are kept and sent again on every hit.

use super::Refusal;

/// The most bytes an entry's kept head takes, as stored (`entry::encode_head`).
pub(super) const MAX_HEAD: usize = 8 * 1024;

/// Headers a hit does not send again: hop-by-hop ones, what the hit's own body and encoding
/// decide, what the proxy sends itself, validators of a representation the hit may re-encode.
const NOT_KEPT: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "content-length",
    "content-encoding",
    "content-range",
    "accept-ranges",
    "vary",
    "date",
    "server",
    "age",
    "etag",
    "last-modified",
    "content-digest",
    "repr-digest",
    "digest",
    "content-md5",
    "set-cookie",
];

/// Prefixes of the proxies' own headers: Envoy's, nginx's internal redirects, rpcedge's.
const NOT_KEPT_PREFIXES: &[&str] = &["x-envoy-", "x-accel-", "x-rpcedge-"];

/// What an entry keeps of the node's head.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// The node's end-to-end headers, names in lower case, in the node's order.
    pub headers: Vec<(String, String)>,
    /// The request headers the answer varies on (names in lower case), with the request's values
    /// (`None`: it had none).
    pub vary: Vec<(String, Option<String>)>,
}

impl Head {
    /// What to keep of the node's response `headers`, for a request with `request` headers (both
    /// as (name, value) pairs, names in any case, a header repeated as often as it came).
    pub fn of<N, V, M, W>(headers: &[(N, V)], request: &[(M, W)]) -> Result<Head, Refusal>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
        M: AsRef<[u8]>,
        W: AsRef<[u8]>,
    {
        if named(headers, "set-cookie").next().is_some() {
            return Err(Refusal::SetCookie);
        }
        let directives = named(headers, "cache-control").flat_map(list);
        if directives
            .map(|d| d.split('=').next().unwrap_or_default().trim().to_ascii_lowercase())
            .any(|d| matches!(d.as_str(), "no-store" | "private" | "no-cache"))
        {
            return Err(Refusal::NoStore);
        }
        let mut vary: Vec<(String, Option<String>)> = Vec::new();
        for name in named(headers, "vary").flat_map(list) {
            let name = name.to_ascii_lowercase();
            if name == "*" {
                return Err(Refusal::VaryAll);
            }
            if name != "accept-encoding" && !vary.iter().any(|(known, _)| *known == name) {
                let value = joined(request, &name);
                vary.push((name, value));
            }
        }
        let hop_by_hop: Vec<String> =
            named(headers, "connection").flat_map(list).map(|n| n.to_ascii_lowercase()).collect();
        let mut kept = Vec::new();
        for (name, value) in headers {
            let name = String::from_utf8_lossy(name.as_ref()).to_ascii_lowercase();
            if !Head::replays(&name) || hop_by_hop.contains(&name) {
                continue;
            }
            let Ok(value) = std::str::from_utf8(value.as_ref()) else { return Err(Refusal::Malformed) };
            kept.push((name, value.to_string()));
        }
        let head = Head { headers: kept, vary };
        if head.size() > MAX_HEAD {
            return Err(Refusal::TooLarge);
        }
        Ok(head)
    }

    /// Whether a request with these headers is one the kept answer is for: the same values of
    /// every header it varies on.
    pub fn is_for<M: AsRef<[u8]>, W: AsRef<[u8]>>(vary: &[(&str, Option<&str>)], request: &[(M, W)]) -> bool {
        vary.iter().all(|(name, value)| joined(request, name).as_deref() == *value)
    }

    /// Whether a hit may send the header `name` (lower case) again.
    pub fn replays(name: &str) -> bool {
        let ours = name.starts_with(':') || NOT_KEPT_PREFIXES.iter().any(|prefix| name.starts_with(prefix));
        !ours && !NOT_KEPT.contains(&name)
    }

    /// Its length as an entry stores it: two counts, each string with its u16 length, and
    /// whether the request had each varied-on header.
    fn size(&self) -> usize {
        let headers = self.headers.iter().map(|(n, v)| 2 + n.len() + 2 + v.len());
        let vary = self.vary.iter().map(|(n, v)| 2 + n.len() + 1 + 2 + v.as_ref().map_or(0, String::len));
        2 + 2 + headers.chain(vary).sum::<usize>()
    }
}

/// The values of the header `name`.
pub(super) fn named<'h, N: AsRef<[u8]>, V: AsRef<[u8]>>(
    headers: &'h [(N, V)],
    name: &'h str,
) -> impl Iterator<Item = &'h [u8]> {
    headers
        .iter()
        .filter(move |(n, _)| n.as_ref().eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, value)| value.as_ref())
}

/// A header's values as one field, each trimmed and joined with ", " as RFC 9110 combines field
/// lines; `None` when there is none.
pub(crate) fn field<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)], name: &str) -> Option<Vec<u8>> {
    let mut values = named(headers, name).map(<[u8]>::trim_ascii);
    let first = values.next()?.to_vec();
    Some(values.fold(first, |joined, value| [joined.as_slice(), b", ", value].concat()))
}

/// [`field`] as text, as an entry keeps it.
fn joined<M: AsRef<[u8]>, W: AsRef<[u8]>>(request: &[(M, W)], name: &str) -> Option<String> {
    field(request, name).map(|value| String::from_utf8_lossy(&value).into_owned())
}

/// The members of a comma-separated field value, trimmed, empty ones left out.
fn list(value: &[u8]) -> impl Iterator<Item = &str> {
    std::str::from_utf8(value).unwrap_or_default().split(',').map(str::trim).filter(|item| !item.is_empty())
}
