//! The 0.1 compatibility rule, where the deployer turns it on
//! ([`ConfigBuilder::rfc8785_records_before`](crate::config::ConfigBuilder::rfc8785_records_before)):
//! 0.1 read every integer as a double, so an operation whose key material or intent holds an
//! integer past ±2^53 was keyed and fingerprinted otherwise then. It applies only to records
//! that name no [`KeyRule`](crate::key::KeyRule) and were created before the cut-over: every
//! record this version writes names its rule, so a record written under today's rule never
//! answers for another input.
//!
//! Before claiming such a key, the engine reads the record under the key 0.1 derived once:
//! when one 0.1 may have written stands there for this very intent (its fingerprint matches,
//! as written then), the operation goes on under it (a replay, a wait, a takeover), instead of
//! running again under the new key. Only what 0.1 wrote is continued there: when it goes before
//! the engine's claim lands (an operator released it, TTL deleted it), the claim there is given
//! back whole and the operation is claimed under today's key, where every later duplicate
//! looks. A record of another intent there is another operation that
//! collided under the old rule, and is left alone. (One of the same intent cannot be told apart
//! from it: a record 0.1 wrote does not keep its key material, so for as long as such records
//! live a colliding id is answered as 0.1 answered it.)

use std::borrow::Cow;
use std::time::SystemTime;

use tracing::info;

use super::Idempotency;
use crate::error::Error;
use crate::execution::Invocation;
use crate::store::StoreExt;

impl Idempotency {
    /// `invocation` as the compatibility rule reads it: unchanged when the rule is off, else
    /// reading 0.1's digest for records before the cut-over, and under the earlier key when 0.1
    /// recorded an operation of its intent there.
    pub(super) async fn under_earlier_key<'a>(
        &self,
        invocation: &'a Invocation,
        now: SystemTime,
    ) -> Result<Cow<'a, Invocation>, Error> {
        let Some(cutover) = self.config.rfc8785_records_before() else {
            return Ok(Cow::Borrowed(invocation));
        };
        if invocation.earlier_key.is_none() && !invocation.fingerprint.has_rfc8785_digest() {
            return Ok(Cow::Borrowed(invocation));
        }
        let mut read = invocation.clone();
        read.fingerprint = read.fingerprint.with_rfc8785_records_before(Some(cutover));
        let Some(earlier) = read.earlier_key.take() else {
            return Ok(Cow::Owned(read));
        };
        let Some(record) = self.store.get(&earlier).await? else {
            return Ok(Cow::Owned(read));
        };
        let fingerprint = &read.fingerprint;
        if record.counts_as_absent(now)
            || !fingerprint.reads_as_rfc8785(&record.fingerprint, record.created_at)
            || !fingerprint.names(&record.fingerprint, record.created_at)
        {
            return Ok(Cow::Owned(read));
        }
        info!(
            key = earlier.short(),
            "0.1 recorded this operation under its key: continuing it there"
        );
        read.key = earlier;
        Ok(Cow::Owned(read))
    }
}
