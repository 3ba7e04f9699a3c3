//! `airlock serve`: verify the installed bundle, open the stores, serve the API until SIGINT or
//! SIGTERM, then drain in-flight requests up to the configured deadline. With `[tls]` it serves
//! HTTPS and reloads the certificate files on SIGHUP.

use anyhow::Context;

use crate::config::Config;
use crate::server::{self, Drained};
use crate::startup;
use crate::state::AppState;

/// Arguments of `airlock serve` (every setting also reads `AIRLOCK_*` and the `--config` TOML).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Settings.
    #[command(flatten)]
    pub config: Config,
}

/// The log filter without `AIRLOCK_LOG`: the libraries' own INFO lines (hnsw_rs per graph
/// dump, tantivy per merge) are noise in an operator's terminal.
pub const DEFAULT_LOG_FILTER: &str = "info,hnsw_rs=warn,tantivy=warn";

/// Installs the log subscriber (the only place in the workspace that does).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Runs the daemon.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.config.load()?;
    init_tracing(config.json_logs());
    // One writer per data directory (airlock_platform::data_lock), held until the process ends.
    let _lock = airlock_platform::data_lock::DataLock::serve(&config.data_dir())?;
    // The SIEM file must be writable before anything else happens (it is attached to the
    // audit log once the ACL is open).
    if let Some(sink) = &config.audit_sink {
        airlock_evidence::audit_sink::FileSink::open(sink)
            .context("refusing to start: [audit_sink]")?;
    }
    tracing::info!(config = ?config, "starting");
    // OIDC discovery first (it names the token and JWKS endpoints the lockdown must allow),
    // still on this one thread.
    let oidc = discover_oidc(&config)?;
    // Egress lockdown while the process is still single-threaded: the runtime, the engine
    // threads and the ladder thread created below inherit it.
    lock_down_with(&config, &egress_ports(&config, oidc.as_deref()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("airlock-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config, oidc))
}

/// `[oidc]`: discovery and the JWKS, fetched on the calling thread without starting one (so
/// before the egress lockdown); a provider that cannot be discovered stops the start.
pub(crate) fn discover_oidc(
    config: &Config,
) -> anyhow::Result<Option<std::sync::Arc<airlock_identity::oidc::Oidc>>> {
    let Some(cfg) = config.oidc.clone() else {
        return Ok(None);
    };
    let issuer = cfg.issuer.clone();
    let oidc = airlock_identity::oidc::Oidc::discover_blocking(cfg)
        .with_context(|| format!("refusing to start: OIDC discovery at {issuer} failed"))?;
    Ok(Some(std::sync::Arc::new(oidc)))
}

/// Every TCP port the daemon dials (the lockdown's allowlist; docs/operations/capacity.md "What the box
/// talks to"): the rack's replicas ([`rack_ports`]), the `[ldap]` directory's, the OIDC
/// provider's issuer, token and JWKS endpoints, and each `[[connectors]]` source's file server
/// and domain controller.
pub(crate) fn egress_ports(
    config: &Config,
    oidc: Option<&airlock_identity::oidc::Oidc>,
) -> Vec<u16> {
    let mut ports = rack_ports(config);
    ports.extend(
        config
            .ldap
            .as_ref()
            .and_then(airlock_identity::ldap::LdapConfig::endpoint)
            .map(|(_, port)| port),
    );
    if let Some(o) = oidc {
        ports.extend(o.endpoints().into_iter().map(|(_, port)| port));
    }
    ports.extend(
        config
            .connectors
            .iter()
            .flat_map(crate::connectors::ConnectorConfig::endpoints)
            .map(|(_, port)| port),
    );
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Applies the egress lockdown to the calling thread and every thread it starts afterwards, as
/// configured: refuses to start when `require_sandbox` is set and the kernel cannot enforce it,
/// otherwise warns and goes on.
pub(crate) fn lock_down(config: &Config) -> anyhow::Result<()> {
    // Outbound TCP only to the inference rack's and the directory's ports (their host:port
    // pairs are the only addresses the daemon dials; OIDC is discovered in `run`).
    lock_down_with(config, &egress_ports(config, None))
}

/// [`lock_down`] with outbound TCP allowed to `ports`.
fn lock_down_with(config: &Config, ports: &[u16]) -> anyhow::Result<()> {
    // The `[audit_sink]` file's directory stays writable (rotation renames and creates there).
    let sink_dir = config
        .audit_sink
        .as_ref()
        .and_then(|s| s.path.parent().map(std::path::Path::to_path_buf))
        .map(|d| {
            if d.as_os_str().is_empty() {
                ".".into()
            } else {
                d
            }
        });
    let also: Vec<&std::path::Path> = sink_dir.iter().map(std::path::PathBuf::as_path).collect();
    match airlock_platform::sandbox::lock_down_daemon_writing(
        &config.data_dir(),
        &also,
        ports,
        config.require_sandbox(),
    ) {
        Ok(_) => Ok(()),
        // Other threads would escape the lockdown: a start-up ordering bug, fatal either way.
        Err(e @ airlock_platform::sandbox::SandboxError::NotSingleThreaded { .. }) => {
            Err(anyhow::Error::new(e).context("refusing to start"))
        }
        Err(e) if config.require_sandbox() => {
            Err(anyhow::Error::new(e).context("refusing to start (require_sandbox = true)"))
        }
        Err(e) => {
            tracing::warn!(error = %e, "egress lockdown not applied");
            Ok(())
        }
    }
}

/// The TCP ports of the configured remote generators' replicas (the lockdown's allowlist).
pub(crate) fn rack_ports(config: &Config) -> Vec<u16> {
    let mut ports: Vec<u16> = config
        .remote_generators
        .iter()
        .flat_map(airlock_serving::remote::RemoteGenerator::endpoints)
        .map(|(_, port)| port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// `[[connectors]]`: opens their state in `data_dir` and starts one sync task per source on the
/// current runtime (crate::connectors); the daemon must be ready. Nothing when none is
/// configured.
pub fn start_connectors(state: &AppState, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let config = state.config();
    if config.connectors.is_empty() {
        return Ok(());
    }
    let services = state
        .services()
        .map_err(|_| anyhow::anyhow!("the daemon is not ready"))?;
    let connectors = crate::connectors::Connectors::open(
        data_dir,
        &config.connectors,
        state.metrics().connectors.clone(),
    )?;
    let connectors = std::sync::Arc::new(connectors);
    connectors.spawn(
        services,
        crate::connectors::SyncLimits {
            extract: config.extract_limits(),
        },
    );
    state.set_connectors(connectors);
    Ok(())
}

async fn serve(
    config: Config,
    oidc: Option<std::sync::Arc<airlock_identity::oidc::Oidc>>,
) -> anyhow::Result<()> {
    let addr = config.addr();
    let grace = config.shutdown_grace();
    let tls = if config.tls.enabled() {
        let tls = crate::tls::TlsServer::load(&config.tls).context("refusing to start")?;
        let tls = std::sync::Arc::new(tls);
        #[cfg(unix)]
        tokio::spawn(crate::tls::reload_on_hangup(tls.clone()).context("listening for SIGHUP")?);
        Some(tls)
    } else {
        None
    };
    let listener = server::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(%addr, scheme, "listening (not ready until start-up completes)");
    let state = AppState::starting(config.clone());
    if let Some(o) = oidc {
        state.set_oidc(o);
    }
    // systemd `Type=notify` (packaging/airlock.service): READY=1 once ready, WATCHDOG=1 from
    // the runtime, STOPPING=1 on drain.
    let notifier = airlock_platform::notify::Notifier::from_env().map(std::sync::Arc::new);
    if let Some(n) = &notifier {
        n.send("STATUS=verifying the bundle and loading models");
        if let Some(every) = airlock_platform::notify::watchdog_interval() {
            tokio::spawn(airlock_platform::notify::watchdog(n.clone(), every));
        }
    }
    let ready_notifier = notifier.clone();

    // Start-up runs beside the listener so /healthz answers while models load.
    let loader_state = state.clone();
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<anyhow::Error>();
    tokio::spawn(async move {
        let opened = tokio::task::spawn_blocking(move || startup::open(&config)).await;
        match opened {
            Ok(Ok(services)) => {
                loader_state.set_services(services);
                // Corpora queued in DATA/ingest-queue/ ingest beside serving.
                if let Ok(services) = loader_state.services() {
                    let data = loader_state.config().data_dir();
                    let status = loader_state.indexing().clone();
                    // Folder jobs (the demo's real documents) as `airlock ingest DIR` runs them.
                    let folders = super::ingest_dir::folder_ingest(loader_state.config());
                    if let Err(e) =
                        airlock_serving::ingest_queue::spawn(services, data, status, folders)
                    {
                        tracing::error!(error = %e, "starting the ingest queue worker");
                    }
                }
                let data = loader_state.config().data_dir();
                if let Err(e) = start_connectors(&loader_state, &data) {
                    tracing::error!(error = %e, "starting the connectors");
                }
                tracing::info!("ready");
                if let Some(n) = &ready_notifier {
                    n.send("READY=1\nSTATUS=serving");
                }
                tokio::spawn(crate::routes::auth::sync_schedule(loader_state));
            }
            Ok(Err(e)) => {
                let _ = fail_tx.send(anyhow::Error::new(e));
            }
            Err(e) => {
                let _ = fail_tx.send(anyhow::anyhow!("start-up task failed: {e}"));
            }
        }
    });
    let failed = std::sync::Arc::new(parking_lot::Mutex::new(None::<anyhow::Error>));
    let failed_w = failed.clone();
    let stop_state = state.clone();
    let startup_failed = async move {
        match fail_rx.await {
            Ok(e) => e,
            // Start-up succeeded (the sender is gone): only a signal stops the daemon.
            Err(_) => std::future::pending().await,
        }
    };
    let stop = async move {
        tokio::select! {
            () = server::shutdown_signal() => {}
            e = startup_failed => *failed_w.lock() = Some(e),
        }
        if let Some(n) = &notifier {
            n.send("STOPPING=1\nSTATUS=draining");
        }
        // Extractions in progress are not waited for: their workers are killed now, so the
        // uploads answer 503 at once and the drain (and the runtime's own shutdown, which waits
        // for blocking tasks) never hangs on a file.
        if let Ok(services) = stop_state.services() {
            services.extractor.shutdown();
        }
    };
    let drained = server::serve_with(listener, state, tls, stop, grace).await?;
    if let Some(e) = failed.lock().take() {
        return Err(e);
    }
    match drained {
        Drained::Clean => tracing::info!("stopped"),
        Drained::DeadlineExceeded => tracing::warn!("stopped after the drain deadline"),
    }
    Ok(())
}
