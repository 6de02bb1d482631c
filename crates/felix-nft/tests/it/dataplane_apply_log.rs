//! The apply log line's end-to-end latency, alone in its test binary: tracing caches
//! whether a log call site is wanted for the whole process, so a subscriber scoped to one test
//! misses lines another test's thread reached first.

use felix_nft::dataplane::kernel::FakeKernel;

use crate::loop_common;
use loop_common::{driver, run_one_endpoint};

/// A `MakeWriter` that appends to a shared buffer (the loop's log lines, read back).
#[derive(Clone, Default)]
struct LogBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The value of `key=` in a logfmt-like line.
fn field(line: &str, key: &str) -> Option<f64> {
    let rest = line.split(&format!(" {key}=")).nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

#[tokio::test(start_paused = true)]
async fn the_apply_line_says_how_long_since_the_update_was_read() {
    // End to end in the daemon: from reading the line to the end of its apply,
    // which contains the whole apply. An apply no update asked for has no such field.
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut d = driver(FakeKernel::default());
    run_one_endpoint(&mut d).await.unwrap();
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let applies: Vec<&str> = text.lines().filter(|l| l.contains(" apply ")).collect();
    assert!(
        !applies.is_empty(),
        "no apply line in:\n{text}\ncalls: {:?}",
        d.kernel.calls
    );
    let first = applies[0];
    let since = field(first, "since_read_ms").unwrap_or_else(|| panic!("{first}"));
    let duration = field(first, "duration_ms").unwrap_or_else(|| panic!("{first}"));
    assert!(since >= duration, "{first}");
    assert!(
        applies[1..]
            .iter()
            .all(|l| field(l, "since_read_ms").is_none()),
        "{applies:?}"
    );
}
