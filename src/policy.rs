//! What one operation declares for itself (recovery, reconciler, classifier, retention,
//! outcome limit), carried by its [`Invocation`](crate::Invocation) to the engine, which falls
//! back on its own defaults for what the operation leaves unset.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{check_max_outcome_bytes, check_retention};
use crate::error::ConfigError;
use crate::failure::Classifier;
use crate::reconcile::{Reconciler, Recovery};

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

// The policy is read, never changed, through its reconciler and classifier (strategies called
// by `&self`): a panic cannot leave it half-updated, so an `Invocation` that carries it stays
// unwind-safe, as it was before it carried one.
impl std::panic::UnwindSafe for OperationPolicy {}
impl std::panic::RefUnwindSafe for OperationPolicy {}
