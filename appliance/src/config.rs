//! The daemon's configuration: one struct read from the command line, `AIRLOCK_*` environment
//! variables and an optional TOML file underneath, validated once at start-up.
//!
//! Precedence: command line > environment > TOML file > built-in default. Every field is an
//! `Option` so that layering can tell "not given" from "given the default"; the accessors apply
//! the defaults. Unknown keys in the file are errors (`deny_unknown_fields`). Secrets are
//! redacted in `Debug`. There are no network defaults: the daemon binds loopback and reads local
//! paths only.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default bind address (loopback only).
pub const DEFAULT_BIND: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Default TCP port.
pub const DEFAULT_PORT: u16 = 8080;
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "./airlock-data";
/// Default body limit for ordinary endpoints (1 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;
/// Default body limit for document uploads and IAM syncs (32 MiB).
pub const DEFAULT_UPLOAD_LIMIT: usize = 32 << 20;

/// Errors found while loading or validating the configuration (user mistakes, exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The TOML file is malformed or has unknown keys.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A value is out of its allowed range.
    #[error("invalid setting `{field}`: {reason}")]
    Invalid {
        /// The setting's name as written in the TOML file.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// Everything `airlock serve` can be told.
///
/// Fields are named identically in TOML (snake_case), on the command line (`--kebab-case`) and
/// in the environment (`AIRLOCK_UPPER_CASE`).
#[derive(Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// TOML configuration file (its settings sit below flags and environment variables).
    #[arg(long = "config", env = "AIRLOCK_CONFIG")]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,

    /// The appliance's data directory [default: ./airlock-data].
    #[arg(long = "data", env = "AIRLOCK_DATA")]
    pub data: Option<PathBuf>,

    /// Address to bind [default: 127.0.0.1].
    #[arg(long, env = "AIRLOCK_BIND")]
    pub bind: Option<IpAddr>,

    /// TCP port [default: 8080].
    #[arg(long, env = "AIRLOCK_PORT")]
    pub port: Option<u16>,

    /// Trusted keyring for bundle verification [default: the data dir's pinned keyring].
    #[arg(long, env = "AIRLOCK_KEYRING")]
    pub keyring: Option<PathBuf>,

    /// Body limit in bytes for ordinary endpoints [default: 1 MiB].
    #[arg(long, env = "AIRLOCK_BODY_LIMIT")]
    pub body_limit: Option<usize>,

    /// Body limit in bytes for document uploads and IAM syncs [default: 32 MiB].
    #[arg(long, env = "AIRLOCK_UPLOAD_LIMIT")]
    pub upload_limit: Option<usize>,

    /// Seconds a non-streaming request may take [default: 120].
    #[arg(long, env = "AIRLOCK_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,

    /// Seconds a stream may stay silent between two chunks before it is ended [default: 60].
    #[arg(long, env = "AIRLOCK_STREAM_IDLE_TIMEOUT_SECS")]
    pub stream_idle_timeout_secs: Option<u64>,

    /// Seconds a shutdown waits for in-flight requests and streams to finish [default: 30].
    #[arg(long, env = "AIRLOCK_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,

    /// Default number of chunks placed in a chat prompt [default: 6].
    #[arg(long, env = "AIRLOCK_TOP_K")]
    pub top_k: Option<usize>,

    /// Default `max_tokens` of a chat completion [default: 256].
    #[arg(long, env = "AIRLOCK_MAX_TOKENS")]
    pub max_tokens: Option<u32>,

    /// Trusted-header mode: the header an SSO proxy sets to the authenticated user id. Off
    /// unless set; requires `trusted_header_secret`.
    #[arg(long, env = "AIRLOCK_TRUSTED_HEADER")]
    pub trusted_header: Option<String>,

    /// Shared secret the SSO proxy sends in `X-Airlock-Proxy-Secret`; requests in trusted-header
    /// mode without it are refused.
    #[arg(long, env = "AIRLOCK_TRUSTED_HEADER_SECRET", hide_env_values = true)]
    pub trusted_header_secret: Option<String>,

    /// Log format: `text` or `json` [default: text].
    #[arg(long, env = "AIRLOCK_LOG_FORMAT")]
    pub log_format: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("config_file", &self.config_file)
            .field("data", &self.data)
            .field("bind", &self.bind)
            .field("port", &self.port)
            .field("keyring", &self.keyring)
            .field("body_limit", &self.body_limit)
            .field("upload_limit", &self.upload_limit)
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("stream_idle_timeout_secs", &self.stream_idle_timeout_secs)
            .field("shutdown_grace_secs", &self.shutdown_grace_secs)
            .field("top_k", &self.top_k)
            .field("max_tokens", &self.max_tokens)
            .field("trusted_header", &self.trusted_header)
            .field(
                "trusted_header_secret",
                &self.trusted_header_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("log_format", &self.log_format)
            .finish()
    }
}

impl Config {
    /// Parses a TOML document (unknown keys are errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
    }

    /// Reads the TOML file named by `config_file` (if any), layers `self` over it and validates
    /// the result.
    pub fn load(self) -> Result<Self, ConfigError> {
        let merged = match &self.config_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                let file = Self::from_toml(&text, path)?;
                self.over(file)
            }
            None => self,
        };
        merged.validate()?;
        Ok(merged)
    }

    /// `self` with every unset field taken from `lower`.
    pub fn over(self, lower: Config) -> Config {
        Config {
            config_file: self.config_file.or(lower.config_file),
            data: self.data.or(lower.data),
            bind: self.bind.or(lower.bind),
            port: self.port.or(lower.port),
            keyring: self.keyring.or(lower.keyring),
            body_limit: self.body_limit.or(lower.body_limit),
            upload_limit: self.upload_limit.or(lower.upload_limit),
            request_timeout_secs: self.request_timeout_secs.or(lower.request_timeout_secs),
            stream_idle_timeout_secs: self
                .stream_idle_timeout_secs
                .or(lower.stream_idle_timeout_secs),
            shutdown_grace_secs: self.shutdown_grace_secs.or(lower.shutdown_grace_secs),
            top_k: self.top_k.or(lower.top_k),
            max_tokens: self.max_tokens.or(lower.max_tokens),
            trusted_header: self.trusted_header.or(lower.trusted_header),
            trusted_header_secret: self.trusted_header_secret.or(lower.trusted_header_secret),
            log_format: self.log_format.or(lower.log_format),
        }
    }

    /// Checks every range and combination; called by [`Config::load`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
            ConfigError::Invalid {
                field,
                reason: reason.into(),
            }
        }
        if self.body_limit() < 1024 {
            return Err(invalid("body_limit", "must be at least 1024 bytes"));
        }
        if self.upload_limit() < self.body_limit() {
            return Err(invalid("upload_limit", "must be at least body_limit"));
        }
        if self.upload_limit() > 1 << 30 {
            return Err(invalid("upload_limit", "must be at most 1 GiB"));
        }
        for (field, v) in [
            ("request_timeout_secs", self.request_timeout_secs),
            ("stream_idle_timeout_secs", self.stream_idle_timeout_secs),
            ("shutdown_grace_secs", self.shutdown_grace_secs),
        ] {
            if v == Some(0) {
                return Err(invalid(field, "must be at least 1 second"));
            }
        }
        if !(1..=64).contains(&self.top_k()) {
            return Err(invalid("top_k", "must be between 1 and 64"));
        }
        if !(1..=8192).contains(&self.max_tokens()) {
            return Err(invalid("max_tokens", "must be between 1 and 8192"));
        }
        match (&self.trusted_header, &self.trusted_header_secret) {
            (Some(h), Some(s)) => {
                if axum::http::HeaderName::try_from(h.as_str()).is_err() {
                    return Err(invalid("trusted_header", "not a valid HTTP header name"));
                }
                if s.len() < 16 {
                    return Err(invalid(
                        "trusted_header_secret",
                        "must be at least 16 characters",
                    ));
                }
            }
            (Some(_), None) => {
                return Err(invalid(
                    "trusted_header_secret",
                    "required when trusted_header is set",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "trusted_header",
                    "trusted_header_secret is set but trusted-header mode is off",
                ));
            }
            (None, None) => {}
        }
        match self.log_format.as_deref() {
            None | Some("text") | Some("json") => {}
            Some(other) => {
                return Err(invalid(
                    "log_format",
                    format!("`{other}` is not `text` or `json`"),
                ));
            }
        }
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// The socket address to bind.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(
            self.bind.unwrap_or(DEFAULT_BIND),
            self.port.unwrap_or(DEFAULT_PORT),
        )
    }

    /// Body limit for ordinary endpoints.
    pub fn body_limit(&self) -> usize {
        self.body_limit.unwrap_or(DEFAULT_BODY_LIMIT)
    }

    /// Body limit for document uploads and IAM syncs.
    pub fn upload_limit(&self) -> usize {
        self.upload_limit.unwrap_or(DEFAULT_UPLOAD_LIMIT)
    }

    /// Time limit of a non-streaming request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs.unwrap_or(120))
    }

    /// Longest silence between two chunks of a stream.
    pub fn stream_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.stream_idle_timeout_secs.unwrap_or(60))
    }

    /// How long a shutdown waits for in-flight work.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs.unwrap_or(30))
    }

    /// Default number of prompt chunks.
    pub fn top_k(&self) -> usize {
        self.top_k.unwrap_or(6)
    }

    /// Default completion length.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(256)
    }

    /// Whether logs are JSON lines.
    pub fn json_logs(&self) -> bool {
        self.log_format.as_deref() == Some("json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_loopback_and_local() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.addr().to_string(), "127.0.0.1:8080");
        assert_eq!(c.data_dir(), PathBuf::from("./airlock-data"));
        assert_eq!(c.body_limit(), 1 << 20);
        assert_eq!(c.upload_limit(), 32 << 20);
    }

    #[test]
    fn toml_rejects_unknown_keys() {
        let err = Config::from_toml("port = 9000\nprot = 1\n", Path::new("a.toml")).unwrap_err();
        assert!(err.to_string().contains("prot"), "{err}");
    }

    #[test]
    fn flags_override_file() {
        let file =
            Config::from_toml("port = 9000\nbind = \"0.0.0.0\"\n", Path::new("a.toml")).unwrap();
        let cli = Config {
            port: Some(9100),
            ..Config::default()
        };
        let c = cli.over(file);
        assert_eq!(c.addr().to_string(), "0.0.0.0:9100");
    }

    #[test]
    fn secrets_are_redacted() {
        let c = Config {
            trusted_header: Some("X-Remote-User".into()),
            trusted_header_secret: Some("very-secret-proxy-value".into()),
            ..Config::default()
        };
        c.validate().unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("very-secret"), "{dbg}");
        assert!(dbg.contains("[redacted]"));
    }

    #[test]
    fn validation_refuses_bad_values() {
        let cases = [
            Config {
                body_limit: Some(10),
                ..Config::default()
            },
            Config {
                upload_limit: Some(1024),
                body_limit: Some(4096),
                ..Config::default()
            },
            Config {
                stream_idle_timeout_secs: Some(0),
                ..Config::default()
            },
            Config {
                trusted_header: Some("X-User".into()),
                ..Config::default()
            },
            Config {
                trusted_header_secret: Some("0123456789abcdef".into()),
                ..Config::default()
            },
            Config {
                log_format: Some("xml".into()),
                ..Config::default()
            },
            Config {
                top_k: Some(0),
                ..Config::default()
            },
        ];
        for c in cases {
            assert!(c.validate().is_err(), "{c:?} should be refused");
        }
    }
}
