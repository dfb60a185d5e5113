//! The debug port's status page in a real browser: headless Chromium (Debian's `chromium`,
//! installed by scripts/install-test-deps.sh) loads `/` from the real server under traffic, the
//! DOM after the page's scripts ran lists the client over its limit, and screenshots at laptop
//! and phone widths are real images with content. `TURNSTILE_UPDATE_SCREENSHOT=1` also writes
//! the laptop one to docs/status-page.png, the README's picture.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::tempdir::TempDir;
use crate::common::{one, TestServer, OVER};

const WEB: &str = "
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 50}
";

const API: &str = "
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

const LIMITED: &str = "203.0.113.9";
const INJECTED: &str = "<b id=\"injected\">x</b>";

/// Chromium, headless, as root in a container (no sandbox), with its own profile directory.
pub fn chromium(profile: &Path, args: &[&str]) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium is on PATH (scripts/install-test-deps.sh installs Debian's chromium)");
    assert!(
        out.status.success(),
        "chromium {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Dimensions, and the share of pixels that are not the page background, of a PNG.
fn png_facts(path: &Path) -> (u32, u32, f64, usize) {
    let file = std::io::BufReader::new(std::fs::File::open(path).expect("screenshot written"));
    let mut reader = png::Decoder::new(file).read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a frame size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let px = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    let background = pixels.iter().filter(|p| p[..3] == [255, 255, 255]).count();
    let mut colors: Vec<&[u8]> = pixels.clone();
    colors.sort_unstable();
    colors.dedup();
    let inked = 1.0 - background as f64 / pixels.len() as f64;
    (info.width, info.height, inked, colors.len())
}

/// Requests until told to stop: a crowd within its limits on both domains, and the limited
/// client still trying.
fn background_traffic(s: &TestServer, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let client = s.client.clone();
    tokio::spawn(async move {
        let mut i = 0u32;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let ip = format!("10.1.{}.{}", i % 7, i % 13);
            let path = format!("/item/{}", i % 5);
            let user = format!("user{}", i % 3);
            for r in [
                one("web", &[("remote_address", LIMITED)]),
                one("web", &[("remote_address", &ip)]),
                one("web", &[("path", &path), ("user", &user)]),
                one("api", &[("api_key", &format!("key-{}", i % 4))]),
            ] {
                let _ = client.clone().should_rate_limit(r).await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_the_client_over_its_limit_on_the_status_page() {
    // Every admitted hit counted, so the three calls of the markup-looking value are listed.
    let env = [
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("TURNSTILE_TOP_SAMPLE", "1"),
    ];
    let s = TestServer::start_files(&[("web.yaml", WEB), ("api.yaml", API)], &env).await;
    let mut over = 0;
    for _ in 0..60 {
        let r = s.call(one("web", &[("remote_address", LIMITED)])).await;
        over += usize::from(r.overall_code == OVER);
    }
    assert_eq!(over, 40);
    // Descriptor values are client input: one that looks like markup must show as text (in
    // the busiest-values list, closed on the page but in its DOM).
    for _ in 0..3 {
        s.call(one("api", &[("api_key", INJECTED)])).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = background_traffic(&s, stop.clone());
    let url = format!("http://{}/", s.running().debug_addr.unwrap());
    let raw = reqwest::get(&url).await.unwrap().text().await.unwrap();
    assert!(
        !raw.contains(LIMITED),
        "the page's HTML alone names no client"
    );

    let dir = TempDir::new("status-page");
    let (profile, laptop, phone) = (
        dir.path().join("profile"),
        dir.path().join("laptop.png"),
        dir.path().join("phone.png"),
    );
    let budget = "--virtual-time-budget=7000";
    let (dom, url2) = (url.clone(), url.clone());
    let p = profile.clone();
    let dom = tokio::task::spawn_blocking(move || chromium(&p, &[budget, "--dump-dom", &dom]))
        .await
        .unwrap();
    // The over-limit table of web.remote_address, as the page's script filled it in.
    let table = dom
        .split_once("id=\"over-web.remote_address\"")
        .map(|(_, rest)| rest.split_once("</table>").map_or(rest, |(t, _)| t))
        .unwrap_or_else(|| panic!("no over-limit table for web.remote_address in:\n{dom}"));
    let first_row = table.split("<tr>").nth(2).expect("a first row");
    assert!(
        first_row.contains(&format!("remote_address={LIMITED}")),
        "{table}"
    );
    let refused: u64 = first_row
        .split_once("class=\"n bad\">")
        .and_then(|(_, r)| r.split_once('<'))
        .and_then(|(n, _)| n.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("an over-limit count in {first_row}"));
    assert!(
        refused >= 40,
        "at least the 40 refusals before the page loaded: {first_row}"
    );
    assert!(dom.contains("web.remote_address") && dom.contains("api.api_key"));
    assert!(
        dom.contains("api_key=&lt;b id=\"injected\"&gt;x&lt;/b&gt;") && !dom.contains(INJECTED),
        "a value is shown as text, never parsed as HTML"
    );

    let shots = tokio::task::spawn_blocking(move || {
        for (size, file) in [("1280,900", &laptop), ("390,844", &phone)] {
            let shot = format!("--screenshot={}", file.display());
            let window = format!("--window-size={size}");
            chromium(&profile, &[budget, &window, &shot, &url2]);
        }
        (png_facts(&laptop), png_facts(&phone), laptop)
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    traffic.await.unwrap();
    let ((w, h, inked, colors), (pw, ph, p_inked, _), laptop) = shots;
    assert_eq!((w, h), (1280, 900));
    assert_eq!((pw, ph), (390, 844));
    assert!(inked > 0.03 && p_inked > 0.03, "blank? {inked} {p_inked}");
    assert!(colors > 16, "text and tables make many shades: {colors}");
    assert!(std::fs::metadata(&laptop).unwrap().len() > 20_000);
    if std::env::var_os("TURNSTILE_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status-page.png");
        std::fs::copy(&laptop, docs).expect("write docs/status-page.png");
    }
}
