//! What an HTTP door answers when the idempotency layer refuses or fails a request: one table,
//! shared by every HTTP door, driven by [`Error::kind`].

use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, ErrorKind, StoreError};
use crate::record::Status;

/// An error answer: status, a stable code and a message written for the client, never the
/// error's own text (stored handler errors and store messages stay inside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorAnswer {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: &'static str,
    pub(crate) retry_after: Option<Duration>,
}

/// Evidence of another operation (another `Idempotency-Key`, or another caller's) that holds
/// the request's business identity: its status and result are that operation's, not this
/// caller's to learn.
fn another_operations(err: &Error) -> bool {
    matches!(err, Error::KeyExpiredConflict { key, evidence } if evidence.key != *key)
}

/// Evidence of an operation that failed for good.
fn settled_as_failed(err: &Error) -> bool {
    matches!(err, Error::KeyExpiredConflict { evidence, .. } if evidence.status == Status::Failed)
}

impl ErrorAnswer {
    /// The answer to `err`.
    pub(crate) fn for_error(err: &Error) -> Self {
        let unavailable = Some(Duration::from_secs(1));
        let (status, code, message, retry_after) = match err.kind() {
            ErrorKind::MissingKey => (
                400,
                "missing_idempotency_key",
                "send an Idempotency-Key header with a unique value per operation",
                None,
            ),
            ErrorKind::CallerUnidentified => (
                401,
                "caller_unidentified",
                "idempotency keys are kept per caller: authenticate the request",
                None,
            ),
            ErrorKind::TenantMissing => (
                400,
                "tenant_missing",
                "the request names no tenant: send it as the API documents",
                None,
            ),
            ErrorKind::InvalidEvent => (
                400,
                "invalid_request",
                "the request could not be read",
                None,
            ),
            ErrorKind::AlreadyInProgress => (
                409,
                "request_in_progress",
                "the original request is still being processed; retry later",
                match err {
                    Error::AlreadyInProgress { retry_after, .. } => Some(*retry_after),
                    _ => unavailable,
                },
            ),
            ErrorKind::PayloadConflict => (
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request; use a new key for a new operation",
                None,
            ),
            ErrorKind::KeyExpiredConflict if another_operations(err) => (
                409,
                "business_identity_taken",
                "another request's operation holds this business identity, which runs at most once: this request was not run (look the operation up before sending it again under a new Idempotency-Key)",
                None,
            ),
            ErrorKind::KeyExpiredConflict if err.already_took_effect() => (
                409,
                "operation_already_applied",
                "this operation was already applied; its response is no longer kept",
                None,
            ),
            ErrorKind::KeyExpiredConflict if settled_as_failed(err) => (
                409,
                "operation_previously_failed",
                "this operation failed and will not be run again; send a new Idempotency-Key for a new attempt",
                None,
            ),
            ErrorKind::Failed if err.applied_but_not_kept() => (
                409,
                "operation_already_applied",
                "this operation was applied but its response could not be kept; do not retry it",
                None,
            ),
            ErrorKind::KeyExpiredConflict => (
                409,
                "operation_pending",
                "an operation with the same business identity has not settled; retry later",
                unavailable,
            ),
            ErrorKind::Indeterminate | ErrorKind::StepMismatch => (
                409,
                "operation_indeterminate",
                "the outcome of this operation is being checked; do not retry it with a new key",
                None,
            ),
            ErrorKind::Failed => return Self::failed_for_good(),
            ErrorKind::Store if err.is_permanent() => (
                500,
                "stored_record_corrupt",
                "the stored record of this operation is damaged and needs an operator; do not retry it",
                None,
            ),
            // An operator released or rewrote the identity's evidence under this attempt: held
            // for them, as an INDETERMINATE operation is.
            ErrorKind::Store
                if matches!(err, Error::Store(StoreError::EvidenceNotOwned { .. })) =>
            {
                (
                    409,
                    "operation_indeterminate",
                    "the outcome of this operation is being checked; do not retry it with a new key",
                    None,
                )
            }
            // No permission, no table, a request the store refuses as built: no retry clears it
            // before the service is fixed.
            ErrorKind::Store if matches!(err, Error::Store(store) if !store.is_transient()) => (
                500,
                "service_cannot_store",
                "the service cannot keep a record of this request (its configuration or a limit); retrying now will not help",
                None,
            ),
            ErrorKind::Store | ErrorKind::LeaseLost | ErrorKind::ReconcileFailed => (
                503,
                "temporarily_unavailable",
                "the request could not be completed now; retry with the same Idempotency-Key",
                unavailable,
            ),
            ErrorKind::OutcomeTooLarge => return Self::applied_not_kept(),
            ErrorKind::StoredOutcomeUnreadable | ErrorKind::OutcomeMismatch => (
                500,
                "stored_response_unreadable",
                "the stored response of this operation could not be read",
                None,
            ),
            ErrorKind::Handler | ErrorKind::RecordsFailed => (
                500,
                "operation_failed",
                "the request failed; retry with the same Idempotency-Key",
                None,
            ),
        };
        Self {
            status,
            code,
            message,
            retry_after,
        }
    }

    /// The answer to the attempt whose operation was applied but whose response could not be
    /// kept (too large, or its body failed): retries are answered `operation_already_applied`.
    pub(crate) fn applied_not_kept() -> Self {
        Self {
            status: 500,
            code: "response_not_kept",
            message: "the operation was applied but its response could not be kept; do not retry it",
            retry_after: None,
        }
    }

    /// The answer to an operation that failed for good (retained FAILED): the same to the
    /// caller whose attempt failed and to every retry, so that no client is told to retry
    /// what will be answered as failed.
    pub(crate) fn failed_for_good() -> Self {
        Self {
            status: 409,
            code: "operation_previously_failed",
            message: "this operation failed and will not be run again; send a new Idempotency-Key for a new attempt",
            retry_after: None,
        }
    }

    /// The body, an RFC 9457 problem detail (`application/problem+json`): `type`
    /// `about:blank` with the status's phrase as `title`, the `status`, the message as
    /// `detail`; and, as extension members, the stable code as `error` and the message as
    /// `message` (the body 0.4 sent, kept for the clients that read it).
    pub(crate) fn body(&self) -> String {
        let title = http::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|status| status.canonical_reason())
            .unwrap_or("Error");
        let mut body = serde_json::Map::new();
        body.insert("type".into(), Value::from("about:blank"));
        body.insert("title".into(), Value::from(title));
        body.insert("status".into(), Value::from(self.status));
        body.insert("detail".into(), Value::from(self.message));
        body.insert("error".into(), Value::from(self.code));
        body.insert("message".into(), Value::from(self.message));
        Value::Object(body).to_string()
    }

    /// The `Retry-After` value in whole seconds, rounded up, from 1 to `longest` (the lease
    /// policy's longest lease: no claim outlives it).
    pub(crate) fn retry_after_secs(&self, longest: Duration) -> Option<u64> {
        let longest = longest.as_secs().max(1);
        self.retry_after.map(|retry_after| {
            retry_after
                .as_secs()
                .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
                .clamp(1, longest)
        })
    }
}
