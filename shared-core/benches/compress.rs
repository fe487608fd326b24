//! One-shot compression of real corpus bodies, by size bucket: libdeflate (what rpcedge uses for
//! whole bodies) at levels 1, 4, 6 and 9 against zlib-rs through flate2 and miniz_oxide at
//! levels 1 and 6. Prints throughput and ratio as a table, which `loadtest/compress_core.py` keeps
//! (results/compress.json) and BENCHMARKS.md renders.
//!
//! miniz_oxide is called directly: flate2 picks one backend per build, and the core's flate2
//! is zlib-rs.

mod common {
    pub mod buckets;
}

use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use rpcedge_core::compress::compress_whole;
use rpcedge_core::Coding;

use common::buckets::{sample, Bucket};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// (name, smallest, largest) body size, and how many bytes of bodies each bucket measures.
const BUCKETS: [(&str, usize, usize, usize); 5] = [
    ("under 1 KiB", 0, KIB - 1, 256 * KIB),
    ("1-16 KiB", KIB, 16 * KIB - 1, 2 * MIB),
    ("16-256 KiB", 16 * KIB, 256 * KIB - 1, 4 * MIB),
    ("256 KiB-4 MiB", 256 * KIB, 4 * MIB - 1, 8 * MIB),
    ("over 4 MiB", 4 * MIB, usize::MAX, 16 * MIB),
];

#[derive(Clone, Copy)]
enum Codec {
    Libdeflate(u32),
    ZlibRs(u32),
    MinizOxide(u8),
}

const CODECS: [Codec; 8] = [
    Codec::Libdeflate(1),
    Codec::Libdeflate(4),
    Codec::Libdeflate(6),
    Codec::Libdeflate(9),
    Codec::ZlibRs(1),
    Codec::ZlibRs(6),
    Codec::MinizOxide(1),
    Codec::MinizOxide(6),
];

impl Codec {
    fn name(self) -> String {
        match self {
            Codec::Libdeflate(l) => format!("libdeflate-{l}"),
            Codec::ZlibRs(l) => format!("flate2-zlib-rs-{l}"),
            Codec::MinizOxide(l) => format!("miniz_oxide-{l}"),
        }
    }

    /// Compressed size of `body` (deflate in a gzip or zlib frame; sizes compare within 18 bytes).
    fn compress(self, body: &[u8]) -> usize {
        match self {
            // The gzip rpcedge sends; a refused (not smaller) body counts as sent whole.
            Codec::Libdeflate(level) => compress_whole(Coding::Gzip, level, body).map_or(body.len(), |c| c.len()),
            Codec::ZlibRs(level) => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::new(level));
                encoder.write_all(body).unwrap();
                encoder.finish().unwrap().len()
            }
            Codec::MinizOxide(level) => miniz_oxide::deflate::compress_to_vec_zlib(body, level).len(),
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn main() {
    let buckets = sample(&BUCKETS);
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(250))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    for bucket in &buckets {
        let mut group = criterion.benchmark_group(bucket.name);
        group.throughput(Throughput::Bytes(bucket.bytes() as u64));
        for codec in CODECS {
            group.bench_with_input(BenchmarkId::from_parameter(codec.name()), &bucket.bodies, |b, bodies| {
                b.iter(|| bodies.iter().map(|body| codec.compress(black_box(body))).sum::<usize>())
            });
        }
        group.finish();
    }
    criterion.final_summary();
    print_report(&buckets);
}

/// The table: MB/s from criterion's mean estimate, ratio from one compression of the sample.
fn print_report(buckets: &[Bucket]) {
    let criterion_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("criterion");
    println!("\n| bucket | bodies | bytes | codec | MB/s | compressed/original |");
    println!("| --- | ---: | ---: | --- | ---: | ---: |");
    for bucket in buckets {
        for codec in CODECS {
            let estimates = criterion_dir.join(bucket.name).join(codec.name()).join("new/estimates.json");
            let Some(mean_ns) = std::fs::read_to_string(&estimates).ok().and_then(|text| mean_ns(&text)) else {
                continue; // filtered out of this run
            };
            let compressed: usize = bucket.bodies.iter().map(|b| codec.compress(b)).sum();
            println!(
                "| {} | {} | {} | {} | {:.0} | {:.3} |",
                bucket.name,
                bucket.bodies.len(),
                bucket.bytes(),
                codec.name(),
                bucket.bytes() as f64 / mean_ns * 1e3,
                compressed as f64 / bucket.bytes() as f64,
            );
        }
    }
}

/// `mean.point_estimate` of a criterion estimates.json, in nanoseconds.
fn mean_ns(text: &str) -> Option<f64> {
    serde_json::from_str::<serde_json::Value>(text).ok()?["mean"]["point_estimate"].as_f64()
}
