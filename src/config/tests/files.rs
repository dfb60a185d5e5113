//! Loading a config location: a file, a directory, ConfigMap symlinks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "turnstile-config-test-{}-{tag}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&p, text).expect("write file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn domain_yaml(domain: &str) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
}

fn domain_names(c: &Config) -> Vec<String> {
    let mut v: Vec<String> = c.domains.keys().cloned().collect();
    v.sort();
    v
}

#[test]
fn load_directory_reads_yaml_and_yml_only() {
    let t = TempDir::new("dir");
    t.write("a.yaml", &domain_yaml("a"));
    t.write("b.yml", &domain_yaml("b"));
    t.write(".hidden.yaml", &domain_yaml("hidden"));
    t.write("c.txt", &domain_yaml("txt"));
    t.write("c.yaml.bak", &domain_yaml("bak"));
    t.write("README", "not yaml: [");
    t.write("sub/d.yaml", &domain_yaml("sub"));
    // A directory whose name looks like a YAML file is not a file.
    t.write("e.yaml/f.yaml", &domain_yaml("nested"));
    let c = Config::load(t.path(), LoadOptions::default()).expect("load dir");
    assert_eq!(domain_names(&c), ["a", "b"]);
}

#[test]
fn load_directory_with_dotfiles_included() {
    let t = TempDir::new("dot");
    t.write("a.yaml", &domain_yaml("a"));
    t.write(".hidden.yaml", &domain_yaml("hidden"));
    t.write(".other.yml", &domain_yaml("other"));
    let opts = LoadOptions {
        include_dotfiles: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("load dir");
    assert_eq!(domain_names(&c), ["a", "hidden", "other"]);
}

#[test]
fn load_single_file() {
    let t = TempDir::new("file");
    let f = t.write("only.yaml", &domain_yaml("only"));
    t.write("other.yaml", &domain_yaml("other"));
    let c = Config::load(&f, LoadOptions::default()).expect("load file");
    assert_eq!(domain_names(&c), ["only"]);
}

#[test]
fn load_follows_configmap_symlinks() {
    use std::os::unix::fs::symlink;
    let t = TempDir::new("configmap");
    t.write("..2024_01_01_00_00_00.123/a.yaml", &domain_yaml("a"));
    t.write("..2024_01_01_00_00_00.123/b.yml", &domain_yaml("b"));
    symlink("..2024_01_01_00_00_00.123", t.path().join("..data")).expect("symlink ..data");
    symlink("..data/a.yaml", t.path().join("a.yaml")).expect("symlink a.yaml");
    symlink("..data/b.yml", t.path().join("b.yml")).expect("symlink b.yml");
    let c = Config::load(t.path(), LoadOptions::default()).expect("load configmap dir");
    assert_eq!(domain_names(&c), ["a", "b"]);
    // `..data` and the timestamped dir are directories: never loaded twice, even with dotfiles on.
    let opts = LoadOptions {
        include_dotfiles: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("load configmap dir with dotfiles");
    assert_eq!(domain_names(&c), ["a", "b"]);
}

#[test]
fn load_directory_error_names_the_file_on_disk() {
    let t = TempDir::new("bad");
    t.write("a.yaml", &domain_yaml("a"));
    let bad = t.write(
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnite}\n",
    );
    let e = Config::load(t.path(), LoadOptions::default()).expect_err("invalid file");
    assert_eq!(e.file, bad.display().to_string(), "{e}");
    assert_eq!(e.path, "descriptors[0].rate_limit.unit", "{e}");
    assert!(e.to_string().contains(&bad.display().to_string()));
}

#[test]
fn load_duplicate_domain_in_directory_and_merge() {
    let t = TempDir::new("dup");
    t.write("a.yaml", &domain_yaml("same"));
    t.write("b.yaml", "domain: same\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 9}\n");
    let e = Config::load(t.path(), LoadOptions::default()).expect_err("duplicate");
    assert!(e.file.ends_with("b.yaml"), "{e}");
    assert!(e.message.contains("duplicate domain"), "{e}");
    let opts = LoadOptions {
        merge_domains: true,
        ..Default::default()
    };
    let c = Config::load(t.path(), opts).expect("merged");
    assert_eq!(only_limit(&c, "same", &[("k", "1")]).requests_per_unit, 1);
    assert_eq!(
        only_limit(&c, "same", &[("other", "1")]).requests_per_unit,
        9
    );
}

#[test]
fn load_missing_path_is_an_error() {
    let t = TempDir::new("missing");
    let p = t.path().join("nope");
    let e = Config::load(&p, LoadOptions::default()).expect_err("missing path");
    assert_eq!(e.file, p.display().to_string());
    assert!(e.message.contains("cannot read"), "{e}");
}

#[test]
fn load_empty_directory_gives_no_domains() {
    let t = TempDir::new("empty");
    let c = Config::load(t.path(), LoadOptions::default()).expect("empty dir loads");
    assert!(c.domains.is_empty());
}

// ------------------------------------------------------------------------------------------
// Settings::from_env
