//! Helpers of the latency benchmarks: create objects concurrently noting when each was
//! created, follow a watch noting when each was first seen done, and the percentiles of the
//! difference.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};

/// When each object was created (client side) and when the watch first saw it done.
#[derive(Default)]
pub struct Times {
    pub created: HashMap<String, Instant>,
    pub done: HashMap<String, Instant>,
}

pub type Shared = Arc<Mutex<Times>>;

/// Follow `api` and record, per name, the first time `done` holds.
pub fn follow<K>(api: Api<K>, times: Shared, done: fn(&K) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
        while let Some(Ok(o)) = events.next().await {
            if done(&o) {
                let now = Instant::now();
                if let (Ok(mut t), Some(n)) = (times.lock(), o.meta().name.clone()) {
                    t.done.entry(n).or_insert(now);
                }
            }
        }
    });
}

/// Create `n` objects built by `make(i)`, 32 at a time, noting each one's creation time.
pub async fn create_all<K>(api: &Api<K>, n: usize, times: &Shared, make: impl Fn(usize) -> Result<K>) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let objects = (0..n).map(make).collect::<Result<Vec<K>>>()?;
    let results = futures::stream::iter(objects)
        .map(|o| async move {
            let name = o.meta().name.clone().unwrap_or_default();
            let t = Instant::now();
            api.create(&PostParams::default(), &o).await.map(|_| (name, t))
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    for r in results {
        let (name, t) = r?;
        if let Ok(mut times) = times.lock() {
            times.created.insert(name, t);
        }
    }
    Ok(())
}

/// Wait until all `n` are done; (p50, p99) of create → done, in milliseconds.
pub async fn percentiles(times: &Shared, n: usize, what: &str) -> Result<(f64, f64)> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = times.lock().map(|t| t.done.len()).unwrap_or(0);
        if done >= n {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: only {done} of {n} done in 600s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut ms: Vec<f64> = t
        .created
        .iter()
        .filter_map(|(name, c)| t.done.get(name).map(|d| d.saturating_duration_since(*c).as_secs_f64() * 1000.0))
        .collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    anyhow::ensure!(ms.len() == n, "{what}: {} measured of {n}", ms.len());
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok((at(0.50), at(0.99)))
}

/// A benchmark knob from the environment (`BENCH_SECONDS=5`), else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// How long each rate figure runs: `BENCH_SECONDS` (default 3).
pub fn seconds() -> Duration {
    Duration::from_secs_f64(env_or("BENCH_SECONDS", 3.0))
}

/// The `p` quantile (0..=1) of sorted values; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
