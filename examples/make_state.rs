//! Writes a state dir holding N live keys, as the durable counters would after N keys were
//! counted today: `make_state DIR N`. For `benches/load/restart.py`, which times a start on it.

use std::fs::File;
use std::io::BufWriter;
use std::time::{SystemTime, UNIX_EPOCH};

use turnstile::durable::format::Frames;
use turnstile::limiter::State;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(n)) = (args.next(), args.next()) else {
        eprintln!("usage: make_state DIR N");
        std::process::exit(2);
    };
    let n: u64 = n.parse().expect("N is a number");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let day = (now / 86_400) as u32;
    let expires = (now / 86_400 + 1) * 86_400;
    std::fs::create_dir_all(&dir).expect("create the state dir");
    let file = File::create(format!("{dir}/counters.1.snap")).expect("create the snapshot");
    let mut frames = Frames::new(BufWriter::new(file), true).expect("write the snapshot");
    for i in 0..n {
        let key = format!("budgets_api_key_user-{i:07}_");
        let state = State::Fixed {
            window: day,
            count: (i % 1000) as u32 + 1,
        };
        let written = frames.record(&key, Some(state), expires as u32);
        written.expect("write the snapshot");
    }
    frames.finish(true).expect("write the snapshot");
}
