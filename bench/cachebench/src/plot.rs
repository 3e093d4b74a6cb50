//! PNG line charts of one series per policy over epochs (or over any x), drawn with
//! plotters' bitmap backend and encoded with `image`.
//!
//! Text needs a TrueType font: `CACHEBENCH_FONT` names one, else the first
//! of a few common system fonts found is used.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::error::{BenchError, Result};

const FAMILY: &str = "sans-serif";
const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];
const SIZE: (u32, u32) = (960, 520);
const LEGEND_WIDTH: u32 = 230;

/// Registers a font once; the error says why none could be.
fn ensure_font() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let candidates = std::env::var("CACHEBENCH_FONT")
                .into_iter()
                .chain(FONTS.iter().map(|s| (*s).to_owned()));
            for path in candidates {
                if let Ok(bytes) = std::fs::read(&path) {
                    // plotters keeps fonts for the life of the process.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    if register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                        return Ok(());
                    }
                }
            }
            Err("no TrueType font found; set CACHEBENCH_FONT to one".into())
        })
        .clone()
        .map_err(BenchError::Plot)
}

fn plot_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// Writes a PNG chart of `series` (name, one value per epoch) with the y
/// axis spanning `y`.
pub fn line_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    y: Range<f64>,
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    let epochs = series
        .iter()
        .map(|(_, v)| v.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let xs: Vec<f64> = (0..epochs).map(|e| e as f64).collect();
    line_chart_over(path, title, ("epoch", &xs), y_label, y, series)
}

/// Writes a PNG chart of `series` (name, the value at each of `x`'s points) with the x axis
/// named `x.0` and the y axis spanning `y`.
pub fn line_chart_over(
    path: &Path,
    title: &str,
    x: (&str, &[f64]),
    y_label: &str,
    y: Range<f64>,
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    ensure_font()?;
    let (x_desc, xs) = x;
    let (w, h) = SIZE;
    let mut pixels = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (plot, legend) = root.split_horizontally(w - LEGEND_WIDTH);
        let first = xs.first().copied().unwrap_or(0.0);
        let last = xs.last().copied().unwrap_or(1.0).max(first + 1.0);
        let mut chart = ChartBuilder::on(&plot)
            .caption(title, (FAMILY, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(first..last, y)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_label)
            .x_labels(xs.len().max(2))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style((FAMILY, 13))
            .draw()
            .map_err(plot_err)?;
        for (k, (name, values)) in series.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            let points = xs.iter().copied().zip(values.iter().copied());
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(plot_err)?;
            let row = 48 + 22 * k as i32;
            legend
                .draw(&PathElement::new(
                    vec![(8, row), (32, row)],
                    color.stroke_width(3),
                ))
                .map_err(plot_err)?;
            legend
                .draw(&Text::new(name.clone(), (40, row - 8), (FAMILY, 14)))
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    image::RgbImage::from_raw(w, h, pixels)
        .ok_or_else(|| plot_err("the bitmap has the wrong size"))?
        .save_with_format(path, image::ImageFormat::Png)
        .map_err(plot_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_with_every_series() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        let series = vec![
            ("a".to_owned(), vec![0.1, 0.5, 0.9]),
            ("b".to_owned(), vec![0.9, 0.5, 0.1]),
        ];
        match line_chart(&path, "t", "y", 0.0..1.0, &series) {
            Ok(()) => {
                let img = image::open(&path).unwrap();
                assert_eq!((img.width(), img.height()), SIZE);
            }
            // A machine without any font cannot label a chart; say so, do not fail.
            Err(BenchError::Plot(why)) if why.contains("no TrueType font") => {}
            Err(e) => panic!("{e}"),
        }
    }
}
