//! `RequestIds`: the request ids of one requester (a `DispatcherClient` and its clones), and the
//! watermark each request carries.
//!
//! A mutating call takes an id once and keeps it for every retry, so a retry after a lost reply
//! gets the outcome the dispatcher recorded. While the call runs its sequence number is *in
//! flight*; every request carries the lowest sequence number in flight (the watermark), telling
//! the dispatcher that everything below was answered and will never be retried, so it may
//! forget those outcomes. A call that ends (answered or abandoned) leaves the set when its
//! [`InFlight`] guard is dropped.

use sluice_proto::dispatcher as pb;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

pub(crate) struct RequestIds {
    requester: u64,
    /// The next sequence number, and the ones in flight.
    state: Mutex<(u64, BTreeSet<u64>)>,
}

/// One call's request id; dropping it takes the call out of flight.
pub(crate) struct InFlight {
    pub id: pb::RequestId,
    ids: Arc<RequestIds>,
}

impl RequestIds {
    pub fn new(requester: u64) -> Arc<RequestIds> {
        Arc::new(RequestIds {
            requester,
            state: Mutex::new((1, BTreeSet::new())),
        })
    }

    /// A fresh id for one call, in flight until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        let mut state = self.state.lock().expect("request id lock poisoned");
        let seq = state.0;
        state.0 += 1;
        state.1.insert(seq);
        let watermark = state.1.first().copied().unwrap_or(seq);
        InFlight {
            id: pb::RequestId {
                requester_id: self.requester,
                seq,
                watermark,
            },
            ids: self.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.ids.state.lock().expect("request id lock poisoned");
        state.1.remove(&self.id.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_is_the_oldest_call_still_in_flight() {
        let ids = RequestIds::new(7);
        let first = ids.begin();
        let second = ids.begin();
        assert_eq!((second.id.seq, second.id.watermark), (2, 1));
        drop(first);
        let third = ids.begin();
        assert_eq!(
            (third.id.seq, third.id.watermark),
            (3, 2),
            "the first was answered"
        );
        drop(second);
        drop(third);
        let fourth = ids.begin();
        assert_eq!(
            (fourth.id.seq, fourth.id.watermark),
            (4, 4),
            "none older in flight"
        );
        assert_eq!(fourth.id.requester_id, 7);
    }
}
