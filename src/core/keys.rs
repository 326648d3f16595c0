//! What the library draws for a transfer: random bytes from the operating
//! system (a token's secret, a window's key byte) and a memory window's
//! next rkey. Below both the transfer and the connections, which each
//! draw them.

use crate::error::{Error, Result};

/// 8 bytes from the operating system's CSPRNG (one system call).
pub fn random_bytes() -> Result<[u8; 8]> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| Error::Internal(format!("getrandom failed: {e}")))?;
    Ok(bytes)
}

/// A window rkey for the next bind: the window's index (the high 24 bits
/// of `current`) with a key byte drawn uniformly (up to a bias of 2^-32,
/// from `random`) among the 255 values other than the current one (older
/// rxe refuses a bind with the same key).
pub fn fresh_window_key(current: u32, random: u32) -> u32 {
    let old = current.to_le_bytes()[0];
    let step = u8::try_from(random % 255).unwrap_or(0).wrapping_add(1);
    current & !0xff | u32::from(old.wrapping_add(step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_window_key_keeps_the_index_and_changes_the_key() {
        let mut keys = std::collections::HashSet::new();
        for _ in 0..2000 {
            let random = random_bytes().unwrap();
            let current = 0x0012_3400 | u32::from(random[0]);
            let next = fresh_window_key(
                current,
                u32::from_le_bytes([random[4], random[5], random[6], random[7]]),
            );
            assert_eq!(next & !0xff, 0x0012_3400);
            assert_ne!(next & 0xff, current & 0xff);
            keys.insert(next & 0xff);
        }
        // Random, not +1: (nearly) every key byte shows up.
        assert!(keys.len() > 200, "{} distinct keys", keys.len());
    }

    #[test]
    fn every_other_key_byte_is_equally_likely() {
        // Every draw of `random` modulo 255, from a current key of 0x5a:
        // each of the 255 other key bytes exactly once, the current never.
        let mut seen = [0u32; 256];
        for random in 0..255u32 {
            seen[usize::from(fresh_window_key(0x0012_345a, random).to_le_bytes()[0])] += 1;
        }
        assert_eq!(seen[0x5a], 0);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(key, &n)| key == 0x5a || n == 1));
    }
}
