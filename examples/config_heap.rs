//! Where a loaded config's memory goes: loads a config file as `serve` does (the tree, then its
//! limits bound to per-limit stats and to heavy-hitter lists) and reports, per descriptor, the
//! growth of the resident set each step causes.
//!
//!   cargo run --release --example config_heap -- CONFIG [TOP_N=20] [--no-reload]
//!   valgrind --tool=massif --depth=12 target/release/examples/config_heap CONFIG
//!
//! `--no-reload` stops once the config is held, so massif's peak is the load's or what is held.
//!
//! Steps: `yaml` is the file's size; `tree` what the built config holds, with its `strings`
//! (values, stat keys and origins: their lengths, summed over the tree) apart; `stats` and
//! `top` what binding the per-limit stats and the heavy hitters adds; `load peak` the most the
//! process held while the tree was built (VmHWM); `reload peak` the most it held while the same
//! file was loaded again and put live beside the first, as a reload does, and `after reload`
//! what it holds once the first is freed.
//!
//! The example runs on glibc malloc, which returns large freed blocks to the kernel at once,
//! so the growth is the data structures' (and massif, which sees glibc's allocations, can
//! attribute them); the `turnstile` binary uses mimalloc, whose pages come on top.

use std::sync::Arc;

use turnstile::config::{Config, LiveConfig, LoadOptions, Node};
use turnstile::hitters::TopTable;
use turnstile::service::metrics::RequestStats;
use turnstile::service::LiveLimits;

/// A field of /proc/self/status, in bytes.
fn status(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn rss() -> usize {
    status("VmRSS")
}

/// Bytes of the strings a node owns (sized to fit; its key is shared with its level).
fn node_strings(n: &Node) -> usize {
    n.value.as_ref().map_or(0, |v| v.len()) + n.stat_key.len() + 4 * n.origin.len()
}

fn main() {
    let (flags, mut args): (Vec<String>, Vec<String>) =
        std::env::args().skip(1).partition(|a| a.starts_with("--"));
    let reload = !flags.iter().any(|f| f == "--no-reload");
    let mut args = args.drain(..);
    let path = args
        .next()
        .expect("usage: config_heap CONFIG [TOP_N] [--no-reload]");
    let top_n: usize = args.next().map_or(turnstile::hitters::DEFAULT_TOP_N, |n| {
        n.parse().expect("TOP_N: a number")
    });
    let empty = rss();
    let yaml = std::fs::metadata(&path).expect("read the config").len() as usize;
    let load = |live: &LiveConfig| {
        Config::load_beside(std::path::Path::new(&path), LoadOptions::default(), live)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let before = rss();
    let config = load(&LiveConfig::default());
    let load_peak = status("VmHWM") - empty;
    let tree = rss() - before;
    let (mut nodes, mut strings) = (0usize, 0usize);
    config.for_each_node(&mut |n| {
        nodes += 1;
        strings += node_strings(n);
    });
    let metrics = Arc::new(RequestStats::default());
    let before = rss();
    let stats = metrics.limit_stats.bind(&config);
    let stats_bytes = rss() - before;
    drop(stats);
    let top = Arc::new(TopTable::new(top_n));
    let before = rss();
    let bound_top = top.bind(&config);
    let top_bytes = rss() - before;
    drop(bound_top);
    let live = LiveLimits::new(config, Arc::clone(&metrics), Arc::clone(&top));
    let held = rss() - empty;
    let (mut reload_peak, mut after_reload) = (0, 0);
    if reload {
        let beside = {
            let live = live.clone();
            LiveConfig::new(move || live.load_full())
        };
        let replaced = live.install(load(&beside));
        reload_peak = status("VmHWM") - empty;
        drop(replaced);
        live.drop_unbound();
        after_reload = rss() - empty;
    }
    let per = |b: usize| b as f64 / nodes as f64;
    let line =
        |what: &str, b: usize| println!("  {what:<20} {b:>12} B {:>7.0} B/descriptor", per(b));
    println!("config_heap: {path}: {nodes} descriptors, top_n {top_n}");
    line("yaml text", yaml);
    line("load peak", load_peak);
    line("tree", tree);
    line("  strings", strings);
    line("  nodes, levels", tree.saturating_sub(strings));
    line("per-limit stats", stats_bytes);
    line("heavy hitters", top_bytes);
    line("held", held);
    if reload {
        line("reload peak", reload_peak);
        line("after reload", after_reload);
    }
    drop(live);
}
