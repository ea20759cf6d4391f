//! Metrics, defined once: each set of counters and gauges is declared by [`metric_set!`] as
//! one list of fields (name, kind, doc comment), which yields the struct the code increments
//! (`prometheus-client` counters and gauges over atomics), a plain snapshot struct of its
//! values (serialised into `/.xpackfs/stats.json` under the field names), and its
//! registration in a [`Registry`] as `xpackfs_<section>_<field>` with the doc comment as
//! help text (the Prometheus endpoint, `-o metrics=ADDR:PORT`). A new counter is one line.
//!
//! `prometheus-client` (the Prometheus project's Rust client) rather than the `metrics`
//! facade: its registries are plain values, not a process-wide recorder, so each mount, and
//! each test, owns its own; metrics are typed atomics that are read back exactly for the
//! JSON; and it needs no async runtime (the daemon is plain threads).
//!
//! Values that the storage layer keeps in its own structures (the compute pool's counters,
//! the tiers' sizes) are read from their snapshots at scrape time by a [`Collector`]
//! ([`Snapshot`] turns any such list of `(name, help, value)` into samples).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
pub use prometheus_client::metrics::MetricType;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::registry::Registry;

/// A monotonic count (exported as `<name>_total`).
pub type Counter = prometheus_client::metrics::counter::Counter<u64>;
/// A value that goes up and down.
pub type Gauge = prometheus_client::metrics::gauge::Gauge<i64>;
/// Counters split by one label (`label="value"`).
pub type Labelled = Family<[(&'static str, &'static str); 1], Counter>;

/// The plain value of a metric kind, for snapshots.
pub trait Read {
    type Value: Copy + Default + std::fmt::Debug + PartialEq + Eq + serde::Serialize;
    fn read(&self) -> Self::Value;
}

impl Read for Counter {
    type Value = u64;
    fn read(&self) -> u64 {
        self.get()
    }
}

impl Read for Gauge {
    type Value = i64;
    fn read(&self) -> i64 {
        self.get()
    }
}

/// A doc comment as help text: one line, no trailing period (the encoder adds one).
pub fn help(doc: &str) -> String {
    let one_line = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    one_line.trim_end_matches('.').to_string()
}

/// Declares a set of metrics once. Each field: its doc comment (the help text; required),
/// its name and its kind (`Counter` or `Gauge`).
///
/// ```ignore
/// metric_set! {
///     /// The disk cache's counters.
///     pub struct DiskStats / DiskCounts {
///         /// Chunks found on disk.
///         hits: Counter,
///     }
/// }
/// ```
///
/// gives `DiskStats` (fields of type [`Counter`], incremented by the code), `DiskCounts`
/// (the same fields as plain numbers, `serde::Serialize`: what `stats.json` shows) from
/// `DiskStats::snapshot`, and `DiskStats::register(&mut registry)`, which registers
/// `hits` under the registry's prefix (`xpackfs_disk_cache_hits_total`).
macro_rules! metric_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident / $snap:ident {
            $( $(#[doc = $doc:literal])+ $field:ident : $kind:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[doc = $doc])+ pub $field: $crate::metrics::$kind, )*
        }

        #[doc = concat!("The values of [`", stringify!($name), "`] at one moment.")]
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
        $vis struct $snap {
            $( $(#[doc = $doc])+ pub $field: <$crate::metrics::$kind as $crate::metrics::Read>::Value, )*
        }

        impl $name {
            /// Every metric of the set, registered under `registry`'s prefix with its doc
            /// comment as help text (the registry keeps handles to the same atomics).
            #[allow(dead_code)]
            pub fn register(&self, registry: &mut $crate::metrics::Registry) {
                $( registry.register(stringify!($field), $crate::metrics::help(concat!($($doc),+)), self.$field.clone()); )*
            }

            /// The values now.
            #[allow(dead_code)]
            pub fn snapshot(&self) -> $snap {
                $snap { $( $field: $crate::metrics::Read::read(&self.$field), )* }
            }
        }

        impl $snap {
            /// The names of the fields, in declaration order.
            #[allow(dead_code)]
            pub const NAMES: &'static [&'static str] = &[$( stringify!($field) ),*];
        }
    };
}
pub(crate) use metric_set;

/// A latency histogram with power-of-two buckets: bucket `b` holds observations of
/// 2^(b-1)..2^b - 1 microseconds (bucket 0: under one), the last one everything longer.
/// Exported as a Prometheus histogram in seconds; `stats.json` shows quantiles of it.
#[derive(Debug, Clone, Default)]
pub struct Latency(Arc<LatencyInner>);

#[derive(Debug)]
struct LatencyInner {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

const LATENCY_BUCKETS: usize = 40;
/// Buckets exported with a finite bound (the encoder makes the counts cumulative).
const EXPORTED_BUCKETS: usize = 28;

impl Default for LatencyInner {
    fn default() -> Self {
        LatencyInner { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_us: AtomicU64::new(0) }
    }
}

impl Latency {
    pub fn record(&self, micros: u64) {
        let b = (64 - micros.leading_zeros()) as usize;
        self.0.buckets[b.min(LATENCY_BUCKETS - 1)].fetch_add(1, Relaxed);
        self.0.sum_us.fetch_add(micros, Relaxed);
    }

    fn counts(&self) -> [u64; LATENCY_BUCKETS] {
        std::array::from_fn(|b| self.0.buckets[b].load(Relaxed))
    }

    /// Upper bound (microseconds) of the bucket holding quantile `q` of the observations
    /// (0 when there are none).
    pub fn quantile(&self, q: f64) -> u64 {
        let counts = self.counts();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return if b == 0 { 0 } else { 1u64 << b };
            }
        }
        u64::MAX
    }
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // Finite bounds 1 us to 2^(EXPORTED_BUCKETS - 1) us (134 s); everything longer in +Inf.
        let counts = self.counts();
        let mut buckets: Vec<(f64, u64)> = (0..EXPORTED_BUCKETS).map(|b| ((1u64 << b) as f64 / 1e6, counts[b])).collect();
        buckets.push((f64::INFINITY, counts[EXPORTED_BUCKETS..].iter().sum()));
        let count = counts.iter().sum();
        let sum = self.0.sum_us.load(Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One value read at scrape time from a structure that keeps its own counters.
#[derive(Debug, Clone, Copy)]
pub enum Sample {
    Counter(u64),
    Gauge(i64),
}

/// A [`Collector`] over a function giving `(name, help, value)` at each scrape: how values
/// kept elsewhere (snapshots of the storage layer) are exported without a second copy.
pub struct Snapshot<F>(pub F);

impl<F> std::fmt::Debug for Snapshot<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Snapshot")
    }
}

impl<F> Collector for Snapshot<F>
where
    F: Fn() -> Vec<(&'static str, &'static str, Sample)> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        for (name, help_text, value) in (self.0)() {
            // As the registry writes the help of registered metrics: ending in a period.
            let help_text = help(help_text) + ".";
            match value {
                Sample::Counter(v) => {
                    let m = ConstCounter::new(v);
                    m.encode(encoder.encode_descriptor(name, &help_text, None, m.metric_type())?)?;
                }
                Sample::Gauge(v) => {
                    let m = ConstGauge::new(v);
                    m.encode(encoder.encode_descriptor(name, &help_text, None, m.metric_type())?)?;
                }
            }
        }
        Ok(())
    }
}

/// The registry rendered as Prometheus/OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!("metrics: encoding failed: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    metric_set! {
        /// Test counters.
        struct Demo / DemoCounts {
            /// Things done.
            done: Counter,
            /// Things waiting, now.
            waiting: Gauge,
        }
    }

    #[test]
    fn one_declaration_gives_struct_snapshot_and_registration() {
        let d = Demo::default();
        d.done.inc_by(3);
        d.waiting.set(-2);
        assert_eq!(d.snapshot(), DemoCounts { done: 3, waiting: -2 });
        assert_eq!(serde_json::to_value(d.snapshot()).unwrap(), serde_json::json!({"done": 3, "waiting": -2}));
        assert_eq!(DemoCounts::NAMES, ["done", "waiting"]);
        let mut r = Registry::with_prefix("xpackfs");
        d.register(r.sub_registry_with_prefix("demo"));
        let text = render(&r);
        assert!(text.contains("# HELP xpackfs_demo_done Things done.\n"), "{text}");
        assert!(text.contains("# TYPE xpackfs_demo_done counter\n"), "{text}");
        assert!(text.contains("xpackfs_demo_done_total 3\n"), "{text}");
        assert!(text.contains("xpackfs_demo_waiting -2\n"), "{text}");
        d.done.inc();
        assert!(render(&r).contains("xpackfs_demo_done_total 4\n"));
    }

    #[test]
    fn latency_quantiles_and_histogram() {
        let l = Latency::default();
        for us in [1u64, 3, 3, 3, 100, 5000] {
            l.record(us);
        }
        assert_eq!(l.quantile(0.5), 4);
        assert_eq!(l.quantile(0.99), 8192);
        assert_eq!(Latency::default().quantile(0.5), 0);
        let mut r = Registry::with_prefix("xpackfs");
        r.register("read_latency_seconds", "Read latency", l.clone());
        let text = render(&r);
        assert!(text.contains("# TYPE xpackfs_read_latency_seconds histogram\n"), "{text}");
        assert!(text.contains("xpackfs_read_latency_seconds_count 6\n"), "{text}");
        assert!(text.contains("xpackfs_read_latency_seconds_bucket{le=\"+Inf\"} 6\n"), "{text}");
        assert!(text.contains("xpackfs_read_latency_seconds_bucket{le=\"0.000004\"} 4\n"), "cumulative: {text}");
        assert!(text.contains("xpackfs_read_latency_seconds_bucket{le=\"134.217728\"} 6\n"), "{text}");
        assert_eq!(text.matches("xpackfs_read_latency_seconds_bucket").count(), 29);
    }

    #[test]
    fn snapshot_collector() {
        let mut r = Registry::with_prefix("xpackfs");
        r.register_collector(Box::new(Snapshot(|| {
            vec![("compute_threads", "Threads.", Sample::Gauge(2)), ("compute_failed", "Failures", Sample::Counter(5))]
        })));
        let text = render(&r);
        assert!(text.contains("# HELP xpackfs_compute_threads Threads.\n"), "{text}");
        assert!(text.contains("xpackfs_compute_threads 2\n"), "{text}");
        assert!(text.contains("xpackfs_compute_failed_total 5\n"), "{text}");
    }
}
