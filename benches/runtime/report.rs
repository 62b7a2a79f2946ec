//! Figures and their output: one [`Row`] per reported metric (samples from every repeat, the
//! baseline measured in the same run, the target), the table on stdout and the JSON file.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

/// One reported metric: a sample per repeat, summarized as min / median / max.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario that measured it.
    pub scenario: &'static str,
    /// What was measured, e.g. `turns/s c=1000 FULL group`.
    pub metric: String,
    /// The unit of every sample.
    pub unit: &'static str,
    /// One value per repeat.
    pub samples: Vec<f64>,
    /// The baseline measured in the same run: its metric name and its samples (one per repeat,
    /// each measured next to the matching sample of this row).
    pub baseline: Option<(String, Vec<f64>)>,
    /// The target, as text, and whether the median meets it.
    pub target: Option<(String, bool)>,
    /// Auxiliary figures that explain this one (e.g. the writer's batch size).
    pub note: Option<String>,
}

impl Row {
    /// A row without baseline or target.
    pub fn new(
        scenario: &'static str,
        metric: impl Into<String>,
        unit: &'static str,
        samples: Vec<f64>,
    ) -> Self {
        Self {
            scenario,
            metric: metric.into(),
            unit,
            samples,
            baseline: None,
            target: None,
            note: None,
        }
    }

    /// Compares this row with `baseline`, measured in the same repeats.
    pub fn vs(mut self, baseline: &Row) -> Self {
        self.baseline = Some((baseline.metric.clone(), baseline.samples.clone()));
        self
    }

    /// Attaches a target and whether it is met.
    pub fn target(mut self, text: impl Into<String>, met: bool) -> Self {
        self.target = Some((text.into(), met));
        self
    }

    /// Attaches a note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// The smallest sample.
    pub fn min(&self) -> f64 {
        self.samples.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The largest sample.
    pub fn max(&self) -> f64 {
        self.samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// The median sample.
    pub fn median(&self) -> f64 {
        median(&self.samples)
    }

    /// The ratio to the baseline: the median over repeats of (sample ÷ the baseline sample of
    /// the same repeat), so a machine that is slower during one repeat moves both; median over
    /// median when the counts differ.
    pub fn ratio(&self) -> Option<f64> {
        let (_, base) = self.baseline.as_ref()?;
        Some(ratio(&self.samples, base))
    }

    /// This row against a floor measured beside it in the same repeats (as [`Row::ratio`]),
    /// for a target relative to that floor. Infinite when a floor sample is not positive: a
    /// ratio to it says nothing, so such a target is not met.
    pub fn ratio_to_floor(&self, floor: &Row) -> f64 {
        if floor.samples.is_empty() || floor.samples.iter().any(|f| *f <= 0.0) {
            return f64::INFINITY;
        }
        ratio(&self.samples, &floor.samples)
    }

    fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "samples": self.samples,
            "min": self.min(),
            "median": self.median(),
            "max": self.max(),
            "baseline": self.baseline.as_ref().map(|(m, v)| {
                json!({ "metric": m, "median": median(v), "samples": v })
            }),
            "ratio": self.ratio(),
            "target": self.target.as_ref().map(|(t, _)| t),
            "met": self.target.as_ref().map(|(_, met)| met),
            "note": self.note,
        })
    }
}

/// The median over repeats of (sample ÷ the base sample of the same repeat); median over
/// median when the counts differ.
fn ratio(samples: &[f64], base: &[f64]) -> f64 {
    if base.len() == samples.len() {
        let ratios: Vec<f64> = samples.iter().zip(base).map(|(s, b)| s / b).collect();
        median(&ratios)
    } else {
        median(samples) / median(base)
    }
}

/// The median of `values` (the mean of the middle two for an even count; NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// The nearest-rank percentile `p` (0..=100) of `values` (NaN when empty).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A number in a readable width: thousands without decimals, small values with three digits.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 10_000.0 {
        let s = format!("{:.0}", v.abs());
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The table of every row, one line each.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "scenario", "metric", "median", "min", "max", "unit", "baseline", "ratio", "target", "met",
    ];
    let lines: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.to_string(),
                r.metric.clone(),
                fmt_num(r.median()),
                fmt_num(r.min()),
                fmt_num(r.max()),
                r.unit.to_string(),
                r.baseline.as_ref().map_or_else(String::new, |(m, v)| {
                    format!("{} ({m})", fmt_num(median(v)))
                }),
                r.ratio().map_or_else(String::new, |x| format!("{x:.2}x")),
                r.target
                    .as_ref()
                    .map_or_else(String::new, |(t, _)| t.clone()),
                r.target.as_ref().map_or_else(String::new, |(_, met)| {
                    (if *met { "yes" } else { "NO" }).into()
                }),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut push = |cells: &[String]| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            // Numbers right-aligned, text left-aligned.
            if (2..=4).contains(&i) || i == 7 {
                let _ = write!(line, "{}{cell}  ", " ".repeat(pad));
            } else {
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    push(&header.map(String::from));
    push(&widths.map(|w| "-".repeat(w)));
    for line in &lines {
        push(line);
    }
    for r in rows.iter().filter(|r| r.note.is_some()) {
        let _ = writeln!(
            out,
            "  note [{} / {}]: {}",
            r.scenario,
            r.metric,
            r.note.as_deref().unwrap_or("")
        );
    }
    out
}

/// Writes the run as JSON: the machine, the command line, every row.
pub fn write_json(
    path: &Path,
    machine: &Value,
    elapsed_s: f64,
    quick: bool,
    repeats: usize,
    rows: &[Row],
) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let doc = json!({
        "machine": machine,
        "loadavg_at_end": loadavg(),
        "elapsed_s": elapsed_s,
        "quick": quick,
        "repeats": repeats,
        "command": std::env::args().collect::<Vec<_>>(),
        "results": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// The machine the run happened on: cores, memory, CPU model, kernel, the database filesystem.
pub fn machine(db_dir: &Path) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string());
    let meminfo = read("/proc/meminfo");
    let mem_kib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok());
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "mem_total_gib": mem_kib.map(|k| (k as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0),
        "cpu": cpu,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "db_dir": db_dir.display().to_string(),
        "db_filesystem": filesystem(db_dir),
        "git": git(),
        "loadavg_at_start": loadavg(),
    })
}

/// `/proc/loadavg`: 1-, 5- and 15-minute load averages (the machine is shared).
pub fn loadavg() -> Value {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let v: Vec<f64> = text
        .split_whitespace()
        .take(3)
        .filter_map(|x| x.parse().ok())
        .collect();
    json!(v)
}

/// The commit measured, and whether `src/` or `Cargo.toml` differ from it.
fn git() -> Value {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = run(&["rev-parse", "--short", "HEAD"]);
    let dirty = run(&["status", "--porcelain", "--", "src", "Cargo.toml"]).map(|s| !s.is_empty());
    json!({ "commit": commit, "src_dirty": dirty })
}

/// The mount (device, mount point, type) holding `dir`, from `/proc/mounts`.
fn filesystem(dir: &Path) -> Value {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?, f.next()?))
        })
        .filter(|(_, point, _)| dir.starts_with(point))
        .max_by_key(|(_, point, _)| point.len());
    best.map_or(
        Value::Null,
        |(device, point, kind)| json!({ "device": device, "mount": point, "type": kind }),
    )
}
