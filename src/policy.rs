//! What one operation declares for itself (recovery, reconciler, classifier, retention,
//! outcome limit), carried by its [`Invocation`](crate::Invocation) to the engine, which falls
//! back on its own defaults for what the operation leaves unset.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{check_max_outcome_bytes, check_retention};
use crate::error::ConfigError;
use crate::execution::Invocation;
use crate::failure::Classifier;
use crate::reconcile::{Reconciler, Recovery};

/// The operation's own policy, for an invocation built by hand; the doors take it from the
/// [`Operation`](crate::Operation), whose setters of the same names say what each does.
impl Invocation {
    /// Recovers a crashed attempt of this operation under `recovery`
    /// ([`Operation::with_recovery`](crate::Operation::with_recovery)).
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.policy.recovery = Some(recovery);
        self
    }

    /// Asks `reconciler` before a takeover of this operation
    /// ([`Operation::with_reconciler`](crate::Operation::with_reconciler)).
    pub fn with_reconciler(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.policy.reconciler = Some(Arc::new(reconciler));
        self
    }

    /// Classifies this operation's handler errors with `classifier`
    /// ([`Operation::with_classifier`](crate::Operation::with_classifier)).
    pub fn with_classifier(mut self, classifier: impl Classifier + 'static) -> Self {
        self.policy.classifier = Some(Arc::new(classifier));
        self
    }

    /// Keeps this operation's settled records for `retention`
    /// ([`Operation::with_retention`](crate::Operation::with_retention)).
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 s ..= 366 days.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        self.policy = self.policy.with_retention(retention)?;
        Ok(self)
    }

    /// Stores this operation's outcomes up to `bytes`
    /// ([`Operation::with_max_outcome_bytes`](crate::Operation::with_max_outcome_bytes)).
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 ..= [`MAX_OUTCOME_BYTES`](crate::config::MAX_OUTCOME_BYTES).
    pub fn with_max_outcome_bytes(mut self, bytes: usize) -> Result<Self, ConfigError> {
        self.policy = self.policy.with_max_outcome_bytes(bytes)?;
        Ok(self)
    }
}

/// One operation's own policy; `None` (or empty) where the engine's default applies.
#[derive(Clone, Default)]
pub(crate) struct OperationPolicy {
    pub(crate) recovery: Option<Recovery>,
    pub(crate) reconciler: Option<Arc<dyn Reconciler>>,
    pub(crate) classifier: Option<Arc<dyn Classifier>>,
    pub(crate) retention: Option<Duration>,
    pub(crate) max_outcome_bytes: Option<usize>,
}

impl OperationPolicy {
    /// Whether the operation declares nothing of its own (the engine's defaults apply).
    pub(crate) fn is_default(&self) -> bool {
        self.recovery.is_none()
            && self.reconciler.is_none()
            && self.classifier.is_none()
            && self.retention.is_none()
            && self.max_outcome_bytes.is_none()
    }

    /// With `retention` for its settled records, checked as
    /// [`ConfigBuilder::retention`](crate::config::ConfigBuilder::retention) checks it.
    pub(crate) fn with_retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        check_retention(retention)?;
        self.retention = Some(retention);
        Ok(self)
    }

    /// With `bytes` as its largest stored outcome, checked as
    /// [`ConfigBuilder::max_outcome_bytes`](crate::config::ConfigBuilder::max_outcome_bytes)
    /// checks it.
    pub(crate) fn with_max_outcome_bytes(mut self, bytes: usize) -> Result<Self, ConfigError> {
        check_max_outcome_bytes(bytes)?;
        self.max_outcome_bytes = Some(bytes);
        Ok(self)
    }
}

impl fmt::Debug for OperationPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationPolicy")
            .field("recovery", &self.recovery)
            .field("reconciler", &self.reconciler.is_some())
            .field("classifier", &self.classifier.is_some())
            .field("retention", &self.retention)
            .field("max_outcome_bytes", &self.max_outcome_bytes)
            .finish()
    }
}

/// Two policies are equal when they declare the same settings and the very same reconciler
/// and classifier (shared, not merely alike).
impl PartialEq for OperationPolicy {
    fn eq(&self, other: &Self) -> bool {
        fn same<T: ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
            match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
        }
        self.recovery == other.recovery
            && same(&self.reconciler, &other.reconciler)
            && same(&self.classifier, &other.classifier)
            && self.retention == other.retention
            && self.max_outcome_bytes == other.max_outcome_bytes
    }
}

impl Eq for OperationPolicy {}
