//! The preflight of a multi-node job (`--preflight`): before the job's command starts, the agents
//! of its allocation measure the network between them, and the job starts only if it passes.
//!
//! Rank 0 listens on the job's `MASTER_PORT` at its data-network address (the path NCCL's socket
//! transport and torch's rendezvous take). Every other rank connects and sends its rank; rank 0
//! then lets one rank at a time stream `bytes` bytes and times each, so pairs are measured alone.
//! It then decides (every rank connected, no pair under `min_mbps`, none under half the median)
//! and sends the verdict to every rank, so either all ranks start the job or none does. Each
//! rank closes its connection first, leaving no TIME_WAIT on the job's port at rank 0.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A pair below this fraction of the median bandwidth fails the preflight.
pub const SLOW_FRACTION: f64 = 0.5;
/// The longest verdict message.
const VERDICT_BYTES_MAX: u32 = 4096;
/// Streamed in chunks of this size.
const CHUNK_BYTES: usize = 1 << 20;

/// What each agent needs to take part.
#[derive(Clone, Debug)]
pub struct Preflight {
    pub rank: usize,
    /// Node names in rank order.
    pub hosts: Vec<String>,
    /// Rank 0's data-network host.
    pub master_host: String,
    pub port: u16,
    pub bytes: u64,
    pub min_mbps: u64,
    /// For everything: connecting, streaming, the verdict.
    pub timeout: Duration,
}

/// One measured pair (rank 0 and `peer`).
#[derive(Clone, Debug, PartialEq)]
pub struct PairRate {
    pub peer_rank: usize,
    pub mbps: f64,
}

/// Why a pair set fails: none when it passes.
pub fn judge(rates: &[PairRate], min_mbps: u64, hosts: &[String]) -> Option<String> {
    let name = |r: usize| hosts.get(r).cloned().unwrap_or_else(|| format!("rank {r}"));
    let mut sorted: Vec<f64> = rates.iter().map(|r| r.mbps).collect();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let bad: Vec<String> = rates
        .iter()
        // Under half the median is "far below the rest" only when there is a rest: three pairs
        // or more (of two, which is the slow one?).
        .filter(|r| r.mbps < min_mbps as f64 || (rates.len() >= 3 && r.mbps < median * SLOW_FRACTION))
        .map(|r| format!("{}-{} {:.0} Mbit/s", name(0), name(r.peer_rank), r.mbps))
        .collect();
    if bad.is_empty() {
        None
    } else {
        Some(format!("{} (minimum {min_mbps} Mbit/s, median {median:.0})", bad.join(", ")))
    }
}

/// Runs this rank's part. `Ok` holds the report to put in the job's output; `Err` why the job
/// must not start.
pub async fn run(p: &Preflight) -> Result<String, String> {
    match tokio::time::timeout(p.timeout, async {
        if p.rank == 0 {
            lead(p).await
        } else {
            follow(p).await
        }
    })
    .await
    {
        Ok(result) => result,
        Err(_) => Err(format!("preflight did not finish within {} ms", p.timeout.as_millis())),
    }
}

async fn lead(p: &Preflight) -> Result<String, String> {
    let addr = format!("{}:{}", p.master_host, p.port);
    let listener = TcpListener::bind(&addr).await.map_err(|e| format!("listen on {addr}: {e}"))?;
    let mut peers: Vec<(usize, TcpStream)> = Vec::new();
    while peers.len() + 1 < p.hosts.len() {
        let (mut conn, _) = listener.accept().await.map_err(|e| format!("accept on {addr}: {e}"))?;
        let rank = conn.read_u32().await.map_err(|e| format!("read a rank: {e}"))? as usize;
        if rank == 0 || rank >= p.hosts.len() || peers.iter().any(|(r, _)| *r == rank) {
            return Err(format!("unexpected rank {rank} connected"));
        }
        peers.push((rank, conn));
    }
    drop(listener);
    peers.sort_by_key(|(r, _)| *r);
    let mut rates = Vec::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    for (rank, conn) in peers.iter_mut() {
        conn.write_u8(b'G').await.map_err(|e| format!("start rank {rank}: {e}"))?;
        let started = Instant::now();
        let mut got = 0u64;
        while got < p.bytes {
            let n = conn.read(&mut buf).await.map_err(|e| format!("read from rank {rank}: {e}"))?;
            if n == 0 {
                return Err(format!("rank {rank} closed after {got} of {} bytes", p.bytes));
            }
            got += n as u64;
        }
        let mbps = got as f64 * 8.0 / 1e6 / started.elapsed().as_secs_f64().max(1e-6);
        rates.push(PairRate { peer_rank: *rank, mbps });
    }
    let failure = judge(&rates, p.min_mbps, &p.hosts);
    let (tag, message) = match &failure {
        None => (b'P', "passed".to_string()),
        Some(why) => (b'F', why.clone()),
    };
    let message = &message.as_bytes()[..message.len().min(VERDICT_BYTES_MAX as usize)];
    for (rank, conn) in peers.iter_mut() {
        let sent = async {
            conn.write_u8(tag).await?;
            conn.write_u32(message.len() as u32).await?;
            conn.write_all(message).await?;
            // The rank closes first.
            let mut rest = [0u8; 1];
            while conn.read(&mut rest).await? > 0 {}
            Ok::<(), std::io::Error>(())
        };
        sent.await.map_err(|e| format!("send the verdict to rank {rank}: {e}"))?;
    }
    let name = |r: usize| p.hosts.get(r).cloned().unwrap_or_default();
    let mut report = String::new();
    for r in &rates {
        report.push_str(&format!("corral preflight: {} <- {} {:.1} Mbit/s\n", name(0), name(r.peer_rank), r.mbps));
    }
    match failure {
        None => {
            report.push_str(&format!("corral preflight: passed on {} nodes\n", p.hosts.len()));
            Ok(report)
        }
        Some(why) => Err(why),
    }
}

async fn follow(p: &Preflight) -> Result<String, String> {
    let addr = format!("{}:{}", p.master_host, p.port);
    let mut conn = loop {
        match TcpStream::connect(&addr).await {
            Ok(c) => break c,
            // Rank 0 may not listen yet; the overall timeout bounds this.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    conn.write_u32(p.rank as u32).await.map_err(|e| format!("send rank to {addr}: {e}"))?;
    let go = conn.read_u8().await.map_err(|e| format!("wait for rank 0: {e}"))?;
    if go != b'G' {
        return Err(format!("rank 0 sent {go:#x} instead of go"));
    }
    let chunk = vec![0x5au8; CHUNK_BYTES];
    let mut sent = 0u64;
    while sent < p.bytes {
        let n = (p.bytes - sent).min(CHUNK_BYTES as u64) as usize;
        conn.write_all(&chunk[..n]).await.map_err(|e| format!("stream to rank 0: {e}"))?;
        sent += n as u64;
    }
    let tag = conn.read_u8().await.map_err(|e| format!("read the verdict: {e}"))?;
    let len = conn.read_u32().await.map_err(|e| format!("read the verdict: {e}"))?;
    if len > VERDICT_BYTES_MAX {
        return Err(format!("verdict of {len} bytes exceeds {VERDICT_BYTES_MAX}"));
    }
    let mut message = vec![0u8; len as usize];
    conn.read_exact(&mut message).await.map_err(|e| format!("read the verdict: {e}"))?;
    let message = String::from_utf8_lossy(&message).into_owned();
    drop(conn);
    match tag {
        b'P' => Ok(format!("corral preflight: passed (measured by {})\n", p.hosts.first().cloned().unwrap_or_default())),
        b'F' => Err(message),
        other => Err(format!("rank 0 sent verdict {other:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn judge_flags_slow_and_absolute_minimums() {
        let rates =
            vec![PairRate { peer_rank: 1, mbps: 9000.0 }, PairRate { peer_rank: 2, mbps: 8800.0 }, PairRate { peer_rank: 3, mbps: 1000.0 }];
        let why = judge(&rates, 0, &hosts(4)).expect("n1-n4 is slow");
        assert!(why.starts_with("n1-n4 1000 Mbit/s"), "{why}");
        assert_eq!(judge(&rates[..2], 0, &hosts(4)), None);
        assert!(judge(&rates[..2], 10_000, &hosts(4)).is_some_and(|w| w.contains("n1-n2") && w.contains("n1-n3")));
        assert_eq!(judge(&[], 0, &hosts(1)), None);
        // Two pairs: no median to be far below, only the minimum counts.
        let two = [PairRate { peer_rank: 1, mbps: 9000.0 }, PairRate { peer_rank: 2, mbps: 1000.0 }];
        assert_eq!(judge(&two, 0, &hosts(3)), None);
        assert!(judge(&two, 2000, &hosts(3)).is_some_and(|w| w.contains("n1-n3")));
    }

    async fn three_ranks(min_mbps: u64, port: u16) -> Vec<Result<String, String>> {
        let base = Preflight {
            rank: 0,
            hosts: hosts(3),
            master_host: "127.0.0.1".into(),
            port,
            bytes: 4 << 20,
            min_mbps,
            timeout: Duration::from_secs(20),
        };
        let tasks: Vec<_> = (0..3)
            .map(|rank| {
                let p = Preflight { rank, ..base.clone() };
                tokio::spawn(async move { run(&p).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("rank task"));
        }
        out
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
    }

    #[tokio::test]
    async fn every_rank_learns_the_one_verdict() {
        let passed = three_ranks(0, free_port()).await;
        let report = passed[0].as_ref().expect("rank 0 passes");
        assert!(report.contains("n1 <- n2") && report.contains("n1 <- n3") && report.contains("passed on 3 nodes"), "{report}");
        assert!(passed[1..].iter().all(|r| r.as_ref().is_ok_and(|t| t.contains("passed"))), "{passed:?}");
        // No loopback reaches this: every rank fails together, with the same reason.
        let failed = three_ranks(u64::MAX / 2, free_port()).await;
        assert!(failed.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("n1-n2") && e.contains("minimum"))), "{failed:?}");
    }

    #[tokio::test]
    async fn a_missing_rank_fails_within_the_timeout() {
        let p = Preflight {
            rank: 0,
            hosts: hosts(2),
            master_host: "127.0.0.1".into(),
            port: free_port(),
            bytes: 1 << 20,
            min_mbps: 0,
            timeout: Duration::from_millis(300),
        };
        let err = run(&p).await.expect_err("nobody connects");
        assert!(err.contains("did not finish within 300 ms"), "{err}");
    }
}
