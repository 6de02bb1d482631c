//! Log output as a log pipeline sees it: one JSON object per line with the stable keys, Felix's
//! severities on screen and file separately, `none` for no file, dependencies held at INFO,
//! and `init_logging` usable once per process.

use std::io::Write;
use std::sync::{Arc, Mutex};

use felix_nft::config::{Config, LogLevel};
use felix_nft::ops::logfmt::{self, LogFormat, LogSettings};
use serde_json::Value;
use tracing::level_filters::LevelFilter;

/// A `MakeWriter` that appends to a shared buffer.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
    fn json_lines(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
    /// The `message` field of every JSON line.
    fn messages(&self) -> Vec<Value> {
        self.json_lines()
            .iter()
            .map(|r| r["message"].clone())
            .collect()
    }
}

fn settings(format: LogFormat, screen: LevelFilter) -> LogSettings {
    LogSettings {
        format,
        screen,
        ansi: false,
        file: None,
    }
}

fn capture(s: &LogSettings, f: impl FnOnce()) -> Buf {
    let buf = Buf::default();
    let w = buf.clone();
    let (dispatch, err) = logfmt::build(s, move || w.clone());
    assert!(err.is_none(), "{err:?}");
    tracing::dispatcher::with_default(&dispatch, f);
    buf
}

#[test]
fn json_is_one_object_per_line_with_stable_keys() {
    let buf = capture(&settings(LogFormat::Json, LevelFilter::INFO), || {
        let span = tracing::info_span!("apply", apply_id = 7_u64);
        let _g = span.enter();
        tracing::info!(
            ifname = "cali12345",
            chain = "filter-cali-tw-cali12345",
            family = "ip",
            objects_changed = 3_u64,
            "programmed endpoint"
        );
        tracing::warn!(error = "first line\nsecond line", "apply failed");
    });
    let lines = buf.json_lines();
    assert_eq!(lines.len(), 2, "{}", buf.text());

    let rec = &lines[0];
    assert_eq!(rec["level"], "INFO");
    assert_eq!(rec["message"], "programmed endpoint");
    assert_eq!(rec["ifname"], "cali12345");
    assert_eq!(rec["chain"], "filter-cali-tw-cali12345");
    assert_eq!(rec["family"], "ip");
    assert_eq!(rec["objects_changed"], 3);
    assert_eq!(rec["target"], "it::ops_logging");
    assert_eq!(rec["span"]["name"], "apply");
    assert_eq!(rec["span"]["apply_id"], 7);
    let ts = rec["timestamp"].as_str().unwrap();
    assert!(
        ts.len() >= 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
        "{ts}"
    );

    // A newline inside a field stays inside the record.
    assert_eq!(lines[1]["level"], "WARN");
    assert_eq!(lines[1]["error"], "first line\nsecond line");
}

#[test]
fn text_is_one_line_per_record() {
    let buf = capture(&settings(LogFormat::Text, LevelFilter::INFO), || {
        tracing::info!(ifname = "cali1", "hello");
    });
    let text = buf.text();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("INFO") && text.contains("hello") && text.contains("ifname=\"cali1\""));
    assert!(
        !text.contains('\u{1b}'),
        "no colour when not a terminal: {text:?}"
    );
}

#[test]
fn screen_severity_filters() {
    let c = Config {
        log_severity_screen: LogLevel::Warning,
        log_file_path: None,
        ..Config::default()
    };
    let mut s = LogSettings::from_config(&c, Some("json")).unwrap();
    s.ansi = false;
    let buf = capture(&s, || {
        tracing::info!("hidden");
        tracing::warn!("shown");
        tracing::error!("shown too");
    });
    let msgs = buf.messages();
    assert_eq!(msgs, ["shown", "shown too"]);
}

#[test]
fn dependencies_stay_at_info_when_we_debug() {
    let buf = capture(&settings(LogFormat::Json, LevelFilter::DEBUG), || {
        tracing::debug!(target: "netlink_proto::connection", "noise");
        tracing::info!(target: "netlink_proto::connection", "dependency info");
        tracing::debug!(target: "felix_nft::dataplane", "our detail");
    });
    let msgs = buf.messages();
    assert_eq!(msgs, ["dependency info", "our detail"]);
}

#[test]
fn file_gets_its_own_severity() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/felix.log");
    let c = Config {
        log_severity_screen: LogLevel::Info,
        log_severity_file: LogLevel::Debug,
        log_file_path: Some(path.display().to_string()),
        ..Config::default()
    };
    let mut s = LogSettings::from_config(&c, Some("json")).unwrap();
    s.ansi = false;
    let screen = capture(&s, || {
        tracing::debug!(target: "felix_nft::ops", "debug detail");
        tracing::info!(target: "felix_nft::ops", "summary");
    });
    let on_screen = screen.messages();
    assert_eq!(on_screen, ["summary"]);
    let file = std::fs::read_to_string(&path).unwrap();
    let in_file: Vec<Value> = file
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["message"].clone())
        .collect();
    assert_eq!(in_file, ["debug detail", "summary"]);
}

#[test]
fn unopenable_file_falls_back_to_the_screen() {
    let s = LogSettings {
        file: Some(("/proc/felix-nft-no/such.log".into(), LevelFilter::INFO)),
        ..settings(LogFormat::Text, LevelFilter::INFO)
    };
    let buf = Buf::default();
    let w = buf.clone();
    let (dispatch, err) = logfmt::build(&s, move || w.clone());
    let err = err.expect("the file cannot be opened");
    assert!(
        err.to_string().contains("/proc/felix-nft-no/such.log"),
        "{err}"
    );
    tracing::dispatcher::with_default(&dispatch, || tracing::info!("still here"));
    assert!(buf.text().contains("still here"));
}

#[test]
fn bad_format_is_refused() {
    let err = LogSettings::from_config(&Config::default(), Some("xml")).unwrap_err();
    assert!(err.to_string().contains("FELIX_NFT_LOG_FORMAT"), "{err}");
}

#[test]
fn init_logging_works_once() {
    // Logging is set up once per process, and other suites of this binary set it up.
    if !testkit::in_own_process("ops_logging::init_logging_works_once") {
        return;
    }
    let c = Config {
        log_file_path: None,
        ..Config::default()
    };
    logfmt::init_logging(&c).expect("first call sets up logging");
    let again = logfmt::init_logging(&c).unwrap_err();
    assert!(
        matches!(again, logfmt::LogError::AlreadyInitialised(_)),
        "{again:?}"
    );
}

#[test]
fn the_format_variable_is_not_a_config_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("felix.cfg");
    std::fs::write(&cfg, "").unwrap();
    let resolved = felix_nft::config::load(&felix_nft::config::LoadInputs {
        config_file: Some(cfg),
        env: vec![
            (logfmt::LOG_FORMAT_ENV.into(), "json".into()),
            ("FELIX_LOGSEVERITYSCREEN".into(), "DEBUG".into()),
        ],
    })
    .unwrap();
    assert!(resolved.unknown.is_empty(), "{:?}", resolved.unknown);
    assert!(resolved.warnings().is_empty(), "{:?}", resolved.warnings());
    assert_eq!(resolved.config.log_severity_screen, LogLevel::Debug);
}
