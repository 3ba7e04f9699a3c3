//! Read-only memory map of the f32 row file (the only `unsafe` of the storage layer).
#![allow(unsafe_code)]

use std::fs::File;
use std::io;

use memmap2::Mmap;

/// Maps `file` read-only. An empty file maps to `None` (mapping zero bytes is an error on Linux).
pub(crate) fn map_read_only(file: &File) -> io::Result<Option<Mmap>> {
    if file.metadata()?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: the file belongs to this index's directory, which only the index writes. The index
    // only ever appends to it while mapped (never truncates or rewrites mapped bytes: truncation
    // of an unpersisted tail happens in `RowFile::open`, before any map exists), so the mapped
    // range stays valid and its contents never change underneath readers.
    let map = unsafe { Mmap::map(file)? };
    Ok(Some(map))
}
