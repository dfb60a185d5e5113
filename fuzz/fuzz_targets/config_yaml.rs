//! Arbitrary bytes → `Config::from_sources`: loading any text must end in a config or a
//! `ConfigError` naming the file, never a panic. A NUL byte splits the input into two files, so
//! duplicate domains, merging and a second `rate_api` are reached too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile::config::{Config, LoadOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let sources: Vec<(String, String)> = text
        .splitn(2, '\0')
        .enumerate()
        .map(|(i, t)| (format!("fuzz{i}.yaml"), t.to_owned()))
        .collect();
    for merge_domains in [false, true] {
        let opts = LoadOptions {
            merge_domains,
            include_dotfiles: false,
        };
        match Config::from_sources(&sources, opts) {
            Ok(config) => {
                // What `turnstile check` prints, and the lookups a request makes.
                let _ = config.describe();
                for name in config.domains.keys() {
                    assert!(config.domain(name).is_some());
                }
                if let Some(api) = &config.rate_api {
                    let _ = api.find("fuzz-key");
                }
            }
            Err(e) => {
                assert!(e.file.starts_with("fuzz"), "{e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
});
