//! A small JSON tree that keeps what replay needs byte-exact: object member order and number
//! text. serde_json does this only with its `preserve_order` and `arbitrary_precision`
//! features, and Cargo would turn those on for every crate built in the same workspace run
//! (including `shared-core`), so this crate parses JSON itself.
//!
//! Parsing and compact writing follow serde_json and Python's `json` module: strings are
//! unescaped on input and written back with the minimal escapes (`\"`, `\\`, `\b`, `\f`, `\n`,
//! `\r`, `\t`, other control characters as lowercase `\u00xx`), everything else as raw UTF-8;
//! a repeated object member keeps its first position and takes its last value.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    /// The number exactly as written in the source.
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Members in document order, names unique.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

#[derive(Debug)]
pub struct ParseError {
    pub offset: usize,
    pub reason: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

impl std::error::Error for ParseError {}

/// Nesting bound: keeps hostile input from overflowing the stack. Deep call traces in the
/// corpus stay far below it.
const MAX_DEPTH: usize = 1000;

/// Objects at least this large are checked for repeated names with a hash set; smaller ones
/// pairwise.
const HASHED_DUPLICATE_CHECK: usize = 16;

pub fn parse(text: &str) -> Result<Json<'_>, ParseError> {
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.pos != parser.bytes.len() {
        return Err(parser.error("trailing characters"));
    }
    Ok(value)
}

impl<'a> Json<'a> {
    /// The member `name` of an object.
    pub fn get(&self, name: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(members) => members
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn write_compact(&self, out: &mut Vec<u8>) {
        self.write(out, false);
    }

    pub fn to_compact(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_compact(&mut out);
        out
    }

    /// Compact, with every object's members sorted by name: equal requests give equal text
    /// whatever order their client wrote the members in.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        self.write(out, true);
    }

    fn write(&self, out: &mut Vec<u8>, sort_members: bool) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Number(text) => out.extend_from_slice(text.as_bytes()),
            Json::String(s) => write_string(out, s),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out, sort_members);
                }
                out.push(b']');
            }
            Json::Object(members) if sort_members => {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                write_members(out, sorted.into_iter(), true);
            }
            Json::Object(members) => write_members(out, members.iter(), false),
        }
    }
}

fn write_members<'j, 'a: 'j>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = &'j (Cow<'a, str>, Json<'a>)>,
    sort_members: bool,
) {
    out.push(b'{');
    for (i, (name, value)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, name);
        out.push(b':');
        value.write(out, sort_members);
    }
    out.push(b'}');
}

/// Writes `s` as a JSON string literal with the minimal escapes.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run_start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(byte >> 4) as usize],
                HEX[(byte & 0xf) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[run_start..i]);
        out.extend_from_slice(escape);
        run_start = i + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, reason: &'static str) -> ParseError {
        ParseError {
            offset: self.pos,
            reason,
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn value(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep"));
        }
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(_) => Err(self.error("expected a value")),
            None => Err(self.error("unexpected end of input")),
        }
    }

    fn literal(&mut self, word: &'static str, value: Json<'a>) -> Result<Json<'a>, ParseError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        self.pos += 1; // '{'
        let mut members = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a member name"));
            }
            let name = self.string()?;
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.error("expected ':'"));
            }
            self.pos += 1;
            members.push((name, self.value(depth + 1)?));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    if has_repeated_names(&members) {
                        members = merge_repeated_names(members);
                    }
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn number(&mut self) -> Result<Json<'a>, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
        }
        Ok(Json::Number(&self.text[start..self.pos]))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    /// A string literal starting at the opening quote; borrowed when it has no escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, ParseError> {
        self.pos += 1; // '"'
        let start = self.pos;
        let mut owned: Option<String> = None;
        let mut run_start = start;
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    let run = &self.text[run_start..self.pos];
                    self.pos += 1;
                    return Ok(match owned {
                        None => Cow::Borrowed(run),
                        Some(mut s) => {
                            s.push_str(run);
                            Cow::Owned(s)
                        }
                    });
                }
                Some(b'\\') => {
                    let s = owned.get_or_insert_with(String::new);
                    s.push_str(&self.text[run_start..self.pos]);
                    self.pos += 1;
                    let unescaped = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            let c = self.unicode_escape()?;
                            s.push(c);
                            run_start = self.pos;
                            continue;
                        }
                        _ => return Err(self.error("invalid escape")),
                    };
                    s.push(unescaped);
                    self.pos += 1;
                    run_start = self.pos;
                }
                Some(0x00..=0x1f) => return Err(self.error("control character in string")),
                Some(_) => self.pos += 1,
            }
        }
    }

    /// The code point of a `\uXXXX` escape (the `\u` already consumed), joining a surrogate
    /// pair. Lone surrogates are rejected, as serde_json does.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(self.error("lone surrogate"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(self.error("lone surrogate"));
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(self.error("lone surrogate")),
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid code point"))
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error("invalid \\u escape"))?;
        let mut value = 0;
        for &digit in digits {
            let nibble = (digit as char)
                .to_digit(16)
                .ok_or_else(|| self.error("invalid \\u escape"))?;
            value = value * 16 + nibble;
        }
        self.pos += 4;
        Ok(value)
    }
}

fn has_repeated_names(members: &[(Cow<'_, str>, Json<'_>)]) -> bool {
    if members.len() < HASHED_DUPLICATE_CHECK {
        members
            .iter()
            .enumerate()
            .any(|(i, (name, _))| members[..i].iter().any(|(earlier, _)| earlier == name))
    } else {
        let mut seen = HashSet::with_capacity(members.len());
        !members.iter().all(|(name, _)| seen.insert(name.as_ref()))
    }
}

/// Keeps each name once, at its first position, with its last value.
fn merge_repeated_names<'a>(
    members: Vec<(Cow<'a, str>, Json<'a>)>,
) -> Vec<(Cow<'a, str>, Json<'a>)> {
    let mut merged: Vec<(Cow<'a, str>, Json<'a>)> = Vec::with_capacity(members.len());
    for (name, value) in members {
        match merged.iter_mut().find(|(existing, _)| *existing == name) {
            Some(slot) => slot.1 = value,
            None => merged.push((name, value)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact(text: &str) -> String {
        String::from_utf8(parse(text).unwrap().to_compact()).unwrap()
    }

    #[test]
    fn keeps_member_order_and_number_text() {
        assert_eq!(
            compact("{ \"b\": 1.50, \"a\": [ 1e3, -0, 12345678901234567890123 ] }"),
            r#"{"b":1.50,"a":[1e3,-0,12345678901234567890123]}"#
        );
    }

    #[test]
    fn normalises_string_escapes_like_python() {
        assert_eq!(
            compact(r#""\u00e9\/\u2192\ud83d\ude00\u001f\u0008""#),
            "\"é/→😀\\u001f\\b\""
        );
    }

    #[test]
    fn repeated_names_keep_first_position_and_last_value() {
        assert_eq!(compact(r#"{"a":1,"b":2,"a":3}"#), r#"{"a":3,"b":2}"#);
        let many: Vec<String> = (0..20).map(|i| format!("\"k{i}\":{i}")).collect();
        let text = format!("{{{},\"k3\":99}}", many.join(","));
        assert!(compact(&text).contains("\"k3\":99,\"k4\""));
    }

    #[test]
    fn canonical_form_sorts_names() {
        let mut out = Vec::new();
        parse(r#"{"b":{"d":1,"c":2},"a":null}"#)
            .unwrap()
            .write_canonical(&mut out);
        assert_eq!(out, br#"{"a":null,"b":{"c":2,"d":1}}"#);
    }

    #[test]
    fn rejects_invalid_input() {
        for bad in [
            "",
            "{",
            "[1,]",
            "01",
            "1.",
            "\"\\ud800\"",
            "\"a\nb\"",
            "nul",
            "{} x",
            "NaN",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
        let deep = "[".repeat(MAX_DEPTH + 2);
        assert!(parse(&deep).is_err());
    }
}
