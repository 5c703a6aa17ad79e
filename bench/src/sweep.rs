//! `--plot`: throughput against element size, swept from 64 B to 4 MiB on its own one-worker
//! cluster, written as a log-log SVG and printed as one line per size.

use crate::cluster::Cluster;
use crate::epoch::{read_epoch, uncompressed, Count};
use anyhow::Context;
use sluice_client::{DispatcherClient, ShardingPolicy};
use sluice_element::Tensor;
use sluice_pipeline::{Dataset, Transform};
use std::path::Path;

/// Sweeps element sizes, writes the plot to `path`, and prints each point.
pub(crate) async fn plot(sluice: &Path, path: &Path) -> anyhow::Result<()> {
    let cluster = Cluster::start(sluice, 1, 1, None)?;
    let client = cluster.client()?;
    let points = sweep(&client).await?;
    std::fs::write(path, plot_svg(&points)).with_context(|| format!("write {}", path.display()))?;
    for (size, mib_s, eps) in &points {
        println!("sweep {size:>9} B/element {mib_s:>10.1} MiB/s {eps:>12.0} elements/s");
    }
    Ok(())
}

/// Throughput against element size (float32 tensors, one worker, no compression): for each size,
/// (bytes per element, MiB/s, elements/s), about 256 MiB per point.
async fn sweep(client: &DispatcherClient) -> anyhow::Result<Vec<(u64, f64, f64)>> {
    let mut points = Vec::new();
    for floats in [16usize, 256, 4096, 65_536, 262_144, 1_048_576] {
        let size = (floats * 4) as u64;
        let count = ((256u64 << 20) / size).clamp(64, 2_000_000);
        let values = vec![0.5f32; floats];
        let dataset =
            Dataset::from_slices(Tensor::from_f32s(vec![1, floats], &values)?).repeat(count);
        let outstanding = ((64u64 << 20) / size).clamp(4, 4096) as u32;
        let epoch = read_epoch(
            client,
            &dataset,
            ShardingPolicy::Off,
            uncompressed(outstanding),
            Count::Bytes,
            |_| {},
        )
        .await?;
        points.push((
            size,
            epoch.bytes as f64 / (1024.0 * 1024.0) / epoch.seconds,
            epoch.elements as f64 / epoch.seconds,
        ));
    }
    Ok(points)
}

/// A log-log SVG of MiB/s against element size.
fn plot_svg(points: &[(u64, f64, f64)]) -> String {
    let (w, h, left, bottom) = (640.0, 400.0, 70.0, 50.0);
    let x = |size: u64| left + ((size as f64).log10() - 1.0) / (7.0 - 1.0) * (w - left - 20.0);
    let y = |mib_s: f64| {
        h - bottom - (mib_s.max(0.1).log10() + 1.0) / (5.0 + 1.0) * (h - bottom - 20.0)
    };
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='{}' y='16' text-anchor='middle'>Sluice: throughput against element size (1 worker, loopback)</text>\n",
        w / 2.0
    );
    for exp in 1..=7 {
        let px = x(10u64.pow(exp));
        svg += &format!("<line x1='{px}' y1='20' x2='{px}' y2='{}' stroke='#ddd'/><text x='{px}' y='{}' text-anchor='middle'>1e{exp} B</text>\n", h - bottom, h - bottom + 16.0);
    }
    for exp in -1..=5 {
        let py = y(10f64.powi(exp));
        svg += &format!("<line x1='{left}' y1='{py}' x2='{}' y2='{py}' stroke='#ddd'/><text x='{}' y='{}' text-anchor='end'>1e{exp}</text>\n", w - 20.0, left - 6.0, py + 4.0);
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>bytes per element</text>\n",
        w / 2.0,
        h - 10.0
    );
    svg += &format!(
        "<text x='16' y='{}' transform='rotate(-90 16 {})' text-anchor='middle'>MiB/s</text>\n",
        h / 2.0,
        h / 2.0
    );
    let path: Vec<String> = points
        .iter()
        .map(|(size, mib_s, _)| format!("{:.1},{:.1}", x(*size), y(*mib_s)))
        .collect();
    svg += &format!(
        "<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{}'/>\n",
        path.join(" ")
    );
    for (size, mib_s, _) in points {
        svg += &format!("<circle cx='{:.1}' cy='{:.1}' r='4' fill='#1f77b4'><title>{size} B: {mib_s:.1} MiB/s</title></circle>\n", x(*size), y(*mib_s));
    }
    svg + "</svg>\n"
}
