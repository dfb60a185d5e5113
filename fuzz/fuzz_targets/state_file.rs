//! Arbitrary bytes as a durable counters' state file (`durable::format::read`, which streams
//! them through `read_from`): never a panic; the records read are whole and re-encode to the
//! bytes of the frames they came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile::durable::format::{put_frame, put_record, read, HEADER, MAX_FRAME};

fuzz_target!(|data: &[u8]| {
    let mut records = Vec::new();
    let (got, _) = read(data, |r| records.push((r.key.to_owned(), r.state, r.expires_s)));
    assert!(got.good_len <= data.len());
    assert_eq!(got.records, records.len());
    // The records read, written again, are the payloads of the good frames, byte for byte.
    let mut payload = Vec::new();
    for (key, state, expires_s) in &records {
        put_record(&mut payload, key, *state, *expires_s);
    }
    let mut from_file = Vec::new();
    let mut at = HEADER.len();
    while at + 8 <= got.good_len {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        from_file.extend_from_slice(&data[at + 8..at + 8 + len]);
        at += 8 + len;
    }
    assert_eq!(payload, from_file);
    // And read back as one frame, they are all there.
    if payload.len() <= MAX_FRAME {
        let mut one = HEADER.to_vec();
        put_frame(&mut one, &payload);
        let (again, fault) = read(&one, |_| {});
        assert_eq!((again.records, fault), (records.len(), None));
    }
});
