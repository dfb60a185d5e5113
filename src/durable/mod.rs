//! Durable counters (`TURNSTILE_STATE_DIR`): the in-memory counters, written behind the decisions
//! to a state dir and read back at the next start.
//!
//! Decisions never wait for the disk. Every entry of a shard's table carries a changed bit, set
//! by whatever changes it; once per sync interval the journal asks every shard for the states
//! changed since the last save (`limiter::Engine::save`, a message like any other, so the shard
//! copies them between two decisions), appends them as one checksummed frame to the log and
//! syncs it (`fdatasync`) before the next interval. When the log outgrows the snapshot, the
//! journal asks for every key instead and writes a new snapshot, which starts a new generation
//! (`dir`). At a graceful stop the last save runs after the last answer (`server` waits for it
//! before the shards stop), so a stop loses nothing; a crash loses at most the hits of the
//! interval being synced. At start the newest snapshot and its log are read before any port
//! serves, each key going to the shard that owns it in this process's layout.
//!
//! The walk of a sync, file by file, is in the crate's overview (`src/lib.rs`).

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

/// `TURNSTILE_STATE_DIR` and `TURNSTILE_STATE_SYNC_INTERVAL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    pub dir: PathBuf,
    /// How often what changed is written and synced: at most this much is lost at a crash.
    pub sync_interval: Duration,
}

impl StateSettings {
    pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);
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
        let mut dir = Dir::open(&settings.dir)?;
        let loaded = dir
            .load(|r| engine.restore(tasks, r.key, r.state, r.expires_s))
            .map_err(|e| {
                format!(
                    "TURNSTILE_STATE_DIR {}: cannot be read: {e}",
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
            interval: settings.sync_interval,
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
                _ = every.tick() => self.sync(engine).await,
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            }
        }
    }

    /// One save: what changed, appended to the log; or every key, as a new snapshot, when the
    /// log has outgrown the snapshot or a save asked for it. Called once more at the stop, after
    /// the last answer.
    pub async fn sync(&mut self, engine: &Engine) {
        let Some(mut dir) = self.dir.take() else {
            return;
        };
        let big = FRAME_TARGET as u64 * 4;
        let all = self.full_next
            || dir.log_len > dir.snapshot_len.max(big)
            || (dir.disk_bytes() > big && self.snapshot_at.elapsed() > SNAPSHOT_AGE);
        // The shards' saves go to the writer one at a time, written as they come: a save of
        // every key holds one shard's share in memory, not the whole state.
        let shards = engine.shard_count();
        let (tx, rx) = mpsc::channel::<Saved>(1);
        let started = Instant::now();
        let writer = tokio::task::spawn_blocking(move || {
            let written = write(&mut dir, rx, shards, all);
            (dir, written)
        });
        // A shard that evicted more than it could list gave every key instead: only a snapshot
        // forgets the rest.
        let (mut lost_track, mut stopped) = (false, false);
        for shard in 0..shards {
            // An error: the shards have stopped (nothing more can change); the writer, short of
            // a shard, writes nothing.
            let Ok(saved) = engine.save(shard, all).await else {
                stopped = true;
                break;
            };
            lost_track |= !all && saved.full;
            // The writer failed, and says why below.
            if tx.send(saved).await.is_err() {
                break;
            }
        }
        drop(tx);
        let (dir, written) = writer.await.expect("the blocking pool runs the write");
        if stopped {
            self.dir = Some(dir);
            return;
        }
        match written {
            Ok(keys) => {
                self.full_next = lost_track;
                if all {
                    self.snapshot_at = Instant::now();
                }
                (self.stats).synced(keys, dir.disk_bytes(), all, started.elapsed());
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

/// Encodes and writes one save, each shard's part as it arrives from `rx`: frames appended to
/// the log (and synced together), or a new snapshot streamed to its file. Answers the keys
/// written; a snapshot short of one of the `shards` parts is not written.
fn write(
    dir: &mut Dir,
    mut rx: mpsc::Receiver<Saved>,
    shards: usize,
    all: bool,
) -> io::Result<u64> {
    let mut keys = 0u64;
    let mut encode = |out: &mut dyn Write| -> io::Result<u64> {
        let mut frames = Frames::new(out, all)?;
        let mut parts = 0;
        while let Some(saved) = rx.blocking_recv() {
            parts += 1;
            for (key, state, expires_s) in saved.iter() {
                frames.record(key, state, expires_s)?;
                keys += u64::from(state.is_some());
            }
        }
        if parts < shards {
            return Err(io::Error::other(format!(
                "{parts} of {shards} shards saved: the shards stopped"
            )));
        }
        frames.finish(all)
    };
    if all {
        dir.write_snapshot(encode)?;
    } else {
        // A log's frames are what changed in one interval: encoded whole, then appended and
        // synced in one go.
        let mut out = Vec::new();
        if encode(&mut out)? > 0 {
            dir.append(&out)?;
        }
    }
    Ok(keys)
}
