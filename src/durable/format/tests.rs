use proptest::prelude::*;

use super::*;

fn states() -> impl Strategy<Value = Option<State>> {
    prop_oneof![
        Just(None),
        (any::<u32>(), any::<u32>())
            .prop_map(|(window, count)| Some(State::Fixed { window, count })),
        (any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(window, prev, cur)| Some(State::Sliding { window, prev, cur })),
        any::<u64>().prop_map(|tat| Some(State::Gcra { tat })),
    ]
}

type Owned = (String, Option<State>, u32);

fn records() -> impl Strategy<Value = Vec<Vec<Owned>>> {
    let record = ("[a-z_é0-9]{0,40}", states(), any::<u32>());
    // An empty frame is a snapshot's end: the writer never writes one otherwise.
    prop::collection::vec(prop::collection::vec(record, 1..8), 0..8)
}

/// A file of these frames, and where each frame ends.
fn file(frames: &[Vec<Owned>], end: bool) -> (Vec<u8>, Vec<usize>) {
    let mut out = HEADER.to_vec();
    let mut ends = vec![out.len()];
    for f in frames {
        let mut payload = Vec::new();
        for (k, s, e) in f {
            put_record(&mut payload, k, *s, if s.is_some() { *e } else { 0 });
        }
        put_frame(&mut out, &payload);
        ends.push(out.len());
    }
    if end {
        put_frame(&mut out, &[]);
    }
    (out, ends)
}

fn read_all(bytes: &[u8]) -> (Vec<Owned>, Read, Option<Fault>) {
    let mut got = Vec::new();
    let (read, fault) = read(bytes, |r| {
        got.push((r.key.to_string(), r.state, r.expires_s))
    });
    (got, read, fault)
}

fn flat(frames: &[Vec<Owned>]) -> Vec<Owned> {
    frames
        .iter()
        .flatten()
        .map(|(k, s, e)| (k.clone(), *s, if s.is_some() { *e } else { 0 }))
        .collect()
}

proptest! {
    /// What is written is read back, in order, and a snapshot's end is seen.
    #[test]
    fn records_round_trip(frames in records()) {
        let (bytes, _) = file(&frames, true);
        let (got, read, fault) = read_all(&bytes);
        prop_assert_eq!(fault, None);
        prop_assert!(read.ended);
        prop_assert_eq!(read.good_len, bytes.len());
        prop_assert_eq!(got, flat(&frames));
    }

    /// Cut at a frame's end, a file gives exactly the frames before the cut; cut anywhere
    /// else, the frames wholly before the cut and a torn frame, never a part of one.
    #[test]
    fn a_file_cut_anywhere_gives_the_whole_frames_before_the_cut(frames in records(), cut in any::<prop::sample::Index>()) {
        let (bytes, ends) = file(&frames, false);
        let at = HEADER.len() + cut.index(bytes.len() - HEADER.len() + 1);
        let (got, read, fault) = read_all(&bytes[..at]);
        let whole = ends.iter().filter(|&&e| e <= at).count() - 1;
        prop_assert_eq!(got, flat(&frames[..whole]));
        prop_assert_eq!(read.good_len, ends[whole]);
        if ends.contains(&at) {
            prop_assert_eq!(fault, None);
        } else {
            prop_assert_eq!(fault, Some(Fault::Torn { at: ends[whole] }));
        }
    }

    /// A flipped byte past the header is caught by the checksum (or the frame's length), and
    /// the frames before it are kept.
    #[test]
    fn a_flipped_byte_is_caught(frames in records(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (mut bytes, ends) = file(&frames, true);
        let at = HEADER.len() + pos.index(bytes.len() - HEADER.len());
        bytes[at] ^= 1 << bit;
        let (got, read, fault) = read_all(&bytes);
        let before = ends.iter().filter(|&&e| e <= at).count() - 1;
        prop_assert!(fault.is_some() || !read.ended, "a damaged file read clean");
        prop_assert_eq!(got, flat(&frames[..before]));
    }

    /// A stream that hands over a few bytes at a time reads as the whole file does, fault and
    /// all, wherever the file is cut.
    #[test]
    fn a_trickling_stream_reads_as_the_whole_file(frames in records(), cut in any::<prop::sample::Index>(), step in 1usize..5) {
        let (bytes, _) = file(&frames, true);
        let at = cut.index(bytes.len() + 1);
        let whole = read_all(&bytes[..at]);
        let mut got = Vec::new();
        let trickle = Trickle { bytes: &bytes[..at], step };
        let (read, fault) = read_from(trickle, |r| got.push((r.key.to_string(), r.state, r.expires_s))).unwrap();
        prop_assert_eq!((got, read, fault), whole);
    }

    /// `Frames` writes the file `put_frame` would: each frame's records, then the end.
    #[test]
    fn frames_write_what_put_frame_writes(frames in records()) {
        let all = flat(&frames);
        let mut out = Vec::new();
        let mut w = Frames::new(&mut out, true).unwrap();
        for (k, s, e) in &all {
            w.record(k, *s, *e).unwrap();
        }
        let len = w.finish(true).unwrap();
        let one: Vec<Vec<Owned>> = if all.is_empty() { vec![] } else { vec![all] };
        prop_assert_eq!(len as usize, out.len());
        prop_assert_eq!(out, file(&one, true).0);
    }

    /// Any bytes at all: no panic, and nothing read without the header.
    #[test]
    fn any_bytes_are_read_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let (got, _, fault) = read_all(&bytes);
        if !bytes.starts_with(HEADER) {
            prop_assert_eq!(fault, Some(Fault::Header));
            prop_assert!(got.is_empty());
        }
    }
}

#[test]
fn a_frame_longer_than_allowed_is_damage_not_an_allocation() {
    let mut bytes = HEADER.to_vec();
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    let (_, _, fault) = read_all(&bytes);
    assert_eq!(
        fault,
        Some(Fault::Length {
            at: HEADER.len(),
            len: u32::MAX as usize
        })
    );
}

#[test]
fn states_round_trip_through_their_bytes() {
    for s in [
        State::Fixed {
            window: 7,
            count: u32::MAX,
        },
        State::Sliding {
            window: u32::MAX,
            prev: 1,
            cur: 2,
        },
        State::Gcra { tat: u64::MAX - 5 },
    ] {
        assert_eq!(state_from(&state_bytes(&s)), Some(s));
    }
    assert_eq!(state_from(&[9; STATE_BYTES]), None);
}

/// A reader that hands over at most `step` bytes a call.
struct Trickle<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

#[test]
fn a_newer_versions_header_is_not_damage() {
    let mut bytes = NAME.to_vec();
    bytes.extend_from_slice(&(VERSION + 1).to_be_bytes());
    let (got, _, fault) = read_all(&bytes);
    assert!(got.is_empty());
    assert_eq!(
        fault,
        Some(Fault::Newer {
            version: VERSION + 1
        })
    );
    let mut older = NAME.to_vec();
    older.extend_from_slice(&0u16.to_be_bytes());
    assert_eq!(read_all(&older).2, Some(Fault::Header));
}

/// A state's bytes are version 1's, byte for byte: files written by an earlier build read the
/// same, and this build's files read in it.
#[test]
fn states_bytes_are_version_1s() {
    let fixed = State::Fixed {
        window: 0x0403_0201,
        count: 0x0807_0605,
    };
    let sliding = State::Sliding {
        window: 0x0403_0201,
        prev: 0x0807_0605,
        cur: 0x0c0b_0a09,
    };
    let gcra = State::Gcra {
        tat: 0x0807_0605_0403_0201,
    };
    let tail = |n: usize| vec![0u8; STATE_BYTES - n];
    let want = |tag: u8, fields: &[u8]| {
        let mut b = vec![tag];
        b.extend_from_slice(fields);
        b.extend(tail(1 + fields.len()));
        b
    };
    assert_eq!(
        state_bytes(&fixed).to_vec(),
        want(1, &[1, 2, 3, 4, 5, 6, 7, 8])
    );
    assert_eq!(
        state_bytes(&sliding).to_vec(),
        want(2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    );
    assert_eq!(
        state_bytes(&gcra).to_vec(),
        want(3, &[1, 2, 3, 4, 5, 6, 7, 8])
    );
    // A whole record: key length, key, 1, the state, the expiry.
    let mut record = Vec::new();
    put_record(&mut record, "k", Some(gcra), 0x0d0c_0b0a);
    let mut expect = vec![1, 0, 0, 0, b'k', 1];
    expect.extend(want(3, &[1, 2, 3, 4, 5, 6, 7, 8]));
    expect.extend([0x0a, 0x0b, 0x0c, 0x0d]);
    assert_eq!(record, expect);
    let mut dropped = Vec::new();
    put_record(&mut dropped, "k", None, 7);
    assert_eq!(dropped, [1, 0, 0, 0, b'k', 0]);
}
