//! Shared set-up for the tests that need the real model (`NDPIPE_MODEL_DIR`).
#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use ndpipe_model::{ImageTensor, OrtBackend, PreprocessConfig, Preprocessor, RuntimeConfig};

/// The model directory from `NDPIPE_MODEL_DIR`, or `None` after printing why the test is skipped.
pub(crate) fn model_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os("NDPIPE_MODEL_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            let msg = format!(
                "SKIPPED {test}: NDPIPE_MODEL_DIR is not set (run tools/model/setup_model.sh OUTDIR and set it to OUTDIR)\n"
            );
            // Straight to the terminal, past the test harness's output capture, where possible.
            let shown = std::fs::OpenOptions::new()
                .append(true)
                .open("/dev/stderr")
                .and_then(|mut tty| tty.write_all(msg.as_bytes()));
            if shown.is_err() {
                eprint!("{msg}");
            }
            None
        }
    }
}

/// The ONNX Runtime library: `NDPIPE_ORT_DYLIB`, else `lib/libonnxruntime.so.1` in the model directory.
pub(crate) fn dylib(model_dir: &Path) -> PathBuf {
    std::env::var_os("NDPIPE_ORT_DYLIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| model_dir.join("lib/libonnxruntime.so.1"))
}

/// CPU, two threads, batches up to 32.
pub(crate) fn config(model_dir: &Path) -> RuntimeConfig {
    RuntimeConfig {
        dylib: dylib(model_dir),
        intra_threads: 2,
        max_batch: 32,
        ..RuntimeConfig::default()
    }
}

/// Runs model tests one at a time (they each use both cores), like `#[serial]`.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One backend per test binary.
pub(crate) fn backend(model_dir: &Path) -> &'static OrtBackend {
    static BACKEND: OnceLock<OrtBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        OrtBackend::load(model_dir, &config(model_dir)).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A sample photo through our ingest preprocessing.
pub(crate) fn sample(model_dir: &Path, file: &str) -> ImageTensor {
    let path = model_dir.join("samples").join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Preprocessor::new(PreprocessConfig::default())
        .run(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .tensor
}
