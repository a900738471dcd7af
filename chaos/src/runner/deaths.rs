//! When each job process died: a watch on the processes the jobs recorded, by (node, pid).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{now_ms, pid_alive};
use crate::rig::Rig;

/// How often the death watcher polls job processes.
const WATCH_INTERVAL_MS: u64 = 20;

/// Which job processes run, by (node, pid): local pids are this machine's; on the rig, each
/// host has a pid namespace of its own.
#[derive(Clone, Debug)]
pub(super) enum Liveness {
    Local,
    /// The rig's directory.
    Rig(PathBuf),
}

impl Liveness {
    pub(super) fn live(&self, wanted: &BTreeSet<(String, i32)>) -> BTreeSet<(String, i32)> {
        match self {
            Liveness::Local => wanted.iter().filter(|(_, pid)| pid_alive(*pid)).cloned().collect(),
            Liveness::Rig(dir) => Rig::live(dir, wanted),
        }
    }

    /// How often the death watch looks: scanning every process of the rig's hosts costs more.
    fn interval(&self) -> Duration {
        match self {
            Liveness::Local => Duration::from_millis(WATCH_INTERVAL_MS),
            Liveness::Rig(_) => Duration::from_millis(WATCH_INTERVAL_MS * 2),
        }
    }
}

/// Watches job processes by (node, pid): for every recorded start without an end, when the
/// process was first seen gone (an upper bound on its death, one interval late at most).
pub(super) struct DeathWatch {
    stop: Arc<AtomicBool>,
    deaths: Arc<Mutex<BTreeMap<(String, i32), u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DeathWatch {
    pub(super) fn start(spans_log: PathBuf, liveness: Liveness) -> DeathWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let deaths = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, d) = (Arc::clone(&stop), Arc::clone(&deaths));
        let thread = std::thread::spawn(move || {
            let mut last_parse = Instant::now() - Duration::from_secs(1);
            let mut open: BTreeSet<(String, i32)> = BTreeSet::new();
            while !s.load(Ordering::Relaxed) {
                if last_parse.elapsed() >= Duration::from_millis(100) {
                    last_parse = Instant::now();
                    let spans = crate::parse_spans(&std::fs::read_to_string(&spans_log).unwrap_or_default());
                    let seen = d.lock().unwrap_or_else(|p| p.into_inner());
                    open = spans
                        .iter()
                        .filter(|s| s.end_ms.is_none())
                        .filter_map(|s| Some((s.node.clone(), s.pid?)))
                        .filter(|k| !seen.contains_key(k))
                        .collect();
                }
                let now = now_ms();
                let alive = liveness.live(&open);
                let mut seen = d.lock().unwrap_or_else(|p| p.into_inner());
                for key in open.difference(&alive).cloned().collect::<Vec<_>>() {
                    open.remove(&key);
                    seen.entry(key).or_insert(now);
                }
                drop(seen);
                std::thread::sleep(liveness.interval());
            }
        });
        DeathWatch { stop, deaths, thread: Some(thread) }
    }

    pub(super) fn finish(mut self) -> BTreeMap<(String, i32), u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let d = self.deaths.lock().unwrap_or_else(|p| p.into_inner());
        d.clone()
    }
}
