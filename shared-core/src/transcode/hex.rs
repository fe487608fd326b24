//! Hex digits to bytes, checked in the same pass (SSE2 on x86_64, AVX2 where the CPU has it, a
//! table elsewhere): for the short strings of Beacon-API objects (roots, keys, signatures), and
//! for reading a JSON string of hex while looking for its end, where faster-hex's separate check
//! and decode passes, after a search for the end, would read it three times.

use super::TranscodeError;

/// Hex digits (either case, no prefix) to the bytes of `out`, twice as few.
pub fn decode_hex(digits: &[u8], out: &mut [u8]) -> Result<(), TranscodeError> {
    // faster-hex's separate wide passes win from a few hundred bytes on
    if out.len() <= SHORT_HEX {
        decode_short_hex(digits, out)
    } else {
        faster_hex::hex_decode(digits, out).map_err(|_| TranscodeError::Hex)
    }
}

/// The longest bytes that `decode_short_hex` decodes.
const SHORT_HEX: usize = 128;

/// Hex digits (either case) to bytes, checked in the same pass: for the short strings of
/// Beacon-API objects (roots, keys, signatures), where faster-hex's separate check and decode
/// passes cost more than the digits. `digits` is twice as long as `out`.
fn decode_short_hex(digits: &[u8], out: &mut [u8]) -> Result<(), TranscodeError> {
    if digits.len() != out.len() * 2 {
        return Err(TranscodeError::Hex);
    }
    let done = decode_vector_blocks(digits, out)?;
    let mut bad = 0;
    for (byte, pair) in out[done..].iter_mut().zip(digits[done * 2..].chunks_exact(2)) {
        let (high, low) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        bad |= high | low;
        *byte = high << 4 | low;
    }
    if bad & 0xf0 != 0 {
        return Err(TranscodeError::Hex);
    }
    Ok(())
}

/// Decodes the whole 32- and 16-byte blocks at the start of `out` with the vector units; how many
/// bytes that was (the rest is the caller's).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn decode_vector_blocks(digits: &[u8], out: &mut [u8]) -> Result<usize, TranscodeError> {
    let mut done = 0;
    if std::is_x86_feature_detected!("avx2") {
        while done + 32 <= out.len() {
            // SAFETY: AVX2 was detected; the 64 digits and 32 bytes are in bounds.
            let valid = unsafe { avx2::decode32(digits[done * 2..].as_ptr(), out[done..].as_mut_ptr()) };
            if !valid {
                return Err(TranscodeError::Hex);
            }
            done += 32;
        }
    }
    while done + 16 <= out.len() {
        // SAFETY: SSE2 is part of x86_64; the 32 digits and 16 bytes are in bounds.
        let valid = unsafe { sse2::decode16(digits[done * 2..].as_ptr(), out[done..].as_mut_ptr()) };
        if !valid {
            return Err(TranscodeError::Hex);
        }
        done += 16;
    }
    Ok(done)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn decode_vector_blocks(_digits: &[u8], _out: &mut [u8]) -> Result<usize, TranscodeError> {
    Ok(0)
}

/// Each byte's value as a hex digit; 0xff for a byte that is not one.
const NIBBLE: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    /// 16 hex digits' values, and whether every one is a digit.
    #[inline(always)]
    unsafe fn nibbles(chars: __m128i) -> (__m128i, i32) {
        // x in [0, k] unsigned: min(x, k) == x
        let within = |x: __m128i, k: i8| _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(k)), x);
        let digit = _mm_sub_epi8(chars, _mm_set1_epi8(b'0' as i8));
        let letter = _mm_sub_epi8(_mm_or_si128(chars, _mm_set1_epi8(0x20)), _mm_set1_epi8(b'a' as i8));
        let (is_digit, is_letter) = (within(digit, 9), within(letter, 5));
        let value = _mm_or_si128(
            _mm_and_si128(is_digit, digit),
            _mm_and_si128(is_letter, _mm_add_epi8(letter, _mm_set1_epi8(10))),
        );
        // each pair of values as one byte in a 16-bit lane: high << 4 | low
        let high = _mm_and_si128(_mm_slli_epi16(value, 4), _mm_set1_epi16(0xf0));
        let bytes = _mm_or_si128(high, _mm_srli_epi16(value, 8));
        (bytes, _mm_movemask_epi8(_mm_or_si128(is_digit, is_letter)))
    }

    /// Decodes 32 digits at `digits` into 16 bytes at `out`; false if any is not a digit.
    #[inline]
    pub unsafe fn decode16(digits: *const u8, out: *mut u8) -> bool {
        let (first, valid_first) = nibbles(_mm_loadu_si128(digits.cast()));
        let (second, valid_second) = nibbles(_mm_loadu_si128(digits.add(16).cast()));
        _mm_storeu_si128(out.cast(), _mm_packus_epi16(first, second));
        valid_first & valid_second == 0xffff
    }
}


#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Decodes 64 digits at `digits` into 32 bytes at `out`; false if any is not a digit. The
    /// same steps as `sse2::decode16`, twice as wide.
    #[target_feature(enable = "avx2")]
    pub unsafe fn decode32(digits: *const u8, out: *mut u8) -> bool {
        let nibbles = |chars: __m256i| {
            let within = |x: __m256i, k: i8| _mm256_cmpeq_epi8(_mm256_min_epu8(x, _mm256_set1_epi8(k)), x);
            let digit = _mm256_sub_epi8(chars, _mm256_set1_epi8(b'0' as i8));
            let letter = _mm256_sub_epi8(_mm256_or_si256(chars, _mm256_set1_epi8(0x20)), _mm256_set1_epi8(b'a' as i8));
            let (is_digit, is_letter) = (within(digit, 9), within(letter, 5));
            let value = _mm256_or_si256(
                _mm256_and_si256(is_digit, digit),
                _mm256_and_si256(is_letter, _mm256_add_epi8(letter, _mm256_set1_epi8(10))),
            );
            let high = _mm256_and_si256(_mm256_slli_epi16(value, 4), _mm256_set1_epi16(0xf0));
            let bytes = _mm256_or_si256(high, _mm256_srli_epi16(value, 8));
            (bytes, _mm256_movemask_epi8(_mm256_or_si256(is_digit, is_letter)))
        };
        let (first, valid_first) = nibbles(_mm256_loadu_si256(digits.cast()));
        let (second, valid_second) = nibbles(_mm256_loadu_si256(digits.add(32).cast()));
        // packus works within each 128-bit lane: put the four quarters back in order
        let packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(first, second), 0b11_01_10_00);
        _mm256_storeu_si256(out.cast(), packed);
        valid_first & valid_second == -1
    }
}

/// Decodes the longest run of whole digit pairs at the start of `text` onto `out`; returns how
/// many digits it took.
pub fn decode_run(text: &[u8], out: &mut Vec<u8>) -> usize {
    let mut taken = 0;
    #[cfg(target_arch = "x86_64")]
    while taken + 32 <= text.len() {
        let mut bytes = [0; 16];
        // SAFETY: SSE2 is part of x86_64; the 32 digits and 16 bytes are in bounds.
        if !unsafe { sse2::decode16(text[taken..].as_ptr(), bytes.as_mut_ptr()) } {
            break;
        }
        out.extend_from_slice(&bytes);
        taken += 32;
    }
    for pair in text[taken..].chunks_exact(2) {
        let (high, low) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        if (high | low) & 0xf0 != 0 {
            break;
        }
        out.push(high << 4 | low);
        taken += 2;
    }
    taken
}
