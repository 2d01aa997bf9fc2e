//! The cost-growth plot of `argocd-agent-dev bench --plot`: the `connect` rows of a JSON-lines
//! results file drawn as two charts (principal RSS and idle CPU against connected agents,
//! each next to its target) and written as a PNG.
//!
//! plotters draws into an RGB buffer; text is rendered with ab_glyph from a TrueType font
//! found on the system (or `--font`); the `png` crate writes the file.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

use argocd_agent_testkit::harness::HarnessError;

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
    /// The principal's CPU use during the idle phase, percent of one core.
    pub idle_cpu_pct: f64,
}

/// The `connect` rows of a JSON-lines file, one per agent count (the last run of each
/// count wins), sorted by agents. Other scenarios' rows are skipped; a line that is not
/// JSON is an error naming its number.
pub fn connect_points(jsonl: &str) -> Result<Vec<ConnectPoint>, HarnessError> {
    let mut points: Vec<ConnectPoint> = Vec::new();
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| HarnessError::from(format!("line {}: not JSON: {e}", i + 1)))?;
        if v["scenario"] != "connect" {
            continue;
        }
        let num = |k: &str| {
            v[k].as_f64().ok_or_else(|| {
                HarnessError::from(format!("line {}: connect row without {k}", i + 1))
            })
        };
        let p = ConnectPoint {
            agents: num("agents")? as u64,
            rss_before_mib: num("rss_before_mib")?,
            rss_connected_mib: num("rss_connected_mib")?,
            idle_bytes_per_agent: num("idle_bytes_per_agent")?,
            idle_cpu_pct: num("idle_cpu_pct")?,
        };
        points.retain(|q| q.agents != p.agents);
        points.push(p);
    }
    points.sort_by_key(|p| p.agents);
    Ok(points)
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

/// Draws the cost-growth plot of `points` into a PNG at `out` (1200 × 500).
pub fn draw_connect_png(
    points: &[ConnectPoint],
    font: &Path,
    out: &Path,
) -> Result<(), HarnessError> {
    if points.is_empty() {
        return Err(HarnessError::from(
            "no connect rows to plot: run `bench connect --json FILE` first",
        ));
    }
    let bytes = std::fs::read(font)
        .map_err(|e| HarnessError::from(format!("font {}: {e}", font.display())))?;
    // plotters keeps registered fonts for the life of the process and wants them 'static.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| HarnessError::from(format!("{}: not a TrueType font", font.display())))?;

    let (w, h) = (1200u32, 500u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw(points, &mut rgb, (w, h)).map_err(|e| HarnessError::from(format!("plot: {e}")))?;
    write_png(out, &rgb, (w, h))
}

fn draw(
    points: &[ConnectPoint],
    rgb: &mut [u8],
    size: (u32, u32),
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
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
        .map(|p| p.idle_cpu_pct)
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
        .map(|p| (p.agents as f64, p.idle_cpu_pct))
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
    root.present()?;
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
        draw_connect_png(&connect_points(ROWS).unwrap(), &font, &out).unwrap();
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
    fn nothing_to_plot_is_an_error() {
        let e = draw_connect_png(&[], Path::new("/nonexistent.ttf"), Path::new("/tmp/x.png"))
            .unwrap_err();
        assert!(e.to_string().contains("no connect rows"), "{e}");
    }
}
