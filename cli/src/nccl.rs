//! `corral nccl-check`: a bandwidth test across an allocation before a job trusts it. It runs a
//! gang job on the allocation; on each node the probe first measures the node's own GPUs with
//! nccl-tests' `all_reduce_perf` when that is installed and the node has GPUs (the all-reduce
//! bus bandwidth over NVLink/PCIe), then every node pair with rank 0: through a
//! `torch.distributed` all-reduce between the two (NCCL on GPUs, gloo without) when torch is
//! installed, else a plain TCP stream on the job's `MASTER_PORT` (the path NCCL's socket
//! transport takes). Rank 0 prints one line per pair and per node; pairs far below the median
//! are flagged. (`all_reduce_perf` across nodes needs MPI, which the probe does not use.)

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, GresRequest, JobSpec, Reply};

use crate::client::Cluster;

/// A pair below this fraction of the median bandwidth is flagged.
const SLOW_FRACTION: f64 = 0.5;
/// Longest wait for every rank to connect, and for the job to finish.
const CONNECT_WAIT: Duration = Duration::from_secs(60);

/// How node pairs are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// torch when it imports, else TCP.
    Auto,
    Torch,
    Tcp,
}

/// A `torch.distributed` pair test: every pair (0, j) all-reduces `bytes` bytes within its own
/// group while the others wait; rank 0 prints `pair` lines in the TCP probe's format and the
/// gathered `intra` figures. argv: bytes, this node's intra-node bus bandwidth (GB/s or nan).
pub const TORCH_PROBE: &str = r#"
import os, sys, time, datetime
import torch
import torch.distributed as dist

nbytes = int(sys.argv[1])
intra = float(sys.argv[2])
rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
hosts = [l.split()[0] for l in open(os.environ["CORRAL_HOSTFILE"]) if l.strip()]
cuda = torch.cuda.is_available()
backend = "nccl" if cuda else "gloo"
dist.init_process_group(backend, init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
                        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
device = torch.device("cuda", 0) if cuda else torch.device("cpu")
data = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
groups = [dist.new_group([0, j]) for j in range(1, world)]
for j, group in enumerate(groups, start=1):
    if rank in (0, j):
        dist.all_reduce(data, group=group)  # warm-up
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        iters = 5
        for _ in range(iters):
            dist.all_reduce(data, group=group)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        # All-reduce bus bandwidth for n=2 ranks: size * 2(n-1)/n / time = size / time.
        mbps = data.numel() * 4 * 8 / 1e6 / max(seconds, 1e-9)
        if rank == 0:
            print("pair 0 %s %d %s %.1f" % (hosts[0], j, hosts[j], mbps), flush=True)
    dist.barrier()
figures = [None] * world
dist.all_gather_object(figures, intra)
if rank == 0:
    for r, f in enumerate(figures):
        if f == f:  # not nan
            print("intra %s %.2f" % (hosts[r], f), flush=True)
    print("probe done", flush=True)
dist.destroy_process_group()
# No interpreter finalization: gloo's worker threads may still drop the last collective's work
# then, which aborts the process (SIGABRT) in torch 2.15 after the probe has succeeded.
sys.stdout.flush()
os._exit(0)
"#;

/// The average bus bandwidth (GB/s) nccl-tests printed: `# Avg bus bandwidth    : 123.45`.
pub fn parse_nccl_tests_busbw(text: &str) -> Option<f64> {
    text.lines().find_map(|l| l.trim_start_matches('#').trim().strip_prefix("Avg bus bandwidth")?.split(':').nth(1)?.trim().parse().ok())
}

/// Runs `all_reduce_perf` on this node's GPUs when it is installed and the job has GPUs: the
/// node's all-reduce bus bandwidth in GB/s, or none.
fn intra_node_busbw(bytes: u64) -> Option<f64> {
    let gpus = std::env::var("CUDA_VISIBLE_DEVICES").ok().filter(|v| !v.is_empty())?.split(',').count();
    let out = std::process::Command::new("all_reduce_perf")
        .args(["-b", "8M", "-e", &format!("{}", bytes.max(8 << 20)), "-f", "2", "-g", &gpus.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        tracing::warn!(status = ?out.status, "all_reduce_perf failed");
        return None;
    }
    parse_nccl_tests_busbw(&String::from_utf8_lossy(&out.stdout))
}

fn torch_available() -> bool {
    std::process::Command::new("python3").args(["-c", "import torch.distributed"]).output().is_ok_and(|o| o.status.success())
}

/// Inside the job: the intra-node test, then the pair test by `method`.
pub fn probe(bytes: u64, method: Method) -> anyhow::Result<()> {
    let intra = intra_node_busbw(bytes);
    let method = match method {
        Method::Auto if torch_available() => Method::Torch,
        Method::Auto => Method::Tcp,
        m => m,
    };
    if std::env::var("NODE_RANK").as_deref() == Ok("0") {
        println!("method {}", if method == Method::Torch { "torch" } else { "tcp" });
    }
    if method == Method::Torch {
        let script = std::env::temp_dir().join(format!("corral-torch-probe-{}.py", std::process::id()));
        std::fs::write(&script, TORCH_PROBE).with_context(|| format!("write {}", script.display()))?;
        let status = std::process::Command::new("python3")
            .arg(&script)
            .arg(bytes.to_string())
            .arg(intra.map_or("nan".to_string(), |b| b.to_string()))
            .status()
            .context("run python3")?;
        let _ = std::fs::remove_file(&script);
        if !status.success() {
            bail!("the torch probe failed: {status}");
        }
        return Ok(());
    }
    tcp_probe(bytes, intra)
}

/// Rank 0 measures every other rank's stream; the others send `bytes` bytes, after their rank
/// and their intra-node figure (f64 bits; NaN for none).
fn tcp_probe(bytes: u64, intra: Option<f64>) -> anyhow::Result<()> {
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
        let mut intra_lines = Vec::new();
        if let Some(b) = intra {
            intra_lines.push(format!("intra {} {b:.2}", name(0)));
        }
        for _ in 1..nnodes {
            let (mut conn, _) = listener.accept().context("accept a rank")?;
            conn.set_read_timeout(Some(CONNECT_WAIT)).context("set read timeout")?;
            let mut header = [0u8; 4];
            conn.read_exact(&mut header).context("read the rank")?;
            let peer = u32::from_be_bytes(header) as usize;
            let mut figure = [0u8; 8];
            conn.read_exact(&mut figure).context("read the rank's intra-node figure")?;
            let figure = f64::from_bits(u64::from_be_bytes(figure));
            if figure.is_finite() {
                intra_lines.push(format!("intra {} {figure:.2}", name(peer)));
            }
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
        for line in intra_lines {
            println!("{line}");
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
        conn.write_all(&intra.unwrap_or(f64::NAN).to_bits().to_be_bytes()).context("send the intra-node figure")?;
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

/// Pairs below `SLOW_FRACTION` of the median. With fewer than three pairs there is no "rest" to
/// be far below (which of two is the slow one?), so none is flagged.
pub fn slow_pairs(pairs: &[Pair]) -> Vec<&Pair> {
    if pairs.len() < 3 {
        return Vec::new();
    }
    let mut rates: Vec<f64> = pairs.iter().map(|p| p.mbps).collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    let Some(median) = rates.get(rates.len() / 2).copied() else { return Vec::new() };
    pairs.iter().filter(|p| p.mbps < median * SLOW_FRACTION).collect()
}

/// `corral nccl-check`: runs the probe as an `nodes`-node gang and reports it. Exits non-zero
/// when the job fails or a pair is far below the rest.
pub async fn check(cluster: &Cluster, nodes: u32, gres: Option<String>, bytes: u64, method: Method, json: bool) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("locate the corral binary")?;
    let workdir = std::env::current_dir().context("read the current directory")?;
    let method_arg = match method {
        Method::Auto => "auto",
        Method::Torch => "torch",
        Method::Tcp => "tcp",
    };
    let mut spec = JobSpec::command(
        vec![exe.display().to_string(), "nccl-probe".into(), "--bytes".into(), bytes.to_string(), "--method".into(), method_arg.into()],
        &workdir.display().to_string(),
        &std::env::var("USER").unwrap_or_else(|_| "root".into()),
    );
    spec.name = "nccl-check".into();
    // The probe finds python3 and all_reduce_perf on the caller's PATH, like any job.
    spec.env = std::env::vars().collect();
    spec.nodes = nodes;
    spec.gres = gres.as_deref().map(GresRequest::parse).transpose().map_err(anyhow::Error::msg)?;
    spec.output = Some(format!("{}/.corral-nccl-check-%j.out", std::env::temp_dir().display()));
    spec.time_limit_ms = Some(CONNECT_WAIT.as_millis() as u64 * 2);
    let Reply::Submitted { job } = cluster.call_patiently(ClientRequest::Submit { spec }, Duration::from_secs(10)).await? else {
        bail!("unexpected reply to the submission");
    };
    let deadline = Instant::now() + CONNECT_WAIT * 3;
    let finished = loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job }, Duration::from_secs(10)).await? {
            if j.state.is_final() {
                break j;
            }
        }
        if Instant::now() > deadline {
            let _ = cluster.call(ClientRequest::Cancel { job }).await;
            bail!("nccl-check job {job} did not finish in {} s", deadline.elapsed().as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut output = Vec::new();
    let mut offset = 0;
    loop {
        let req = ClientRequest::Logs { job, stream: proto::LogStream::Stdout, offset, max_bytes: proto::limits::LOG_CHUNK_BYTES_MAX };
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
    let used = text.lines().find_map(|l| l.strip_prefix("method ")).unwrap_or("tcp").trim().to_string();
    let intra: Vec<(String, f64)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["intra", node, gbps] => Some((node.to_string(), gbps.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    if json {
        let list: Vec<_> =
            pairs.iter().map(|p| serde_json::json!({"a": p.a, "b": p.b, "mbps": p.mbps, "slow": slow.contains(&p)})).collect();
        let intra: Vec<_> = intra.iter().map(|(n, g)| serde_json::json!({"node": n, "busbw_gbps": g})).collect();
        println!(
            "{}",
            serde_json::json!({"job": job, "state": finished.state.as_str(), "method": used, "pairs": list, "intra_node": intra})
        );
    } else {
        println!("nccl-check job {job} on {} nodes ({used}): {}", nodes, finished.state.as_str());
        for p in &pairs {
            let flag = if slow.contains(&p) { "  <- far below the rest" } else { "" };
            println!("  {:<12} {:<12} {:>10.1} Mbit/s{flag}", p.a, p.b, p.mbps);
        }
        for (n, g) in &intra {
            println!("  {n:<12} all_reduce_perf bus bandwidth {g:.2} GB/s");
        }
    }
    let ok = finished.state == proto::JobState::Completed && pairs.len() + 1 == nodes as usize && slow.is_empty();
    Ok(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_bus_bandwidth_parses() {
        let out = "#  Rank  0 Group  0 Pid  41 on    gpu01 device  0 [0x18] NVIDIA H200\n\
                   #       size         count      type   redop    root     time   algbw   busbw #wrong\n\
                   134217728      33554432     float     sum      -1   1203.4  111.53  195.18      0\n\
                   # Out of bounds values : 0 OK\n\
                   # Avg bus bandwidth    : 182.394 \n";
        assert_eq!(parse_nccl_tests_busbw(out), Some(182.394));
        assert_eq!(parse_nccl_tests_busbw("no figures"), None);
    }

    #[test]
    fn the_torch_probe_is_valid_python() {
        let dir = std::env::temp_dir().join(format!("corral-torch-probe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let script = dir.join("probe.py");
        std::fs::write(&script, TORCH_PROBE).expect("write");
        let out = std::process::Command::new("python3").args(["-m", "py_compile"]).arg(&script).output();
        let _ = std::fs::remove_dir_all(&dir);
        match out {
            Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("python3 not found ({e}): the torch probe's syntax was not checked"),
        }
    }

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
