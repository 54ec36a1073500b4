//! Failure classes: which handler errors release the claim and which are retained.
//!
//! - **Retryable** (before any effect): the claim is released and a retry executes afresh.
//! - **Terminal** (the effect may exist, or retrying cannot help): the record becomes FAILED
//!   with a serialisable [`RetainedFailure`](crate::record::RetainedFailure), replayed to every
//!   later caller as [`Error::Failed`](crate::Error::Failed); the handler does not run again.
//!
//! A handler error that is a [`Release`] is released without asking the classifier.
//!
//! The default (an operation that sets no classifier) treats every error as retryable unless it
//! is (or wraps) a [`Terminal`]. Let the handler's own error type decide with [`ByErrorType`]:
//!
//! ```
//! use lambda_idempotency::failure::{ByErrorType, Classifier, FailureClass, HasFailureClass, Terminal};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum PaymentError {
//!     #[error("the card was declined")]
//!     Declined,
//!     #[error("the gateway timed out before answering")]
//!     GatewayTimeout,
//! }
//!
//! impl HasFailureClass for PaymentError {
//!     fn failure_class(&self) -> FailureClass {
//!         match self {
//!             Self::Declined => FailureClass::terminal("card_declined"),
//!             Self::GatewayTimeout => FailureClass::Retryable,
//!         }
//!     }
//! }
//!
//! let classifier = ByErrorType::<PaymentError>::new();
//! assert_eq!(classifier.classify(&PaymentError::Declined), FailureClass::terminal("card_declined"));
//! assert_eq!(classifier.classify(&PaymentError::GatewayTimeout), FailureClass::Retryable);
//!
//! // An error of another type is classified as by default: a handler marks it terminal by
//! // wrapping it.
//! let marked = Terminal::new("invoice_rejected", std::io::Error::other("rejected by the ledger"));
//! assert_eq!(classifier.classify(&marked), FailureClass::terminal("invoice_rejected"));
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::marker::PhantomData;

use crate::error::BoxError;

/// What a handler failure means for the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureClass {
    /// No effect happened; release the claim so that a retry executes.
    Retryable,
    /// Retain the failure under a stable machine-readable kind and replay it.
    Terminal {
        /// Stable kind, e.g. `card_declined`.
        kind: String,
    },
}

impl FailureClass {
    /// A terminal class with this kind.
    pub fn terminal(kind: impl Into<String>) -> Self {
        Self::Terminal { kind: kind.into() }
    }
}

/// Decides the class of a handler error: a one-method strategy.
pub trait Classifier: Send + Sync {
    /// The class of `error`.
    fn classify(&self, error: &(dyn StdError + 'static)) -> FailureClass;
}

/// Terminal if the error or any error in its source chain is a [`Terminal`]; else retryable.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DefaultClassifier;

impl Classifier for DefaultClassifier {
    fn classify(&self, error: &(dyn StdError + 'static)) -> FailureClass {
        find_in_chain::<Terminal>(error).map_or(FailureClass::Retryable, |terminal| {
            FailureClass::terminal(&terminal.kind)
        })
    }
}

/// Classifies by the handler's own error type `E` (found anywhere in the source chain);
/// other errors are classified as by default: terminal when they are (or wrap) a [`Terminal`],
/// else retryable. A [`Terminal`] wrapping an `E` is terminal, whatever `E` says: the handler
/// marked it so (a timeout after which the effect may exist).
///
/// ```
/// use lambda_idempotency::failure::{ByErrorType, Classifier, FailureClass, HasFailureClass, Terminal};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("the gateway timed out")]
/// struct GatewayTimeout;
///
/// impl HasFailureClass for GatewayTimeout {
///     fn failure_class(&self) -> FailureClass {
///         FailureClass::Retryable
///     }
/// }
///
/// let classifier = ByErrorType::<GatewayTimeout>::new();
/// assert_eq!(classifier.classify(&GatewayTimeout), FailureClass::Retryable);
/// let marked = Terminal::new("charge_uncertain", GatewayTimeout);
/// assert_eq!(classifier.classify(&marked), FailureClass::terminal("charge_uncertain"));
/// ```
pub struct ByErrorType<E>(PhantomData<fn() -> E>);

impl<E> ByErrorType<E> {
    /// The classifier.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<E> Default for ByErrorType<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> fmt::Debug for ByErrorType<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ByErrorType<{}>", std::any::type_name::<E>())
    }
}

impl<E: HasFailureClass + StdError + 'static> Classifier for ByErrorType<E> {
    fn classify(&self, error: &(dyn StdError + 'static)) -> FailureClass {
        // From the outside in, the first that says: a `Terminal` the handler wrapped around its
        // own error is the handler's verdict on that error.
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(terminal) = error.downcast_ref::<Terminal>() {
                return FailureClass::terminal(&terminal.kind);
            }
            if let Some(typed) = error.downcast_ref::<E>() {
                return typed.failure_class();
            }
            current = error.source();
        }
        FailureClass::Retryable
    }
}

/// An error type that knows its own failure class.
pub trait HasFailureClass {
    /// The class of this error.
    fn failure_class(&self) -> FailureClass;
}

/// Marks an error as terminal, with a stable kind: the operation is not re-run.
#[derive(Debug)]
pub struct Terminal {
    kind: String,
    source: BoxError,
}

impl Terminal {
    /// Wraps `source` as a terminal failure of `kind`.
    pub fn new(kind: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            kind: kind.into(),
            source: source.into(),
        }
    }

    /// The stable kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl fmt::Display for Terminal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl StdError for Terminal {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// Marks a handler error whose claim is released whatever the engine's [`Classifier`] says:
/// the handler produced nothing that must not run again. The HTTP doors wrap the responses
/// they do not store (401, 403, 407, 408, 409, 412, 425, 428, 429, 5xx) in it, so that a
/// classifier that retains every error cannot turn "try again" into a retained failure.
///
/// ```
/// use lambda_idempotency::failure::Release;
///
/// let released = Release::new(std::io::Error::other("the upstream answered 503"));
/// assert_eq!(released.to_string(), "the upstream answered 503");
/// ```
#[derive(Debug)]
pub struct Release {
    source: BoxError,
}

impl Release {
    /// Wraps `source` as an error whose claim is released.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }

    /// Whether `error` is a [`Release`] (the handler's error itself, not one it wraps).
    pub(crate) fn is(error: &(dyn StdError + 'static)) -> bool {
        error.is::<Self>()
    }

    /// The `T` a [`Release`] wraps, or `error` as it was.
    #[cfg(feature = "http")]
    pub(crate) fn take<T: StdError + 'static>(error: BoxError) -> Result<T, BoxError> {
        let released = error.downcast::<Self>()?;
        released
            .source
            .downcast::<T>()
            .map(|inner| *inner)
            .map_err(|source| Box::new(Self { source }) as BoxError)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl StdError for Release {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A handler error that came after its operation took effect: the HTTP door's handler
/// answered a status that says done (2xx, 3xx) with no writes waiting for the completion,
/// then the response's body failed. Retained as
/// [`FailureKind::OutcomeUnstorable`](crate::record::FailureKind::OutcomeUnstorable) whatever
/// the classifier says (a retry is told that the operation was applied), never released for
/// a retry to run the effect again.
#[derive(Debug)]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) struct AfterEffect {
    source: BoxError,
}

impl AfterEffect {
    /// Wraps `source`, an error met after the operation took effect.
    #[cfg(feature = "http")]
    pub(crate) fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }

    /// Whether `error` is an [`AfterEffect`] (the handler's error itself, not one it wraps).
    pub(crate) fn is(error: &(dyn StdError + 'static)) -> bool {
        error.is::<Self>()
    }
}

impl fmt::Display for AfterEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed after the operation took effect: {}", self.source)
    }
}

impl StdError for AfterEffect {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A handler that panicked instead of returning: the error a batch reports for that record
/// (its claim was given back for a reconciled takeover), while the rest of the batch is
/// answered. The panic's message is not kept: it may carry payload data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Panicked;

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the handler panicked")
    }
}

impl StdError for Panicked {}

fn find_in_chain<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}
