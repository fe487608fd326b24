//! A raw DEFLATE stream made continuable: its final block marked non-final and the stream closed
//! by a sync flush (an empty stored block, which ends on a byte boundary) and an empty final
//! block. The stream inflates to the same bytes; without its last two bytes it is a run of
//! non-final blocks that more blocks can follow, so that the streams of several cache entries
//! are spliced into one gzip body without compressing anything again.
//!
//! Finding the final block takes a walk over the stream's blocks, decoding the Huffman codes
//! without producing output (RFC 1951, after Mark Adler's puff). No library exposes block
//! boundaries: zlib's `Z_BLOCK` does, but neither flate2 nor libdeflate passes it on.

/// The last two bytes of a continuable stream: BFINAL 1, BTYPE 01 (fixed codes), end of block.
pub const EMPTY_FINAL_BLOCK: [u8; 2] = [0x03, 0x00];
/// A sync flush: an empty stored block's LEN and NLEN, after its header and padding.
const SYNC_MARKER: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// `stream` rewritten to end in a sync flush and [`EMPTY_FINAL_BLOCK`]; `None` when it is not a
/// well-formed stream of blocks, or has bytes after its final block.
pub fn continuable(stream: &[u8]) -> Option<Vec<u8>> {
    let (final_header, end) = walk(stream)?;
    if end.div_ceil(8) != stream.len() {
        return None;
    }
    let mut out = stream.to_vec();
    out[final_header / 8] &= !(1 << (final_header % 8));
    let spare = end % 8;
    if spare != 0 {
        // the padding after the last code: the stored block's header starts there
        *out.last_mut().expect("a stream has bytes") &= (1u8 << spare) - 1;
    }
    // the stored block's 3 header bits fit in the last byte when at least 3 bits are left in it
    if spare == 0 || spare > 5 {
        out.push(0);
    }
    out.extend_from_slice(&SYNC_MARKER);
    out.extend_from_slice(&EMPTY_FINAL_BLOCK);
    Some(out)
}

/// Where the final block's header starts and where the stream ends, in bits.
fn walk(stream: &[u8]) -> Option<(usize, usize)> {
    let mut bits = Bits { data: stream, at: 0 };
    loop {
        let header = bits.at;
        let last = bits.take(1)? == 1;
        match bits.take(2)? {
            0 => {
                bits.at = bits.at.next_multiple_of(8);
                let len = bits.take(16)?;
                if bits.take(16)? != !len & 0xffff {
                    return None;
                }
                bits.at += len as usize * 8;
                if bits.at > stream.len() * 8 {
                    return None;
                }
            }
            1 => codes(&mut bits, &Huffman::fixed_lengths(), &Huffman::fixed_distances())?,
            2 => {
                let (lengths, distances) = dynamic_tables(&mut bits)?;
                codes(&mut bits, &lengths, &distances)?;
            }
            _ => return None,
        }
        if last {
            return Some((header, bits.at));
        }
    }
}

/// Least significant bit first, as DEFLATE packs them.
struct Bits<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn take(&mut self, n: u32) -> Option<u32> {
        let mut value = 0;
        for i in 0..n {
            let byte = *self.data.get(self.at / 8)?;
            value |= u32::from((byte >> (self.at % 8)) & 1) << i;
            self.at += 1;
        }
        Some(value)
    }
}

/// A canonical Huffman code: how many codes there are of each length, and the symbols in code
/// order.
struct Huffman {
    counts: [u16; 16],
    symbols: Vec<u16>,
}

impl Huffman {
    /// `None` for an over-subscribed set of lengths (an incomplete one is allowed, as zlib does
    /// for a single distance code).
    fn new(lengths: &[u8]) -> Option<Huffman> {
        let mut counts = [0u16; 16];
        for &length in lengths {
            counts[usize::from(length)] += 1;
        }
        counts[0] = 0;
        let mut left = 1i32;
        for &count in &counts[1..] {
            left = (left << 1) - i32::from(count);
            if left < 0 {
                return None;
            }
        }
        let mut offsets = [0u16; 16];
        for length in 1..15 {
            offsets[length + 1] = offsets[length] + counts[length];
        }
        let mut symbols = vec![0; lengths.len()];
        for (symbol, &length) in lengths.iter().enumerate() {
            if length != 0 {
                symbols[usize::from(offsets[usize::from(length)])] = symbol as u16;
                offsets[usize::from(length)] += 1;
            }
        }
        Some(Huffman { counts, symbols })
    }

    fn fixed_lengths() -> Huffman {
        let lengths: Vec<u8> = (0..288)
            .map(|symbol| match symbol {
                0..=143 => 8,
                144..=255 => 9,
                256..=279 => 7,
                _ => 8,
            })
            .collect();
        Huffman::new(&lengths).expect("the fixed code is complete")
    }

    fn fixed_distances() -> Huffman {
        Huffman::new(&[5; 30]).expect("the fixed code is complete")
    }

    fn decode(&self, bits: &mut Bits) -> Option<u16> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for &count in &self.counts[1..] {
            code |= bits.take(1)? as i32;
            let count = i32::from(count);
            if code - count < first {
                return self.symbols.get((index + code - first) as usize).copied();
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        None
    }
}

/// Extra bits of the length codes 257..285 and of the distance codes.
const LENGTH_EXTRA: [u32; 29] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
const DISTANCE_EXTRA: [u32; 30] =
    [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
/// The order in which a dynamic block gives the code length code's lengths.
const CODE_LENGTH_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// A dynamic block's literal/length and distance codes.
fn dynamic_tables(bits: &mut Bits) -> Option<(Huffman, Huffman)> {
    let literals = bits.take(5)? as usize + 257;
    let distances = bits.take(5)? as usize + 1;
    let code_lengths = bits.take(4)? as usize + 4;
    if literals > 286 || distances > 30 {
        return None;
    }
    let mut lengths = [0u8; 19];
    for &symbol in &CODE_LENGTH_ORDER[..code_lengths] {
        lengths[symbol] = bits.take(3)? as u8;
    }
    let code_length_code = Huffman::new(&lengths)?;
    let mut lengths = Vec::with_capacity(literals + distances);
    while lengths.len() < literals + distances {
        let symbol = code_length_code.decode(bits)?;
        let (length, repeat) = match symbol {
            0..=15 => (symbol as u8, 1),
            16 => (*lengths.last()?, 3 + bits.take(2)?),
            17 => (0, 3 + bits.take(3)?),
            18 => (0, 11 + bits.take(7)?),
            _ => return None,
        };
        if lengths.len() + repeat as usize > literals + distances {
            return None;
        }
        lengths.resize(lengths.len() + repeat as usize, length);
    }
    if lengths[256] == 0 {
        return None; // no end-of-block code
    }
    Some((Huffman::new(&lengths[..literals])?, Huffman::new(&lengths[literals..])?))
}

/// Walks a block's codes up to its end-of-block code.
fn codes(bits: &mut Bits, literal_length: &Huffman, distance: &Huffman) -> Option<()> {
    loop {
        let symbol = literal_length.decode(bits)?;
        match symbol {
            0..=255 => {}
            256 => return Some(()),
            _ => {
                let extra = *LENGTH_EXTRA.get(usize::from(symbol - 257))?;
                bits.take(extra)?;
                let code = distance.decode(bits)?;
                bits.take(*DISTANCE_EXTRA.get(usize::from(code))?)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::deflate_raw;
    use flate2::{Decompress, FlushDecompress, Status};

    fn inflate(stream: &[u8], len: usize) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len + 1);
        let done = Decompress::new(false).decompress_vec(stream, &mut out, FlushDecompress::Finish).ok()?;
        (done == Status::StreamEnd).then_some(out)
    }

    /// Text, repeats and noise: stored, fixed and dynamic blocks from libdeflate's levels.
    fn inputs() -> Vec<Vec<u8>> {
        let mut noise = Vec::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..70_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            noise.push(state as u8);
        }
        let json: Vec<u8> = (0..3000)
            .flat_map(|i| format!(r#"{{"blockNumber":"0x{i:x}","gasUsed":"0x5208","logs":[]}},"#).into_bytes())
            .collect();
        vec![b"a".to_vec(), b"{}".to_vec(), json.clone(), noise.clone(), [json, noise].concat(), vec![0; 200_000]]
    }

    /// A stored block that is not final, then the input in a final stored block.
    fn stored(input: &[u8]) -> Vec<u8> {
        let len = input.len() as u16;
        [&[0u8, 1, 0, 0xfe, 0xff, b'x', 1][..], &len.to_le_bytes(), &(!len).to_le_bytes(), input].concat()
    }

    #[test]
    fn a_continuable_stream_inflates_alike_and_continues_without_its_last_two_bytes() {
        for input in inputs() {
            let streams = [1, 6, 12].map(|level| deflate_raw(level, &input));
            let stored = (input.len() < 60_000).then(|| (stored(&input), [b"x", &input[..]].concat()));
            let cases = streams.into_iter().flatten().map(|stream| (stream, input.clone())).chain(stored);
            for (stream, input) in cases {
                let continued = continuable(&stream).expect("libdeflate's stream is walked");
                assert_eq!(inflate(&continued, input.len()).as_deref(), Some(&input[..]));
                // two of them one after the other, then a final empty block: both inputs
                let open = &continued[..continued.len() - 2];
                assert_eq!(&continued[continued.len() - 2..], EMPTY_FINAL_BLOCK);
                let twice = [open, open, &EMPTY_FINAL_BLOCK].concat();
                assert_eq!(inflate(&twice, input.len() * 2), Some([&input[..], &input[..]].concat()));
            }
        }
    }

    #[test]
    fn a_broken_stream_is_not_rewritten() {
        let stream = deflate_raw(6, &inputs()[2]).unwrap();
        assert_eq!(continuable(&stream[..stream.len() / 2]), None, "cut short");
        assert_eq!(continuable(&[stream.as_slice(), &[0]].concat()), None, "a byte past its end");
        assert_eq!(continuable(&[0x07]), None, "BTYPE 11");
        assert_eq!(continuable(&[]), None);
    }
}
