//! The byte layout of a bundle file, below the manifest.
//!
//! A bundle is two concatenated zstd frames, so `zstd -dc bundle.tar.zst | tar t` works:
//!
//! 1. the **metadata frame**: the tar entries `manifest.json` and `manifest.sig.json` (no
//!    end-of-archive blocks), stored in *raw* zstd blocks (128 KiB each, the last one shorter)
//!    with the frame's XXH64 content checksum. Raw blocks have no redundant encodings, so every
//!    byte of this frame is covered by the checksum, the signature or the framing rules;
//! 2. the **payload frame**: the payload entries and the tar end-of-archive blocks, compressed
//!    at the builder's level with a fixed 8 MiB window and a content checksum. The manifest
//!    records its exact size and SHA-256, so no byte of it can change unnoticed either (zstd
//!    has many encodings of the same content; the digest pins the one that was signed).
//!
//! Nothing may follow the payload frame.

/// zstd frame magic number.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// The builder's zstd window log (8 MiB), fixed so that frame headers are canonical.
pub const WINDOW_LOG: u32 = 23;
/// Frame header descriptor of both frames: content checksum, nothing else.
pub const FRAME_DESCRIPTOR: u8 = 0x04;
/// Window descriptor for [`WINDOW_LOG`].
pub const WINDOW_DESCRIPTOR: u8 = ((WINDOW_LOG - 10) << 3) as u8;
/// Size of every raw block of the metadata frame but the last.
pub const RAW_BLOCK: usize = 128 * 1024;

/// Encodes `content` as a zstd frame of raw blocks with a content checksum.
pub fn metadata_frame(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + content.len() / RAW_BLOCK * 3 + 16);
    out.extend_from_slice(&ZSTD_MAGIC);
    out.push(FRAME_DESCRIPTOR);
    out.push(WINDOW_DESCRIPTOR);
    let mut blocks = content.chunks(RAW_BLOCK).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&block_header(true, 0));
    }
    while let Some(block) = blocks.next() {
        out.extend_from_slice(&block_header(blocks.peek().is_none(), block.len()));
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&(xxh64(content, 0) as u32).to_le_bytes());
    out
}

/// A raw block header: bit 0 last-block, bits 1-2 type (0 = raw), bits 3.. size.
fn block_header(last: bool, size: usize) -> [u8; 3] {
    let v = (size as u32) << 3 | u32::from(last);
    let b = v.to_le_bytes();
    [b[0], b[1], b[2]]
}

/// Decodes a raw block header into (last, type, size).
pub(crate) fn parse_block_header(h: [u8; 3]) -> (bool, u8, usize) {
    let v = u32::from_le_bytes([h[0], h[1], h[2], 0]);
    (v & 1 == 1, ((v >> 1) & 3) as u8, (v >> 3) as usize)
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(acc: u64, val: u64) -> u64 {
    (acc ^ round(0, val)).wrapping_mul(P1).wrapping_add(P4)
}

fn u64_at(d: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(d[i..i + 8].try_into().expect("8 bytes"))
}

/// XXH64 (the hash zstd uses for content checksums; it stores the low 32 bits).
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len();
    let mut i = 0;
    let mut h = if len >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while i + 32 <= len {
            for (lane, acc) in v.iter_mut().enumerate() {
                *acc = round(*acc, u64_at(data, i + lane * 8));
            }
            i += 32;
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for acc in v {
            h = merge(h, acc);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len as u64);
    while i + 8 <= len {
        h = (h ^ round(0, u64_at(data, i)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
        i += 8;
    }
    if i + 4 <= len {
        let k = u64::from(u32::from_le_bytes(
            data[i..i + 4].try_into().expect("4 bytes"),
        ));
        h = (h ^ k.wrapping_mul(P1))
            .rotate_left(23)
            .wrapping_mul(P2)
            .wrapping_add(P3);
        i += 4;
    }
    for &b in &data[i..] {
        h = (h ^ u64::from(b).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn xxh64_reference_vectors() {
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn metadata_frames_decode_with_libzstd() {
        // libzstd checks the framing and the XXH64 checksum, for every code path of xxh64.
        for len in [
            0,
            1,
            3,
            4,
            7,
            8,
            31,
            32,
            33,
            100,
            RAW_BLOCK - 1,
            RAW_BLOCK,
            RAW_BLOCK + 1,
            3 * RAW_BLOCK + 17,
        ] {
            let content: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let frame = metadata_frame(&content);
            let mut out = Vec::new();
            zstd::stream::read::Decoder::new(&frame[..])
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, content, "length {len}");
            let mut bad = frame.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            assert!(
                zstd::stream::read::Decoder::new(&bad[..])
                    .unwrap()
                    .read_to_end(&mut Vec::new())
                    .is_err()
            );
        }
    }

    #[test]
    fn block_headers_round_trip() {
        for (last, size) in [(true, 0), (false, RAW_BLOCK), (true, 5)] {
            assert_eq!(
                parse_block_header(block_header(last, size)),
                (last, 0, size)
            );
        }
    }
}
