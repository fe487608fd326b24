//! Which level pays, by coding and body size: libdeflate's levels 1 to 12 (gzip), zstd's 1 to 19
//! and brotli's 0 to 9 (10 and 11 take seconds per megabyte, out of a proxy's reach) on real
//! corpus bodies, bucket by bucket (quarter-decades of size from the 1 KiB gate up). For each it
//! prints the time per body, the ratio, and the bytes each level saves over the next cheaper one
//! per extra microsecond, the figures `level auto` (`compress::auto_level`) was chosen from.
//!
//! For gzip it also prints the stock compressors' bytes beside libdeflate's levels: zlib's level 6
//! with Envoy's compressor's 4 KiB window (`window_bits` 12) and with the 32 KiB window of nginx's
//! `gzip_comp_level 6`, and the cheapest libdeflate level that sends no more than each.
//!
//!     cargo bench -p rpcedge-core --bench level            # every coding
//!     cargo bench -p rpcedge-core --bench level -- zstd    # one

mod common {
    pub mod buckets;
}

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use rpcedge_core::compress::{auto_level, compress_whole};
use rpcedge_core::Coding;

use common::buckets::{sample, Bucket};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// (name, smallest, largest) body size, and at most 4 MiB of bodies per bucket.
const BUCKETS: [(&str, usize, usize, usize); 7] = [
    ("1-4 KiB", KIB, 4 * KIB - 1, 4 * MIB),
    ("4-16 KiB", 4 * KIB, 16 * KIB - 1, 4 * MIB),
    ("16-64 KiB", 16 * KIB, 64 * KIB - 1, 4 * MIB),
    ("64-256 KiB", 64 * KIB, 256 * KIB - 1, 4 * MIB),
    ("256 KiB-1 MiB", 256 * KIB, MIB - 1, 4 * MIB),
    ("1-4 MiB", MIB, 4 * MIB - 1, 4 * MIB),
    ("over 4 MiB", 4 * MIB, usize::MAX, 4 * MIB),
];
/// The levels measured per coding.
const CODINGS: [(Coding, &[u32]); 3] = [
    (Coding::Gzip, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
    (Coding::Zstd, &[1, 2, 3, 4, 5, 6, 7, 9, 12, 15, 19]),
    (Coding::Br, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
];

/// Bytes rpcedge sends for `bucket` in `coding` at `level` (a body it refuses as not smaller
/// counted whole).
fn compressed(bucket: &Bucket, coding: Coding, level: u32) -> usize {
    bucket.bodies.iter().map(|body| compress_whole(coding, level, body).map_or(body.len(), |c| c.len())).sum()
}

fn main() {
    let buckets: Vec<Bucket> = sample(&BUCKETS).into_iter().filter(|bucket| !bucket.bodies.is_empty()).collect();
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(700))
        .configure_from_args();
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-')).unwrap_or_default();
    let mut report = Vec::new();
    for (coding, levels) in CODINGS.into_iter().filter(|(coding, _)| coding.token().contains(filter.as_str())) {
      for bucket in &buckets {
        let mut group = criterion.benchmark_group(format!("level {} {}", coding.token(), bucket.name));
        group.throughput(Throughput::Bytes(bucket.bytes() as u64));
        let mut rows = Vec::new();
        for &level in levels {
            let started = std::time::Instant::now();
            let mut rounds = 0u32;
            group.bench_with_input(BenchmarkId::from_parameter(level), &bucket.bodies, |b, bodies| {
                b.iter(|| {
                    rounds += 1;
                    for body in bodies {
                        black_box(compress_whole(coding, level, black_box(body)));
                    }
                })
            });
            // Criterion keeps its estimates to itself: our own mean over every round it ran
            // (warm-up included) serves the table; its report has the careful figure.
            let per_body_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds) / bucket.bodies.len() as f64;
            rows.push((level, per_body_us, compressed(bucket, coding, level)));
        }
        group.finish();
        report.push((coding, bucket, rows));
      }
    }
    criterion.final_summary();
    print_report(&report);
    print_stock(&report);
}

/// gzip's framing: a 10-byte header and an 8-byte trailer around the DEFLATE stream.
const GZIP_FRAMING: usize = 18;

/// Bytes zlib's level 6 sends for `body` with a window of `window_bits` (memLevel 8, zlib's own;
/// Envoy's default of 5 makes a little more), as gzip.
fn zlib6(body: &[u8], window_bits: u8) -> usize {
    let mut zlib = flate2::Compress::new_with_window_bits(flate2::Compression::new(6), false, window_bits);
    let mut out = Vec::with_capacity(body.len() + body.len() / 100 + 128);
    let status = zlib.compress_vec(body, &mut out, flate2::FlushCompress::Finish).expect("zlib compresses");
    assert_eq!(status, flate2::Status::StreamEnd, "room for the whole stream");
    out.len() + GZIP_FRAMING
}

/// Per bucket, the stock compressors' bytes and the cheapest libdeflate level that sends no more.
fn print_stock(report: &[(Coding, &Bucket, Vec<LevelRow>)]) {
    println!("\n| bucket | zlib 6, 4 KiB window (Envoy) | cheapest level at or under it | zlib 6, 32 KiB window (nginx gzip 6) | cheapest level at or under it | auto |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (coding, bucket, rows) in report.iter().filter(|(coding, _, _)| *coding == Coding::Gzip) {
        let mean = bucket.bytes() / bucket.bodies.len();
        let cheapest = |stock: usize| {
            let mut fitting: Vec<&LevelRow> = rows.iter().filter(|&&(_, _, bytes)| bytes <= stock).collect();
            fitting.sort_by(|a, b| a.1.total_cmp(&b.1));
            fitting.first().map_or("none".into(), |&&(level, _, _)| level.to_string())
        };
        let ratio = |bytes: usize| bytes as f64 / bucket.bytes() as f64;
        let [envoy, nginx] = [12, 15].map(|bits| bucket.bodies.iter().map(|body| zlib6(body, bits).min(body.len())).sum::<usize>());
        println!(
            "| {} | {:.4} | {} | {:.4} | {} | {} |",
            bucket.name,
            ratio(envoy),
            cheapest(envoy),
            ratio(nginx),
            cheapest(nginx),
            auto_level(*coding, mean),
        );
    }
}

/// A level, its µs per body and the bytes it sends for the bucket.
type LevelRow = (u32, f64, usize);

/// Per bucket and level: µs per body, the ratio, and the marginal bytes saved per extra µs over
/// the best cheaper level (the exchange rate that `auto_level`'s choice is read against).
fn print_report(report: &[(Coding, &Bucket, Vec<LevelRow>)]) {
    println!("\n| coding | bucket | bodies | mean body B | level | µs/body | compressed/original | B saved per extra µs | auto |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |");
    for (coding, bucket, rows) in report {
        let mean = bucket.bytes() / bucket.bodies.len();
        let auto = auto_level(*coding, mean);
        for &(level, us, compressed) in rows {
            let marginal = rows
                .iter()
                .filter(|&&(_, cheaper_us, cheaper_bytes)| cheaper_us < us && cheaper_bytes > compressed)
                .map(|&(_, cheaper_us, cheaper_bytes)| {
                    (cheaper_bytes - compressed) as f64 / bucket.bodies.len() as f64 / (us - cheaper_us)
                })
                .fold(None, |best: Option<f64>, x| Some(best.map_or(x, |b| b.min(x))));
            println!(
                "| {} | {} | {} | {} | {} | {:.1} | {:.4} | {} | {} |",
                coding.token(),
                bucket.name,
                bucket.bodies.len(),
                mean,
                level,
                us,
                compressed as f64 / bucket.bytes() as f64,
                marginal.map_or("–".into(), |m| format!("{m:.1}")),
                if level == auto { "←" } else { "" },
            );
        }
    }
}
