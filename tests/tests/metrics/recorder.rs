//! A recorder installed once for the whole test binary (the relay runs in
//! spawned tasks, which a thread's local recorder does not follow): it
//! keeps every counter's value and every histogram's samples by name and
//! labels, and the names it was given a description of. Tests keep apart
//! by their topics, or hold [`crate::common::hooks::exclusive`] to read
//! the label-less counters.

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A series: its name and its labels, sorted.
type Series = (String, BTreeMap<String, String>);

#[derive(Debug, Default)]
pub(crate) struct Recorded {
    counters: Mutex<HashMap<Series, Arc<Count>>>,
    histograms: Mutex<HashMap<Series, Arc<Samples>>>,
    gauges: Mutex<HashSet<String>>,
    described: Mutex<HashMap<String, Option<Unit>>>,
}

#[derive(Debug, Default)]
struct Count(AtomicU64);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

fn series(key: &Key) -> Series {
    let labels = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    (key.name().to_owned(), labels)
}

fn wanted(name: &str, labels: &[(&str, &str)]) -> Series {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    (name.to_owned(), labels)
}

impl Recorder for &'static Recorded {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), unit);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), unit);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut all = self.counters.lock().unwrap();
        Counter::from_arc(all.entry(series(key)).or_default().clone())
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.gauges.lock().unwrap().insert(key.name().to_owned());
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut all = self.histograms.lock().unwrap();
        Histogram::from_arc(all.entry(series(key)).or_default().clone())
    }
}

impl Recorded {
    /// The counter `name` with exactly these labels (0: never counted).
    pub(crate) fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let all = self.counters.lock().unwrap();
        all.get(&wanted(name, labels))
            .map_or(0, |c| c.0.load(Ordering::Relaxed))
    }

    /// The samples of the histogram `name` with exactly these labels.
    pub(crate) fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let all = self.histograms.lock().unwrap();
        all.get(&wanted(name, labels))
            .map_or_else(Vec::new, |s| s.0.lock().unwrap().clone())
    }

    /// The label sets of the histogram `name` whose `label` is `value`.
    pub(crate) fn histogram_series(
        &self,
        name: &str,
        label: &str,
        value: &str,
    ) -> Vec<BTreeMap<String, String>> {
        let all = self.histograms.lock().unwrap();
        all.keys()
            .filter(|(n, l)| n == name && l.get(label).is_some_and(|v| v == value))
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Every name registered so far: counters, gauges, histograms.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: HashSet<String> = HashSet::new();
        names.extend(self.counters.lock().unwrap().keys().map(|(n, _)| n.clone()));
        names.extend(
            self.histograms
                .lock()
                .unwrap()
                .keys()
                .map(|(n, _)| n.clone()),
        );
        names.extend(self.gauges.lock().unwrap().iter().cloned());
        let mut names: Vec<_> = names.into_iter().collect();
        names.sort();
        names
    }

    /// Whether `name` was described, and with which unit.
    pub(crate) fn description(&self, name: &str) -> Option<Option<Unit>> {
        self.described.lock().unwrap().get(name).cloned()
    }
}

/// The binary's recorder, installed (and idem's metrics described) on
/// first use.
pub(crate) fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<&'static Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorded: &'static Recorded = Box::leak(Box::default());
        metrics::set_global_recorder(recorded).expect("the only recorder of this binary");
        idem_runtime::metrics::describe();
        recorded
    })
}
