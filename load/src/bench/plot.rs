//! The cost-growth plot of `argocd-agent-dev bench --plot`, drawn from the rows of a
//! JSON-lines results file and written as a PNG: the `connect` rows as two charts (principal
//! RSS and idle CPU against connected agents, each next to its target), and the `big-hub` and
//! `big-spoke` rows as two more (principal RSS against Applications on the hub, agent RSS
//! against Applications on its spoke).
//!
//! plotters draws into an RGB buffer; text is rendered with ab_glyph from a TrueType font
//! found on the system (or `--font`); the `png` crate writes the file.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

use argocd_agent_testkit::harness::HarnessError;

use super::soak::{Line, ReplicaSample};

/// Target: idle bytes per agent (issue's target line in the memory chart).
const TARGET_BYTES_PER_AGENT: f64 = 32.0 * 1024.0;
/// Target: idle CPU, % of one core.
const TARGET_IDLE_CPU_PCT: f64 = 5.0;

/// Where a TrueType sans-serif font usually is (Debian/Ubuntu, Fedora, Arch, Alpine, macOS).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// One `connect` run, as the plot needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectPoint {
    /// Simulated agents connected.
    pub agents: u64,
    /// The principal's resident set before any agent connected, MiB.
    pub rss_before_mib: f64,
    /// Its resident set with every agent connected, at the end of the idle phase, MiB.
    pub rss_connected_mib: f64,
    /// Resident set the connected agents added, bytes per agent.
    pub idle_bytes_per_agent: f64,
    /// The principal's CPU use during the idle phase, percent of one core; `None` where
    /// the run said it was not measured (a window too short for its clock), and the CPU
    /// chart leaves the point out.
    pub idle_cpu_pct: Option<f64>,
}

/// The principal at one number of Applications on the hub (from a `big-hub` row, which
/// gives two: one Application per agent, and `apps_per_agent` per agent).
#[derive(Debug, Clone, PartialEq)]
pub struct HubPoint {
    /// Applications on the hub.
    pub apps: u64,
    /// Its resident set once started with them and no agent connected (the watch cache), MiB.
    pub rss_cold_mib: f64,
    /// Its resident set with every agent connected and resynced after a storm, MiB.
    pub rss_settled_mib: f64,
}

/// The agent at one number of Applications on its spoke (from a `big-spoke` row, which gives
/// two: connected with none, and with `apps`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpokePoint {
    /// Applications on the spoke.
    pub apps: u64,
    /// The agent's resident set, idle, MiB.
    pub rss_mib: f64,
}

/// Every row the plot draws.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlotData {
    /// `connect` rows by agents.
    pub connect: Vec<ConnectPoint>,
    /// `big-hub` rows by Applications on the hub.
    pub hub: Vec<HubPoint>,
    /// `big-hub --replicas N` rows by Applications on the hub: the largest replica's RSS.
    pub replica: Vec<HubPoint>,
    /// `big-spoke` rows by Applications on the spoke.
    pub spoke: Vec<SpokePoint>,
}

impl PlotData {
    /// Whether there is nothing to draw.
    pub fn is_empty(&self) -> bool {
        self.connect.is_empty()
            && self.hub.is_empty()
            && self.replica.is_empty()
            && self.spoke.is_empty()
    }
}

/// Replaces the point with the same key (a later run wins) and keeps `points` sorted.
fn upsert<T>(points: &mut Vec<T>, p: T, key: impl Fn(&T) -> u64) {
    points.retain(|q| key(q) != key(&p));
    points.push(p);
    points.sort_by_key(|q| key(q));
}

/// The rows of a JSON-lines file the plot draws: `connect` (one per agent count),
/// `big-hub` and `big-spoke` (one point per number of Applications); the last run of each
/// wins. Other scenarios' rows are skipped; a line that is not JSON, or a row without a
/// value the plot needs, is an error naming its number.
pub fn plot_data(jsonl: &str) -> Result<PlotData, HarnessError> {
    let mut data = PlotData::default();
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| HarnessError::from(format!("line {}: not JSON: {e}", i + 1)))?;
        let scenario = v["scenario"].as_str().unwrap_or_default();
        let num = |k: &str| {
            v[k].as_f64().ok_or_else(|| {
                HarnessError::from(format!("line {}: {scenario} row without {k}", i + 1))
            })
        };
        match scenario {
            "connect" => {
                let p = ConnectPoint {
                    agents: num("agents")? as u64,
                    rss_before_mib: num("rss_before_mib")?,
                    rss_connected_mib: num("rss_connected_mib")?,
                    idle_bytes_per_agent: num("idle_bytes_per_agent")?,
                    idle_cpu_pct: match &v["idle_cpu_pct"] {
                        Value::String(s) if s.starts_with("not measured") => None,
                        _ => Some(num("idle_cpu_pct")?),
                    },
                };
                upsert(&mut data.connect, p, |p| p.agents);
            }
            "big-hub" if v["replicas"].as_u64().is_some_and(|r| r > 1) => {
                // The largest of a list of numbers (a row whose list is missing, empty or
                // holds anything else is an error).
                let largest = |k: &str| {
                    v[k].as_array()
                        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                        .and_then(|a| a.into_iter().reduce(f64::max))
                        .ok_or_else(|| {
                            HarnessError::from(format!("line {}: big-hub row without {k}", i + 1))
                        })
                };
                let p = HubPoint {
                    apps: num("apps")? as u64,
                    rss_cold_mib: largest("replica_rss_cold_mib")?,
                    rss_settled_mib: largest("replica_rss_settled_mib")?,
                };
                upsert(&mut data.replica, p, |p| p.apps);
            }
            "big-hub" => {
                for (apps, cold, settled) in [
                    ("apps_small", "rss_cold_small_mib", "rss_settled_small_mib"),
                    ("apps", "rss_cold_mib", "rss_settled_mib"),
                ] {
                    let p = HubPoint {
                        apps: num(apps)? as u64,
                        rss_cold_mib: num(cold)?,
                        rss_settled_mib: num(settled)?,
                    };
                    upsert(&mut data.hub, p, |p| p.apps);
                }
            }
            "big-spoke" => {
                for (apps, rss) in [
                    (0.0, num("agent_rss_empty_mib")?),
                    (num("apps")?, num("agent_rss_mib")?),
                ] {
                    let p = SpokePoint {
                        apps: apps as u64,
                        rss_mib: rss,
                    };
                    upsert(&mut data.spoke, p, |p| p.apps);
                }
            }
            _ => {}
        }
    }
    Ok(data)
}

/// The `connect` rows of a JSON-lines file ([`plot_data`]), sorted by agents.
pub fn connect_points(jsonl: &str) -> Result<Vec<ConnectPoint>, HarnessError> {
    Ok(plot_data(jsonl)?.connect)
}

/// A usable font: `explicit`, else the first of the usual DejaVu Sans, Liberation Sans and
/// Arial paths (`FONT_CANDIDATES`) that exists.
pub fn find_font(explicit: Option<&Path>) -> Result<PathBuf, HarnessError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            HarnessError::from(format!(
                "no TrueType font found for the plot (looked at {}); pass --font FILE.ttf or \
                 install one (Debian/Ubuntu: apt-get install fonts-dejavu-core)",
                FONT_CANDIDATES.join(", ")
            ))
        })
}

/// Target line of the hub chart: the sharding model of docs/ha.md ("~6 KiB per
/// Application" in every replica's cache).
const MODEL_BYTES_PER_APP: f64 = 6.0 * 1024.0;

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Draws the cost-growth plot of `data` into a PNG at `out`: 1200 pixels wide, 500 high per
/// row of charts (agents; Applications).
pub fn draw_png(data: &PlotData, font: &Path, out: &Path) -> Result<(), HarnessError> {
    if data.is_empty() {
        return Err(HarnessError::from(
            "no connect, big-hub or big-spoke rows to plot: run `bench connect --json FILE` \
             (or big-hub, big-spoke) first",
        ));
    }
    register(font)?;
    let (w, h) = (1200u32, 500 * rows(data));
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw(data, &mut rgb, (w, h)).map_err(|e| HarnessError::from(format!("plot: {e}")))?;
    write_png(out, &rgb, (w, h))
}

/// Registers `font` as plotters' "sans-serif".
fn register(font: &Path) -> Result<(), HarnessError> {
    let bytes = std::fs::read(font)
        .map_err(|e| HarnessError::from(format!("font {}: {e}", font.display())))?;
    // plotters keeps registered fonts for the life of the process and wants them 'static.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| HarnessError::from(format!("{}: not a TrueType font", font.display())))
}

/// Draws a soak's samples into a PNG at `out`: each replica's RSS, open descriptors and
/// queue depth over time (one line per process: a restarted replica starts a new one) and
/// this process's RSS, each restart a grey vertical line.
pub fn draw_soak_png(lines: &[Line], font: &Path, out: &Path) -> Result<(), HarnessError> {
    if !lines.iter().any(|l| matches!(l, Line::Sample { .. })) {
        return Err(HarnessError::from(
            "no samples to plot: run `bench soak --samples FILE` first",
        ));
    }
    register(font)?;
    let (w, h) = (1400u32, 1000u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw_soak(lines, &mut rgb, (w, h)).map_err(|e| HarnessError::from(format!("plot: {e}")))?;
    write_png(out, &rgb, (w, h))
}

/// One quantity of the soak over time: (minutes, value) per (replica, generation).
type SoakSeries = Vec<((String, u32), Vec<(f64, f64)>)>;

fn soak_series(lines: &[Line], f: impl Fn(&ReplicaSample) -> Option<f64>) -> SoakSeries {
    let mut out: SoakSeries = Vec::new();
    for l in lines {
        let Line::Sample { t_s, replicas, .. } = l else {
            continue;
        };
        for r in replicas {
            let Some(v) = f(r) else { continue };
            let key = (r.replica.clone(), r.generation);
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, pts)) => pts.push((t_s / 60.0, v)),
                None => out.push((key, vec![(t_s / 60.0, v)])),
            }
        }
    }
    out
}

fn draw_soak(lines: &[Line], rgb: &mut [u8], size: (u32, u32)) -> DrawResult {
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((2, 2));
    let restarts: Vec<f64> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Restart { t_s, .. } => Some(t_s / 60.0),
            _ => None,
        })
        .collect();
    let max_t = lines
        .iter()
        .map(|l| l.t_s() / 60.0)
        .fold(1.0 / 60.0, f64::max);
    let charts: [(&str, &str, SoakSeries); 3] = [
        (
            "Replica RSS (MiB)",
            "MiB",
            soak_series(lines, |r| Some(r.rss_mib)),
        ),
        (
            "Replica open file descriptors",
            "fds",
            soak_series(lines, |r| Some(r.fds as f64)),
        ),
        (
            "Replica queue depth (argocd_principal_queue_depth)",
            "events",
            soak_series(lines, |r| r.queue_depth),
        ),
    ];
    for ((caption, unit, series), area) in charts.iter().zip(areas.iter()) {
        soak_chart(area, caption, unit, series, &restarts, max_t)?;
    }
    let bench: SoakSeries = vec![(
        ("bench process".to_owned(), 1),
        lines
            .iter()
            .filter_map(|l| match l {
                Line::Sample { t_s, bench, .. } => Some((t_s / 60.0, bench.rss_mib)),
                _ => None,
            })
            .collect(),
    )];
    if let Some(area) = areas.get(3) {
        soak_chart(
            area,
            "This process: simulated agents and hub (RSS, MiB)",
            "MiB",
            &bench,
            &restarts,
            max_t,
        )?;
    }
    root.present()?;
    Ok(())
}

/// The colour of replica `principal-<slot>`'s lines.
fn replica_color(name: &str) -> RGBColor {
    const COLORS: [RGBColor; 5] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
    ];
    let slot: usize = name
        .rsplit('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    COLORS[slot % COLORS.len()]
}

fn soak_chart(
    area: &Area<'_>,
    caption: &str,
    unit: &str,
    series: &SoakSeries,
    restarts: &[f64],
    max_t: f64,
) -> DrawResult {
    let max_y = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_t * 1.02, 0f64..max_y)?;
    // Whole minutes, or tenths on a run of a few minutes (the smoke's 40 s).
    let digits = usize::from(max_t < 10.0);
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc(unit)
        .x_label_formatter(&|x| format!("{x:.digits$}"))
        .draw()?;
    let grey = RGBColor(160, 160, 160);
    chart
        .draw_series(
            restarts
                .iter()
                .map(|&t| PathElement::new([(t, 0.0), (t, max_y)], grey.stroke_width(1))),
        )?
        .label("replica restart (kill -9)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(1)));
    let mut labelled: Vec<&str> = Vec::new();
    for ((name, _), pts) in series {
        let color = if name.starts_with("principal-") {
            replica_color(name)
        } else {
            BLACK
        };
        let drawn = chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
        if !labelled.contains(&name.as_str()) {
            labelled.push(name);
            drawn.label(name.clone()).legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Rows of charts: agents (with connect rows), Applications (with big-hub or big-spoke rows).
fn rows(data: &PlotData) -> u32 {
    u32::from(!data.connect.is_empty())
        + u32::from(!(data.hub.is_empty() && data.replica.is_empty() && data.spoke.is_empty()))
}

fn draw(data: &PlotData, rgb: &mut [u8], size: (u32, u32)) -> DrawResult {
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows(data) as usize, 1));
    let mut areas = areas.iter();
    if !data.connect.is_empty() {
        let area = areas.next().ok_or("no row for the agents' charts")?;
        draw_connect(&data.connect, area)?;
    }
    if let Some(area) = areas.next() {
        let (left, right) = area.split_horizontally(size.0 / 2);
        draw_hub(&data.hub, &data.replica, &left)?;
        draw_spoke(&data.spoke, &right)?;
    }
    root.present()?;
    Ok(())
}

/// A chart's place with a note saying which rows would fill it.
fn empty_chart(area: &Area<'_>, caption: &str, note: &str) -> DrawResult {
    let area = area.titled(caption, ("sans-serif", 20))?;
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        note.to_owned(),
        (w as i32 / 6, h as i32 / 2),
        ("sans-serif", 16),
    ))?;
    Ok(())
}

fn draw_connect(points: &[ConnectPoint], root: &Area<'_>) -> DrawResult {
    let size = root.dim_in_pixel();
    let (left, right) = root.split_horizontally(size.0 / 2);
    let max_agents = points.iter().map(|p| p.agents).max().unwrap_or(1) as f64 * 1.05;
    let base = points
        .iter()
        .map(|p| p.rss_before_mib)
        .fold(f64::MAX, f64::min);
    let target_rss = |n: f64| base + n * TARGET_BYTES_PER_AGENT / (1024.0 * 1024.0);
    let max_rss = points
        .iter()
        .map(|p| p.rss_connected_mib)
        .fold(target_rss(max_agents), f64::max)
        * 1.1;

    let mut mem = ChartBuilder::on(&left)
        .caption("Principal RSS with N idle agents (MiB)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..max_agents, 0f64..max_rss)?;
    mem.configure_mesh()
        .x_desc("connected agents")
        .y_desc("MiB")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    mem.draw_series(LineSeries::new(
        [(0.0, base), (max_agents, target_rss(max_agents))],
        RED.stroke_width(2),
    ))?
    .label("target: 32 KiB per agent")
    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    let measured: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.agents as f64, p.rss_connected_mib))
        .collect();
    mem.draw_series(LineSeries::new(measured.clone(), BLUE.stroke_width(2)))?
        .label("measured")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    mem.draw_series(measured.iter().map(|&c| Circle::new(c, 4, BLUE.filled())))?;
    // Each point's cost per agent, written above and to the left of it.
    mem.draw_series(points.iter().map(|p| {
        EmptyElement::at((p.agents as f64, p.rss_connected_mib))
            + Text::new(
                format!("{:.1} KiB/agent", p.idle_bytes_per_agent / 1024.0),
                (-95, -22),
                ("sans-serif", 14),
            )
    }))?;
    mem.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let max_cpu = points
        .iter()
        .filter_map(|p| p.idle_cpu_pct)
        .fold(TARGET_IDLE_CPU_PCT, f64::max)
        * 1.3;
    let mut cpu = ChartBuilder::on(&right)
        .caption(
            "Principal CPU with N idle agents (% of one core)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..max_agents, 0f64..max_cpu)?;
    cpu.configure_mesh()
        .x_desc("connected agents")
        .y_desc("%")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    cpu.draw_series(LineSeries::new(
        [
            (0.0, TARGET_IDLE_CPU_PCT),
            (max_agents, TARGET_IDLE_CPU_PCT),
        ],
        RED.stroke_width(2),
    ))?
    .label("target: 5 % at 10,000 agents")
    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    let measured: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.agents as f64, p.idle_cpu_pct?)))
        .collect();
    cpu.draw_series(LineSeries::new(measured.clone(), BLUE.stroke_width(2)))?
        .label("measured (default 30 s heartbeats)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    cpu.draw_series(measured.iter().map(|&c| Circle::new(c, 4, BLUE.filled())))?;
    cpu.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// One line of the hub chart: its points, the RSS it draws of each, its colour and label.
type HubLine<'a> = (&'a [HubPoint], fn(&HubPoint) -> f64, RGBColor, &'a str);

/// Principal RSS against Applications on the hub: cache only and with the fleet settled,
/// next to the docs/ha.md model; with `replicas`, the largest `--ha` replica's of a
/// `big-hub --replicas N` run (agents spread over the replicas) at the same two moments.
fn draw_hub(points: &[HubPoint], replicas: &[HubPoint], area: &Area<'_>) -> DrawResult {
    const CAPTION: &str = "Principal RSS with N Applications on the hub (MiB)";
    let Some(first) = points.first() else {
        return empty_chart(
            area,
            CAPTION,
            "no big-hub rows: run `bench big-hub --json FILE`",
        );
    };
    let max_apps = points
        .iter()
        .chain(replicas)
        .map(|p| p.apps)
        .max()
        .unwrap_or(1) as f64
        * 1.05;
    let model =
        |n: f64| first.rss_cold_mib + (n - first.apps as f64) * MODEL_BYTES_PER_APP / 1048576.0;
    let max_rss = points
        .iter()
        .chain(replicas)
        .map(|p| p.rss_settled_mib.max(p.rss_cold_mib))
        .fold(model(max_apps), f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(CAPTION, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..max_apps, 0f64..max_rss)?;
    chart
        .configure_mesh()
        .x_desc("Applications on the hub")
        .y_desc("MiB")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            [
                (first.apps as f64, model(first.apps as f64)),
                (max_apps, model(max_apps)),
            ],
            RED.stroke_width(2),
        ))?
        .label("model (docs/ha.md): 6 KiB per Application")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    let settled: fn(&HubPoint) -> f64 = |p| p.rss_settled_mib;
    let cold: fn(&HubPoint) -> f64 = |p| p.rss_cold_mib;
    let lines: [HubLine<'_>; 4] = [
        (points, settled, BLUE, "agents connected and resynced"),
        (
            points,
            cold,
            RGBColor(0, 150, 0),
            "watch cache only (no agent)",
        ),
        (
            replicas,
            settled,
            RGBColor(140, 0, 160),
            "largest --ha replica of N, agents spread and resynced",
        ),
        (
            replicas,
            cold,
            RGBColor(230, 120, 0),
            "largest --ha replica of N, no agent",
        ),
    ];
    for (line, rss, color, label) in lines {
        if line.is_empty() {
            continue;
        }
        let series: Vec<(f64, f64)> = line.iter().map(|p| (p.apps as f64, rss(p))).collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(series.iter().map(|&c| Circle::new(c, 4, color.filled())))?;
    }
    // Each further point's cost per Application against the first, above and left of it.
    chart.draw_series(points.iter().skip(1).map(|p| {
        let per_app = (p.rss_settled_mib - first.rss_settled_mib) * 1048576.0
            / (p.apps - first.apps).max(1) as f64;
        EmptyElement::at((p.apps as f64, p.rss_settled_mib))
            + Text::new(
                format!("{:.1} KiB/app", per_app / 1024.0),
                (-95, -22),
                ("sans-serif", 14),
            )
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// One agent's RSS against Applications on its spoke.
fn draw_spoke(points: &[SpokePoint], area: &Area<'_>) -> DrawResult {
    const CAPTION: &str = "Agent RSS with N Applications on its spoke (MiB)";
    let Some(first) = points.first() else {
        return empty_chart(
            area,
            CAPTION,
            "no big-spoke rows: run `bench big-spoke --json FILE`",
        );
    };
    let max_apps = points.iter().map(|p| p.apps).max().unwrap_or(1).max(1) as f64 * 1.05;
    let max_rss = points.iter().map(|p| p.rss_mib).fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .caption(CAPTION, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..max_apps, 0f64..max_rss)?;
    chart
        .configure_mesh()
        .x_desc("Applications on the spoke")
        .y_desc("MiB")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    let measured: Vec<(f64, f64)> = points.iter().map(|p| (p.apps as f64, p.rss_mib)).collect();
    chart
        .draw_series(LineSeries::new(measured.clone(), BLUE.stroke_width(2)))?
        .label("measured (one agent process, idle)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart.draw_series(measured.iter().map(|&c| Circle::new(c, 4, BLUE.filled())))?;
    chart.draw_series(points.iter().skip(1).map(|p| {
        let per_app = (p.rss_mib - first.rss_mib) * 1048576.0 / (p.apps - first.apps).max(1) as f64;
        EmptyElement::at((p.apps as f64, p.rss_mib))
            + Text::new(
                format!("{:.1} KiB/app", per_app / 1024.0),
                (-95, -22),
                ("sans-serif", 14),
            )
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn write_png(out: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<(), HarnessError> {
    let err = |e: &dyn std::fmt::Display| HarnessError::from(format!("{}: {e}", out.display()));
    let file = std::fs::File::create(out).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| err(&e))?;
    writer.write_image_data(rgb).map_err(|e| err(&e))?;
    writer.finish().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROWS: &str = r#"{"scenario":"connect","agents":2000,"rss_before_mib":20.1,"rss_connected_mib":114.5,"idle_bytes_per_agent":49473,"idle_cpu_pct":0.7}
{"scenario":"storm","agents":1000,"ready_s":0.15}
{"scenario":"connect","agents":1000,"rss_before_mib":20.0,"rss_connected_mib":90.0,"idle_bytes_per_agent":72000,"idle_cpu_pct":0.9}

{"scenario":"connect","agents":1000,"rss_before_mib":20.0,"rss_connected_mib":68.1,"idle_bytes_per_agent":50462,"idle_cpu_pct":0.43}
"#;

    #[test]
    fn connect_rows_are_read_last_run_wins_sorted() {
        let p = connect_points(ROWS).unwrap();
        assert_eq!(
            p.iter().map(|p| p.agents).collect::<Vec<_>>(),
            vec![1000, 2000]
        );
        assert_eq!(p[0].idle_bytes_per_agent, 50462.0);
        assert_eq!(p[1].rss_connected_mib, 114.5);
        assert_eq!(p[0].idle_cpu_pct, Some(0.43));
    }

    #[test]
    fn an_unmeasured_idle_cpu_is_left_out_not_drawn_as_0() {
        let rows = r#"{"scenario":"connect","agents":5,"rss_before_mib":20.0,"rss_connected_mib":21.0,"idle_bytes_per_agent":40000,"idle_cpu_pct":"not measured: 0 µs of CPU read by a clock of 20000 µs resolution (at least 10× it needed)"}"#;
        let p = connect_points(rows).unwrap();
        assert_eq!(p[0].idle_cpu_pct, None);
        // Any other string is still an error naming the row.
        let e = connect_points(&rows.replace("not measured", "oops")).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn bad_rows_name_their_line() {
        let e = connect_points("{\"scenario\":\"connect\"}\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = connect_points("\nnot json\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    /// Renders a real PNG with a system font (`.ci/run` installs fonts-dejavu-core) and
    /// reads it back: the size is right and the pixels are not all background.
    #[test]
    fn draws_a_png() {
        let font = find_font(None).expect("a TrueType font (apt-get install fonts-dejavu-core)");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("connect.png");
        draw_png(&plot_data(ROWS).unwrap(), &font, &out).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1200, 500));
        let inked = buf.chunks(3).filter(|px| px != &[255, 255, 255]).count();
        assert!(inked > 10_000, "only {inked} non-white pixels");
        // Blue (the measured series) and red (the targets) are both drawn.
        assert!(buf.chunks(3).any(|px| px == [0, 0, 255]));
        assert!(buf.chunks(3).any(|px| px == [255, 0, 0]));
    }

    #[test]
    fn draws_a_soak_png_with_each_replica_and_the_restarts() {
        let text = r#"{"kind":"sample","t_s":0.0,"before_restart":false,"replicas":[{"replica":"principal-0","generation":1,"pid":7,"rss_mib":90.0,"fds":700,"threads":3,"queue_depth":2.0,"connected":667.0,"series":4300},{"replica":"principal-1","generation":1,"pid":8,"rss_mib":91.0,"fds":701,"threads":3,"queue_depth":0.0,"connected":666.0,"series":4300}],"bench":{"rss_mib":300.0,"fds":2100,"threads":3,"tasks":10000,"agents_connected":2000,"hub_leases":2003}}
{"kind":"sample","t_s":300.0,"before_restart":true,"replicas":[{"replica":"principal-0","generation":1,"pid":7,"rss_mib":95.0,"fds":700,"threads":3,"queue_depth":1.0,"connected":667.0,"series":4300},{"replica":"principal-1","generation":1,"pid":8,"rss_mib":96.0,"fds":701,"threads":3,"queue_depth":null,"connected":null,"series":null}],"bench":{"rss_mib":310.0,"fds":2100,"threads":3,"tasks":10000,"agents_connected":2000,"hub_leases":2003}}
{"kind":"restart","t_s":300.0,"replica":"principal-1","generation":2,"ready_s":1.2}
{"kind":"sample","t_s":600.0,"before_restart":false,"replicas":[{"replica":"principal-0","generation":1,"pid":7,"rss_mib":96.0,"fds":700,"threads":3,"queue_depth":0.0,"connected":900.0,"series":4300},{"replica":"principal-1","generation":2,"pid":9,"rss_mib":60.0,"fds":400,"threads":3,"queue_depth":0.0,"connected":433.0,"series":4000}],"bench":{"rss_mib":320.0,"fds":2100,"threads":3,"tasks":10000,"agents_connected":2000,"hub_leases":2003}}
"#;
        let lines = crate::bench::soak::read_lines(text).unwrap();
        let series = soak_series(&lines, |r| Some(r.rss_mib));
        // principal-1's restart starts a series of its own.
        assert_eq!(
            series
                .iter()
                .map(|(k, p)| (k.0.as_str(), k.1, p.len()))
                .collect::<Vec<_>>(),
            vec![
                ("principal-0", 1, 3),
                ("principal-1", 1, 2),
                ("principal-1", 2, 1)
            ]
        );
        assert_eq!(soak_series(&lines, |r| r.queue_depth)[1].1.len(), 1);
        let font = find_font(None).expect("a TrueType font (apt-get install fonts-dejavu-core)");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("soak.png");
        draw_soak_png(&lines, &font, &out).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1400, 1000));
        // principal-0's colour and the restart's grey are drawn.
        assert!(buf.chunks(3).any(|px| px == [31, 119, 180]));
        assert!(buf.chunks(3).any(|px| px == [160, 160, 160]));
        assert!(draw_soak_png(&lines[2..3], &font, &out).is_err());
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let e = draw_png(
            &PlotData::default(),
            Path::new("/nonexistent.ttf"),
            Path::new("/tmp/x.png"),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("no connect, big-hub or big-spoke rows"),
            "{e}"
        );
    }

    const BIG: &str = r#"{"scenario":"big-hub","agents":1000,"apps_small":1000,"apps":10000,"rss_cold_small_mib":30.0,"rss_cold_mib":60.0,"rss_settled_small_mib":80.0,"rss_settled_mib":120.0}
{"scenario":"big-hub","agents":1000,"apps_small":1000,"apps":5000,"rss_cold_small_mib":31.0,"rss_cold_mib":45.0,"rss_settled_small_mib":81.0,"rss_settled_mib":100.0}
{"scenario":"big-spoke","apps":10000,"agent_rss_empty_mib":12.0,"agent_rss_mib":70.0}
{"scenario":"big-spoke","apps":2000,"agent_rss_empty_mib":11.0,"agent_rss_mib":24.0}
"#;

    #[test]
    fn hub_and_spoke_rows_give_two_points_each() {
        let d = plot_data(BIG).unwrap();
        assert!(d.connect.is_empty());
        // The second run's one-per-agent point replaces the first's (same Applications).
        assert_eq!(
            d.hub
                .iter()
                .map(|p| (p.apps, p.rss_cold_mib))
                .collect::<Vec<_>>(),
            vec![(1000, 31.0), (5000, 45.0), (10000, 60.0)]
        );
        assert_eq!(d.hub[2].rss_settled_mib, 120.0);
        assert_eq!(
            d.spoke
                .iter()
                .map(|p| (p.apps, p.rss_mib))
                .collect::<Vec<_>>(),
            vec![(0, 11.0), (2000, 24.0), (10000, 70.0)]
        );
        let e = plot_data("{\"scenario\":\"big-hub\",\"apps\":3}\n").unwrap_err();
        assert!(e.to_string().contains("line 1: big-hub row without"), "{e}");
    }

    #[test]
    fn a_replicas_row_gives_the_largest_replica() {
        let row = r#"{"scenario":"big-hub","agents":1000,"apps":10000,"replicas":3,"replica_rss_cold_mib":[20.0,22.5,21.0],"replica_rss_settled_mib":[40.0,39.0,44.0]}"#;
        let d = plot_data(&format!("{BIG}{row}\n")).unwrap();
        assert_eq!(
            d.replica,
            vec![HubPoint {
                apps: 10000,
                rss_cold_mib: 22.5,
                rss_settled_mib: 44.0
            }]
        );
        // The single principal's points are its own.
        assert_eq!(d.hub.len(), 3);
        let e = plot_data("{\"scenario\":\"big-hub\",\"apps\":3,\"replicas\":3}\n").unwrap_err();
        assert!(
            e.to_string().contains("without replica_rss_cold_mib"),
            "{e}"
        );
        let odd = row.replace("[20.0,22.5,21.0]", "[20.0,\"x\"]");
        assert!(
            plot_data(&format!("{odd}\n")).is_err(),
            "a list with a non-number"
        );
        // Drawn in the hub chart in their own colours.
        let font = find_font(None).expect("a TrueType font (apt-get install fonts-dejavu-core)");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cost.png");
        draw_png(&plot_data(&format!("{BIG}{row}\n")).unwrap(), &font, &out).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut buf).unwrap();
        assert!(buf.chunks(3).any(|px| px == [140, 0, 160]));
        assert!(buf.chunks(3).any(|px| px == [230, 120, 0]));
    }

    /// With Application rows the plot gets a second row of charts: hub (with the model line
    /// in red and the cache-only curve in green) and spoke.
    #[test]
    fn draws_the_application_charts_below() {
        let font = find_font(None).expect("a TrueType font (apt-get install fonts-dejavu-core)");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cost.png");
        let rows = format!("{ROWS}{BIG}");
        draw_png(&plot_data(&rows).unwrap(), &font, &out).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1200, 1000));
        let lower = &buf[buf.len() / 2..];
        assert!(lower.chunks(3).any(|px| px == [0, 150, 0]));
        assert!(lower.chunks(3).any(|px| px == [0, 0, 255]));
        assert!(lower.chunks(3).any(|px| px == [255, 0, 0]));
        // Only Application rows: one row of charts.
        draw_png(&plot_data(BIG).unwrap(), &font, &out).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let reader = dec.read_info().unwrap();
        assert_eq!((reader.info().width, reader.info().height), (1200, 500));
    }
}
