//! `corral nccl-check`: a bandwidth test across an allocation before a job trusts it. It runs a
//! gang job whose ranks stream data to rank 0 over TCP on the job's `MASTER_PORT` (the same path
//! NCCL's socket transport takes; `all_reduce_perf` and torch are not used yet) and reports the
//! bandwidth of each node pair, flagging pairs far below the median.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{GresRequest, JobSpec, Reply, Request};

use crate::client::Cluster;

/// A pair below this fraction of the median bandwidth is flagged.
const SLOW_FRACTION: f64 = 0.5;
/// Longest wait for every rank to connect, and for the job to finish.
const CONNECT_WAIT: Duration = Duration::from_secs(60);

/// Inside the job: rank 0 measures every other rank's stream; the others send `bytes` bytes.
pub fn probe(bytes: u64) -> anyhow::Result<()> {
    let var = |k: &str| std::env::var(k).with_context(|| format!("read {k}: run inside a corral job"));
    let rank: usize = var("NODE_RANK")?.parse().context("parse NODE_RANK")?;
    let nnodes: usize = var("NNODES")?.parse().context("parse NNODES")?;
    let master = var("MASTER_ADDR")?;
    let port: u16 = var("MASTER_PORT")?.parse().context("parse MASTER_PORT")?;
    let hosts: Vec<String> = std::fs::read_to_string(var("CORRAL_HOSTFILE")?)
        .context("read the hostfile")?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    let name = |r: usize| hosts.get(r).cloned().unwrap_or_else(|| format!("rank{r}"));
    if rank == 0 {
        let listener = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("listen on port {port}"))?;
        listener.set_nonblocking(false).context("set blocking")?;
        for _ in 1..nnodes {
            let (mut conn, _) = listener.accept().context("accept a rank")?;
            conn.set_read_timeout(Some(CONNECT_WAIT)).context("set read timeout")?;
            let mut header = [0u8; 4];
            conn.read_exact(&mut header).context("read the rank")?;
            let peer = u32::from_be_bytes(header) as usize;
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0u64;
            let started = Instant::now();
            while got < bytes {
                let n = conn.read(&mut buf).context("read the stream")?;
                if n == 0 {
                    bail!("rank {peer} closed after {got} of {bytes} bytes");
                }
                got += n as u64;
            }
            let mbps = got as f64 * 8.0 / 1e6 / started.elapsed().as_secs_f64().max(1e-6);
            println!("pair 0 {} {peer} {} {mbps:.1}", name(0), name(peer));
        }
        println!("probe done");
    } else {
        let deadline = Instant::now() + CONNECT_WAIT;
        let mut conn = loop {
            match TcpStream::connect((master.as_str(), port)) {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "rank 0 not listening yet");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e).with_context(|| format!("connect to rank 0 at {master}:{port}")),
            }
        };
        conn.write_all(&(rank as u32).to_be_bytes()).context("send the rank")?;
        let buf = vec![0x5au8; 1 << 20];
        let mut sent = 0u64;
        while sent < bytes {
            let n = (bytes - sent).min(buf.len() as u64) as usize;
            conn.write_all(&buf[..n]).context("stream to rank 0")?;
            sent += n as u64;
        }
    }
    Ok(())
}

/// One measured pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub a: String,
    pub b: String,
    pub mbps: f64,
}

/// Parses the `pair` lines rank 0 printed.
pub fn parse_pairs(text: &str) -> Vec<Pair> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["pair", _, a, _, b, mbps] => Some(Pair { a: a.to_string(), b: b.to_string(), mbps: mbps.parse().ok()? }),
                _ => None,
            }
        })
        .collect()
}

/// Pairs below `SLOW_FRACTION` of the median.
pub fn slow_pairs(pairs: &[Pair]) -> Vec<&Pair> {
    let mut rates: Vec<f64> = pairs.iter().map(|p| p.mbps).collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    let Some(median) = rates.get(rates.len() / 2).copied() else { return Vec::new() };
    pairs.iter().filter(|p| p.mbps < median * SLOW_FRACTION).collect()
}

/// `corral nccl-check`: runs the probe as an `nodes`-node gang and reports it. Exits non-zero
/// when the job fails or a pair is far below the rest.
pub async fn check(cluster: &Cluster, nodes: u32, gres: Option<String>, bytes: u64, json: bool) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locate the corral binary")?;
    let workdir = std::env::current_dir().context("read the current directory")?;
    let mut spec = JobSpec::command(
        vec![exe.display().to_string(), "nccl-probe".into(), "--bytes".into(), bytes.to_string()],
        &workdir.display().to_string(),
        &std::env::var("USER").unwrap_or_else(|_| "root".into()),
    );
    spec.name = "nccl-check".into();
    spec.nodes = nodes;
    spec.gres = gres.as_deref().map(GresRequest::parse).transpose().map_err(anyhow::Error::msg)?;
    spec.output = Some(format!("{}/.corral-nccl-check-%j.out", std::env::temp_dir().display()));
    spec.time_limit_ms = Some(CONNECT_WAIT.as_millis() as u64 * 2);
    let Reply::Submitted { job } = cluster.call_patiently(Request::Submit { spec }, Duration::from_secs(10)).await? else {
        bail!("unexpected reply to the submission");
    };
    let deadline = Instant::now() + CONNECT_WAIT * 3;
    let finished = loop {
        if let Reply::Job(j) = cluster.call_patiently(Request::GetJob { job }, Duration::from_secs(10)).await? {
            if j.state.is_final() {
                break j;
            }
        }
        if Instant::now() > deadline {
            let _ = cluster.call(Request::Cancel { job }).await;
            bail!("nccl-check job {job} did not finish in {} s", deadline.elapsed().as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut output = Vec::new();
    let mut offset = 0;
    loop {
        let req = Request::Logs { job, stream: proto::LogStream::Stdout, offset, max_bytes: proto::limits::LOG_CHUNK_BYTES_MAX };
        let Reply::LogChunk { data, next_offset, .. } = cluster.call_patiently(req, Duration::from_secs(10)).await? else {
            bail!("unexpected reply to the log request");
        };
        if data.is_empty() {
            break;
        }
        output.extend_from_slice(&data);
        offset = next_offset;
    }
    let text = String::from_utf8_lossy(&output);
    let pairs = parse_pairs(&text);
    let slow = slow_pairs(&pairs);
    if json {
        let list: Vec<_> =
            pairs.iter().map(|p| serde_json::json!({"a": p.a, "b": p.b, "mbps": p.mbps, "slow": slow.contains(&p)})).collect();
        println!("{}", serde_json::json!({"job": job, "state": finished.state.as_str(), "pairs": list}));
    } else {
        println!("nccl-check job {job} on {} nodes: {}", nodes, finished.state.as_str());
        for p in &pairs {
            let flag = if slow.contains(&p) { "  <- far below the rest" } else { "" };
            println!("  {:<12} {:<12} {:>10.1} Mbit/s{flag}", p.a, p.b, p.mbps);
        }
    }
    let ok = finished.state == proto::JobState::Completed && pairs.len() + 1 == nodes as usize && slow.is_empty();
    Ok(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_and_slow_ones_are_flagged() {
        let pairs = parse_pairs("noise\npair 0 n1 1 n2 9000.0\npair 0 n1 2 n3 8800.5\npair 0 n1 3 n4 1000\nprobe done\n");
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[1], Pair { a: "n1".into(), b: "n3".into(), mbps: 8800.5 });
        let slow = slow_pairs(&pairs);
        assert_eq!(slow.len(), 1);
        assert_eq!(slow[0].b, "n4");
        assert!(slow_pairs(&[]).is_empty());
    }
}
