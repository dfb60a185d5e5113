//! state-formats: how should turnstile keep rate-limit counters on disk? (issue 38)
//!
//! Compares three ways of persisting a shard's counters under the access pattern of
//! the issue:
//!
//! * `own`   — a snapshot file plus an append-only log of CRC-framed batches
//!             (one `fdatasync` per sync), compacted into a new snapshot when the log
//!             outgrows the snapshot;
//! * `redb`  — one write transaction per sync batch, default durability (fsync on commit);
//! * `fjall` — one write batch per sync, journal persisted with `fdatasync` per batch.
//!
//! Each record is a key (text, ~20-60 bytes), a 16-byte state and a 4-byte expiry
//! (seconds). For every store and repetition the bench runs, in a fresh directory:
//!
//! 1. (a) a full save of N live keys;
//! 2. (b) syncs of 10 000 and of 100 000 dirty keys (updates of live keys);
//! 3. (c) a read of everything back into a `HashMap<String, ([u8; 16], u32)>`,
//!        cold (page cache dropped, if permitted) and warm;
//! 4. (d) an hour of churn: 60 syncs, each 1 simulated minute: N/20 keys expire and
//!        are deleted, N/20 new keys arrive, N/20 live keys change; disk bytes are
//!        compared with the live keys' raw size (key bytes + 20 per key);
//!        then (c) again on the churned state.
//!
//! Timings use `std::time::Instant`; the summary reports medians over all repetitions.
//!
//! Usage: state-formats [--keys N] [--reps R] [--churn-syncs S] [--dir DIR] [own] [redb] [fjall]

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// In-memory value: 16-byte algorithm state + expiry in seconds.
type Val = ([u8; 16], u32);
/// The shard's in-memory view of its counters.
type Live = HashMap<String, Val>;
/// One sync's worth of changes: `Some` = upsert, `None` = delete.
type Batch = Vec<(String, Option<Val>)>;

const BASE_NOW: u32 = 1_000_000;
/// Simulated seconds between churn syncs (60 syncs = one hour).
const CHURN_STEP_S: u32 = 60;
/// Live keys last this many churn steps (N/20 expire per step → N live).
const LIFETIME_STEPS: u64 = 20;

// ---------------------------------------------------------------- workload

const DOMAINS: [&str; 5] = ["api", "login", "search", "export", "upload"];

/// Key text for id, 25-55 bytes, shaped like `domain_key1_value1_key2_value2`.
fn key_of(id: u64) -> String {
    let d = DOMAINS[(id % 5) as usize];
    match id % 3 {
        0 => format!(
            "{d}_remote_address_10.{}.{}.{}",
            (id >> 16) & 255,
            (id >> 8) & 255,
            id & 255
        ),
        1 => format!("{d}_user_{id:08}_route_/v1/items/{}", id % 1000),
        _ => format!("{d}_tenant_{:05}_user_{id:08}_method_POST", id % 9973),
    }
}

fn state_of(id: u64, version: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&id.to_le_bytes());
    s[8..].copy_from_slice(&version.to_le_bytes());
    s
}

struct Workload {
    n: u64,
    per_step: u64,
    /// Live ids are always the contiguous range [lo, hi): ids expire in id order.
    lo: u64,
    hi: u64,
    now: u32,
    version: u64,
    rng: u64,
}

impl Workload {
    fn new(n: u64, seed: u64) -> Self {
        Workload { n, per_step: n / LIFETIME_STEPS, lo: 0, hi: n, now: BASE_NOW, version: 0, rng: seed }
    }

    /// Group g = id / per_step expires at churn step g + 1.
    fn expiry_of(&self, id: u64) -> u32 {
        BASE_NOW + ((id / self.per_step) as u32 + 1) * CHURN_STEP_S
    }

    fn next_rand(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn initial(&self) -> Live {
        let mut live = Live::with_capacity(self.n as usize);
        for id in self.lo..self.hi {
            live.insert(key_of(id), (state_of(id, 0), self.expiry_of(id)));
        }
        live
    }

    /// `count` distinct random live keys with a new state.
    fn updates(&mut self, count: u64, batch: &mut Batch) {
        self.version += 1;
        let span = self.hi - self.lo;
        let mut seen = HashSet::with_capacity(count as usize);
        while (seen.len() as u64) < count.min(span) {
            let id = self.lo + self.next_rand() % span;
            if seen.insert(id) {
                batch.push((key_of(id), Some((state_of(id, self.version), self.expiry_of(id)))));
            }
        }
    }

    /// One simulated minute of churn: expired keys deleted, new keys, updated keys.
    fn churn_step(&mut self) -> Batch {
        self.now += CHURN_STEP_S;
        let mut batch = Vec::with_capacity(3 * self.per_step as usize);
        while self.lo < self.hi && self.expiry_of(self.lo) <= self.now {
            batch.push((key_of(self.lo), None));
            self.lo += 1;
        }
        self.updates(self.per_step, &mut batch);
        for id in self.hi..self.hi + self.per_step {
            batch.push((key_of(id), Some((state_of(id, self.version), self.expiry_of(id)))));
        }
        self.hi += self.per_step;
        batch
    }
}

fn apply(live: &mut Live, batch: &Batch) {
    for (k, v) in batch {
        match v {
            Some(v) => {
                live.insert(k.clone(), *v);
            }
            None => {
                live.remove(k);
            }
        }
    }
}

fn raw_size(live: &Live) -> u64 {
    live.keys().map(|k| k.len() as u64 + 20).sum()
}

// ---------------------------------------------------------------- stores

trait Store: Sized {
    const NAME: &'static str;
    /// Create a fresh store in `dir`.
    fn open(dir: &Path) -> Self;
    /// Open a store that already holds data (between phases of the bench).
    fn reopen(dir: &Path) -> Self;
    /// Write every live key, durably (the first save / a graceful stop).
    fn full_save(&mut self, live: &Live);
    /// Write one sync interval's changes, durably. `live` is the state after the batch
    /// (the own format compacts from it).
    fn sync(&mut self, batch: &Batch, live: &Live);
    /// Graceful stop: leave the store so that the next start reads it fastest.
    fn close(self) {}
    /// Open `dir` and read every live (unexpired at `now`) key.
    fn load(dir: &Path, now: u32) -> Live;
}

fn encode_val(v: &Val) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..16].copy_from_slice(&v.0);
    b[16..].copy_from_slice(&v.1.to_le_bytes());
    b
}

fn decode_val(b: &[u8]) -> Val {
    let mut s = [0u8; 16];
    s.copy_from_slice(&b[..16]);
    (s, u32::from_le_bytes(b[16..20].try_into().unwrap()))
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

// ---- own format -------------------------------------------------------------
//
// dir/snapshot      : [magic "TSS1"][u64 generation][u64 record count] then frames
// dir/log.<generation>     : frames appended after the snapshot of generation <generation>
// frame             : [u32 payload len][u32 crc32(payload)][payload]
// payload           : records [u16 key len][key][u8 tag][16 state][u32 expires_s]
// tag               : 0 = put, 1 = delete
//
// The generation in the log's name ties a log to its snapshot, so a crash between
// renaming a new snapshot and removing the old log cannot replay stale records.

const SNAP_MAGIC: &[u8; 4] = b"TSS1";
const SNAP_CHUNK: usize = 1 << 20;
const TAG_PUT: u8 = 0;
const TAG_DEL: u8 = 1;

struct Own {
    dir: PathBuf,
    generation: u64,
    snapshot_len: u64,
    log: File,
    log_len: u64,
    buf: Vec<u8>,
    compactions: u32,
}

fn put_record(buf: &mut Vec<u8>, key: &str, tag: u8, v: &Val) {
    buf.extend_from_slice(&(key.len() as u16).to_le_bytes());
    buf.extend_from_slice(key.as_bytes());
    buf.push(tag);
    buf.extend_from_slice(&encode_val(v));
}

/// Wrap `buf[start..]` (already reserved 8 header bytes at `start`) into a frame.
fn seal_frame(buf: &mut [u8], start: usize) {
    let payload_len = (buf.len() - start - 8) as u32;
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

impl Own {
    fn log_path(dir: &Path, generation: u64) -> PathBuf {
        dir.join(format!("log.{generation}"))
    }

    fn write_snapshot(&mut self, live: &Live) {
        let generation = self.generation + 1;
        let tmp = self.dir.join("snapshot.tmp");
        let mut buf = Vec::with_capacity(SNAP_CHUNK + 4096);
        let mut f = File::create(&tmp).unwrap();
        buf.extend_from_slice(SNAP_MAGIC);
        buf.extend_from_slice(&generation.to_le_bytes());
        buf.extend_from_slice(&(live.len() as u64).to_le_bytes());
        let mut written = 0u64;
        let mut start = buf.len();
        buf.extend_from_slice(&[0u8; 8]);
        for (k, v) in live {
            put_record(&mut buf, k, TAG_PUT, v);
            if buf.len() >= SNAP_CHUNK {
                seal_frame(&mut buf, start);
                f.write_all(&buf).unwrap();
                written += buf.len() as u64;
                buf.clear();
                start = 0;
                buf.extend_from_slice(&[0u8; 8]);
            }
        }
        if buf.len() > start + 8 {
            seal_frame(&mut buf, start);
        } else {
            buf.truncate(start);
        }
        f.write_all(&buf).unwrap();
        written += buf.len() as u64;
        f.sync_all().unwrap();
        drop(f);
        fs::rename(&tmp, self.dir.join("snapshot")).unwrap();
        let new_log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(Self::log_path(&self.dir, generation))
            .unwrap();
        sync_dir(&self.dir);
        let _ = fs::remove_file(Self::log_path(&self.dir, self.generation));
        self.generation = generation;
        self.log = new_log;
        self.log_len = 0;
        self.snapshot_len = written;
        self.compactions += 1;
    }

    /// Parse frames from `data`, applying records to `out`; stops at the first damaged
    /// or truncated frame (a torn tail). Returns bytes consumed.
    fn read_frames(data: &[u8], now: u32, out: &mut Live) -> usize {
        let mut pos = 0;
        while pos + 8 <= data.len() {
            let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap());
            let Some(payload) = data.get(pos + 8..pos + 8 + len) else { break };
            if crc32fast::hash(payload) != crc {
                break;
            }
            let mut p = 0;
            while p + 2 <= payload.len() {
                let kl = u16::from_le_bytes(payload[p..p + 2].try_into().unwrap()) as usize;
                let key = &payload[p + 2..p + 2 + kl];
                let tag = payload[p + 2 + kl];
                let v = decode_val(&payload[p + 3 + kl..p + 23 + kl]);
                p += 23 + kl;
                let key = std::str::from_utf8(key).expect("key is utf-8");
                if tag == TAG_PUT && v.1 > now {
                    // `get_mut` first: avoids allocating the String for keys already present.
                    if let Some(slot) = out.get_mut(key) {
                        *slot = v;
                    } else {
                        out.insert(key.to_owned(), v);
                    }
                } else {
                    out.remove(key);
                }
            }
            pos += 8 + len;
        }
        pos
    }
}

impl Store for Own {
    const NAME: &'static str = "own";

    fn open(dir: &Path) -> Self {
        fs::create_dir_all(dir).unwrap();
        // The bench always starts fresh: generation 0, empty log.
        let log = OpenOptions::new().create(true).append(true).open(Self::log_path(dir, 0)).unwrap();
        Own { dir: dir.to_owned(), generation: 0, snapshot_len: 0, log, log_len: 0, buf: Vec::new(), compactions: 0 }
    }

    fn reopen(dir: &Path) -> Self {
        let snap = fs::read(dir.join("snapshot")).unwrap();
        let generation = u64::from_le_bytes(snap[4..12].try_into().unwrap());
        let log_path = Self::log_path(dir, generation);
        let log = OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let log_len = log.metadata().unwrap().len();
        Own {
            dir: dir.to_owned(),
            generation,
            snapshot_len: snap.len() as u64 - 20,
            log,
            log_len,
            buf: Vec::new(),
            compactions: 0,
        }
    }

    fn full_save(&mut self, live: &Live) {
        self.write_snapshot(live);
    }

    fn sync(&mut self, batch: &Batch, live: &Live) {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; 8]);
        const ZERO: Val = ([0u8; 16], 0);
        for (k, v) in batch {
            match v {
                Some(v) => put_record(&mut self.buf, k, TAG_PUT, v),
                None => put_record(&mut self.buf, k, TAG_DEL, &ZERO),
            }
        }
        seal_frame(&mut self.buf, 0);
        self.log.write_all(&self.buf).unwrap();
        self.log.sync_data().unwrap();
        self.log_len += self.buf.len() as u64;
        if self.log_len > self.snapshot_len {
            self.write_snapshot(live);
        }
    }

    fn load(dir: &Path, now: u32) -> Live {
        let snap = fs::read(dir.join("snapshot")).unwrap();
        assert_eq!(&snap[..4], SNAP_MAGIC);
        let generation = u64::from_le_bytes(snap[4..12].try_into().unwrap());
        let count = u64::from_le_bytes(snap[12..20].try_into().unwrap());
        let mut out = Live::with_capacity(count as usize + count as usize / 8);
        Self::read_frames(&snap[20..], now, &mut out);
        drop(snap);
        if let Ok(log) = fs::read(Self::log_path(dir, generation)) {
            Self::read_frames(&log, now, &mut out);
        }
        out
    }
}

// ---- redb -------------------------------------------------------------------

const REDB_TABLE: redb::TableDefinition<&str, [u8; 20]> = redb::TableDefinition::new("counters");

struct Redb {
    db: redb::Database,
}

impl Redb {
    fn write<'a>(&mut self, items: impl Iterator<Item = (&'a String, Option<Val>)>) {
        let tx = self.db.begin_write().unwrap(); // default durability: Immediate (fsync)
        {
            let mut t = tx.open_table(REDB_TABLE).unwrap();
            for (k, v) in items {
                match v {
                    Some(v) => {
                        t.insert(k.as_str(), encode_val(&v)).unwrap();
                    }
                    None => {
                        t.remove(k.as_str()).unwrap();
                    }
                }
            }
        }
        tx.commit().unwrap();
    }
}

impl Store for Redb {
    const NAME: &'static str = "redb";

    fn open(dir: &Path) -> Self {
        fs::create_dir_all(dir).unwrap();
        Redb { db: redb::Database::create(dir.join("state.redb")).unwrap() }
    }

    fn reopen(dir: &Path) -> Self {
        Redb { db: redb::Database::open(dir.join("state.redb")).unwrap() }
    }

    fn full_save(&mut self, live: &Live) {
        self.write(live.iter().map(|(k, v)| (k, Some(*v))));
    }

    fn sync(&mut self, batch: &Batch, _live: &Live) {
        self.write(batch.iter().map(|(k, v)| (k, *v)));
    }

    fn load(dir: &Path, now: u32) -> Live {
        use redb::{ReadableDatabase, ReadableTableMetadata, ReadableTable};
        let db = redb::Database::open(dir.join("state.redb")).unwrap();
        let rx = db.begin_read().unwrap();
        let t = rx.open_table(REDB_TABLE).unwrap();
        let mut out = Live::with_capacity(t.len().unwrap() as usize);
        for item in t.iter().unwrap() {
            let (k, v) = item.unwrap();
            let v = decode_val(&v.value());
            if v.1 > now {
                out.insert(k.value().to_owned(), v);
            }
        }
        out
    }
}

// ---- fjall ------------------------------------------------------------------

struct Fjall {
    db: fjall::Database,
    ks: fjall::Keyspace,
}

impl Fjall {
    fn open_db(dir: &Path) -> (fjall::Database, fjall::Keyspace) {
        let db = fjall::Database::builder(dir).open().unwrap();
        let ks = db.keyspace("counters", fjall::KeyspaceCreateOptions::default).unwrap();
        (db, ks)
    }

    fn write<'a>(&mut self, items: impl Iterator<Item = (&'a String, Option<Val>)>) {
        // Journal fdatasync'ed when the batch commits.
        let mut b = self.db.batch().durability(Some(fjall::PersistMode::SyncData));
        for (k, v) in items {
            match v {
                Some(v) => b.insert(&self.ks, k.as_str(), encode_val(&v)),
                None => b.remove(&self.ks, k.as_str()),
            }
        }
        b.commit().unwrap();
    }
}

impl Store for Fjall {
    const NAME: &'static str = "fjall";

    fn open(dir: &Path) -> Self {
        let (db, ks) = Self::open_db(dir);
        Fjall { db, ks }
    }

    fn reopen(dir: &Path) -> Self {
        Self::open(dir)
    }

    /// Flush the memtable into a table, so that the next open need not replay the journal.
    fn close(self) {
        self.ks.rotate_memtable_and_wait().unwrap();
    }

    fn full_save(&mut self, live: &Live) {
        self.write(live.iter().map(|(k, v)| (k, Some(*v))));
    }

    fn sync(&mut self, batch: &Batch, _live: &Live) {
        self.write(batch.iter().map(|(k, v)| (k, *v)));
    }

    fn load(dir: &Path, now: u32) -> Live {
        let t0 = Instant::now();
        let (db, ks) = Self::open_db(dir);
        let t1 = t0.elapsed();
        let mut out = Live::with_capacity(ks.approximate_len());
        for g in ks.iter() {
            let (k, v) = g.into_inner().unwrap();
            let v = decode_val(&v);
            if v.1 > now {
                out.insert(String::from_utf8(k.to_vec()).unwrap(), v);
            }
        }
        let t2 = t0.elapsed();
        drop(ks);
        drop(db);
        if std::env::var_os("FJALL_DEBUG").is_some() {
            eprintln!("fjall load: open {:?}, iterate {:?}, drop {:?}", t1, t2 - t1, t0.elapsed() - t2);
        }
        out
    }
}

// ---------------------------------------------------------------- measuring

/// (apparent bytes, allocated bytes) of everything under `dir`.
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = (0, 0);
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            let (a, b) = disk_usage(&e.path());
            total.0 += a;
            total.1 += b;
        } else {
            total.0 += m.len();
            total.1 += m.blocks() * 512;
        }
    }
    total
}

/// Write back dirty pages and drop the page cache (needs root; returns false if refused).
fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// CPU time (ns) used so far by the live threads of this process, from
/// /proc/self/task/*/schedstat; unlike wall time it hardly depends on other load.
fn process_cpu_ns() -> u64 {
    let mut total = 0;
    if let Ok(tasks) = fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed(), r)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[derive(Default)]
struct Samples {
    full_save: Vec<f64>,
    sync_10k: Vec<f64>,
    sync_100k: Vec<f64>,
    read_cold: Vec<f64>,
    read_warm: Vec<f64>,
    read_warm_cpu: Vec<f64>,
    churn_sync: Vec<f64>,
    churn_sync_max: Vec<f64>,
    read_cold_churned: Vec<f64>,
    read_warm_churned: Vec<f64>,
    read_warm_churned_cpu: Vec<f64>,
    disk_full: Vec<f64>,
    disk_churn_end: Vec<f64>,
    disk_churn_peak: Vec<f64>,
    raw_mib: Vec<f64>,
    compactions: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
}

fn check_same(got: &Live, want: &Live) {
    assert_eq!(got.len(), want.len(), "key count after reading");
    for (k, v) in want {
        assert_eq!(got.get(k), Some(v), "value of {k}");
    }
}

struct Cfg {
    keys: u64,
    reps: usize,
    churn_syncs: usize,
    root: PathBuf,
    cold_ok: bool,
}

/// Read back cold (page cache dropped) and warm, checking the result.
/// Returns (cold wall ms, warm wall ms, warm CPU ms).
fn read_both<S: Store>(dir: &Path, now: u32, want: &Live, cfg: &Cfg) -> (f64, f64, f64) {
    let cold = if cfg.cold_ok {
        drop_caches();
        let (d, got) = time(|| S::load(dir, now));
        check_same(&got, want);
        ms(d)
    } else {
        f64::NAN
    };
    let cpu0 = process_cpu_ns();
    let (d, got) = time(|| S::load(dir, now));
    let cpu = (process_cpu_ns() - cpu0) as f64 / 1e6;
    check_same(&got, want);
    (cold, ms(d), cpu)
}

fn run<S: Store>(cfg: &Cfg, s: &mut Samples, rep: usize, extra: impl Fn(&S) -> u32) {
    let dir = cfg.root.join(format!("{}-{rep}", S::NAME));
    let _ = fs::remove_dir_all(&dir);
    let mut w = Workload::new(cfg.keys, 0x5EED + rep as u64);
    let mut live = w.initial();
    let raw = raw_size(&live) as f64;
    s.raw_mib.push(raw / (1 << 20) as f64);

    // (a) first full save
    let mut st = S::open(&dir);
    let (d, ()) = time(|| st.full_save(&live));
    s.full_save.push(ms(d));
    s.disk_full.push(disk_usage(&dir).0 as f64 / raw);

    // (b) syncs of 10k and 100k dirty keys
    for (count, out) in [(10_000u64, &mut s.sync_10k), (100_000u64, &mut s.sync_100k)] {
        for _ in 0..5 {
            let mut batch = Vec::new();
            w.updates(count.min(cfg.keys), &mut batch);
            apply(&mut live, &batch);
            let (d, ()) = time(|| st.sync(&batch, &live));
            out.push(ms(d));
        }
    }
    st.close();

    // (c) read back after the full save + syncs
    let (c, wm, cpu) = read_both::<S>(&dir, w.now, &live, cfg);
    s.read_cold.push(c);
    s.read_warm.push(wm);
    s.read_warm_cpu.push(cpu);

    // (d) an hour of churn
    let mut st = S::reopen(&dir);
    let mut times = Vec::new();
    let mut peak = 0u64;
    for _ in 0..cfg.churn_syncs {
        let batch = w.churn_step();
        apply(&mut live, &batch);
        let (d, ()) = time(|| st.sync(&batch, &live));
        times.push(ms(d));
        peak = peak.max(disk_usage(&dir).0);
    }
    s.compactions.push(extra(&st) as f64);
    s.churn_sync.push(median(&times));
    s.churn_sync_max.push(times.iter().cloned().fold(0.0, f64::max));
    st.close();
    let raw_now = raw_size(&live) as f64;
    s.disk_churn_end.push(disk_usage(&dir).0 as f64 / raw_now);
    s.disk_churn_peak.push(peak as f64 / raw_now);
    let (c, wm, cpu) = read_both::<S>(&dir, w.now, &live, cfg);
    s.read_cold_churned.push(c);
    s.read_warm_churned.push(wm);
    s.read_warm_churned_cpu.push(cpu);
    eprintln!(
        "{} rep {rep}: full {:.0} ms, sync10k {:.1} ms, sync100k {:.1} ms, read cold {:.0} / warm {:.0} ms, churn sync med {:.1} max {:.1} ms, read churned cold {:.0} / warm {:.0} ms (cpu {:.0}), disk x{:.2} -> x{:.2} (peak x{:.2})",
        S::NAME,
        s.full_save.last().unwrap(),
        median(&s.sync_10k[s.sync_10k.len() - 5..]),
        median(&s.sync_100k[s.sync_100k.len() - 5..]),
        s.read_cold.last().unwrap(),
        s.read_warm.last().unwrap(),
        s.churn_sync.last().unwrap(),
        s.churn_sync_max.last().unwrap(),
        s.read_cold_churned.last().unwrap(),
        s.read_warm_churned.last().unwrap(),
        s.read_warm_churned_cpu.last().unwrap(),
        s.disk_full.last().unwrap(),
        s.disk_churn_end.last().unwrap(),
        s.disk_churn_peak.last().unwrap(),
    );
    let _ = fs::remove_dir_all(&dir);
}

fn main() {
    let mut cfg = Cfg {
        keys: 1_000_000,
        reps: 3,
        churn_syncs: 60,
        root: PathBuf::from("bench-data"),
        cold_ok: false,
    };
    let mut which = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--keys" => cfg.keys = args.next().unwrap().parse().unwrap(),
            "--reps" => cfg.reps = args.next().unwrap().parse().unwrap(),
            "--churn-syncs" => cfg.churn_syncs = args.next().unwrap().parse().unwrap(),
            "--dir" => cfg.root = PathBuf::from(args.next().unwrap()),
            "own" | "redb" | "fjall" => which.push(a),
            _ => panic!("usage: state-formats [--keys N] [--reps R] [--churn-syncs S] [--dir DIR] [own] [redb] [fjall]"),
        }
    }
    if which.is_empty() {
        which = vec!["own".into(), "redb".into(), "fjall".into()];
    }
    fs::create_dir_all(&cfg.root).unwrap();
    cfg.cold_ok = drop_caches();
    eprintln!(
        "keys {}, reps {}, churn syncs {}, dir {}, page cache drop {}",
        cfg.keys,
        cfg.reps,
        cfg.churn_syncs,
        cfg.root.display(),
        if cfg.cold_ok { "works (cold reads measured)" } else { "refused (cold reads skipped)" }
    );

    let mut results = Vec::new();
    for name in &which {
        let mut s = Samples::default();
        for rep in 0..cfg.reps {
            match name.as_str() {
                "own" => run::<Own>(&cfg, &mut s, rep, |o| o.compactions),
                "redb" => run::<Redb>(&cfg, &mut s, rep, |_| 0),
                _ => run::<Fjall>(&cfg, &mut s, rep, |_| 0),
            }
        }
        results.push((name.clone(), s));
    }

    println!("\nMedians over {} repetitions, {} keys (raw live size = key bytes + 20 per key):\n", cfg.reps, cfg.keys);
    let rows: [(&str, fn(&Samples) -> &Vec<f64>, &str); 16] = [
        ("(a) full save of all keys, ms", |s| &s.full_save, "{:.0}"),
        ("(b) sync 10 000 dirty keys, ms", |s| &s.sync_10k, "{:.1}"),
        ("(b) sync 100 000 dirty keys, ms", |s| &s.sync_100k, "{:.1}"),
        ("(c) read all, cold cache, ms", |s| &s.read_cold, "{:.0}"),
        ("(c) read all, warm cache, ms", |s| &s.read_warm, "{:.0}"),
        ("(c) read all, warm cache, process CPU ms", |s| &s.read_warm_cpu, "{:.0}"),
        ("(d) churn sync (N/10 puts + N/20 deletes), median ms", |s| &s.churn_sync, "{:.1}"),
        ("(d) churn sync, slowest of the hour, ms", |s| &s.churn_sync_max, "{:.1}"),
        ("(c) read all after churn, cold, ms", |s| &s.read_cold_churned, "{:.0}"),
        ("(c) read all after churn, warm, ms", |s| &s.read_warm_churned, "{:.0}"),
        ("(c) read all after churn, warm, process CPU ms", |s| &s.read_warm_churned_cpu, "{:.0}"),
        ("(d) disk / raw live, after full save", |s| &s.disk_full, "{:.2}"),
        ("(d) disk / raw live, after 1 h churn (closed)", |s| &s.disk_churn_end, "{:.2}"),
        ("(d) disk / raw live, peak during churn", |s| &s.disk_churn_peak, "{:.2}"),
        ("raw live size, MiB", |s| &s.raw_mib, "{:.1}"),
        ("own-format compactions during the hour", |s| &s.compactions, "{:.0}"),
    ];
    print!("| measure |");
    for (n, _) in &results {
        print!(" {n} |");
    }
    println!();
    print!("|---|");
    for _ in &results {
        print!("---:|");
    }
    println!();
    for (label, get, fmt) in rows {
        print!("| {label} |");
        for (_, s) in &results {
            let m = median(get(s));
            let cell = if m.is_nan() {
                "n/a".to_string()
            } else if fmt == "{:.0}" {
                format!("{m:.0}")
            } else if fmt == "{:.1}" {
                format!("{m:.1}")
            } else {
                format!("{m:.2}")
            };
            print!(" {cell} |");
        }
        println!();
    }
}
