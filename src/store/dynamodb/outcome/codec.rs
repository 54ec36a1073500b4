//! zstd decompression that never allocates past a limit: the only way the DynamoDB store
//! decompresses what a table holds (outcomes and step results), so that a record whose bytes
//! claim or expand to more than the limit (a corrupt record, or a compression bomb a writer
//! to the table planted) is refused with a typed error instead of taking the memory.

use std::io::Read;

/// zstd's smallest window (its `ZSTD_WINDOWLOG_ABSOLUTEMIN`).
const MIN_WINDOW_LOG: u32 = 10;
/// The largest window a decompression ever sets up (zstd's own default limit, 128 MiB, is
/// larger than anything the store writes: [`MAX_OUTCOME_BYTES`] is 16 MiB).
///
/// [`MAX_OUTCOME_BYTES`]: crate::config::MAX_OUTCOME_BYTES
const MAX_WINDOW_LOG: u32 = 27;

/// Why [`decompress_within`] refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Inflate {
    /// The bytes decompress (or would) to more than the limit.
    #[error("decompresses past the limit of {limit} bytes")]
    OverLimit {
        /// The limit.
        limit: usize,
    },
    /// The bytes are not a zstd frame this build reads.
    #[error("does not decompress: {0}")]
    Corrupt(std::io::Error),
}

/// The zstd frames in `stored`, decompressed, at most `limit` bytes: memory grows with what
/// actually comes out (never with what a header claims), the decoder's window is capped at the
/// largest outcome's (a frame that needs a larger one is refused before its window is set up),
/// and the
/// first byte past the limit ends the read.
pub(crate) fn decompress_within(stored: &[u8], limit: usize) -> Result<Vec<u8>, Inflate> {
    // A frame that names its content size says at once whether it fits.
    if let Ok(Some(declared)) = zstd::zstd_safe::get_frame_content_size(stored)
        && declared > limit as u64
    {
        return Err(Inflate::OverLimit { limit });
    }
    let mut decoder = zstd::stream::read::Decoder::with_buffer(stored).map_err(Inflate::Corrupt)?;
    // The window is capped by the largest outcome any writer keeps, not by this one's length:
    // a frame another build wrote with a larger window than its content (streamed, without a
    // pledged size) still reads, and memory stays bounded by the output limit and this cap.
    decoder
        .window_log_max(window_log(crate::config::MAX_OUTCOME_BYTES.max(limit)))
        .map_err(Inflate::Corrupt)?;
    let mut out = Vec::new();
    decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(Inflate::Corrupt)?;
    if out.len() > limit {
        return Err(Inflate::OverLimit { limit });
    }
    Ok(out)
}

/// The smallest window (log 2) that holds `limit` bytes, within zstd's bounds.
fn window_log(limit: usize) -> u32 {
    let log = usize::BITS - limit.saturating_sub(1).leading_zeros();
    log.clamp(MIN_WINDOW_LOG, MAX_WINDOW_LOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_within_the_limit_comes_back_exactly() -> Result<(), Inflate> {
        let raw = br#"{"lines":[1,2,3]}"#.repeat(5000);
        let stored = zstd::bulk::compress(&raw, 19).map_err(Inflate::Corrupt)?;
        assert_eq!(decompress_within(&stored, raw.len())?, raw);
        Ok(())
    }

    /// A bomb: 1 MiB of zeros compresses to a few dozen bytes.
    #[test]
    fn a_bomb_past_the_limit_is_refused() -> Result<(), Inflate> {
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).map_err(Inflate::Corrupt)?;
        assert!(bomb.len() < 1024, "{} bytes", bomb.len());
        assert!(matches!(
            decompress_within(&bomb, 4096),
            Err(Inflate::OverLimit { limit: 4096 })
        ));
        Ok(())
    }

    /// The same bomb, streamed without a content size in its header: refused by the read's
    /// bound (or the window's), not by the header.
    #[test]
    fn a_bomb_that_hides_its_size_is_refused_too() -> std::io::Result<()> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3)?;
        encoder.include_contentsize(false)?;
        std::io::Write::write_all(&mut encoder, &vec![0u8; 1 << 20])?;
        let bomb = encoder.finish()?;
        assert!(matches!(
            decompress_within(&bomb, 4096),
            Err(Inflate::OverLimit { .. } | Inflate::Corrupt(_))
        ));
        assert!(matches!(
            decompress_within(&bomb, 1 << 19),
            Err(Inflate::OverLimit { .. } | Inflate::Corrupt(_))
        ));
        Ok(())
    }

    #[test]
    fn garbage_is_corrupt() {
        assert!(matches!(
            decompress_within(b"not zstd at all", 1 << 20),
            Err(Inflate::Corrupt(_))
        ));
    }

    #[test]
    fn windows_cover_the_limit() {
        assert_eq!(window_log(1), MIN_WINDOW_LOG);
        assert_eq!(window_log(1 << 20), 20);
        assert_eq!(window_log((1 << 20) + 1), 21);
        assert_eq!(window_log(usize::MAX), MAX_WINDOW_LOG);
    }
}
