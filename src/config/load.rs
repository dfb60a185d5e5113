//! Reading a config location: a YAML file, or every `*.yaml`/`*.yml` of a directory; and
//! GoCC's key file beside it.

use std::path::{Path, PathBuf};

use super::build::{Builder, LiveConfig};
use super::{Config, ConfigError, GoccKeys, LoadOptions};

/// Everything the limits are read from when they come from files: the start, every reload and
/// `turnstile check` read them through [`Sources::load`].
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The YAML location (a file or a directory).
    pub path: PathBuf,
    /// A missing `path` loads as no YAML at all rather than an error: true when the location is
    /// the default one, never named by a setting (a GoCC deployment has no YAML).
    pub optional: bool,
    /// GoCC's key file (`CONFIG_FILE`).
    pub gocc_file: Option<PathBuf>,
    pub opts: LoadOptions,
    /// The config being served, when the files are read again to replace it (a reload).
    pub live: LiveConfig,
}

impl Sources {
    pub fn load(&self) -> Result<Config, ConfigError> {
        // `--config gocc.json`: GoCC's key file named as the location (JSON is YAML too, but a
        // GoCC file is no turnstile YAML).
        let json = self.path.extension().is_some_and(|e| e == "json") && self.path.is_file();
        let gocc_file = match (&self.gocc_file, json) {
            (Some(f), true) => {
                return Err(ConfigError {
                    file: self.path.display().to_string(),
                    path: String::new(),
                    message: format!(
                        "is read as GoCC's key file, and CONFIG_FILE names another ({}): \
                         name one",
                        f.display()
                    ),
                })
            }
            (None, true) => Some(&self.path),
            (f, false) => f.as_ref(),
        };
        let mut config =
            if json || (self.optional && std::fs::symlink_metadata(&self.path).is_err()) {
                Config::default()
            } else {
                Config::load_beside(&self.path, self.opts, &self.live)?
            };
        if let Some(f) = gocc_file {
            config.gocc = Some(GoccKeys::load(f)?);
        }
        Ok(config)
    }

    /// Nothing to read at all: no setting named a location, the default one does not exist,
    /// and there is no GoCC key file. Loading gives no limits, which nobody means (a forgotten
    /// `--config`): `check` refuses it, `serve` warns.
    pub fn found_nothing(&self) -> bool {
        self.optional && self.gocc_file.is_none() && std::fs::symlink_metadata(&self.path).is_err()
    }

    /// What [`Sources::found_nothing`] found, for `check`'s error and `serve`'s warning.
    pub fn nothing_found_message(&self) -> String {
        format!(
            "no config found: neither --config nor RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, \
             RUNTIME_APPDIRECTORY or CONFIG_FILE is set, and the default location {} does not \
             exist",
            self.path.display()
        )
    }

    /// The plain files to watch besides the YAML location.
    pub fn extra_files(&self) -> Vec<PathBuf> {
        self.gocc_file.iter().cloned().collect()
    }
}

impl Config {
    /// Loads a YAML file, or every `*.yaml`/`*.yml` of a directory (dotfiles ignored), in name order.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Config, ConfigError> {
        Config::load_beside(path, opts, &LiveConfig::default())
    }

    /// As [`Config::load`], to replace the live config, `live`: what the two have in common
    /// is held once.
    pub fn load_beside(
        path: &Path,
        opts: LoadOptions,
        live: &LiveConfig,
    ) -> Result<Config, ConfigError> {
        let mut builder = Builder::beside(live);
        for f in list_files(path, opts)? {
            super::yaml::add_path(&mut builder, &f.display().to_string(), &f, opts)?;
        }
        Ok(builder.finish())
    }

    /// Builds a config from `(file name, YAML text)` pairs; the file names only label errors.
    pub fn from_sources(
        sources: &[(String, String)],
        opts: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let mut builder = Builder::default();
        for (file, text) in sources {
            super::yaml::add_file(&mut builder, file, text, opts)?;
        }
        Ok(builder.finish())
    }
}

/// The files a config location names: the file itself, or a directory's YAML files.
pub fn list_files(path: &Path, opts: LoadOptions) -> Result<Vec<PathBuf>, ConfigError> {
    let err = |message: String| ConfigError {
        file: path.display().to_string(),
        path: String::new(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| err(format!("cannot list: {e}")))? {
        let entry = entry.map_err(|e| err(format!("cannot list: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with('.') && !opts.include_dotfiles)
            || !(name.ends_with(".yaml") || name.ends_with(".yml"))
        {
            continue;
        }
        // Follows symlinks, so a Kubernetes ConfigMap's `..data/x.yaml` links count as files.
        if std::fs::metadata(entry.path())
            .map(|m| m.is_file())
            .unwrap_or(false)
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}
