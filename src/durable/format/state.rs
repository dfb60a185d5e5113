//! A key's state in a record: 17 bytes, a tag (1 fixed window, 2 sliding window, 3 token
//! bucket, 4 a window from the first hit), then the state's fields little-endian, the bytes after them zero. The format
//! reads the fields `limiter::State` exposes; the limiter knows nothing of its bytes.

use crate::limiter::State;

/// A state's length in a record.
pub const STATE_BYTES: usize = 17;

/// The bytes of `state` in a record.
pub fn state_bytes(state: &State) -> [u8; STATE_BYTES] {
    let mut b = [0u8; STATE_BYTES];
    match *state {
        State::Fixed { window, count } => {
            b[0] = 1;
            b[1..5].copy_from_slice(&window.to_le_bytes());
            b[5..9].copy_from_slice(&count.to_le_bytes());
        }
        State::Sliding { window, prev, cur } => {
            b[0] = 2;
            b[1..5].copy_from_slice(&window.to_le_bytes());
            b[5..9].copy_from_slice(&prev.to_le_bytes());
            b[9..13].copy_from_slice(&cur.to_le_bytes());
        }
        State::Gcra { tat } => {
            b[0] = 3;
            b[1..9].copy_from_slice(&tat.to_le_bytes());
        }
        State::FromFirstHit { count, end } => {
            b[0] = 4;
            b[1..5].copy_from_slice(&count.to_le_bytes());
            b[5..13].copy_from_slice(&end.to_le_bytes());
        }
    }
    b
}

/// The state [`state_bytes`] wrote; `None` for bytes it cannot have written.
pub fn state_from(b: &[u8; STATE_BYTES]) -> Option<State> {
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let zero_from = |i: usize| b[i..].iter().all(|&x| x == 0);
    match b[0] {
        1 if zero_from(9) => Some(State::Fixed {
            window: u32_at(1),
            count: u32_at(5),
        }),
        2 if zero_from(13) => Some(State::Sliding {
            window: u32_at(1),
            prev: u32_at(5),
            cur: u32_at(9),
        }),
        3 if zero_from(9) => Some(State::Gcra {
            tat: u64::from(u32_at(1)) | (u64::from(u32_at(5)) << 32),
        }),
        4 if zero_from(13) => Some(State::FromFirstHit {
            count: u32_at(1),
            end: u64::from(u32_at(5)) | (u64::from(u32_at(9)) << 32),
        }),
        _ => None,
    }
}
