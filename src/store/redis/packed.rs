//! Commands packed by hand, back to back, as a pipeline goes on the wire: each a RESP array of
//! bulk strings (`*<n>\r\n` then `$<len>\r\n<bytes>\r\n` per argument), exactly what the
//! crate's `Pipeline::get_packed_pipeline` writes for the same arguments (the tests compare
//! them). One buffer a round trip, the keys written into it in place: building a `redis::Cmd`
//! per op grew two vectors per command and the crate then copied it all into a third.
//! Connections made through the crate get `redis::Pipeline`s rebuilt from these ([`Packed::pipeline`]).

/// Commands in RESP, back to back.
#[derive(Debug, Default)]
pub(super) struct Packed {
    buf: Vec<u8>,
    /// Where each command ends in `buf`.
    ends: Vec<usize>,
    /// Arguments the command being written still owes (checked in debug builds).
    owed: usize,
}

/// "00" to "99".
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `n` in decimal, written at the end of `buf` (two digits a step).
pub(super) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    while n >= 100 {
        let d = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
    }
    if n >= 10 {
        let d = n as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    &buf[i..]
}

/// Arguments encoded once, to be copied into commands as they are.
#[derive(Debug)]
pub(super) struct Encoded {
    args: usize,
    bytes: Vec<u8>,
}

impl Encoded {
    pub(super) fn new(args: &[&[u8]]) -> Encoded {
        let mut p = Packed {
            owed: args.len(),
            ..Packed::default()
        };
        for a in args {
            p.arg(a);
        }
        Encoded {
            args: args.len(),
            bytes: p.buf,
        }
    }
}

impl Packed {
    /// Room for `cmds` commands of a few short arguments each.
    pub(super) fn with_capacity(cmds: usize) -> Packed {
        Packed {
            buf: Vec::with_capacity(cmds * 80),
            ends: Vec::with_capacity(cmds),
            owed: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every command, as written on the wire.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// `kind` (`*` or `$`), `n` in decimal and CRLF: a header line, in one write.
    fn header(&mut self, kind: u8, n: u64) {
        let mut d = [0u8; 20];
        let digits = decimal(n, &mut d);
        let mut line = [0u8; 23];
        line[0] = kind;
        line[1..1 + digits.len()].copy_from_slice(digits);
        line[1 + digits.len()..3 + digits.len()].copy_from_slice(b"\r\n");
        self.buf.extend_from_slice(&line[..3 + digits.len()]);
    }

    /// Starts a command of `args` arguments (the name included).
    pub(super) fn start(&mut self, args: usize) {
        debug_assert_eq!(self.owed, 0, "the previous command is complete");
        self.owed = args;
        self.header(b'*', args as u64);
    }

    /// One argument, written from `parts` in turn.
    pub(super) fn parts(&mut self, parts: &[&[u8]]) {
        debug_assert!(self.owed > 0, "an argument the command declared");
        self.owed -= 1;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.buf.reserve(len + 25);
        self.header(b'$', len as u64);
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.buf.extend_from_slice(b"\r\n");
        if self.owed == 0 {
            self.ends.push(self.buf.len());
        }
    }

    /// `n` arguments already in RESP (constant ones, encoded once: see [`Encoded`]).
    pub(super) fn encoded(&mut self, e: &Encoded) {
        debug_assert!(self.owed >= e.args, "arguments the command declared");
        self.owed -= e.args;
        self.buf.extend_from_slice(&e.bytes);
        if self.owed == 0 {
            self.ends.push(self.buf.len());
        }
    }

    pub(super) fn arg(&mut self, a: &[u8]) {
        self.parts(&[a]);
    }

    /// A number argument, in decimal (as the crate writes integers).
    pub(super) fn int(&mut self, n: u64) {
        let mut d = [0u8; 20];
        self.arg(decimal(n, &mut d));
    }

    /// A whole command.
    pub(super) fn push(&mut self, args: &[&[u8]]) {
        self.start(args.len());
        for a in args {
            self.arg(a);
        }
    }

    /// The arguments of command `i`, read back.
    pub(super) fn args(&self, i: usize) -> Vec<&[u8]> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let cmd = &self.buf[start..self.ends[i]];
        // `*<n>\r\n` then `$<len>\r\n<bytes>\r\n` each, as written above.
        let line = |at: usize| -> (usize, usize) {
            let end = at + cmd[at..].iter().position(|&b| b == b'\r').unwrap_or(0);
            let n = std::str::from_utf8(&cmd[at + 1..end])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            (n, end + 2)
        };
        let (n, mut at) = line(0);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, from) = line(at);
            out.push(&cmd[from..from + len]);
            at = from + len + 2;
        }
        out
    }

    /// The commands as a `redis::Pipeline` (for connections made through the crate); a
    /// command's error comes back as its reply.
    pub(super) fn pipeline(&self) -> redis::Pipeline {
        self.pipeline_of(0..self.len())
    }

    /// The commands `which` as a `redis::Pipeline`, as [`pipeline`](Self::pipeline).
    pub(super) fn pipeline_of(&self, which: std::ops::Range<usize>) -> redis::Pipeline {
        let mut pipe = redis::Pipeline::with_capacity(which.len());
        pipe.ignore_errors();
        for i in which {
            let mut c = redis::Cmd::new();
            for a in self.args(i) {
                c.arg(a);
            }
            pipe.add_command(c);
        }
        pipe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_as_the_crate_packs_and_read_back() {
        let mut p = Packed::with_capacity(2);
        p.push(&[b"INCRBY", b"a_key_17", b"3"]);
        p.start(4);
        p.arg(b"EVALSHA");
        p.parts(&[b"ab", b"", b"cd"]);
        p.int(0);
        p.int(u64::MAX);
        p.start(2);
        p.encoded(&Encoded::new(&[b"GET", b""]));
        assert_eq!(p.len(), 3);
        let mut pipe = redis::pipe();
        pipe.cmd("INCRBY").arg("a_key_17").arg(3u64);
        pipe.cmd("EVALSHA").arg("abcd").arg(0).arg(u64::MAX);
        pipe.cmd("GET").arg("");
        assert_eq!(p.bytes(), pipe.get_packed_pipeline().as_slice());
        assert_eq!(
            p.pipeline().get_packed_pipeline(),
            pipe.get_packed_pipeline()
        );
        assert_eq!(
            p.args(1),
            vec![&b"EVALSHA"[..], b"abcd", b"0", b"18446744073709551615"]
        );
        assert_eq!(p.args(2), vec![&b"GET"[..], b""]);
        assert_eq!(
            p.pipeline_of(1..2).get_packed_pipeline(),
            redis::pipe()
                .cmd("EVALSHA")
                .arg("abcd")
                .arg(0)
                .arg(u64::MAX)
                .get_packed_pipeline()
        );
    }

    #[test]
    fn decimals() {
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        for n in [7, 10, 42, 99, 100, 101, 999, 1000, 12345, 1_000_000_000] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
        assert_eq!(decimal(1_700_000_123, &mut buf), b"1700000123");
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }
}
