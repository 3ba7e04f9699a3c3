//! Hard limits that stop decompression bombs and oversized bundles early.

/// Hard limits applied to declared sizes (in the manifest) and to actual bytes decompressed.
/// A bundle over any limit is refused before its payload is read (declared sizes) or as soon as
/// the decompressed stream exceeds what the manifest allows (actual sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest single payload file, in bytes.
    pub max_file_size: u64,
    /// Largest sum of payload file sizes, in bytes.
    pub max_total_size: u64,
    /// Most payload files.
    pub max_entries: u64,
    /// Largest `manifest.json`, in bytes (`manifest.sig.json` gets the same limit).
    pub max_manifest_size: u64,
}

impl Default for Limits {
    /// 8 GiB per file, 32 GiB in total, 10 000 files, 4 MiB manifest.
    fn default() -> Self {
        Limits {
            max_file_size: 8 << 30,
            max_total_size: 32 << 30,
            max_entries: 10_000,
            max_manifest_size: 4 << 20,
        }
    }
}
