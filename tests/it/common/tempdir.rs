//! A fresh directory for one test: removed when dropped, kept (and its path printed) when the
//! test failed, so the configs and logs in it can be read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static DIRS: AtomicUsize = AtomicUsize::new(0);

pub struct TempDir(PathBuf);

impl TempDir {
    /// Unique per process and call; `tag` names it for whoever finds it left behind. Under the
    /// system temp dir rather than the target dir: unix socket paths made in it must stay short.
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "turnstile-test-{}-{tag}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `rel` inside the directory, creating parents. The text goes to a hidden
    /// file first and is renamed into place, as a Secret volume or cert-manager would do it: a
    /// server watching the file never reads half of it.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        let parent = p.parent().expect("a file inside the directory");
        std::fs::create_dir_all(parent).expect("create parent");
        let name = p.file_name().expect("a file name").to_string_lossy();
        let tmp = parent.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write file");
        std::fs::rename(&tmp, &p).expect("rename file into place");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
