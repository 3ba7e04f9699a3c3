//! The daemon's shared state: configuration, metrics, admission, and the services that exist
//! only once start-up has verified the bundle and opened the stores (`/readyz` turns 200 then).

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;
use airlock_serving::admission::Admission;
use airlock_serving::services::Services;

struct Inner {
    config: Config,
    metrics: Metrics,
    admission: Admission,
    services: ArcSwapOption<Services>,
    logins: crate::session::LoginLimiter,
    oidc: std::sync::OnceLock<Arc<airlock_identity::oidc::Oidc>>,
    indexing: Arc<airlock_serving::ingest_queue::Status>,
    approvals: crate::approvals::Approvals,
    connectors: std::sync::OnceLock<Arc<crate::connectors::Connectors>>,
}

/// Cheap-to-clone handle on everything a handler needs.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl AppState {
    /// A state that is not ready yet (no services): `/healthz` answers, `/readyz` is 503 and
    /// every other endpoint answers 503 `not-ready`.
    pub fn starting(config: Config) -> Self {
        let metrics = Metrics::new();
        let admission = Admission::from_settings(metrics.admission(), &config.admission());
        AppState {
            inner: Arc::new(Inner {
                config,
                metrics,
                admission,
                services: ArcSwapOption::empty(),
                logins: crate::session::LoginLimiter::default(),
                oidc: std::sync::OnceLock::new(),
                indexing: Arc::default(),
                approvals: crate::approvals::Approvals::default(),
                connectors: std::sync::OnceLock::new(),
            }),
        }
    }

    /// A ready state.
    pub fn ready(config: Config, services: Services) -> Self {
        let s = Self::starting(config);
        s.set_services(services);
        s
    }

    /// Installs the services: the daemon is ready from now on.
    pub fn set_services(&self, services: Services) {
        self.inner.metrics.set_bundle(services.bundle_version());
        match services.acl.last_full_sync_us() {
            Ok(Some(us)) => self.inner.metrics.iam_synced_at(us as f64 / 1e6),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "reading the last IAM sync time"),
        }
        self.inner.admission.watch_engines(&services.generators);
        self.inner.services.store(Some(Arc::new(services)));
    }

    /// Withdraws the services (shutdown): `/readyz` turns 503.
    pub fn clear_services(&self) -> Option<Arc<Services>> {
        self.inner.services.swap(None)
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The admission component.
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// The failed sign-in counters (in memory).
    pub fn logins(&self) -> &crate::session::LoginLimiter {
        &self.inner.logins
    }

    /// Installs the discovered OIDC provider (`[oidc]`); a second call changes nothing.
    pub fn set_oidc(&self, oidc: Arc<airlock_identity::oidc::Oidc>) {
        let _ = self.inner.oidc.set(oidc);
    }

    /// The OIDC provider when `[oidc]` is configured and discovered (`display_name()` and
    /// `login_url()` are what `GET /v1/auth/methods` reports).
    pub fn oidc(&self) -> Option<&Arc<airlock_identity::oidc::Oidc>> {
        self.inner.oidc.get()
    }

    /// Whether start-up has completed.
    pub fn is_ready(&self) -> bool {
        self.inner.services.load().is_some()
    }

    /// The services, or 503 `not-ready`.
    pub fn services(&self) -> Result<Arc<Services>, ApiError> {
        self.inner.services.load_full().ok_or(ApiError::NotReady)
    }

    /// The approvals issued and not yet used (crate::approvals).
    pub fn approvals(&self) -> &crate::approvals::Approvals {
        &self.inner.approvals
    }

    /// Installs the connectors' scheduler (`[[connectors]]`); a second call changes nothing.
    pub fn set_connectors(&self, connectors: Arc<crate::connectors::Connectors>) {
        let _ = self.inner.connectors.set(connectors);
    }

    /// The connectors' scheduler, once started.
    pub fn connectors(&self) -> Option<&Arc<crate::connectors::Connectors>> {
        self.inner.connectors.get()
    }

    /// The background ingest worker's progress (airlock_serving::ingest_queue).
    pub fn indexing(&self) -> &Arc<airlock_serving::ingest_queue::Status> {
        &self.inner.indexing
    }
}
