//! The state dir on disk: its lock, and the files of one generation. A generation `N` is a
//! snapshot `counters.N.snap` (every live key, streamed to a temporary file, synced, renamed,
//! the dir synced) and the log `counters.N.log` the saves append to after it (each
//! frame synced with `fdatasync` before the next interval). A new snapshot starts generation
//! `N + 1`; the files of `N` are deleted once it is on disk. Reading takes the newest snapshot
//! and its log; the files of older generations are leftovers of a crash between those steps.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::format::{self, Fault, Record};

const LOCK: &str = "lock";
/// Damaged files kept aside for inspection; older ones are deleted.
const KEEP_DAMAGED: usize = 3;

/// The state dir, locked by this process while it lives.
#[derive(Debug)]
pub(super) struct Dir {
    path: PathBuf,
    /// Held open: the lock lasts as long as the file handle.
    _lock: File,
    generation: u64,
    log: Option<File>,
    pub(super) log_len: u64,
    pub(super) snapshot_len: u64,
}

/// A file that could not be read whole: where it is now (set aside), and why.
#[derive(Debug)]
pub(super) struct Damaged {
    pub(super) file: PathBuf,
    pub(super) kept_as: Option<PathBuf>,
    pub(super) fault: Fault,
}

/// What a start read.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    pub(super) records: usize,
    pub(super) damaged: Vec<Damaged>,
    /// A log whose last frame was cut short: the save a crash interrupted, not damage.
    pub(super) torn_log: Option<PathBuf>,
}

impl Dir {
    /// Opens (creating it if need be) and locks the state dir. Errors name the dir and what is
    /// wrong with it.
    pub(super) fn open(path: &Path, setting: &str) -> Result<Dir, String> {
        let named = |what: String| format!("{setting} {}: {what}", path.display());
        if path.exists() && !path.is_dir() {
            return Err(named("is not a directory".into()));
        }
        fs::create_dir_all(path).map_err(|e| named(format!("cannot be created: {e}")))?;
        let lock_path = path.join(LOCK);
        let mut lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(|e| named(format!("cannot write {}: {e}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(&lock_path).unwrap_or_default();
                return Err(named(format!(
                    "is held by another running turnstile (process {}); two processes must not share a state dir",
                    holder.trim()
                )));
            }
            Err(TryLockError::Error(e)) => {
                return Err(named(format!("cannot lock {}: {e}", lock_path.display())))
            }
        }
        lock.set_len(0)
            .and_then(|()| writeln!(lock, "{}", std::process::id()))
            .map_err(|e| named(format!("cannot write {}: {e}", lock_path.display())))?;
        Ok(Dir {
            path: path.to_owned(),
            _lock: lock,
            generation: 0,
            log: None,
            log_len: 0,
            snapshot_len: 0,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, generation: u64, ext: &str) -> PathBuf {
        self.path.join(format!("counters.{generation}.{ext}"))
    }

    /// Every generation with a snapshot, newest first.
    fn generations(&self) -> io::Result<Vec<u64>> {
        let mut gens: Vec<u64> = fs::read_dir(&self.path)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("counters.")?
                    .strip_suffix(".snap")?
                    .parse()
                    .ok()
            })
            .collect();
        gens.sort_unstable_by_key(|g| std::cmp::Reverse(*g));
        Ok(gens)
    }

    /// Reads the newest generation, handing on its records in order (the snapshot's, then the
    /// log's). A damaged file gives what could be read before the damage, and is set aside.
    pub(super) fn load(&mut self, mut f: impl FnMut(Record<'_>)) -> io::Result<Loaded> {
        let mut loaded = Loaded::default();
        let Some(&generation) = self.generations()?.first() else {
            return Ok(loaded);
        };
        self.generation = generation;
        for ext in ["snap", "log"] {
            let file = self.file(generation, ext);
            let opened = match File::open(&file) {
                Ok(o) => o,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            // Unbuffered: a frame's payload is read straight into place, in one read or a few.
            let (read, fault) = format::read_from(opened, &mut f)?;
            loaded.records += read.records;
            let fault = match (ext, fault) {
                (_, None) if ext == "log" || read.ended => continue,
                // A snapshot is written whole before it is renamed into place: one without its
                // end was cut short afterwards.
                (_, None) => Fault::Torn { at: read.good_len },
                ("log", Some(Fault::Torn { .. })) => {
                    loaded.torn_log = Some(file);
                    continue;
                }
                // A rollback after an upgrade: the counts are whole, only this build cannot
                // read them. Setting them aside would lose them under a wrong name.
                (_, Some(fault @ Fault::Newer { .. })) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: {fault} (start that version on it again, or move the \
                             directory away to start from zero)",
                            file.display()
                        ),
                    ))
                }
                (_, Some(fault)) => fault,
            };
            let kept_as = self.set_aside(&file);
            loaded.damaged.push(Damaged {
                file,
                kept_as,
                fault,
            });
        }
        Ok(loaded)
    }

    /// Moves a damaged file out of the way (`<name>.damaged-<unix seconds>`), keeping the
    /// newest few.
    fn set_aside(&self, file: &Path) -> Option<PathBuf> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let name = file.file_name()?.to_string_lossy().into_owned();
        let aside = self.path.join(format!("{name}.damaged-{secs}"));
        fs::rename(file, &aside).ok()?;
        let mut kept: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(&self.path)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".damaged-"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        kept.sort_unstable_by_key(|k| std::cmp::Reverse(k.0));
        for (_, old) in kept.iter().skip(KEEP_DAMAGED) {
            let _ = fs::remove_file(old);
        }
        Some(aside)
    }

    /// Starts a new generation from the snapshot `write` writes (answering its length), as
    /// it writes it: written and synced under a temporary name, renamed, the dir synced; then
    /// an empty log; then the older generations' files are deleted. A snapshot `write` fails
    /// is deleted, and the generation stays.
    pub(super) fn write_snapshot(
        &mut self,
        write: impl FnOnce(&mut dyn Write) -> io::Result<u64>,
    ) -> io::Result<()> {
        let next = self.generation + 1;
        let tmp = self.path.join(format!("counters.{next}.snap.tmp"));
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        let written = write(&mut out)
            .and_then(|len| Ok((len, out.into_inner().map_err(|e| e.into_error())?)))
            .and_then(|(len, f)| f.sync_all().map(|()| len));
        let len = match written {
            Ok(len) => len,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        fs::rename(&tmp, self.file(next, "snap"))?;
        let mut log = File::create(self.file(next, "log"))?;
        log.write_all(format::HEADER)?;
        log.sync_all()?;
        File::open(&self.path)?.sync_all()?;
        self.generation = next;
        self.log = Some(log);
        self.log_len = format::HEADER.len() as u64;
        self.snapshot_len = len;
        self.delete_older(next);
        Ok(())
    }

    /// Appends the frames `write` writes (answering their length) to the log, as it writes
    /// them, and waits until they are on disk (nothing to wait for when there were none).
    pub(super) fn append(
        &mut self,
        write: impl FnOnce(&mut dyn Write) -> io::Result<u64>,
    ) -> io::Result<()> {
        let log = self
            .log
            .as_mut()
            .ok_or_else(|| io::Error::other("no log open: a snapshot comes first"))?;
        let mut out = BufWriter::with_capacity(1 << 20, &mut *log);
        let written = write(&mut out).and_then(|len| out.flush().map(|()| len));
        drop(out);
        match written.and_then(|len| (if len > 0 { log.sync_data() } else { Ok(()) }).map(|()| len))
        {
            Ok(len) => {
                self.log_len += len;
                Ok(())
            }
            Err(e) => {
                // What was written may be on disk in part; the next save starts a new
                // generation rather than append after it.
                self.log = None;
                Err(e)
            }
        }
    }

    /// Bytes the state takes on disk now (the snapshot and its log).
    pub(super) fn disk_bytes(&self) -> u64 {
        self.snapshot_len + self.log_len
    }

    /// Deletes the files of generations before `current`, and temporary files left by a crash.
    fn delete_older(&self, current: u64) {
        let Ok(entries) = fs::read_dir(&self.path) else {
            return;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("counters.") else {
                continue;
            };
            if name.contains(".damaged-") {
                continue;
            }
            let generation = rest.split('.').next().and_then(|g| g.parse::<u64>().ok());
            if generation.is_some_and(|g| g < current) || name.ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}
