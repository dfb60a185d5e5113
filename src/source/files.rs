//! Noticing change: a poller compares a fingerprint of the config location (or of certificate
//! files) with the last one seen and calls back when it differs ([`poll`]); what a change
//! reads again is the caller's (`server`'s followed files).
//!
//! Polling, not inotify: a fingerprint of names, sizes, mtimes and resolved symlink targets is
//! cheap at one a second, works on every filesystem (overlay, NFS, ConfigMap volumes), and sees
//! a Kubernetes ConfigMap update, which swaps the `..data` symlink in one rename: the files'
//! resolved targets change even though no listed name does.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fnv::FnvHasher;
use tokio::sync::watch;

/// What a change of is worth a reload.
#[derive(Debug, Clone)]
pub enum Watched {
    /// A config location (file or directory of YAML files), and with `RUNTIME_WATCH_ROOT` the
    /// runtime root, whose symlink a deploy may swap.
    Config {
        path: PathBuf,
        root: Option<PathBuf>,
        include_dotfiles: bool,
        /// Files read with the location (GoCC's key file, `CONFIG_FILE`).
        extra: Vec<PathBuf>,
    },
    /// Plain files, such as TLS certificates (Kubernetes Secrets also swap `..data`).
    Files(Vec<PathBuf>),
}

/// A hash of everything in `w` that a change of content or a symlink swap touches. A missing
/// path hashes as missing, so its appearance is a change too.
pub fn fingerprint(w: &Watched) -> u64 {
    let mut h = FnvHasher::default();
    match w {
        Watched::Config {
            path,
            root,
            include_dotfiles,
            extra,
        } => {
            if let Some(root) = root {
                hash_resolved(root, &mut h);
            }
            hash_location(path, *include_dotfiles, &mut h);
            for f in extra {
                hash_file(f, &mut h);
            }
        }
        Watched::Files(files) => {
            for f in files {
                hash_file(f, &mut h);
            }
        }
    }
    h.finish()
}

fn hash_resolved(p: &Path, h: &mut FnvHasher) {
    match std::fs::canonicalize(p) {
        Ok(c) => c.hash(h),
        Err(e) => e.kind().hash(h),
    }
}

fn hash_file(p: &Path, h: &mut FnvHasher) {
    p.hash(h);
    hash_resolved(p, h);
    // `metadata` follows symlinks: the size and mtime are the target's. A directory's own
    // mtime moves whenever any file in it does, dotfiles included, so only its files count.
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => true.hash(h),
        Ok(m) => {
            m.len().hash(h);
            m.modified().ok().hash(h);
        }
        Err(e) => e.kind().hash(h),
    }
}

fn hash_location(path: &Path, include_dotfiles: bool, h: &mut FnvHasher) {
    hash_file(path, h);
    let Ok(dir) = std::fs::read_dir(path) else {
        return;
    };
    let mut names: Vec<_> = dir
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| {
            let n = n.to_string_lossy();
            // As `list_files`: only YAML, dotfiles only when asked. `..data` itself is a
            // dotfile; its swap shows through the resolved targets of the files linking to it.
            (include_dotfiles || !n.starts_with('.'))
                && (n.ends_with(".yaml") || n.ends_with(".yml"))
        })
        .collect();
    names.sort();
    for n in names {
        hash_file(&path.join(n), h);
    }
}

/// Polls `watched` every `interval` until `stop` turns true, calling `on_change` when its
/// fingerprint differs from the last one seen, starting from `baseline` (taken when the live
/// config was loaded, so a change made in between is not missed), and waiting for it before
/// the next look, so changes are handled one at a time, in order. A change that fails to load
/// is not retried until the files change again, so a bad config is logged once, not every tick.
pub async fn poll<F: Future<Output = ()>>(
    watched: Watched,
    baseline: u64,
    interval: Duration,
    mut on_change: impl FnMut() -> F,
    mut stop: watch::Receiver<bool>,
) {
    if interval.is_zero() {
        return;
    }
    let mut last = baseline;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = fingerprint(&watched);
        if now != last {
            last = now;
            on_change().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "turnstile-watch-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn fingerprint_sees_configmap_swap_and_ignores_dotfiles() {
        let dir = temp("cm");
        std::fs::create_dir(dir.join("..v1")).unwrap();
        std::fs::write(dir.join("..v1/a.yaml"), "domain: a\n").unwrap();
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", dir.join("a.yaml")).unwrap();
        let w = Watched::Config {
            path: dir.clone(),
            root: None,
            include_dotfiles: false,
            extra: Vec::new(),
        };
        let f0 = fingerprint(&w);
        std::fs::write(dir.join(".hidden.yaml"), "x").unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        assert_eq!(
            fingerprint(&w),
            f0,
            "dotfiles and non-YAML files are ignored"
        );
        // Same size, new target: only the resolved path tells.
        std::fs::create_dir(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v2/a.yaml"), "domain: b\n").unwrap();
        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert_ne!(fingerprint(&w), f0);
        let _ = std::fs::remove_dir_all(dir);
    }
}
