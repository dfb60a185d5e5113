//! Durable counters (`TURNSTILE_STATE_DIR`): the in-memory counters, written behind the decisions
//! to a state dir and read back at the next start.
//!
//! Decisions never wait for the disk. Every entry of a shard's table carries a changed bit, set
//! by whatever changes it; once per save interval the journal asks every shard for the states
//! changed since the last save (`limiter::Engine::save`, a message like any other, a page of at
//! most 32 768 keys at a time, so the shard copies them between two decisions), appends them as
//! checksummed frames (`format`) to the log and syncs it to disk (`fdatasync`) before the next
//! interval. When the log outgrows the snapshot, the journal asks for every key instead and
//! writes a new snapshot, which starts a new generation (`dir`). The journal runs on a thread of
//! its own (`server` starts and stops it); at a graceful stop the last save runs after the last
//! answer and before the shards stop, so a stop loses nothing; a crash loses at most the hits
//! of the interval being saved. At start the newest snapshot and its log are read before any port
//! serves, each key going to the shard that owns it in this process's layout.
//!
//! The walk of a save, file by file, is in docs/architecture.md. The setting
//! and the metrics name a save a "sync" (`TURNSTILE_STATE_SYNC_INTERVAL`,
//! `turnstile_state_syncs_total`), as they were published; inside the code a "sync" is
//! local-first's exchange with the store.

mod dir;
pub mod format;
mod stats;

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::limiter::{Engine, Saved, ShardTask};
use dir::Dir;
use format::{Frames, FRAME_TARGET};
pub use stats::StateStats;

/// `TURNSTILE_STATE_DIR` and `TURNSTILE_STATE_SYNC_INTERVAL` (the save interval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    pub dir: PathBuf,
    /// The setting that named `dir`, as errors about it say (`TURNSTILE_STATE_DIR`, or what
    /// stands for it on another command line).
    pub named: &'static str,
    /// How often what changed is saved (written, and synced to disk): at most this much is
    /// lost at a crash.
    pub save_interval: Duration,
}

impl StateSettings {
    pub const DEFAULT_SAVE_INTERVAL: Duration = Duration::from_secs(1);
}

/// The state dir, opened, locked and read back into the shards: what keeps them on disk.
#[derive(Debug)]
pub struct Journal {
    dir: Option<Dir>,
    interval: Duration,
    stats: Arc<StateStats>,
    /// The next save asks for every key and starts a new generation: the first one, and after
    /// a failed write or a shard that lost track of what it dropped.
    full_next: bool,
    /// When the current snapshot was written.
    snapshot_at: Instant,
}

/// A snapshot older than this is written again (if the state is more than a few frames), so
/// expired keys leave the disk even when few keys change.
const SNAPSHOT_AGE: Duration = Duration::from_secs(600);

impl Journal {
    /// Opens and locks the state dir, and puts what it holds into the shards (`tasks`, not yet
    /// started) of `engine`. An unusable dir is an error naming it; a damaged file is not (it is
    /// logged, counted and set aside, and what could be read before the damage is kept).
    pub fn open(
        settings: &StateSettings,
        engine: &Engine,
        tasks: &mut [ShardTask],
        stats: Arc<StateStats>,
    ) -> Result<Journal, String> {
        let started = Instant::now();
        let mut dir = Dir::open(&settings.dir, settings.named)?;
        let loaded = dir
            .load(|r| engine.restore(tasks, r.key, r.state, r.expires_s))
            .map_err(|e| {
                format!(
                    "{} {}: cannot be read: {e}",
                    settings.named,
                    dir.path().display()
                )
            })?;
        for d in &loaded.damaged {
            stats.damaged();
            tracing::error!(
                file = %d.file.display(),
                kept_as = %d.kept_as.as_ref().map_or("(could not be moved)".into(), |p| p.display().to_string()),
                fault = %d.fault,
                "durable counters: a state file is damaged; starting with what could be read before the damage"
            );
        }
        if let Some(file) = &loaded.torn_log {
            tracing::warn!(
                file = %file.display(),
                "durable counters: the last sync before the stop was cut short (a crash); its hits are lost"
            );
        }
        let keys: u64 = tasks.iter().map(|t| t.keys()).sum();
        stats.restored(keys);
        tracing::info!(
            dir = %dir.path().display(),
            records = loaded.records,
            keys,
            ms = started.elapsed().as_millis() as u64,
            "durable counters read"
        );
        Ok(Journal {
            dir: Some(dir),
            interval: settings.save_interval,
            stats,
            full_next: true,
            snapshot_at: Instant::now(),
        })
    }

    /// Saves what changed every interval until `stop` turns true.
    pub async fn run(&mut self, engine: &Engine, mut stop: watch::Receiver<bool>) {
        let mut every = tokio::time::interval(self.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.save(engine).await,
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            }
        }
    }

    /// One save: what changed, appended to the log; or every key, as a new snapshot, when the
    /// log has outgrown the snapshot or a save asked for it. Called once more at the stop, after
    /// the last answer.
    pub async fn save(&mut self, engine: &Engine) {
        let Some(mut dir) = self.dir.take() else {
            return;
        };
        let big = FRAME_TARGET as u64 * 4;
        let all = self.full_next
            || dir.log_len > dir.snapshot_len.max(big)
            || (dir.disk_bytes() > big && self.snapshot_at.elapsed() > SNAPSHOT_AGE);
        // The shards' pages go to the writer one at a time, written as they come: a save holds
        // about a page per shard in memory, and a shard copies a page between two decisions.
        let (tx, rx) = mpsc::channel::<Part>(1);
        let started = Instant::now();
        let writer = tokio::task::spawn_blocking(move || {
            let written = write(&mut dir, rx, all);
            (dir, written)
        });
        let sent = send_pages(engine, all, &tx).await;
        drop(tx);
        let (dir, written) = writer.await.expect("the blocking pool runs the write");
        // The shards have stopped: nothing more can change, and the writer wrote nothing.
        if let Err(Stop::Shards) = sent {
            self.dir = Some(dir);
            return;
        }
        // A shard that evicted more than it could list gave every key instead: only a snapshot
        // forgets the rest.
        let lost_track = sent.unwrap_or(false);
        match written {
            Ok(keys) => {
                self.full_next = lost_track;
                if all {
                    self.snapshot_at = Instant::now();
                }
                (self.stats).saved(keys, dir.disk_bytes(), all, started.elapsed());
            }
            Err(e) => {
                // The changed bits were cleared by the save: only a full save writes them again.
                self.full_next = true;
                self.stats.failed();
                tracing::error!(dir = %dir.path().display(), error = %e, "durable counters: a sync could not be written; the next one writes every key");
            }
        }
        self.dir = Some(dir);
    }
}

/// What the journal hands the writer: a shard's page, or word that every page has been sent.
enum Part {
    Page(Saved),
    Complete,
}

/// Why a save did not send every page.
enum Stop {
    /// The shards have stopped.
    Shards,
    /// The writer failed (it says why).
    Writer,
}

/// Sends the writer every shard's pages of one save: of what changed, or of every key and then,
/// as a last pass, of what changed meanwhile (keys counted, or moved within a shard's table,
/// after their page was read), so the snapshot misses nothing. Answers whether a shard lost
/// track of what it dropped (a save of what changed only).
async fn send_pages(engine: &Engine, all: bool, tx: &mpsc::Sender<Part>) -> Result<bool, Stop> {
    let mut lost_track = false;
    let passes: &[bool] = if all { &[true, false] } else { &[false] };
    for &pass in passes {
        for shard in 0..engine.shard_count() {
            let (mut from, mut every) = (0, pass);
            loop {
                let page = (engine.save(shard, every, from).await).map_err(|_| Stop::Shards)?;
                every = page.full;
                lost_track |= !all && page.full;
                let next = page.next;
                tx.send(Part::Page(page)).await.map_err(|_| Stop::Writer)?;
                match next {
                    Some(n) => from = n,
                    None => break,
                }
            }
        }
    }
    tx.send(Part::Complete).await.map_err(|_| Stop::Writer)?;
    Ok(lost_track)
}

/// Encodes and writes one save, its pages as they arrive from `rx`: frames appended to the log
/// (and synced together), or a new snapshot streamed to its file. Answers the keys written; a
/// save whose pages stop short of `Part::Complete` is not written.
fn write(dir: &mut Dir, mut rx: mpsc::Receiver<Part>, all: bool) -> io::Result<u64> {
    let mut keys = 0u64;
    let encode = |out: &mut dyn Write| -> io::Result<u64> {
        let mut frames = Frames::new(out, all)?;
        loop {
            match rx.blocking_recv() {
                Some(Part::Page(saved)) => {
                    for (key, state, expires_s) in saved.iter() {
                        frames.record(key, state, expires_s)?;
                        keys += u64::from(state.is_some());
                    }
                }
                Some(Part::Complete) => break,
                None => return Err(io::Error::other("the save stopped before its last page")),
            }
        }
        frames.finish(all)
    };
    if all {
        dir.write_snapshot(encode)?;
    } else {
        dir.append(encode)?;
    }
    Ok(keys)
}
