//! Answers from stored records: replays, retained failures, waits.

use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::{debug, warn};

use crate::error::{Error, StoreError, decode_failure};
use crate::execution::{Execution, Invocation, Origin};
use crate::key::OperationKey;
use crate::record::MAX_RESULT_REF_BYTES;
use crate::record::{Record, Status};

/// The evidence's result reference: the part of the result at the invocation's pointer.
pub(super) fn result_ref(invocation: &Invocation, raw: &RawValue) -> Option<String> {
    let pointer = invocation.result_ref.as_ref()?;
    let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    let reference = match pointer.find(&value)? {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if reference.len() > MAX_RESULT_REF_BYTES {
        warn!(
            bytes = reference.len(),
            "result reference over {MAX_RESULT_REF_BYTES} bytes: not kept in the evidence"
        );
        return None;
    }
    Some(reference)
}

/// The answer for a business identity whose evidence stands and whose record is gone or
/// expired (an adoption of this operation's own orphaned claim is handled before).
pub(crate) fn identity_taken(invocation: &Invocation, evidence: crate::record::Evidence) -> Error {
    let key = &invocation.key;
    if evidence.key == *key
        && !invocation
            .fingerprint
            .names(&evidence.fingerprint, evidence.created_at)
    {
        return Error::PayloadConflict { key: key.clone() };
    }
    if evidence.key == *key && evidence.status == Status::Indeterminate {
        return Error::Indeterminate { key: key.clone() };
    }
    warn!(evidence_status = %evidence.status, "business identity already claimed");
    // Only an identity shared across tenants (an explicit opt-in) can meet another tenant's
    // evidence: the caller learns its status, never that operation.
    let evidence = match evidence.key.tenant() == key.tenant() {
        true => evidence,
        false => evidence.redacted(),
    };
    Error::KeyExpiredConflict {
        key: key.clone(),
        evidence: Box::new(evidence),
    }
}

/// Decodes stored JSON into the handler's output type.
pub(super) fn decode_outcome<T: DeserializeOwned>(
    key: &OperationKey,
    raw: Box<RawValue>,
) -> Result<(T, Box<RawValue>), Error> {
    match serde_json::from_str(raw.get()) {
        Ok(value) => Ok((value, raw)),
        Err(err) => Err(Error::StoredOutcomeUnreadable {
            key: key.clone(),
            reason: decode_failure(&err),
        }),
    }
}

/// The answer for a key held by a live record of the same intent: replay or wait.
pub(crate) fn answer_existing<T: DeserializeOwned>(
    existing: Record,
    invocation: &Invocation,
    now: SystemTime,
) -> Result<Execution<T>, Error> {
    let key = invocation.key.clone();
    if !invocation
        .fingerprint
        .names(&existing.fingerprint, existing.created_at)
    {
        return Err(Error::PayloadConflict { key });
    }
    let unreadable = |reason: String| Error::StoredOutcomeUnreadable {
        key: key.clone(),
        reason,
    };
    match existing.status {
        Status::Completed => {
            // A store reads a record without its outcome only past its retention (its parts
            // deleted by TTL): one in force without it is damaged.
            let Some(outcome) = existing.outcome else {
                return Err(Error::Store(StoreError::CorruptRecord {
                    key_short: key.short().to_owned(),
                    reason: "its outcome is missing".into(),
                }));
            };
            let json =
                String::from_utf8(outcome).map_err(|_| unreadable("not UTF-8".to_owned()))?;
            let raw =
                RawValue::from_string(json).map_err(|err| unreadable(decode_failure(&err)))?;
            let (value, raw) = decode_outcome(&key, raw)?;
            debug!("replayed");
            Ok(Execution {
                value,
                raw,
                origin: Origin::Replayed,
                reentered: false,
            })
        }
        Status::Failed => {
            let failure = serde_json::from_slice(existing.outcome.as_deref().unwrap_or_default())
                .map_err(|err| unreadable(decode_failure(&err)))?;
            Err(Error::Failed { key, failure })
        }
        Status::InProgress => Err(Error::AlreadyInProgress {
            key,
            attempt: existing.lease.attempt,
            retry_after: existing.lease.remaining(now),
        }),
        Status::Indeterminate => Err(Error::Indeterminate { key }),
    }
}
