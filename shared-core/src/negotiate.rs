//! Accept-Encoding negotiation as RFC 9110 §12.5.3 specifies it.
//!
//! Header lines are fed one by one (repeated headers are one comma-separated list); an element
//! that does not parse is ignored as a whole, so a bad header never matters more than a missing
//! one.

use std::ffi::CStr;

/// A content coding rpcedge can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Coding {
    Gzip = 1,
    /// HTTP's "deflate" is the zlib format (RFC 9110 §8.4.1.2).
    Deflate = 2,
}

impl Coding {
    /// The token for Content-Encoding, NUL-terminated for C hosts.
    pub fn name(self) -> &'static CStr {
        match self {
            Coding::Gzip => c"gzip",
            Coding::Deflate => c"deflate",
        }
    }

    /// The token for Content-Encoding.
    pub fn token(self) -> &'static str {
        self.name().to_str().expect("ASCII")
    }
}

/// A qvalue in thousandths: 0..=1000.
type Weight = u16;

/// The weights an Accept-Encoding field gives to what rpcedge cares about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptEncoding {
    present: bool,
    gzip: Option<Weight>,
    deflate: Option<Weight>,
    identity: Option<Weight>,
    any: Option<Weight>,
}

impl AcceptEncoding {
    /// Folds in one Accept-Encoding field line.
    pub fn add(&mut self, value: &[u8]) {
        self.present = true;
        for element in value.split(|&b| b == b',') {
            if let Some((coding, weight)) = parse_element(element) {
                let slot = if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip") {
                    &mut self.gzip
                } else if coding.eq_ignore_ascii_case(b"deflate") {
                    &mut self.deflate
                } else if coding.eq_ignore_ascii_case(b"identity") {
                    &mut self.identity
                } else if coding == b"*" {
                    &mut self.any
                } else {
                    continue;
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

    /// The coding to send, or `None` for identity.
    ///
    /// No field at all means the client did not ask: send identity, as every browser-era proxy
    /// does. A coding not listed takes the weight of `*`. Identity wins only when it is weighed
    /// (itself or by `*`) above every coding; gzip wins ties, being the one every client decodes.
    pub fn choose(&self) -> Option<Coding> {
        if !self.present {
            return None;
        }
        let weight = |w: Option<Weight>| w.or(self.any).unwrap_or(0);
        let (coding, best) = [(Coding::Gzip, weight(self.gzip)), (Coding::Deflate, weight(self.deflate))]
            .into_iter()
            .fold((Coding::Gzip, 0), |acc, c| if c.1 > acc.1 { c } else { acc });
        // Identity competes only when the client weighed it; listing a coding at all is a request for it.
        let identity = self.identity.or(self.any).unwrap_or(0);
        (best > 0 && best >= identity).then_some(coding)
    }
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
    use super::*;

    fn choose(lines: &[&str]) -> Option<Coding> {
        let mut accept = AcceptEncoding::default();
        for line in lines {
            accept.add(line.as_bytes());
        }
        accept.choose()
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
