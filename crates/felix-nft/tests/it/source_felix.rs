//! The fd 3 transport keeps Felix's back-pressure (§1.2): while the consumer does not
//! take messages, the reader stops reading once the bounded channel is full, so Felix's writes
//! block instead of piling up in our memory.

use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use felix_api::frame::{encode_frame, MAX_FRAME_LEN};
use felix_api::{to_dataplane, IpSetUpdate, ToDataplane};
use felix_nft::source::felix::spawn_reader;
use felix_nft::source::CHANNEL_CAPACITY;

/// A reader over `data` that counts how many bytes have been taken from it.
struct Counting {
    data: Vec<u8>,
    pos: usize,
    taken: Arc<AtomicUsize>,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        self.taken.fetch_add(n, Ordering::SeqCst);
        Ok(n)
    }
}

#[test]
fn reader_stops_reading_while_the_channel_is_full() {
    let frames = 3 * CHANNEL_CAPACITY;
    let mut data = Vec::new();
    let mut frame_len = 0;
    for seq in 0..frames as u64 {
        let f = encode_frame(&ToDataplane {
            sequence_number: seq,
            payload: Some(to_dataplane::Payload::IpsetUpdate(IpSetUpdate {
                id: "s:x".into(),
                members: vec!["10.0.0.0/24".into(); 64],
                r#type: 2,
            })),
        });
        frame_len = f.len();
        data.extend(f);
    }
    let total = data.len();
    let taken = Arc::new(AtomicUsize::new(0));
    let (mut rx, handle) = spawn_reader(
        Counting {
            data,
            pos: 0,
            taken: taken.clone(),
        },
        MAX_FRAME_LEN,
    )
    .unwrap();

    // Let the reader run until it blocks on the full channel.
    let mut last = usize::MAX;
    while taken.load(Ordering::SeqCst) != last {
        last = taken.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
    }
    // At most a full channel, the frame waiting to go in, and one read-ahead buffer (64 KiB).
    let bound = (CHANNEL_CAPACITY + 1) * frame_len + 64 * 1024;
    assert!(
        last <= bound,
        "read {last} of {total} bytes with nobody consuming (bound {bound})"
    );
    assert!(last < total);

    // Consuming lets everything through, in order.
    for seq in 0..frames as u64 {
        let u = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(u.message.sequence_number, seq);
    }
    assert!(rx.blocking_recv().is_none());
    assert_eq!(handle.join().unwrap().unwrap().frames, frames as u64);
    assert_eq!(taken.load(Ordering::SeqCst), total);
}
