use super::*;
use crate::delivery::Delivered;
use bytes::Bytes;
use futures::FutureExt;
use sluice_element::{Compression, PackedBuilder, Tensor};
use std::sync::Arc;
use tokio::sync::Semaphore;

fn scalar(v: i64) -> Element {
    Tensor::scalar_i64(v).into()
}

/// A stream over `rx` alone, without an iteration loop behind it.
fn stream(rx: flume::Receiver<Delivery>) -> ElementStream {
    ElementStream::over(rx, CancellationToken::new())
}

fn delivered(elements: Elements) -> Delivery {
    Ok(Delivered {
        elements,
        permit: None,
        bytes: 0,
        indices: None,
    })
}

#[tokio::test]
async fn an_element_that_does_not_decode_ends_the_epoch_after_the_ones_before_it() {
    let (tx, rx) = flume::unbounded();
    let mut run = PackedBuilder::default();
    run.push(&scalar(7), Compression::None);
    run.push_encoded(&[1, 0, 9], Bytes::new()); // not an element
    run.push(&scalar(8), Compression::None);
    tx.send(delivered(Elements::Packed(run.finish().into_decoder())))
        .unwrap();
    tx.send(delivered(Elements::one(scalar(9)))).unwrap();
    let mut epoch = stream(rx);

    assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(7));
    assert!(matches!(
        epoch.next().await,
        Some(Err(ClientError::Dataset(_)))
    ));
    assert!(epoch.cancel.is_cancelled(), "the iteration loop is stopped");
    // Nothing after the error, though more was delivered; the blocking path agrees.
    assert!(epoch.next().await.is_none());
    assert!(epoch.next_blocking().is_none());
}

#[tokio::test]
async fn a_dropped_next_loses_no_delivery() {
    let (tx, rx) = flume::unbounded();
    let mut epoch = stream(rx);
    // Polled once with nothing delivered, then dropped.
    assert!(epoch.next().now_or_never().is_none());
    tx.send(delivered(Elements::one(scalar(1)))).unwrap();
    drop(tx);
    let mut seen = Vec::new();
    while let Some(element) = epoch.next().await {
        seen.push(element.unwrap());
    }
    assert_eq!(seen, vec![scalar(1)]);
}

#[tokio::test]
async fn a_batch_gives_its_permits_back_with_its_last_element() {
    // With one permit (`max_outstanding_requests` 1), the worker can send the next batch only
    // once the caller has the last element of this one, not when it asks for the next.
    let permits = Arc::new(Semaphore::new(1));
    let permit = permits.clone().try_acquire_many_owned(1).unwrap();
    let (tx, rx) = flume::unbounded();
    tx.send(Ok(Delivered {
        elements: Elements::one(scalar(1)),
        permit: Some(permit),
        bytes: 0,
        indices: None,
    }))
    .unwrap();
    let mut epoch = stream(rx);
    assert_eq!(permits.available_permits(), 0);
    assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(1));
    assert_eq!(
        permits.available_permits(),
        1,
        "released with the last element"
    );

    // A batch of many gives them back in groups, and the rest with its last element.
    let n = 2 * RELEASE_EVERY + 5;
    permits.add_permits(n - 1);
    let permit = permits.clone().try_acquire_many_owned(n as u32).unwrap();
    let mut run = PackedBuilder::default();
    for v in 0..n {
        run.push(&scalar(v as i64), Compression::None);
    }
    tx.send(Ok(Delivered {
        elements: Elements::Packed(run.finish().into_decoder()),
        permit: Some(permit),
        bytes: 0,
        indices: None,
    }))
    .unwrap();
    for v in 0..n {
        assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(v as i64));
        let taken = v + 1;
        let released = permits.available_permits();
        assert!(
            released <= taken && taken - released < RELEASE_EVERY,
            "{taken} taken, {released} released"
        );
    }
    assert_eq!(permits.available_permits(), n);
}

/// A runner of "Python" ops for tests: doubles integers, and raises on 3.
#[derive(Debug)]
struct Doubling;

struct DoublingFunction;

impl sluice_element::PythonRunner for Doubling {
    fn prepare(
        &self,
        _op: &dpb::PyFunctionOp,
    ) -> Result<Arc<dyn sluice_element::PythonFunction>, DatasetError> {
        Ok(Arc::new(DoublingFunction))
    }
}

impl sluice_element::PythonFunction for DoublingFunction {
    fn call(&self, input: Element) -> std::sync::mpsc::Receiver<sluice_element::CallResult> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let result = match input.as_i64() {
            Some(3) => Err(DatasetError::Python(Box::new(
                sluice_element::PythonException {
                    type_module: "builtins".into(),
                    type_name: "ValueError".into(),
                    message: "three".into(),
                    traceback: "Traceback (most recent call last):\n".into(),
                    function: "double".into(),
                },
            ))),
            Some(v) => Ok(vec![scalar(v * 2)]),
            None => Err(DatasetError::Cancelled),
        };
        let _ = tx.send(result);
        rx
    }

    fn parallelism(&self) -> usize {
        1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_ops_after_distribute_run_with_the_given_runner_and_keep_its_exception() {
    let (tx, rx) = flume::unbounded();
    for v in 0..5 {
        tx.send(delivered(Elements::one(scalar(v)))).unwrap();
    }
    drop(tx);
    let op = dpb::Op {
        kind: Some(dpb::op::Kind::PyFunction(dpb::PyFunctionOp {
            kind: dpb::PyFunctionKind::Map as i32,
            pickled: vec![1],
            name: "double".into(),
            python_version: "3.11".into(),
            cloudpickle_version: "3.1.2".into(),
            ..Default::default()
        })),
    };
    let runner: Arc<dyn sluice_element::PythonRunner> = Arc::new(Doubling);
    let options = ExecOptions {
        python: Some(runner),
        ..ExecOptions::default()
    };
    let out = run_local_ops(
        rx,
        std::slice::from_ref(&op),
        &options,
        CancellationToken::new(),
    )
    .unwrap();
    let mut epoch = stream(out);
    assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(0));
    assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(2));
    assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(4));
    match epoch.next().await {
        Some(Err(ClientError::Dataset(e))) => match *e {
            DatasetError::Python(p) => assert_eq!(
                (p.type_name.as_str(), p.message.as_str()),
                ("ValueError", "three")
            ),
            other => panic!("not a python exception: {other}"),
        },
        other => panic!("not a dataset error: {other:?}"),
    }

    // Without a runner the op is refused when the epoch starts.
    let (_tx, rx) = flume::unbounded();
    let refused = run_local_ops(rx, &[op], &ExecOptions::default(), CancellationToken::new());
    assert!(matches!(
        refused.err(),
        Some(ClientError::Dataset(e)) if matches!(*e, DatasetError::PythonRuntime(_))
    ));
}

#[tokio::test]
async fn an_epoch_counts_its_deliveries_and_the_waits_that_ended_in_one() {
    let dataset = "an_epoch_counts_its_deliveries";
    let (tx, rx) = flume::unbounded();
    let mut epoch = stream(rx);
    epoch.metrics = crate::ClientMetrics::global().for_read(dataset, Some("train"));
    // A wait: polled with nothing delivered, then a delivery of three elements.
    assert!(epoch.next().now_or_never().is_none());
    let mut run = PackedBuilder::default();
    for v in 0..3 {
        run.push(&scalar(v), Compression::None);
    }
    let packed = run.finish();
    let bytes = packed.byte_len() as u64;
    tx.send(Ok(Delivered {
        elements: Elements::Packed(packed.into_decoder()),
        permit: None,
        bytes,
        indices: None,
    }))
    .unwrap();
    for v in 0..3 {
        assert_eq!(epoch.next().await.unwrap().unwrap(), scalar(v));
    }
    // Buffered already: no wait. Then the blocking path waits for one.
    tx.send(delivered(Elements::one(scalar(3)))).unwrap();
    assert_eq!(epoch.next_blocking().unwrap().unwrap(), scalar(3));
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        tx.send(delivered(Elements::one(scalar(4)))).unwrap();
    });
    assert_eq!(epoch.next_blocking().unwrap().unwrap(), scalar(4));
    sender.join().unwrap();
    // The end of the epoch is not a stall.
    assert!(epoch.next().await.is_none());

    assert_eq!(epoch.metrics.elements(), 5);
    assert_eq!(epoch.metrics.bytes(), bytes);
    let text = crate::ClientMetrics::global().encode_text();
    let series = format!(r#"{{dataset="{dataset}",job="train"}}"#);
    for line in [
        format!("sluice_client_received_elements_total{series} 5"),
        format!("sluice_client_stall_seconds_count{series} 2"),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
}
