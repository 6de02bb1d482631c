//! The bodies of the fuzz targets, shared by the coverage-guided fuzzer (`fuzz/`, cargo-fuzz)
//! and the bounded, proptest-driven runs and corpus replays of the test suite
//! (`fuzz.rs`). Each takes arbitrary bytes and must neither panic nor allocate without a
//! bound; what it accepts must round-trip and render to objects the kernel can hold.
#![allow(dead_code)]

use std::io::Cursor;

use felix_api::frame::FrameReader;
use felix_api::{decode_to_dataplane, json, ToDataplane};
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft_rules::names::MAX_NAME_LEN;
use nf_tables::batch::Batch;
use nf_tables::diff;
use nf_tables::model::{Table, TablePatch};
use prost::Message as _;

/// The frame size limit the frame target reads with: big enough for real messages, small
/// enough that a fuzzer's input cannot make the reader allocate much.
pub const FRAME_LIMIT: u64 = 64 << 10;

/// One JSON line (the stream and socket transports): decodes or fails with a message; what
/// decodes survives its own encoding and is then fed to the dataplane.
pub fn json_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match json::decode::<ToDataplane>(text) {
        Ok(m) => {
            let again = serde_json::to_string(&m).expect("a decoded message encodes");
            let back: ToDataplane = json::decode(&again).expect("an encoded message decodes");
            assert_eq!(back, m, "JSON round trip of {text:?}");
            validate_render_encode(vec![m]);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// One protobuf envelope (fd 3's frame body).
pub fn proto_envelope(data: &[u8]) {
    if let Ok(m) = decode_to_dataplane(data) {
        let again = m.encode_to_vec();
        let back = decode_to_dataplane(&again).expect("an encoded envelope decodes");
        assert_eq!(back, m, "protobuf round trip");
        validate_render_encode(vec![m]);
    }
}

/// A byte stream on fd 3: frames are cut until the clean end or the first error; bodies are
/// decoded, and the messages that decode go to the dataplane together.
pub fn frame_stream(data: &[u8]) {
    let mut r = FrameReader::with_max_len(Cursor::new(data), FRAME_LIMIT);
    let mut msgs = Vec::new();
    let mut bytes = 0usize;
    loop {
        match r.read_frame() {
            Ok(Some(body)) => {
                bytes += 8 + body.len();
                assert!(bytes <= data.len(), "a frame longer than its stream");
                if let Ok(m) = decode_to_dataplane(&body) {
                    msgs.push(m);
                }
            }
            Ok(None) => break,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                break;
            }
        }
        if msgs.len() > 64 {
            break;
        }
    }
    validate_render_encode(msgs);
}

/// Messages through validation, the incremental renderer and our codec: every object the
/// dataplane renders for what it accepted has a name the kernel can hold and encodes.
pub fn validate_render_encode(msgs: Vec<ToDataplane>) {
    let mut cfg = DataplaneConfig::default();
    cfg.rules.log_prefix = "%t %k %n %p".into();
    let Ok(mut dp) = Dataplane::new(cfg, 1) else {
        return;
    };
    for m in &msgs {
        let _ = dp.on_update(m);
    }
    let mut tables: Vec<Table> = Vec::new();
    TablePatch::fold_all(dp.tables_patch(), &mut tables);
    let mut batch = Batch::new(1, None);
    for t in &tables {
        for (name, chain) in &t.chains {
            assert!(
                name.len() <= MAX_NAME_LEN && !name.contains('\0'),
                "chain {name:?}"
            );
            for r in &chain.rules {
                if let Some(c) = &r.comment {
                    assert!(c.len() <= 128 && !c.contains('\0'), "comment {c:?}");
                }
            }
        }
        for name in t.sets.keys() {
            assert!(
                name.len() <= MAX_NAME_LEN && !name.contains('\0'),
                "set {name:?}"
            );
        }
        diff::diff(t, None, false)
            .encode(&mut batch)
            .expect("what the renderer makes encodes");
    }
    let _ = batch.finish(true);
}
