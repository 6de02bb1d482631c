//! The integration tests of `felix-api`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

mod proto_json;
mod proto_protoc;
mod proto_roundtrip;
mod proto_schema;
