//! A small JSON scanner for the transcoders: it walks the input once, hands out strings as
//! borrowed slices (unescaped only when they carry escapes, which hex never needs), and skips
//! what a schema does not name without building anything. serde_json would build a tree, or
//! need a type per schema; the transcoders want neither.

use std::borrow::Cow;

use super::TranscodeError;

/// Nesting deeper than this in a skipped value is refused rather than followed.
const MAX_DEPTH: usize = 512;

pub struct Scanner<'a> {
    input: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        Scanner { input, at: 0 }
    }

    pub fn error(&self, what: &'static str) -> TranscodeError {
        TranscodeError::Json { what, at: self.at }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.input.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.input.get(self.at).copied()
    }

    pub fn expect(&mut self, byte: u8, what: &'static str) -> Result<(), TranscodeError> {
        if self.peek() != Some(byte) {
            return Err(self.error(what));
        }
        self.at += 1;
        Ok(())
    }

    /// Where the scanner is in its input.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Consumes `byte` if it comes next (after whitespace).
    pub fn eat(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        self.at += usize::from(next);
        next
    }

    /// The bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.input.len() - self.at
    }

    /// Only whitespace is left.
    pub fn end(&mut self) -> Result<(), TranscodeError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.error("more after the value")),
        }
    }

    /// A string of 0x-prefixed hex digit pairs and nothing else, decoded onto `out` as its end is
    /// looked for; false, with nothing read, for any other string (odd digits, escapes, no
    /// prefix), which the caller then reads with [`Scanner::string`].
    pub fn hex_string(&mut self, out: &mut Vec<u8>) -> bool {
        self.skip_whitespace();
        let Some(text) = self.input[self.at..].strip_prefix(b"\"0x") else { return false };
        let start = out.len();
        let taken = super::hex::decode_run(text, out);
        if text.get(taken) != Some(&b'"') {
            out.truncate(start);
            return false;
        }
        self.at += 3 + taken + 1;
        true
    }

    /// Whether the next string is `"name"` exactly: then it is read.
    fn quoted_is(&mut self, name: &[u8]) -> bool {
        let start = self.at;
        if self.quoted_exact(name.len()) == Some(name) {
            return true;
        }
        self.at = start;
        false
    }

    /// A string's contents, unescaped.
    pub fn string(&mut self) -> Result<Cow<'a, [u8]>, TranscodeError> {
        self.expect(b'"', "a string")?;
        let start = self.at;
        // Keys and numbers are short: a plain loop finds their end before memchr would start.
        let head = &self.input[start..self.input.len().min(start + 32)];
        let end = match head.iter().position(|&b| b == b'"' || b == b'\\') {
            Some(offset) => start + offset,
            None => match memchr::memchr2(b'"', b'\\', &self.input[start..]) {
                Some(offset) => start + offset,
                None => return Err(self.error("an unterminated string")),
            },
        };
        if self.input[end] == b'"' {
            self.at = end + 1;
            return Ok(Cow::Borrowed(&self.input[start..end]));
        }
        self.at = start;
        self.escaped_string().map(Cow::Owned)
    }

    fn escaped_string(&mut self) -> Result<Vec<u8>, TranscodeError> {
        let mut out = Vec::new();
        loop {
            let Some(&byte) = self.input.get(self.at) else { return Err(self.error("an unterminated string")) };
            self.at += 1;
            match byte {
                b'"' => return Ok(out),
                b'\\' => {
                    let Some(&escape) = self.input.get(self.at) else { return Err(self.error("a broken escape")) };
                    self.at += 1;
                    match escape {
                        b'"' | b'\\' | b'/' => out.push(escape),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => self.unicode_escape(&mut out)?,
                        _ => return Err(self.error("a broken escape")),
                    }
                }
                0..=0x1f => return Err(self.error("a control character in a string")),
                _ => out.push(byte),
            }
        }
    }

    fn unicode_escape(&mut self, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
        let first = self.utf16_unit()?;
        let code = if (0xd800..0xdc00).contains(&first) {
            if self.input.get(self.at..self.at + 2) != Some(b"\\u") {
                return Err(self.error("a lone surrogate"));
            }
            self.at += 2;
            let second = self.utf16_unit()?;
            if !(0xdc00..0xe000).contains(&second) {
                return Err(self.error("a lone surrogate"));
            }
            0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
        } else {
            first
        };
        let c = char::from_u32(code).ok_or(self.error("a lone surrogate"))?;
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }

    /// The four hex digits of a `\u` escape.
    fn utf16_unit(&mut self) -> Result<u32, TranscodeError> {
        let digits = self.input.get(self.at..self.at + 4).ok_or(self.error("a broken \\u escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.error("a broken \\u escape"))?;
        let value = u32::from_str_radix(text, 16).map_err(|_| self.error("a broken \\u escape"))?;
        self.at += 4;
        Ok(value)
    }

    /// The next `len` bytes inside quotes, when the value is a string that long, unchecked: for a
    /// caller that checks them as it reads them (hex cannot hold a quote or an escape). `None`,
    /// with nothing consumed, otherwise.
    pub fn quoted_exact(&mut self, len: usize) -> Option<&'a [u8]> {
        self.skip_whitespace();
        let text = self.input.get(self.at..self.at + len + 2)?;
        if text[0] != b'"' || text[len + 1] != b'"' {
            return None;
        }
        self.at += len + 2;
        Some(&text[1..=len])
    }

    /// `true` or `false`.
    pub fn boolean(&mut self) -> Result<bool, TranscodeError> {
        self.skip_whitespace();
        for (word, value) in [(&b"true"[..], true), (b"false", false)] {
            if self.input[self.at..].starts_with(word) {
                self.at += word.len();
                return Ok(value);
            }
        }
        Err(self.error("a boolean"))
    }

    /// The digits of a non-negative integer, as a decimal string (the Beacon-API's form) or a bare
    /// number.
    pub fn decimal(&mut self) -> Result<Cow<'a, [u8]>, TranscodeError> {
        let digits = if self.peek() == Some(b'"') {
            self.string()?
        } else {
            let start = self.at;
            let len = self.input[start..].iter().take_while(|b| b.is_ascii_digit()).count();
            self.at += len;
            Cow::Borrowed(&self.input[start..start + len])
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(self.error("a decimal integer"));
        }
        Ok(digits)
    }

    /// A u64, quoted or bare, read in one pass: the Beacon-API's slots, indices and amounts.
    /// `None`, with nothing consumed, for anything else (escapes, a sign, more than u64 holds),
    /// which [`Scanner::decimal`] then reads.
    pub fn decimal_u64(&mut self) -> Option<u64> {
        self.skip_whitespace();
        let rest = &self.input[self.at..];
        let quoted = rest.first() == Some(&b'"');
        let digits = &rest[usize::from(quoted)..];
        let (mut value, mut len) = (0u64, 0);
        // eight digits at a time while that cannot overflow
        while len < 16 {
            let Some(value8) = digits.get(len..len + 8).and_then(eight_digits) else { break };
            value = value * 100_000_000 + value8;
            len += 8;
        }
        while let Some(digit) = digits.get(len).map(|byte| byte.wrapping_sub(b'0')).filter(|&digit| digit <= 9) {
            // 19 digits cannot overflow; the 20th may
            value = if len < 19 { value * 10 + u64::from(digit) } else { value.checked_mul(10)?.checked_add(u64::from(digit))? };
            len += 1;
        }
        if len == 0 || (quoted && digits.get(len) != Some(&b'"')) {
            return None;
        }
        self.at += len + 2 * usize::from(quoted);
        Some(value)
    }

    /// Walks an object's members: `member` gets each key and must consume its value.
    pub fn object(
        &mut self,
        member: impl FnMut(&mut Self, &[u8]) -> Result<(), TranscodeError>,
    ) -> Result<(), TranscodeError> {
        self.object_expecting(|| None, member)
    }

    /// Walks an object as [`Scanner::object`] does, trying first the key that `expected` names:
    /// a schema's fields usually come in its order, and a key that matches costs a comparison
    /// instead of a search for its end.
    pub fn object_expecting(
        &mut self,
        expected: impl Fn() -> Option<&'static [u8]>,
        mut member: impl FnMut(&mut Self, &[u8]) -> Result<(), TranscodeError>,
    ) -> Result<(), TranscodeError> {
        self.expect(b'{', "an object")?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            let key = match expected().filter(|name| self.quoted_is(name)) {
                Some(name) => Cow::Borrowed(name),
                None => self.string()?,
            };
            self.expect(b':', "a colon")?;
            member(self, &key)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error("a comma or the object's end")),
            }
        }
    }

    /// Walks an array: `item` must consume each element.
    pub fn array(&mut self, mut item: impl FnMut(&mut Self) -> Result<(), TranscodeError>) -> Result<(), TranscodeError> {
        self.expect(b'[', "an array")?;
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            item(self)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error("a comma or the array's end")),
            }
        }
    }

    /// Skips one value of any kind, checking its syntax, and returns its text.
    pub fn value(&mut self) -> Result<&'a [u8], TranscodeError> {
        self.skip_whitespace();
        let start = self.at;
        // the containers open around this point: true for an object
        let mut open: Vec<bool> = Vec::new();
        loop {
            match self.peek().ok_or(self.error("a value"))? {
                b'"' => {
                    self.string()?;
                }
                kind @ (b'{' | b'[') => {
                    if open.len() == MAX_DEPTH {
                        return Err(self.error("nesting too deep"));
                    }
                    self.at += 1;
                    let object = kind == b'{';
                    if self.peek() == Some(if object { b'}' } else { b']' }) {
                        self.at += 1;
                    } else {
                        open.push(object);
                        if object {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                _ => self.scalar()?,
            }
            // a value is complete: close the containers it ends, or go on to the next element
            loop {
                let Some(&object) = open.last() else { return Ok(&self.input[start..self.at]) };
                match self.peek() {
                    Some(b',') => {
                        self.at += 1;
                        if object {
                            self.member_key()?;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.at += 1;
                        open.pop();
                    }
                    Some(b']') if !object => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return Err(self.error("a comma or a container's end")),
                }
            }
        }
    }

    fn member_key(&mut self) -> Result<(), TranscodeError> {
        self.string()?;
        self.expect(b':', "a colon")
    }

    fn scalar(&mut self) -> Result<(), TranscodeError> {
        let rest = &self.input[self.at..];
        for word in [&b"true"[..], b"false", b"null"] {
            if rest.starts_with(word) {
                self.at += word.len();
                return Ok(());
            }
        }
        let len = rest.iter().take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')).count();
        if len == 0 || std::str::from_utf8(&rest[..len]).ok().and_then(|n| n.parse::<f64>().ok()).is_none() {
            return Err(self.error("a value"));
        }
        self.at += len;
        Ok(())
    }
}

/// Eight ASCII decimal digits as their value, in a few word operations; `None` if any byte is not
/// a digit.
fn eight_digits(text: &[u8]) -> Option<u64> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let word = u64::from_le_bytes(text.try_into().ok()?);
    // each byte in 0x30..=0x39: its high nibble is 3, and adding 6 leaves it 3
    if word & (0xf0 * ONES) != 0x30 * ONES || word.wrapping_add(0x06 * ONES) & (0xf0 * ONES) != 0x30 * ONES {
        return None;
    }
    // the first digit is the lowest byte: combine neighbours into pairs, pairs into fours, fours
    // into eight
    let word = word - 0x30 * ONES;
    let pairs = (word * 10 + (word >> 8)) & 0x00ff_00ff_00ff_00ff;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_ffff_0000_ffff;
    Some((fours * 10_000 + (fours >> 32)) & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_u64_reads_what_str_parse_reads() {
        let cases = ["0", "7", "12345678", "123456789", "1234567812345678", "12345678123456789", "18446744073709551615", "09876543210", "00000000000000000000"];
        for text in cases {
            for input in [format!("\"{text}\","), format!("{text},")] {
                let mut json = Scanner::new(input.as_bytes());
                assert_eq!(json.decimal_u64(), Some(text.parse().unwrap()), "{input}");
                assert_eq!(json.peek(), Some(b','), "{input}: the number and its quotes read");
            }
        }
        for text in ["\"18446744073709551616\"", "\"99999999999999999999\"", "\"1234567a\"", "\"\"", "\"12", "-1", "\"1\\u0030\""] {
            let mut json = Scanner::new(text.as_bytes());
            assert_eq!(json.decimal_u64(), None, "{text}");
            assert_eq!(json.remaining(), text.len(), "{text}: nothing consumed");
        }
    }

    #[test]
    fn eight_digits_is_every_eight_digit_number() {
        for n in (0..100_000_000u64).step_by(9_973).chain([99_999_999]) {
            assert_eq!(eight_digits(format!("{n:08}").as_bytes()), Some(n));
        }
        for bad in [*b"1234567/", *b"1234567:", *b"/2345678", *b"12 45678", *b"\x00\x00\x00\x00\x00\x00\x00\x00"] {
            assert_eq!(eight_digits(&bad), None, "{bad:?}");
        }
    }
}
