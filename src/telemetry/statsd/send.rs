//! The push: a task on the admin runtime that flushes every interval and once more at the
//! stop, over UDP (one socket, datagrams of at most 1432 bytes) or TCP (one connection, opened
//! again after a failure). A dead statsd host costs this task a timeout, never a request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;

use super::wire::{pack, TCP_PACKET, UDP_PACKET};
use super::StatsdStats;
use super::{Exporter, Flush, Protocol, StatsdSettings};

/// gostats' `defaultDialTimeout` and `defaultWriteTimeout` (`net_sink.go`).
const DIAL_TIMEOUT: Duration = Duration::from_millis(1500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where packets go.
pub struct Sink {
    host: String,
    port: u16,
    protocol: Protocol,
    udp: Option<UdpSocket>,
    tcp: Option<TcpStream>,
}

impl Sink {
    pub fn new(s: &StatsdSettings) -> Sink {
        Sink {
            host: s.host.clone(),
            port: s.port,
            protocol: if s.dog.is_some() {
                Protocol::Udp
            } else {
                s.protocol
            },
            udp: None,
            tcp: None,
        }
    }

    async fn resolve(&self) -> std::io::Result<SocketAddr> {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        tokio::net::lookup_host((host, self.port))
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{} resolves to nothing", self.host)))
    }

    /// Sends `lines`; an error means some were not delivered (over TCP) or not handed to the
    /// kernel (over UDP).
    pub async fn send(&mut self, lines: &[String]) -> std::io::Result<usize> {
        match self.protocol {
            Protocol::Udp => self.send_udp(lines).await,
            Protocol::Tcp => self.send_tcp(lines).await,
        }
    }

    async fn send_udp(&mut self, lines: &[String]) -> std::io::Result<usize> {
        let packets = pack(lines, UDP_PACKET);
        if self.udp.is_none() {
            let to = self.resolve().await?;
            let any: SocketAddr = if to.is_ipv4() {
                "0.0.0.0:0".parse().expect("address")
            } else {
                "[::]:0".parse().expect("address")
            };
            let socket = UdpSocket::bind(any).await?;
            socket.connect(to).await?;
            self.udp = Some(socket);
        }
        let socket = self.udp.as_ref().expect("bound above");
        for p in &packets {
            if let Err(e) = socket.send(p).await {
                // Re-resolve next time: the host may have moved.
                self.udp = None;
                return Err(e);
            }
        }
        Ok(packets.len())
    }

    async fn send_tcp(&mut self, lines: &[String]) -> std::io::Result<usize> {
        let packets = pack(lines, TCP_PACKET);
        if self.tcp.is_none() {
            let to = self.resolve().await?;
            let conn = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(to))
                .await
                .map_err(|_| std::io::Error::other("statsd connect timed out"))??;
            self.tcp = Some(conn);
        }
        let conn = self.tcp.as_mut().expect("connected above");
        for p in &packets {
            let wrote = tokio::time::timeout(WRITE_TIMEOUT, conn.write_all(p)).await;
            if !matches!(wrote, Ok(Ok(()))) {
                self.tcp = None;
                return Err(std::io::Error::other("statsd write failed or timed out"));
            }
        }
        Ok(packets.len())
    }
}

/// Flushes every `settings.flush_interval` until the stop, then once more. `collect` reads the
/// live counters into a flush (the caller knows where the live config is).
pub async fn run(
    settings: StatsdSettings,
    stats: Arc<StatsdStats>,
    collect: impl Fn(&Exporter, &StatsdSettings) -> Flush,
    mut stop: watch::Receiver<bool>,
) {
    let mut exporter = Exporter::default();
    let mut sink = Sink::new(&settings);
    let mut every = tokio::time::interval(settings.flush_interval.max(Duration::from_millis(1)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    let mut logged = false;
    loop {
        let stopping = tokio::select! {
            _ = every.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        let flush = collect(&exporter, &settings);
        match sink.send(&flush.lines).await {
            Ok(n) => {
                stats.sent(n as u64);
                exporter.commit(flush);
                logged = false;
            }
            Err(e) => {
                // Kept for the next flush: counters catch up once statsd is back.
                stats.failed();
                if !logged {
                    tracing::warn!(host = %settings.host, port = settings.port, error = %e,
                        "statsd push failed; retrying at the next flush");
                    logged = true;
                }
            }
        }
        if stopping {
            return;
        }
    }
}
