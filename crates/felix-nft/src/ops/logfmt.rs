//! Log output: Felix's severity parameters (§3.2) on `tracing`, as text or one-line
//! JSON.
//!
//! - `LogSeverityScreen` → stderr, `LogSeverityFile` → `LogFilePath` (`none` = no file).
//!   Felix's levels map to tracing's; `WARNING` is `WARN`, and `FATAL`, which tracing lacks,
//!   keeps only `ERROR`. `LogSeveritySys` is not acted on: there is no syslog output.
//! - The level applies to felix-nft's own events; dependencies (netlink crates, via the `log`
//!   bridge) are held at `INFO` or quieter so `DEBUG` stays readable.
//! - The format is chosen by the environment variable [`LOG_FORMAT_ENV`] (`text`, the default,
//!   or `json`) and applies to both outputs.
//!
//! JSON records are one object per line with these keys — API for log pipelines, do not
//! rename: `timestamp` (RFC 3339, UTC), `level` (`TRACE`…`ERROR`), `message`, `target`, the
//! event's own fields at top level under their snake_case names (`ifname`, `chain`, `family`,
//! …), and `span` (`{"name": …, <span fields>}`) when the event happened inside one.
//!
//! Logging is set up once per process, with no reload: Felix restarts on a logging change.
//!
//! The log file is created with mode 0640 (owner and group read it; it names policies,
//! endpoints and addresses) and opened for appending; it is never rotated by felix-nft. Rotate
//! it with logrotate's `copytruncate`: writes in append mode go to the end of the truncated file.
//! Every value from input is cut to a bounded length before it reaches a message (see
//! [`felix_api::clip`]).

use std::fs::{File, OpenOptions};
use std::io::IsTerminal as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::Dispatch;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Registry;

use crate::config::{Config, LogLevel};

/// The environment variable that selects the log format: `text` or `json`.
pub const LOG_FORMAT_ENV: &str = "FELIX_NFT_LOG_FORMAT";

/// What can go wrong setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{LOG_FORMAT_ENV}={value:?} is not a log format (expected text or json)")]
    BadFormat { value: String },
    #[error("opening log file {path}")]
    OpenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("logging is already set up for this process")]
    AlreadyInitialised(#[source] tracing_subscriber::util::TryInitError),
}

/// How records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per record.
    #[default]
    Text,
    /// One JSON object per line (keys: see the module docs).
    Json,
}

impl FromStr for LogFormat {
    type Err = LogError;
    fn from_str(s: &str) -> Result<Self, LogError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(LogError::BadFormat {
                value: s.to_string(),
            }),
        }
    }
}

/// Felix's severity → the most verbose tracing level shown.
pub fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Trace => LevelFilter::TRACE,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Warning => LevelFilter::WARN,
        // tracing has no level above ERROR.
        LogLevel::Error | LogLevel::Fatal => LevelFilter::ERROR,
    }
}

/// Everything [`init_logging`] decides, separated from the process so tests can build it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub format: LogFormat,
    /// Level on the screen (stderr).
    pub screen: LevelFilter,
    /// Colour on the screen (text format only).
    pub ansi: bool,
    /// Log file and its level; `None` when `LogFilePath` is `none`.
    pub file: Option<(PathBuf, LevelFilter)>,
}

impl LogSettings {
    /// From the config and the value of [`LOG_FORMAT_ENV`] (if set).
    pub fn from_config(config: &Config, format: Option<&str>) -> Result<Self, LogError> {
        Ok(LogSettings {
            format: format
                .map(LogFormat::from_str)
                .transpose()?
                .unwrap_or_default(),
            screen: level_filter(config.log_severity_screen),
            ansi: std::io::stderr().is_terminal(),
            file: config
                .log_file_path
                .as_ref()
                .filter(|p| !p.eq_ignore_ascii_case("none"))
                .map(|p| (PathBuf::from(p), level_filter(config.log_severity_file))),
        })
    }
}

/// The agent and the crates of its layers, by the name their events carry as target: ours,
/// logged at the configured level.
const OUR_CRATES: [&str; 6] = [
    env!("CARGO_CRATE_NAME"),
    "nf_tables",
    "rtnl",
    "felix_api",
    "felix_nft_rules",
    "netlink_wire",
];

/// Our events at `level`; everyone else's at `level` but never more verbose than INFO.
fn targets(level: LevelFilter) -> Targets {
    OUR_CRATES
        .iter()
        .fold(Targets::new(), |t, krate| t.with_target(*krate, level))
        .with_default(level.min(LevelFilter::INFO))
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

fn output<W>(format: LogFormat, ansi: bool, writer: W, level: LevelFilter) -> BoxedLayer
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        LogFormat::Text => base.with_ansi(ansi).with_filter(targets(level)).boxed(),
        LogFormat::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(targets(level))
            .boxed(),
    }
}

fn open_log_file(path: &Path) -> Result<File, LogError> {
    let open = || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
    };
    open().map_err(|source| LogError::OpenFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The dispatcher for `settings`, writing the screen output to `screen`. The second value is
/// the error opening the log file, if that failed (the dispatcher then logs to the screen
/// only).
pub fn build<W>(settings: &LogSettings, screen: W) -> (Dispatch, Option<LogError>)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let mut layers: Vec<BoxedLayer> = vec![output(
        settings.format,
        settings.ansi,
        screen,
        settings.screen,
    )];
    let mut file_error = None;
    if let Some((path, level)) = &settings.file {
        match open_log_file(path) {
            Ok(f) => layers.push(output(settings.format, false, Mutex::new(f), *level)),
            Err(e) => file_error = Some(e),
        }
    }
    (Dispatch::new(Registry::default().with(layers)), file_error)
}

/// Sets up this process's logging from the config and [`LOG_FORMAT_ENV`]. Call once, early;
/// a second call fails with [`LogError::AlreadyInitialised`].
///
/// If the log file cannot be opened, logging goes on to the screen and the failure is logged
/// there as an error: unlike Felix, which stops, because `apply` or `plan` from a shell should
/// not need a writable `/var/log`.
pub fn init_logging(config: &Config) -> Result<(), LogError> {
    let format = std::env::var(LOG_FORMAT_ENV).ok();
    let settings = LogSettings::from_config(config, format.as_deref())?;
    let (dispatch, file_error) = build(&settings, std::io::stderr);
    dispatch.try_init().map_err(LogError::AlreadyInitialised)?;
    if let Some(e) = file_error {
        tracing::error!(error = %e, cause = %std::error::Error::source(&e)
            .map(ToString::to_string).unwrap_or_default(),
            "log file unavailable; logging to the screen only");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn felix_levels_map() {
        assert_eq!(level_filter(LogLevel::Warning), LevelFilter::WARN);
        assert_eq!(level_filter(LogLevel::Fatal), LevelFilter::ERROR);
        assert_eq!(level_filter(LogLevel::Trace), LevelFilter::TRACE);
    }

    #[test]
    fn format_parses() {
        assert_eq!("JSON".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        assert!("yaml".parse::<LogFormat>().is_err());
    }

    #[test]
    fn the_log_file_is_not_world_readable() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("felix.log");
        open_log_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        // 0640 under the usual umask; a stricter umask only takes bits away.
        assert_eq!(mode & !0o640, 0, "mode {mode:o}");
    }

    #[test]
    fn none_disables_the_file() {
        let mut c = Config {
            log_file_path: Some("none".into()),
            ..Config::default()
        };
        assert_eq!(LogSettings::from_config(&c, None).unwrap().file, None);
        c.log_file_path = None;
        assert_eq!(LogSettings::from_config(&c, None).unwrap().file, None);
        c.log_file_path = Some("/tmp/x.log".into());
        c.log_severity_file = LogLevel::Debug;
        let s = LogSettings::from_config(&c, Some("json")).unwrap();
        assert_eq!(
            s.file,
            Some((PathBuf::from("/tmp/x.log"), LevelFilter::DEBUG))
        );
        assert_eq!(s.format, LogFormat::Json);
    }
}
