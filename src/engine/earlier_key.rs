//! Operations that a version before 0.2 recorded under another key: those versions read every
//! integer of the key material as a double, so a key whose material holds an integer past
//! ±2^53 is derived otherwise now. Before claiming such a key, the engine reads the record
//! under the earlier key once: when one stands there for this very intent (its fingerprint
//! matches, as written then), the operation goes on under it (a replay, a wait, a takeover),
//! instead of running again under the new key. A record of another intent there is another
//! operation that collided under the old rule, and is left alone. (One of the same intent
//! cannot be told apart from it: a record 0.1 wrote does not keep its key material, so for as
//! long as such records live a colliding id is answered as 0.1 answered it. The lookup costs a
//! `GetItem` for such keys only; `ConfigBuilder::earlier_keys(false)` ends it once one
//! retention has passed since the upgrade.)

use std::borrow::Cow;
use std::time::SystemTime;

use tracing::info;

use super::{Idempotency, erased};
use crate::error::Error;
use crate::execution::Invocation;
use crate::store::Store;

impl Idempotency {
    /// `invocation`, under the earlier key when an operation of its intent is recorded there.
    pub(super) async fn under_earlier_key<'a>(
        &self,
        invocation: &'a Invocation,
        now: SystemTime,
    ) -> Result<Cow<'a, Invocation>, Error> {
        let Some(earlier) = invocation
            .earlier_key
            .as_ref()
            .filter(|_| self.config.earlier_keys())
        else {
            return Ok(Cow::Borrowed(invocation));
        };
        let Some(record) = erased(self.store.get(earlier)).await? else {
            return Ok(Cow::Borrowed(invocation));
        };
        if record.counts_as_absent(now) || !invocation.fingerprint.matches(&record.fingerprint) {
            return Ok(Cow::Borrowed(invocation));
        }
        info!(
            key = earlier.short(),
            "an earlier version recorded this operation under its key: continuing it there"
        );
        let mut continued = invocation.clone();
        continued.key = earlier.clone();
        continued.earlier_key = None;
        Ok(Cow::Owned(continued))
    }
}
