//! What the apply loop has to tell Felix on fd 4, waiting for the writer: a queue that never
//! blocks the loop and stays bounded however slowly Felix reads. Endpoint statuses are kept
//! latest-per-endpoint (a newer status or remove of an endpoint replaces the one still waiting, in
//! its place), the process status latest-only; everything else waits in order. So what waits is
//! bounded by the number of endpoints, and a Felix that reads nothing stops nothing but its own
//! status reports.
//!
//! Handles: [`Outbox`] (the loop's end, cloneable; the queue closes when the last one is dropped)
//! and [`OutboxReader`] (the writer's end: blocking for the fd 4 thread, async for in-process
//! consumers). Once the writer reports that fd 4 failed, pushes are dropped: there is nobody to
//! tell.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::Notify;

use felix_api::from_dataplane::Payload as Out;
use felix_api::{FromDataplane, HostEndpointId, WorkloadEndpointId};

/// What a waiting message may be replaced by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Workload(String, String, String),
    Host(String),
    Process,
    /// Never replaced: the number is unique.
    Other(u64),
}

fn workload_key(id: Option<&WorkloadEndpointId>) -> Option<Key> {
    id.map(|i| {
        Key::Workload(
            i.orchestrator_id.clone(),
            i.workload_id.clone(),
            i.endpoint_id.clone(),
        )
    })
}

fn host_key(id: Option<&HostEndpointId>) -> Option<Key> {
    id.map(|i| Key::Host(i.endpoint_id.clone()))
}

#[derive(Default)]
struct Queue {
    order: VecDeque<Key>,
    waiting: HashMap<Key, FromDataplane>,
    next_other: u64,
    /// Messages replaced by a newer one of the same key before they were written.
    coalesced: u64,
    /// Every [`Outbox`] is gone: the reader drains what waits and ends.
    closed: bool,
    /// The writer gave up (fd 4 failed): pushes are dropped.
    broken: bool,
}

impl Queue {
    fn key(&mut self, m: &FromDataplane) -> Key {
        let key = match &m.payload {
            Some(Out::WorkloadEndpointStatusUpdate(u)) => workload_key(u.id.as_ref()),
            Some(Out::WorkloadEndpointStatusRemove(r)) => workload_key(r.id.as_ref()),
            Some(Out::HostEndpointStatusUpdate(u)) => host_key(u.id.as_ref()),
            Some(Out::HostEndpointStatusRemove(r)) => host_key(r.id.as_ref()),
            Some(Out::ProcessStatusUpdate(_)) => Some(Key::Process),
            _ => None,
        };
        key.unwrap_or_else(|| {
            self.next_other += 1;
            Key::Other(self.next_other)
        })
    }

    fn push(&mut self, m: FromDataplane) {
        if self.broken {
            return;
        }
        let key = self.key(&m);
        if let Some(slot) = self.waiting.get_mut(&key) {
            *slot = m;
            self.coalesced += 1;
        } else {
            self.order.push_back(key.clone());
            self.waiting.insert(key, m);
        }
    }

    fn take(&mut self) -> Vec<FromDataplane> {
        let waiting = &mut self.waiting;
        self.order
            .drain(..)
            .filter_map(|k| waiting.remove(&k))
            .collect()
    }
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes a blocking reader.
    cv: Condvar,
    /// Wakes an async reader.
    notify: Notify,
    /// Live [`Outbox`] handles.
    senders: Mutex<usize>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves a queue that is still consistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        self.cv.notify_all();
        self.notify.notify_one();
    }
}

/// The apply loop's end of the queue.
pub struct Outbox {
    shared: Arc<Shared>,
}

/// The writer's end of the queue.
pub struct OutboxReader {
    shared: Arc<Shared>,
}

/// A new queue.
pub fn outbox() -> (Outbox, OutboxReader) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue::default()),
        cv: Condvar::new(),
        notify: Notify::new(),
        senders: Mutex::new(1),
    });
    (
        Outbox {
            shared: shared.clone(),
        },
        OutboxReader { shared },
    )
}

impl Outbox {
    /// Queues `m`; never waits.
    pub fn push(&self, m: FromDataplane) {
        self.shared.lock().push(m);
        self.shared.wake();
    }

    /// Messages replaced before they were written, so far.
    pub fn coalesced(&self) -> u64 {
        self.shared.lock().coalesced
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        *self
            .shared
            .senders
            .lock()
            .unwrap_or_else(|p| p.into_inner()) += 1;
        Outbox {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let mut n = self
            .shared
            .senders
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            self.shared.lock().closed = true;
            self.shared.wake();
        }
    }
}

impl OutboxReader {
    /// Everything waiting, oldest first; blocks until there is something. `None` once every
    /// [`Outbox`] is gone and nothing waits.
    pub fn blocking_take(&self) -> Option<Vec<FromDataplane>> {
        let mut q = self.shared.lock();
        loop {
            let batch = q.take();
            if !batch.is_empty() {
                return Some(batch);
            }
            if q.closed {
                return None;
            }
            q = self.shared.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`Self::blocking_take`] for a task.
    pub async fn take(&self) -> Option<Vec<FromDataplane>> {
        loop {
            let notified = self.shared.notify.notified();
            {
                let mut q = self.shared.lock();
                let batch = q.take();
                if !batch.is_empty() {
                    return Some(batch);
                }
                if q.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Everything waiting now, without waiting.
    pub fn try_take(&self) -> Vec<FromDataplane> {
        self.shared.lock().take()
    }

    /// The writer cannot write any more: later pushes are dropped, and what waits is freed.
    pub fn break_off(&self) {
        let mut q = self.shared.lock();
        q.broken = true;
        q.order.clear();
        q.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_api::{
        DataplaneInSync, ProcessStatusUpdate, WorkloadEndpointStatusRemove,
        WorkloadEndpointStatusUpdate,
    };

    fn wid(n: &str) -> WorkloadEndpointId {
        WorkloadEndpointId {
            orchestrator_id: "k8s".into(),
            workload_id: n.into(),
            endpoint_id: "eth0".into(),
        }
    }

    fn up(n: &str, status: &str) -> FromDataplane {
        FromDataplane {
            sequence_number: 0,
            payload: Some(Out::WorkloadEndpointStatusUpdate(
                WorkloadEndpointStatusUpdate {
                    id: Some(wid(n)),
                    status: Some(felix_api::EndpointStatus {
                        status: status.into(),
                    }),
                    endpoint: None,
                },
            )),
        }
    }

    fn gone(n: &str) -> FromDataplane {
        FromDataplane {
            sequence_number: 0,
            payload: Some(Out::WorkloadEndpointStatusRemove(
                WorkloadEndpointStatusRemove { id: Some(wid(n)) },
            )),
        }
    }

    fn in_sync() -> FromDataplane {
        FromDataplane {
            sequence_number: 0,
            payload: Some(Out::DataplaneInSync(DataplaneInSync {})),
        }
    }

    fn process(uptime: f64) -> FromDataplane {
        FromDataplane {
            sequence_number: 0,
            payload: Some(Out::ProcessStatusUpdate(ProcessStatusUpdate {
                iso_timestamp: String::new(),
                uptime,
            })),
        }
    }

    #[test]
    fn the_latest_status_of_an_endpoint_replaces_the_waiting_one_in_its_place() {
        let (tx, rx) = outbox();
        tx.push(in_sync());
        tx.push(up("a", "down"));
        tx.push(up("b", "up"));
        tx.push(process(1.0));
        tx.push(up("a", "up"));
        tx.push(gone("b"));
        tx.push(process(2.0));
        tx.push(in_sync());
        assert_eq!(
            rx.try_take(),
            vec![in_sync(), up("a", "up"), gone("b"), process(2.0), in_sync()]
        );
        assert_eq!(tx.coalesced(), 3);
        assert!(rx.try_take().is_empty());
    }

    #[test]
    fn a_reader_that_never_reads_holds_one_status_per_endpoint() {
        let (tx, rx) = outbox();
        for round in 0..50 {
            for n in 0..100 {
                tx.push(up(
                    &n.to_string(),
                    if round % 2 == 0 { "up" } else { "down" },
                ));
            }
        }
        let waiting = rx.try_take();
        assert_eq!(waiting.len(), 100);
        assert_eq!(waiting[7], up("7", "down"));
    }

    #[test]
    fn the_reader_ends_when_every_sender_is_gone_and_nothing_waits() {
        let (tx, rx) = outbox();
        let tx2 = tx.clone();
        let reader = std::thread::spawn(move || {
            let mut got = 0;
            while let Some(batch) = rx.blocking_take() {
                got += batch.len();
            }
            got
        });
        tx.push(up("a", "up"));
        drop(tx);
        tx2.push(up("b", "up"));
        drop(tx2);
        assert_eq!(reader.join().ok(), Some(2));
    }

    #[test]
    fn after_a_break_pushes_are_dropped() {
        let (tx, rx) = outbox();
        tx.push(up("a", "up"));
        rx.break_off();
        tx.push(up("b", "up"));
        assert!(rx.try_take().is_empty());
    }

    #[tokio::test]
    async fn an_async_reader_wakes_on_a_push() {
        let (tx, rx) = outbox();
        let reader = tokio::spawn(async move { rx.take().await });
        tokio::task::yield_now().await;
        tx.push(in_sync());
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .ok()
            .and_then(|r| r.ok())
            .flatten();
        assert_eq!(got, Some(vec![in_sync()]));
    }
}
