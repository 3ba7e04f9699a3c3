//! Progress reporting for long work (the CLI draws a bar; libraries only count bytes).

/// Receives byte counts during build, verify and install. Implementations must be cheap: they
/// are called once per buffer (about 1 MiB).
pub trait Progress: Sync {
    /// Work of `total` bytes starts (`message` says which phase).
    fn begin(&self, _message: &str, _total: u64) {}
    /// `bytes` more bytes are done.
    fn advance(&self, _bytes: u64) {}
    /// The phase is done.
    fn finish(&self) {}
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
