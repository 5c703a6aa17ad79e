//! Reading one epoch and timing it: the client side of every workload. The reading loop is
//! part of what is measured, so it does no more per element than the workload reports (see
//! `Count`) and reads the clock only now and then.

use indicatif::{ProgressBar, ProgressStyle};
use sluice_client::{DispatcherClient, DispatcherClientExt, DistributeOptions, ShardingPolicy};
use sluice_pipeline::Dataset;
use std::time::{Duration, Instant};

/// What an epoch's reader counts of each element: no more than the workload reports, so the
/// tiny workloads' reader does what the local executor's loop does (count).
#[derive(Clone, Copy)]
pub(crate) enum Count {
    Elements,
    /// Rows of batched elements (their first dimension), as `elements`.
    Rows,
    /// Elements, and their bytes.
    Bytes,
}

/// What an epoch reads: a dataset registered for it, or one registered before (its definition
/// is not sent again, which for a large one is most of a short epoch).
#[derive(Clone, Copy)]
pub(crate) enum Input<'a> {
    Dataset(&'a Dataset),
    Registered(&'a str),
}

impl<'a> From<&'a Dataset> for Input<'a> {
    fn from(dataset: &'a Dataset) -> Self {
        Input::Dataset(dataset)
    }
}

/// What one epoch measured.
pub(crate) struct Epoch {
    pub(crate) elements: u64,
    /// Counted only with `Count::Bytes`.
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) first_element: Duration,
    /// From the last element to the end of input.
    pub(crate) end_of_epoch: Duration,
}

/// Reads one epoch of `input` as a new job (a dataset is registered first); `on_element` is
/// told the count so far now and then (for a progress bar).
pub(crate) async fn read_epoch<'a>(
    client: &DispatcherClient,
    input: impl Into<Input<'a>>,
    mode: ShardingPolicy,
    options: DistributeOptions,
    count: Count,
    mut on_element: impl FnMut(u64),
) -> anyhow::Result<Epoch> {
    let started = Instant::now();
    let service = match input.into() {
        Input::Dataset(dataset) => client.distribute(dataset, mode, options).await?,
        Input::Registered(id) => client.from_dataset_id(mode, id, options).await?,
    };
    let mut epoch = service.iter().await?;
    let (mut elements, mut bytes) = (0u64, 0u64);
    let mut first_element = None;
    let mut last = Instant::now();
    let end_of_epoch;
    loop {
        let next = epoch.next().await;
        // The clock is read for the first elements and then every 64th: a read per element was
        // a measurable share of the tiny workloads' CPU. The latency epochs are short enough to
        // be timed element by element.
        let timed = elements < 4096 || elements.is_multiple_of(64);
        let now = if timed || next.is_none() {
            Instant::now()
        } else {
            last
        };
        // Looked at where `next` put it: moving a 64-byte element out of the `Option` and the
        // `Result` costs more than reading a tiny one (store-forwarding stalls).
        let element = match next {
            Some(Ok(ref element)) => element,
            Some(Err(e)) => return Err(e.into()),
            None => {
                end_of_epoch = now - last;
                break;
            }
        };
        first_element.get_or_insert_with(|| now - started);
        last = now;
        match count {
            Count::Elements => elements += 1,
            Count::Rows => elements += rows(element),
            Count::Bytes => {
                elements += 1;
                bytes += element.byte_size() as u64;
            }
        }
        if timed {
            on_element(elements);
        }
    }
    Ok(Epoch {
        elements,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        first_element: first_element.unwrap_or_default(),
        end_of_epoch,
    })
}

/// Rows of a batched element (its first dimension), 1 for a scalar.
fn rows(element: &sluice_element::Element) -> u64 {
    match element {
        sluice_element::Element::Tensor(t) => t.shape().first().copied().unwrap_or(1) as u64,
        _ => 1,
    }
}

/// One small epoch, so registration, channels and worker tasks are warm before a measurement.
pub(crate) async fn warm_up(client: &DispatcherClient, mode: ShardingPolicy) -> anyhow::Result<()> {
    read_epoch(
        client,
        &Dataset::range(1000),
        mode,
        options(1024),
        Count::Elements,
        |_| {},
    )
    .await
    .map(|_| ())
}

/// An epoch read with a progress bar of `total` elements.
pub(crate) async fn measured<'a>(
    client: &DispatcherClient,
    input: impl Into<Input<'a>>,
    mode: ShardingPolicy,
    options: DistributeOptions,
    count: Count,
    total: u64,
    label: &str,
) -> anyhow::Result<Epoch> {
    let bar = progress(total, label);
    let epoch = read_epoch(client, input, mode, options, count, |e| bar.set_position(e)).await;
    bar.finish_and_clear();
    epoch
}

fn progress(total: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} {bar:30.cyan/blue} {pos:>9}/{len:9} {per_sec:>14}")
            .expect("a valid progress template"),
    );
    bar.set_message(label.to_string());
    bar
}

/// Options with `outstanding` as `max_outstanding_requests`.
pub(crate) fn options(outstanding: u32) -> DistributeOptions {
    DistributeOptions {
        max_outstanding_requests: Some(outstanding),
        ..DistributeOptions::default()
    }
}

/// Like [`options`], without compression: the figures are of the data plane, not of snappy.
pub(crate) fn uncompressed(outstanding: u32) -> DistributeOptions {
    DistributeOptions {
        compression: sluice_client::Compression::None,
        ..options(outstanding)
    }
}
