//! The state files' bytes. A file is a header, then frames: `[u32 payload length][u32 CRC-32 of
//! the payload][payload]`, little-endian. A payload is records back to back: `[u32 key length]
//! [key (UTF-8)][u8 1][17-byte state (`state`)][u32 expiry, whole seconds since the Unix epoch]` for a key
//! and its state, or `[u32 key length][key][u8 0]` for a key dropped before its expiry (evicted),
//! which must not come back. A snapshot ends with an empty frame; a log has no end (each save
//! appends one frame), so a log cut at a frame boundary is only shorter.
//!
//! A frame is applied whole or not at all: its checksum and every record are checked before any
//! record is handed on.

use std::io::{self, Write};

use crate::limiter::State;

mod state;
pub use state::{state_bytes, state_from, STATE_BYTES};

/// The first bytes of every state file: [`NAME`], then the format's version as a big-endian
/// `u16` ([`VERSION`]).
pub const HEADER: &[u8; 8] = b"TSTATE\x00\x01";

/// The name every version's header starts with.
pub const NAME: &[u8; 6] = b"TSTATE";

/// The version this build writes and reads.
pub const VERSION: u16 = 1;

/// No frame is longer: a length past it is damage, not a reason to allocate.
pub const MAX_FRAME: usize = 16 << 20;

/// A full save is cut into frames of about this size.
pub const FRAME_TARGET: usize = 1 << 20;

/// One record as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub key: &'a str,
    /// `None`: the key was dropped; forget it.
    pub state: Option<State>,
    pub expires_s: u32,
}

/// Appends one record to a payload.
pub fn put_record(out: &mut Vec<u8>, key: &str, state: Option<State>, expires_s: u32) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    match state {
        Some(s) => {
            out.push(1);
            out.extend_from_slice(&state_bytes(&s));
            out.extend_from_slice(&expires_s.to_le_bytes());
        }
        None => out.push(0),
    }
}

/// Appends a frame holding `payload` (at most [`MAX_FRAME`] bytes).
pub fn put_frame(out: &mut Vec<u8>, payload: &[u8]) {
    debug_assert!(payload.len() <= MAX_FRAME);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// What a file held, up to where it could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Read {
    /// Records handed on.
    pub records: usize,
    /// Bytes of whole, good frames from the start (the header included).
    pub good_len: usize,
    /// An empty frame was read (a snapshot's end); nothing after it is read.
    pub ended: bool,
}

/// Why a file could not be read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("not a turnstile state file (its first bytes are not the header)")]
    Header,
    /// A later version of the format, written by a newer turnstile: not damage, and nothing
    /// this build may read or move.
    #[error(
        "written in state format version {version} by a newer turnstile; this one reads version \
         {VERSION}"
    )]
    Newer { version: u16 },
    /// The file ends inside a frame: a write cut short (by a crash, or a truncation).
    #[error("cut short at byte {at}: the last frame is incomplete")]
    Torn { at: usize },
    #[error("the frame at byte {at} fails its checksum")]
    Checksum { at: usize },
    #[error("the frame at byte {at} says it holds {len} bytes, more than a frame may")]
    Length { at: usize, len: usize },
    #[error("the frame at byte {at} holds a record that cannot be read")]
    Record { at: usize },
}

/// Reads `bytes` (a whole file) as [`read_from`] reads a stream.
pub fn read(bytes: &[u8], f: impl FnMut(Record<'_>)) -> (Read, Option<Fault>) {
    read_from(bytes, f).expect("a slice reads without an I/O error")
}

/// Reads a file from `r`, one frame in memory at a time, handing on every record of every good
/// frame in order; stops at the end, at an empty frame, or at the first fault (what came before
/// is handed on). Only an I/O error of `r` itself is an error.
pub fn read_from(
    mut r: impl io::Read,
    mut f: impl FnMut(Record<'_>),
) -> io::Result<(Read, Option<Fault>)> {
    let mut read = Read::default();
    let mut header = [0u8; HEADER.len()];
    if fill(&mut r, &mut header)? < HEADER.len() || &header[..NAME.len()] != NAME {
        return Ok((read, Some(Fault::Header)));
    }
    let version = u16::from_be_bytes([header[6], header[7]]);
    if version > VERSION {
        return Ok((read, Some(Fault::Newer { version })));
    }
    if &header != HEADER {
        return Ok((read, Some(Fault::Header)));
    }
    let mut at = HEADER.len();
    read.good_len = at;
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 8];
        match fill(&mut r, &mut head)? {
            0 => break,
            8 => {}
            _ => return Ok((read, Some(Fault::Torn { at }))),
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_FRAME {
            return Ok((read, Some(Fault::Length { at, len })));
        }
        payload.resize(len, 0);
        if fill(&mut r, &mut payload)? < len {
            return Ok((read, Some(Fault::Torn { at })));
        }
        if crc32fast::hash(&payload) != crc {
            return Ok((read, Some(Fault::Checksum { at })));
        }
        // Every record checked first, so a frame is applied whole or not at all.
        if records(&payload).any(|r| r.is_none()) {
            return Ok((read, Some(Fault::Record { at })));
        }
        for r in records(&payload).flatten() {
            f(r);
            read.records += 1;
        }
        at += 8 + len;
        read.good_len = at;
        if len == 0 {
            read.ended = true;
            break;
        }
    }
    Ok((read, None))
}

/// Reads into `buf` until it is full or `r` ends: how many bytes were read.
fn fill(r: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Records written out as frames of about [`FRAME_TARGET`] bytes as they come, so a save of
/// any size holds one frame in memory.
pub struct Frames<W: Write> {
    out: W,
    payload: Vec<u8>,
    written: u64,
}

impl<W: Write> Frames<W> {
    /// Frames to write to `out`, after the file's header when `header` (a new file).
    pub fn new(mut out: W, header: bool) -> io::Result<Frames<W>> {
        let mut written = 0;
        if header {
            out.write_all(HEADER)?;
            written = HEADER.len() as u64;
        }
        Ok(Frames {
            out,
            payload: Vec::new(),
            written,
        })
    }

    pub fn record(&mut self, key: &str, state: Option<State>, expires_s: u32) -> io::Result<()> {
        put_record(&mut self.payload, key, state, expires_s);
        if self.payload.len() >= FRAME_TARGET {
            self.frame()?;
        }
        Ok(())
    }

    fn frame(&mut self) -> io::Result<()> {
        let p = &self.payload;
        self.out.write_all(&(p.len() as u32).to_le_bytes())?;
        self.out.write_all(&crc32fast::hash(p).to_le_bytes())?;
        self.out.write_all(p)?;
        self.written += 8 + p.len() as u64;
        self.payload.clear();
        Ok(())
    }

    /// Writes the records not yet in a frame, then a snapshot's end (an empty frame) when
    /// `end`; answers the bytes written in all.
    pub fn finish(mut self, end: bool) -> io::Result<u64> {
        if !self.payload.is_empty() {
            self.frame()?;
        }
        if end {
            self.frame()?;
        }
        Ok(self.written)
    }
}

/// The records of a payload; a `None` where one cannot be read (and nothing after it).
fn records(mut p: &[u8]) -> impl Iterator<Item = Option<Record<'_>>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if p.is_empty() || failed {
            return None;
        }
        let r = record(&mut p);
        failed = r.is_none();
        Some(r)
    })
}

fn record<'a>(p: &mut &'a [u8]) -> Option<Record<'a>> {
    let len = u32::from_le_bytes(take(p, 4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(take(p, len)?).ok()?;
    match take(p, 1)?[0] {
        0 => Some(Record {
            key,
            state: None,
            expires_s: 0,
        }),
        1 => {
            let state = state_from(take(p, STATE_BYTES)?.try_into().ok()?)?;
            let expires_s = u32::from_le_bytes(take(p, 4)?.try_into().ok()?);
            Some(Record {
                key,
                state: Some(state),
                expires_s,
            })
        }
        _ => None,
    }
}

fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if p.len() < n {
        return None;
    }
    let (head, rest) = p.split_at(n);
    *p = rest;
    Some(head)
}

#[cfg(test)]
mod tests;
