//! The corpus's response bodies sampled by size bucket, for the compression benchmarks.

#[path = "../../tests/common/corpus.rs"]
#[allow(dead_code)] // origins are for the golden test's messages
mod corpus;

pub struct Bucket {
    pub name: &'static str,
    pub bodies: Vec<Vec<u8>>,
}

impl Bucket {
    pub fn bytes(&self) -> usize {
        self.bodies.iter().map(Vec::len).sum()
    }
}

/// Bodies of each (name, smallest, largest, byte budget) bucket, spread over its sizes, up to
/// its budget; a bucket the corpus has no body for is empty.
pub fn sample(buckets: &[(&'static str, usize, usize, usize)]) -> Vec<Bucket> {
    let mut all = corpus::bodies();
    all.sort_by_key(|b| b.bytes.len());
    buckets
        .iter()
        .map(|&(name, low, high, budget)| {
            let members: Vec<Vec<u8>> =
                all.iter().filter(|b| (low..=high).contains(&b.bytes.len())).map(|b| b.bytes.clone()).collect();
            // Every n-th body, so the sample spans the bucket rather than its small end.
            let total: usize = members.iter().map(Vec::len).sum();
            let step = total.div_ceil(budget).max(1);
            Bucket { name, bodies: members.into_iter().step_by(step).collect() }
        })
        .collect()
}
