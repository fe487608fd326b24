//! Which of N daemons holds a key: jump consistent hashing (Lamping and Veach, 2014). Every host
//! computes the same shard from the key alone, so nginx and Envoy in one fleet agree, and going
//! from N to N+1 daemons moves only the keys that land on the new one (about 1/(N+1)).

use super::Key;

/// The shard, `0..shards`, of `key` (`shards` of 0 counts as 1).
pub fn shard(key: &Key, shards: u32) -> u32 {
    let mut state = u64::from_le_bytes(key.0[..8].try_into().expect("8 bytes"));
    let (mut bucket, mut next) = (0i64, 0i64);
    while next < i64::from(shards.max(1)) {
        bucket = next;
        // A linear congruential step; the next bucket this key would jump to as buckets grow.
        state = state.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / ((state >> 33) + 1) as f64)) as i64;
    }
    bucket as u32
}
