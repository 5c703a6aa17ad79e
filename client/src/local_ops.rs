//! The ops chained after `distribute` (`ServiceDataset::map` and friends), run by the reader:
//! a blocking thread pulls the service's deliveries through the local pipeline and hands its
//! elements to the `ElementStream` one at a time. It stops when the stream is cancelled or
//! dropped; a service error ends the local pipeline and is passed on unchanged, after the
//! elements that came before it.

use crate::delivery::{Delivered, Delivery, Elements};
use crate::error::ClientError;
use sluice_element::{pb as dpb, ElementIter};
use sluice_executor::ExecOptions;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Runs the ops chained after `distribute` on a blocking thread, between the service's
/// elements and the caller. A service error ends the local pipeline and is passed on as is.
pub(crate) fn run_local_ops(
    input: flume::Receiver<Delivery>,
    ops: &[dpb::Op],
    options: &ExecOptions,
    cancel: CancellationToken,
) -> Result<flume::Receiver<Delivery>, ClientError> {
    let service_error: Arc<Mutex<Option<ClientError>>> = Arc::new(Mutex::new(None));
    let error_slot = service_error.clone();
    let mut batch = Elements::Decoded(Vec::new().into_iter());
    let source: ElementIter = Box::new(std::iter::from_fn(move || loop {
        if let Some(element) = batch.next() {
            return Some(element);
        }
        match input.recv() {
            Ok(Ok(delivered)) => batch = delivered.elements,
            Ok(Err(e)) => {
                *error_slot.lock().expect("error slot lock poisoned") = Some(e);
                return None;
            }
            Err(_) => return None,
        }
    }));
    let mut pipeline = sluice_executor::apply_ops(source, ops, options)?;
    let (tx, rx) = flume::bounded(1);
    std::thread::Builder::new()
        .name("sluice-local-ops".into())
        .spawn(move || {
            for item in pipeline.by_ref() {
                if cancel.is_cancelled() {
                    return;
                }
                let delivery = item
                    .map(|e| Delivered {
                        bytes: e.byte_size() as u64,
                        indices: None,
                        elements: Elements::one(e),
                        permit: None,
                    })
                    .map_err(ClientError::from);
                if tx.send(delivery).is_err() {
                    return;
                }
            }
            if let Some(e) = service_error
                .lock()
                .expect("error slot lock poisoned")
                .take()
            {
                let _ = tx.send(Err(e));
            }
        })
        .map_err(|e| {
            ClientError::FailedPrecondition(format!("spawn local pipeline thread: {e}"))
        })?;
    Ok(rx)
}
