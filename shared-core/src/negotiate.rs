//! Accept-Encoding negotiation as RFC 9110 §12.5.3 specifies it, and Accept negotiation between
//! JSON and SSZ as the Beacon-API specifies it.
//!
//! Header lines are fed one by one (repeated headers are one comma-separated list); an element
//! that does not parse is ignored as a whole, so a bad header never matters more than a missing
//! one.


use crate::transcode::WitnessForm;

/// A content coding rpcedge can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Coding {
    Gzip = 1,
    /// HTTP's "deflate" is the zlib format (RFC 9110 §8.4.1.2).
    Deflate = 2,
    /// Zstandard (RFC 8878), as a single frame.
    Zstd = 3,
    /// Brotli (RFC 7932).
    Br = 4,
    /// Zstandard against rpcedge's dictionary (RFC 9842 §4): only for a client whose
    /// `Available-Dictionary` names it, and that names `dcz` itself.
    Dcz = 5,
}

impl Coding {
    pub const ALL: [Coding; 5] = [Coding::Gzip, Coding::Deflate, Coding::Zstd, Coding::Br, Coding::Dcz];

    /// The server's order of preference where the operator sets none (`encodings`), by
    /// measurement on the corpus (`benches/level.rs`, docs/compression.md "Encodings"): zstd
    /// first, which makes the fewest bytes for the least CPU; gzip next, as br (the Rust port of
    /// Google's encoder) makes 1-3 % fewer bytes for 1.5-2x gzip's CPU, so br goes to a client
    /// that prefers it or takes no gzip; deflate last, for a client that takes nothing else.
    /// Not dcz: a location makes it where the operator lists it, beside the location that serves
    /// the dictionary (first: a client offered it has the dictionary, which makes a small answer
    /// about a fifth smaller than zstd alone); elsewhere its `Vary: Available-Dictionary` would
    /// only split downstream caches.
    pub const DEFAULT_ORDER: [Coding; 4] = [Coding::Zstd, Coding::Gzip, Coding::Br, Coding::Deflate];

    /// The token for Content-Encoding.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Dcz => "dcz",
        }
    }

    /// The coding a content-coding token names (`x-gzip` is gzip), case-insensitively.
    pub fn from_token(token: &[u8]) -> Option<Coding> {
        if token.eq_ignore_ascii_case(b"x-gzip") {
            return Some(Coding::Gzip);
        }
        Coding::ALL.into_iter().find(|coding| token.eq_ignore_ascii_case(coding.token().as_bytes()))
    }

    fn index(self) -> usize {
        self as usize - 1
    }
}

/// A qvalue in thousandths: 0..=1000.
type Weight = u16;

/// The weights an Accept-Encoding field gives to what rpcedge cares about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptEncoding {
    present: bool,
    codings: [Option<Weight>; Coding::ALL.len()],
    identity: Option<Weight>,
    any: Option<Weight>,
    /// `Available-Dictionary` names rpcedge's dictionary (`None`: the request has none).
    dictionary: Option<bool>,
}

impl AcceptEncoding {
    /// Folds in one `Available-Dictionary` field line: a second one makes the field a list,
    /// which names no dictionary.
    pub fn available_dictionary(&mut self, value: &[u8]) {
        self.dictionary = Some(self.dictionary.is_none() && crate::dictionary::is_named_by(value));
    }

    /// Whether `coding` may go to this client at all: dcz only where the client has the
    /// dictionary and names dcz itself (`*` does not cover a coding that needs a dictionary).
    fn may_take(&self, coding: Coding) -> bool {
        coding != Coding::Dcz || (self.dictionary == Some(true) && self.codings[coding.index()].is_some())
    }

    /// Folds in one Accept-Encoding field line.
    pub fn add(&mut self, value: &[u8]) {
        self.present = true;
        for element in value.split(|&b| b == b',') {
            if let Some((coding, weight)) = parse_element(element) {
                let slot = match Coding::from_token(coding) {
                    Some(coding) => &mut self.codings[coding.index()],
                    None if coding.eq_ignore_ascii_case(b"identity") => &mut self.identity,
                    None if coding == b"*" => &mut self.any,
                    None => continue,
                };
                // Listed twice: the most favourable weight wins, as a client meant one of them.
                *slot = Some(slot.map_or(weight, |w| w.max(weight)));
            }
        }
    }

    /// Parses a single field value.
    pub fn parse(value: &[u8]) -> Self {
        let mut accept = AcceptEncoding::default();
        accept.add(value);
        accept
    }

    /// The coding to send out of `offered` (the server's order of preference), or `None` for
    /// identity.
    ///
    /// No field at all means the client did not ask: send identity, as every browser-era proxy
    /// does. A coding not listed takes the weight of `*`. The client's weights decide; among
    /// equal ones a coding the client named wins over one that only `*` covers, then the
    /// server's order does, but that a coding only `*` covers is gzip where it can be: a client
    /// that names none (an old or generic one sends a bare `*`) gets the one every client
    /// decodes. Identity wins only when it is weighed (itself or by `*`) above every offered
    /// coding.
    pub fn choose(&self, offered: &[Coding]) -> Option<Coding> {
        if !self.present {
            return None;
        }
        // (weight, named by the client, gzip) orders the candidates; the server's order breaks ties
        let rank = |coding: Coding| match self.codings[coding.index()] {
            Some(weight) => (weight, true, false),
            None => (self.any.unwrap_or(0), false, coding == Coding::Gzip),
        };
        let (coding, (best, _, _)) = offered
            .iter()
            .filter(|&&coding| self.may_take(coding))
            .map(|&coding| (coding, rank(coding)))
            .fold(None, |acc: Option<(Coding, (Weight, bool, bool))>, c| match acc {
                Some(acc) if acc.1 >= c.1 => Some(acc),
                _ => Some(c),
            })?;
        // Identity competes only when the client weighed it; listing a coding at all is a request for it.
        let identity = self.identity.or(self.any).unwrap_or(0);
        (best > 0 && best >= identity).then_some(coding)
    }

    /// The codings of `offered` the client takes, in the order `choose` would pick them one after
    /// another (the client's best first), up to the first that identity would win over.
    pub fn rank(&self, offered: &[Coding]) -> Vec<Coding> {
        let mut left = offered.to_vec();
        let mut ranked = Vec::with_capacity(left.len());
        while let Some(coding) = self.choose(&left) {
            left.retain(|&other| other != coding);
            ranked.push(coding);
        }
        ranked
    }
}

/// What a response body is sent as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaType {
    /// `application/json`, the default.
    Json,
    /// `application/octet-stream`, with the witness container a client asked for.
    Ssz(WitnessForm),
}

impl MediaType {
    pub fn content_type(self) -> &'static str {
        match self {
            MediaType::Json => "application/json",
            MediaType::Ssz(_) => "application/octet-stream",
        }
    }
}

/// An Accept field, weighed as Lodestar (a Beacon-API server) weighs it: an entry is
/// `type/subtype`, then optionally `q` as its first parameter (0 < q <= 1; an entry whose first
/// parameter is anything else, or a bad q, is skipped; later parameters are not read), the
/// highest q wins and a tie goes to the later entry. `*/*` and
/// `application/*` take JSON, the default. rpcedge's one extension, a `witness=eip8025`
/// parameter on `application/octet-stream`, asks for EIP-8025's three-field witness container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accept {
    present: bool,
    best: Option<(Weight, MediaType)>,
}

impl Accept {
    /// Folds in one Accept field line.
    pub fn add(&mut self, value: &[u8]) {
        self.present = true;
        for element in value.split(|&b| b == b',') {
            if let Some((weight, media)) = parse_media_range(element) {
                if self.best.map_or(true, |(best, _)| weight >= best) {
                    self.best = Some((weight, media));
                }
            }
        }
    }

    /// Parses a single field value.
    pub fn parse(value: &[u8]) -> Self {
        let mut accept = Accept::default();
        accept.add(value);
        accept
    }

    /// What to send: JSON when the client sent no Accept; `None` when it accepts nothing rpcedge
    /// can send (a 406 where the Beacon-API says so).
    pub fn choose(&self) -> Option<MediaType> {
        if !self.present {
            return Some(MediaType::Json);
        }
        self.best.map(|(_, media)| media)
    }
}

/// A Content-Type value's media type, without its parameters.
pub(crate) fn media_type(content_type: &[u8]) -> &[u8] {
    content_type.split(|&b| b == b';').next().unwrap_or_default().trim_ascii()
}

/// The witness form an SSZ Content-Type names (its `witness` parameter).
pub(crate) fn witness_form(content_type: &[u8]) -> WitnessForm {
    match parse_media_range(content_type) {
        Some((_, MediaType::Ssz(form))) => form,
        _ => WitnessForm::Lossless,
    }
}

/// `type/subtype [; witness=eip8025] [; q=qvalue]`, in Lodestar's terms; `None` to skip it.
fn parse_media_range(element: &[u8]) -> Option<(Weight, MediaType)> {
    let mut parts = element.split(|&b| b == b';');
    let range = parts.next()?.trim_ascii();
    let mut form = WitnessForm::Lossless;
    let mut weight = None;
    for param in parts {
        let (name, value) = split_once(param.trim_ascii(), b'=')?;
        let (name, value) = (name.trim_ascii(), value.trim_ascii());
        if name.eq_ignore_ascii_case(b"witness") && value.eq_ignore_ascii_case(b"eip8025") {
            form = WitnessForm::Eip8025;
        } else if weight.is_some() {
            // Lodestar reads the first parameter only
        } else if name.eq_ignore_ascii_case(b"q") {
            weight = Some(parse_qvalue(value).filter(|&q| q > 0)?);
        } else {
            return None;
        }
    }
    let media = if range.eq_ignore_ascii_case(b"application/octet-stream") {
        MediaType::Ssz(form)
    } else if [&b"application/json"[..], b"*/*", b"application/*"].iter().any(|t| range.eq_ignore_ascii_case(t)) {
        MediaType::Json
    } else {
        return None;
    };
    Some((weight.unwrap_or(1000), media))
}

/// `coding *( OWS ";" OWS "q=" qvalue )`; `None` when anything is off.
fn parse_element(element: &[u8]) -> Option<(&[u8], Weight)> {
    let mut parts = element.split(|&b| b == b';');
    let coding = parts.next()?.trim_ascii();
    if coding.is_empty() || !coding.iter().all(|&b| is_tchar(b)) {
        return None;
    }
    let mut weight = 1000;
    let mut seen_q = false;
    for param in parts {
        let (name, value) = split_once(param.trim_ascii(), b'=')?;
        if seen_q || !name.trim_ascii().eq_ignore_ascii_case(b"q") {
            return None;
        }
        weight = parse_qvalue(value.trim_ascii())?;
        seen_q = true;
    }
    Some((coding, weight))
}

/// `"0" [ "." 0*3DIGIT ] / "1" [ "." 0*3("0") ]`
fn parse_qvalue(v: &[u8]) -> Option<Weight> {
    let (int, frac) = match split_once(v, b'.') {
        Some((int, frac)) => (int, frac),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let thousandths = frac.iter().chain(b"000").take(3).fold(0, |acc, d| acc * 10 + Weight::from(d - b'0'));
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

fn split_once(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let at = s.iter().position(|&b| b == sep)?;
    Some((&s[..at], &s[at + 1..]))
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn accept_picks_json_or_ssz_as_lodestar_does() {
        use super::{Accept, MediaType};
        use crate::transcode::WitnessForm::{Eip8025, Lossless};
        let choose = |value: &str| Accept::parse(value.as_bytes()).choose();
        assert_eq!(Accept::default().choose(), Some(MediaType::Json), "no Accept: JSON");
        for (value, expected) in [
            ("application/octet-stream", Some(MediaType::Ssz(Lossless))),
            ("Application/Octet-Stream", Some(MediaType::Ssz(Lossless))),
            ("application/json", Some(MediaType::Json)),
            ("*/*", Some(MediaType::Json)),
            ("application/octet-stream;q=0.9, application/json;q=1", Some(MediaType::Json)),
            ("application/octet-stream;q=1, application/json;q=0.9", Some(MediaType::Ssz(Lossless))),
            ("application/octet-stream;q=0.9, */*;q=0.1", Some(MediaType::Ssz(Lossless))),
            // a tie goes to the later entry
            ("application/json, application/octet-stream", Some(MediaType::Ssz(Lossless))),
            ("application/octet-stream, application/json", Some(MediaType::Json)),
            // malformed entries are skipped, not fatal
            ("application/octet-stream;q=2, application/json;q=0.5", Some(MediaType::Json)),
            ("application/octet-stream;q=0, application/json;q=0.1", Some(MediaType::Json)),
            ("application/octet-stream;charset=x, application/json;q=0.1", Some(MediaType::Json)),
            ("application/octet-stream;q=abc", None),
            ("application/json;q=0.5;charset=utf-8", Some(MediaType::Json)),
            ("text/html", None),
            ("", None),
            ("application/octet-stream; witness=eip8025", Some(MediaType::Ssz(Eip8025))),
            ("application/octet-stream;q=0.8;witness=EIP8025", Some(MediaType::Ssz(Eip8025))),
        ] {
            assert_eq!(choose(value), expected, "{value:?}");
        }
        let mut lines = Accept::default();
        lines.add(b"application/octet-stream;q=0.5");
        lines.add(b"application/json;q=0.4");
        assert_eq!(lines.choose(), Some(MediaType::Ssz(Lossless)), "repeated lines are one list");
        assert_eq!(MediaType::Ssz(Eip8025).content_type(), "application/octet-stream");
    }

    use super::*;

    fn choose_from(offered: &[Coding], lines: &[&str]) -> Option<Coding> {
        let mut accept = AcceptEncoding::default();
        for line in lines {
            accept.add(line.as_bytes());
        }
        accept.choose(offered)
    }

    /// Between gzip and deflate, gzip first, as rpcedge chose before it made zstd and br.
    fn choose(lines: &[&str]) -> Option<Coding> {
        choose_from(&[Coding::Gzip, Coding::Deflate], lines)
    }

    #[test]
    fn the_clients_weights_decide_then_the_servers_order() {
        use Coding::*;
        let order = [Zstd, Gzip, Br, Deflate];
        let cases: &[(&str, Option<Coding>)] = &[
            // Chromium, Firefox, curl --compressed with zstd, undici
            ("gzip, deflate, br, zstd", Some(Zstd)),
            ("gzip, deflate, br", Some(Gzip)),
            ("gzip;q=0.9, deflate, br", Some(Br)),
            ("ZSTD", Some(Zstd)),
            ("br;q=1.0, gzip;q=0.8, *;q=0.1", Some(Br)),
            ("zstd;q=0, br, gzip", Some(Gzip)),
            ("zstd;q=0, *", Some(Gzip)),
            ("zstd;q=0, gzip;q=0, *", Some(Br)),
            ("zstd;q=0.5, gzip", Some(Gzip)),
            // a client that names no coding gets gzip, which every client decodes
            ("*", Some(Gzip)),
            ("*;q=0.5", Some(Gzip)),
            ("br;q=0.5, *", Some(Gzip)),
            ("br, *", Some(Br)),
            ("gzip;q=0, *", Some(Zstd)),
            ("*;q=0.5, br;q=0.6", Some(Br)),
            ("identity;q=0", None),
            ("identity;q=0, br", Some(Br)),
            ("br;q=0.4, identity;q=0.5", None),
            ("br;q=0.5, identity;q=0.5", Some(Br)),
            ("compress, sdch", None),
            ("dcz, zstd;q=0.9", Some(Zstd)),
        ];
        for (line, expected) in cases {
            assert_eq!(choose_from(&order, &[line]), *expected, "{line:?}");
        }
        // Only what the server offers is chosen, in its order.
        assert_eq!(choose_from(&[Gzip], &["gzip, deflate, br, zstd"]), Some(Gzip));
        assert_eq!(choose_from(&[Br, Zstd], &["gzip, deflate, br, zstd"]), Some(Br));
        assert_eq!(choose_from(&[Zstd], &["gzip, br"]), None);
        assert_eq!(choose_from(&[], &["gzip"]), None);
        assert_eq!(Coding::from_token(b"Br"), Some(Br));
        assert_eq!(Coding::from_token(b"x-zstd"), None);
    }

    #[test]
    fn rfc_9110_cases() {
        use Coding::*;
        let cases: &[(&[&str], Option<Coding>)] = &[
            (&[], None),
            (&[""], None),
            (&["gzip"], Some(Gzip)),
            (&["GZip"], Some(Gzip)),
            (&["x-gzip"], Some(Gzip)),
            (&["deflate"], Some(Deflate)),
            (&["gzip, deflate, br"], Some(Gzip)),
            (&["deflate, gzip"], Some(Gzip)),
            (&["br"], None),
            (&["*"], Some(Gzip)),
            (&["gzip;q=0"], None),
            (&["gzip;q=0, *"], Some(Deflate)),
            (&["gzip;q=0.5, deflate;q=0.8"], Some(Deflate)),
            (&["gzip ; Q=0.001"], Some(Gzip)),
            (&["gzip;q=0.5, identity"], None),
            (&["gzip;q=0.5, identity;q=0.4"], Some(Gzip)),
            (&["gzip;q=0.5, *;q=0.6"], Some(Deflate)),
            (&["gzip;q=0.5, deflate;q=0.4, identity;q=0.6"], None),
            (&["identity;q=0"], None),
            (&["*;q=0"], None),
            (&["identity;q=0, *;q=0.1"], Some(Gzip)),
            (&["br", "gzip"], Some(Gzip)),
            (&["gzip;q=0", "gzip;q=1"], Some(Gzip)),
            // Malformed elements are dropped, the rest still counts.
            (&["gzip;q=2"], None),
            (&["gzip;q=1.5, deflate"], Some(Deflate)),
            (&["gzip;q=0.1234"], None),
            (&["gzip;q=abc, deflate;q=0.2"], Some(Deflate)),
            (&["gzip;level=1"], None),
            (&["gzip;q=0.5;q=0.6"], None),
            (&["gz ip"], None),
            (&[",,, gzip ,"], Some(Gzip)),
            (&["gzip;q="], None),
            (&["\u{e9}gzip, gzip"], Some(Gzip)),
        ];
        for (lines, expected) in cases {
            assert_eq!(choose(lines), *expected, "{lines:?}");
        }
    }

    #[test]
    fn qvalue_grammar() {
        assert_eq!(parse_qvalue(b"0"), Some(0));
        assert_eq!(parse_qvalue(b"0."), Some(0));
        assert_eq!(parse_qvalue(b"0.5"), Some(500));
        assert_eq!(parse_qvalue(b"0.05"), Some(50));
        assert_eq!(parse_qvalue(b"1.000"), Some(1000));
        assert_eq!(parse_qvalue(b"1.001"), None);
        assert_eq!(parse_qvalue(b".5"), None);
        assert_eq!(parse_qvalue(b"-0"), None);
    }
}
