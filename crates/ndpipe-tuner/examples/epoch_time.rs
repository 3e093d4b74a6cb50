//! Seconds per training epoch of NDPipe's head on 50,000 × 1280 features, batch 1024.
//!
//! `cargo run --release --example epoch_time [epochs]` (default 3 epochs per class count).

use std::time::Instant;

use ndpipe_tuner::{Head, HeadConfig};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

const ROWS: usize = 50_000;
const DIM: usize = 1280;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 3,
    };
    let mut rng = Pcg64Mcg::seed_from_u64(0);
    let features: Vec<f32> = (0..ROWS * DIM)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    println!("rows {ROWS}, dim {DIM}, batch 1024, {epochs} epochs");
    for classes in [10u32, 100] {
        let labels: Vec<u32> = (0..ROWS).map(|_| rng.random_range(0..classes)).collect();
        let names = (0..classes).map(|i| format!("c{i}")).collect();
        let mut head = Head::new(HeadConfig::new(names))?;
        let start = Instant::now();
        let report = head.train_run(&features, &labels, 0, 1, epochs)?;
        let per_epoch = start.elapsed().as_secs_f64() / epochs as f64;
        let eval_start = Instant::now();
        head.evaluate(&features, &labels)?;
        println!(
            "C={classes:>3}: {:.3} s/epoch ({:.1} ms per 4096 rows), evaluate {:.3} s, run report {:.3} s",
            per_epoch,
            per_epoch * 1e3 * 4096.0 / ROWS as f64,
            eval_start.elapsed().as_secs_f64(),
            report.seconds
        );
    }
    Ok(())
}
