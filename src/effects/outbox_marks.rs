//! The outbox table's marks: an event published (by the relay, the sweeper or a Pipe), parked (its destination refused it) or redriven (for a Pipe to publish again),
//! and the pending events found through the table's sparse [`PENDING_INDEX`], oldest first.
//!
//! Every mark is one conditional `UpdateItem`: it applies only to an item that exists and was
//! not published yet, so a late or repeated mark (the relay and the sweeper both published an
//! event) changes nothing and answers `false` (`true`: marked now).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue;
use tracing::warn;

use super::outbox::{OUTBOX_RETENTION, Outbox, OutboxRecord};
#[cfg(feature = "relay")]
use super::pending_index::retry_shard;
use super::pending_index::{PARKED, PENDING_INDEX, PENDING_SHARDS, RETRY_SHARDS, pending_shard};
use crate::error::BoxError;
use crate::record::{epoch_millis, epoch_secs};

/// How often [`OutboxMarks::settled`] asks again for the keys DynamoDB left unprocessed.
pub const SETTLED_READS: usize = 3;

/// The most bytes of a destination's refusal kept on a parked event.
pub const MAX_PARKED_REASON_BYTES: usize = 1024;

/// What published an event, as its mark says (`published_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishedBy {
    /// The relay, from the table's stream.
    Relay,
    /// The sweeper, from the pending index.
    Sweeper,
    /// An EventBridge Pipe, marked by a rule on its bus (template.yaml's
    /// `OutboxMarkerFunction`).
    Pipe,
}

impl PublishedBy {
    /// The mark's value: `relay`, `sweeper` or `pipe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Sweeper => "sweeper",
            Self::Pipe => "pipe",
        }
    }
}

/// An outbox request that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// DynamoDB failed the request (throttled, unavailable, access denied, no such table or
    /// index): retry later, or grant the role the action on the outbox table and its index.
    #[error(
        "the outbox table refused `{operation}` ({code}); check that the table and its `pending` index exist and that the role may use them, then retry"
    )]
    Request {
        /// The DynamoDB action.
        operation: &'static str,
        /// DynamoDB's error code, when it gave one.
        code: String,
        /// The SDK's error.
        #[source]
        source: BoxError,
    },
    /// An item in the pending index is not an outbox event this crate wrote.
    #[error("the outbox item `{id}` is not an outbox event ({reason}); inspect it in the table")]
    NotAnEvent {
        /// The item's `pk`.
        id: String,
        /// What is missing or malformed.
        reason: &'static str,
    },
}

impl OutboxError {
    fn request<E>(operation: &'static str, err: aws_sdk_dynamodb::error::SdkError<E>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let code = err.code().unwrap_or("no code").to_owned();
        Self::Request {
            operation,
            code,
            source: Box::new(err),
        }
    }
}

/// What a read of the pending index found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Found {
    /// The events (each with its `created_at`), oldest first within each index partition.
    pub events: Vec<OutboxRecord>,
    /// The ids of indexed items this build cannot read as outbox events (a destination kind a
    /// later build added, an item another writer put there): left as they are, and reported.
    pub unreadable: Vec<String>,
}

/// The marks and the pending index of one outbox table.
#[derive(Clone)]
pub struct OutboxMarks {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl fmt::Debug for OutboxMarks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxMarks")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl OutboxMarks {
    /// The marks of `outbox`, written with `client`, each request bounded by the store's
    /// [`OPERATION_TIMEOUT`](crate::store::OPERATION_TIMEOUT) (its tries by
    /// [`ATTEMPT_TIMEOUT`](crate::store::ATTEMPT_TIMEOUT)) where the client sets none.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use std::time::SystemTime;
    /// use lambda_idempotency::effects::{Outbox, OutboxMarks, PublishedBy};
    ///
    /// let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let marks = OutboxMarks::new(aws_sdk_dynamodb::Client::new(&config), &Outbox::new("outbox"));
    /// let oldest = marks.oldest_pending().await?;
    /// # let _ = oldest; Ok(()) }
    /// ```
    pub fn new(client: aws_sdk_dynamodb::Client, outbox: &Outbox) -> Self {
        // Bounded as the store's client is: a mark hung on a dead connection would hold the
        // relay's or the sweep's batch, and the failures behind it, until the function timed out.
        let client = match crate::store::bounded_timeouts(
            client.config().timeout_config(),
            crate::store::OPERATION_TIMEOUT,
            crate::store::ATTEMPT_TIMEOUT,
        ) {
            Some(timeouts) => aws_sdk_dynamodb::Client::from_conf(
                client
                    .config()
                    .to_builder()
                    .timeout_config(timeouts)
                    .build(),
            ),
            None => client,
        };
        Self {
            client,
            table: outbox.table().to_owned(),
        }
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// An `UpdateItem` of event `id`'s item: every mark is one.
    fn update(
        &self,
        id: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(id.to_owned()))
    }

    /// Marks event `id` published by `by` at `now`: out of the pending index, expiring
    /// [`OUTBOX_RETENTION`] later: `true`, or `false` when it was published already or is
    /// gone (nothing changed).
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the write.
    pub async fn published(
        &self,
        id: &str,
        by: PublishedBy,
        now: SystemTime,
    ) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression(
                "SET published_at = :now, published_by = :by, expires_at = :expires REMOVE pending, redriven_at, redrives",
            )
            .condition_expression("attribute_exists(pk) AND attribute_not_exists(published_at)")
            .expression_attribute_values(":now", number(epoch_millis(now)))
            .expression_attribute_values(":by", AttributeValue::S(by.as_str().to_owned()))
            .expression_attribute_values(":expires", number(epoch_secs(now + OUTBOX_RETENTION)))
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// The ids among `ids` whose events are settled: published (by anything) or parked. One
    /// strongly consistent `BatchGetItem` per 100 ids; keys DynamoDB leaves unprocessed are
    /// asked again up to [`SETTLED_READS`] times, then counted as not settled (their events
    /// are published again: at least once).
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the read.
    pub async fn settled(&self, ids: &[&str]) -> Result<HashSet<String>, OutboxError> {
        let mut settled = HashSet::new();
        let distinct: Vec<&str> = ids
            .iter()
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        for chunk in distinct.chunks(100) {
            let mut keys: Vec<HashMap<String, AttributeValue>> = chunk
                .iter()
                .map(|id| HashMap::from([("pk".to_owned(), AttributeValue::S((*id).to_owned()))]))
                .collect();
            for _ in 0..SETTLED_READS {
                if keys.is_empty() {
                    break;
                }
                let request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .projection_expression("pk, published_at, pending")
                    .build()
                    .map_err(|err| OutboxError::Request {
                        operation: "BatchGetItem",
                        code: "no code".to_owned(),
                        source: Box::new(err),
                    })?;
                let answer = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|err| OutboxError::request("BatchGetItem", err))?;
                let items = answer
                    .responses()
                    .and_then(|tables| tables.get(&self.table))
                    .into_iter()
                    .flatten();
                for item in items {
                    let published = item.contains_key("published_at");
                    let parked = item
                        .get("pending")
                        .and_then(|pending| pending.as_s().ok())
                        .is_some_and(|pending| pending == PARKED);
                    let id = item.get("pk").and_then(|pk| pk.as_s().ok());
                    if let (true, Some(id)) = (published || parked, id) {
                        settled.insert(id.clone());
                    }
                }
                keys = answer
                    .unprocessed_keys()
                    .and_then(|tables| tables.get(&self.table))
                    .map(|unprocessed| unprocessed.keys().to_vec())
                    .unwrap_or_default();
            }
        }
        Ok(settled)
    }

    /// Redrives pending event `id` at `now` for a publisher that reads the table's stream (an
    /// EventBridge Pipe): sets `redriven_at` (and counts `redrives`), a modification whose new image the Pipe's filter
    /// lets through, so the Pipe publishes the event again as it did the first time. The mark
    /// that follows removes `redriven_at`. `false` when it is no longer pending.
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the write.
    pub async fn redrive(&self, id: &str, now: SystemTime) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression("SET redriven_at = :now ADD redrives :one")
            .condition_expression(
                "attribute_exists(pk) AND attribute_not_exists(published_at) AND pending <> :parked",
            )
            .expression_attribute_values(":parked", AttributeValue::S(PARKED.to_owned()))
            .expression_attribute_values(":now", number(epoch_millis(now)))
            .expression_attribute_values(":one", number(1))
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// A sweep's [`OutboxMarks::redrive`] of an event it read redriven `read` times, last
    /// before `cutoff` (or never): refused when a sweep beside this one (overlapping, an
    /// operator's `idemctl outbox sweep`) redrove it meanwhile. The write sets the count it
    /// read plus one rather than adding one, so that when it applies and loses its answer the
    /// SDK's retry, meeting it in place, applies the same again (no change, no stream record)
    /// and answers redriven.
    #[cfg(feature = "relay")]
    pub(crate) async fn redrive_as_read(
        &self,
        id: &str,
        now: SystemTime,
        cutoff: SystemTime,
        read: u32,
    ) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression("SET redriven_at = :now, redrives = :next")
            .condition_expression(
                "attribute_exists(pk) AND attribute_not_exists(published_at) AND pending <> :parked AND (((attribute_not_exists(redriven_at) OR redriven_at <= :cutoff) AND (attribute_not_exists(redrives) OR redrives = :read)) OR (redriven_at = :now AND redrives = :next))",
            )
            .expression_attribute_values(":parked", AttributeValue::S(PARKED.to_owned()))
            .expression_attribute_values(":now", number(epoch_millis(now)))
            .expression_attribute_values(":cutoff", number(epoch_millis(cutoff)))
            .expression_attribute_values(":read", number(read))
            .expression_attribute_values(":next", number(read.saturating_add(1)))
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// Parks event `id` at `now` with its destination's refusal (`reason`, cut to
    /// [`MAX_PARKED_REASON_BYTES`]): kept without a TTL, out of the sweeper's way, listed by
    /// [`OutboxMarks::parked`]. `false` when it was published meanwhile.
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the write.
    pub async fn park(&self, id: &str, reason: &str, now: SystemTime) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression(
                "SET pending = :parked, parked_at = :now, parked_reason = :reason REMOVE expires_at, redriven_at",
            )
            .condition_expression("attribute_exists(pk) AND attribute_not_exists(published_at)")
            .expression_attribute_values(":parked", AttributeValue::S(PARKED.to_owned()))
            .expression_attribute_values(":now", number(epoch_millis(now)))
            .expression_attribute_values(
                ":reason",
                AttributeValue::S(bounded(reason, MAX_PARKED_REASON_BYTES).to_owned()),
            )
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// Puts event `id`, an item 0.4 wrote (no `pending`, a TTL from its commit), in the pending
    /// index and drops its TTL, so that the sweeper publishes it once the stream gives up on
    /// it: what the relay does when it fails to publish one. `false` when it is indexed
    /// already, published, or gone.
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the write.
    #[cfg(feature = "relay")]
    pub(crate) async fn adopt(&self, id: &str) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression("SET pending = :shard REMOVE expires_at")
            .condition_expression(
                "attribute_exists(pk) AND attribute_not_exists(pending) AND attribute_not_exists(published_at)",
            )
            .expression_attribute_values(":shard", AttributeValue::S(pending_shard(id).to_owned()))
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// Puts parked event `id` back among the pending ones (its destination takes it now: a
    /// grant added, a queue created), for the next sweep to publish: `true`, or `false` when it
    /// is not parked (published, pending already, or no such event). The write names itself
    /// (`unparked_by`, a token of this call), so that when it applies and loses its answer the
    /// SDK's retry finds its own write, `true`, not an event that is "not parked".
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails the write.
    pub async fn unpark(&self, id: &str) -> Result<bool, OutboxError> {
        let update = self
            .update(id)
            .update_expression(
                "SET pending = :shard, unparked_by = :token REMOVE parked_at, parked_reason, redrives, redriven_at, sweep_failures, sweep_failed_at",
            )
            .condition_expression(
                "pending = :parked OR (unparked_by = :token AND attribute_not_exists(published_at))",
            )
            .expression_attribute_values(":parked", AttributeValue::S(PARKED.to_owned()))
            .expression_attribute_values(":shard", AttributeValue::S(pending_shard(id).to_owned()))
            .expression_attribute_values(
                ":token",
                AttributeValue::S(uuid::Uuid::new_v4().to_string()),
            )
            .send()
            .await;
        settled(update, "UpdateItem")
    }

    /// About `limit` pending events committed before `created_before`, oldest first within
    /// each of the index's partitions: each partition of events no sweep has tried is read up
    /// to its share of `limit` (a sixteenth, at least one: events stuck in one partition never
    /// hide the others'), then what the others left is shared among those that filled theirs
    /// (two events in one partition are both found); then the partitions of events a sweep
    /// failed to publish, the same way, with what is left of `limit`. Each partition reads up
    /// to its share of [`MAX_FOUND_BYTES`] of payloads: a backlog of large events is swept
    /// over several runs, within a function's memory.
    ///
    /// # Errors
    /// [`OutboxError::Request`] when DynamoDB fails a query.
    pub async fn pending(
        &self,
        created_before: SystemTime,
        limit: usize,
    ) -> Result<Found, OutboxError> {
        self.read_shares(created_before, limit, None).await
    }

    /// [`OutboxMarks::pending`] for a sweep at `now`: an event a sweep failed to publish is
    /// read past, without taking a share, until its turn comes again (`backoff` after its last
    /// failure, doubled for each earlier one, up to 64 times), so that events whose
    /// destination keeps failing neither hide the others nor are tried at every sweep.
    #[cfg(feature = "relay")]
    pub(crate) async fn due(
        &self,
        created_before: SystemTime,
        limit: usize,
        now: SystemTime,
        backoff: Duration,
    ) -> Result<Found, OutboxError> {
        self.read_shares(created_before, limit, Some((now, backoff)))
            .await
    }

    async fn read_shares(
        &self,
        created_before: SystemTime,
        limit: usize,
        due: Option<(SystemTime, Duration)>,
    ) -> Result<Found, OutboxError> {
        let mut found = Found::default();
        // Boxed: a sweep's future holds these reads inside the runtime's, and an unboxed
        // layout past the compiler's depth limit fails a caller's build.
        Box::pin(self.read_partitions(&PENDING_SHARDS, created_before, limit, None, &mut found))
            .await?;
        let retries = limit.saturating_sub(found.events.len());
        Box::pin(self.read_partitions(&RETRY_SHARDS, created_before, retries, due, &mut found))
            .await?;
        Ok(found)
    }

    /// Appends to `found` about `limit` events of `partitions`: each its share first (at
    /// least one), then what the others left, shared among those that filled theirs, round
    /// after round while one fills what it was given (events of one partition never hide
    /// another's, and a few partitions holding every event still give `limit`).
    async fn read_partitions(
        &self,
        partitions: &[&str],
        created_before: SystemTime,
        limit: usize,
        due: Option<(SystemTime, Duration)>,
        found: &mut Found,
    ) -> Result<(), OutboxError> {
        let share = limit.div_ceil(partitions.len()).max(1);
        let at_start = found.events.len();
        // What an earlier read found (an event a concurrent sweep moved to its retry
        // partition meanwhile) is not found twice.
        let found_before = found_ids(found);
        let mut filled = Vec::new();
        for partition in partitions {
            let before = found.events.len();
            self.query(
                partition,
                Some(created_before),
                share,
                due,
                &found_before,
                found,
            )
            .await?;
            if found.events.len() - before == share {
                filled.push((*partition, share));
            }
        }
        loop {
            let left = limit.saturating_sub(found.events.len() - at_start);
            if left == 0 || filled.is_empty() {
                return Ok(());
            }
            let more = left.div_ceil(filled.len());
            let mut still_filled = Vec::new();
            for (partition, taken) in filled {
                let left = limit.saturating_sub(found.events.len() - at_start);
                if left == 0 {
                    break;
                }
                // Read again from the partition's oldest, past what was found already.
                let seen = found_ids(found);
                let given = more.min(left);
                let before = found.events.len();
                self.query(
                    partition,
                    Some(created_before),
                    taken + given,
                    due,
                    &seen,
                    found,
                )
                .await?;
                let added = found.events.len() - before;
                if added == given {
                    still_filled.push((partition, taken + given));
                }
            }
            filled = still_filled;
        }
    }

    /// Records that a sweep at `now` failed to publish pending event `id`: counted
    /// (`sweep_failures`), timed (`sweep_failed_at`) and moved to its retry partition of the
    /// index ([`OutboxMarks::due`]). The failures counted so far, `None` when the event is no
    /// longer pending (published or parked meanwhile) or this failure is counted already: the
    /// write's answer was lost and its retry found it done, or a sweep beside this one (within
    /// `backoff`, the shortest wait between two tries) counted its own failure of it.
    #[cfg(feature = "relay")]
    pub(crate) async fn sweep_failed(
        &self,
        id: &str,
        now: SystemTime,
        backoff: Duration,
    ) -> Result<Option<u32>, OutboxError> {
        let due = now.checked_sub(backoff).unwrap_or(UNIX_EPOCH);
        let update = self
            .update(id)
            .update_expression("SET pending = :retry, sweep_failed_at = :now ADD sweep_failures :one")
            .condition_expression(
                "attribute_exists(pk) AND attribute_not_exists(published_at) AND pending <> :parked AND (attribute_not_exists(sweep_failed_at) OR (sweep_failed_at <= :due AND sweep_failed_at <> :now))",
            )
            .expression_attribute_values(":retry", AttributeValue::S(retry_shard(id).to_owned()))
            .expression_attribute_values(":parked", AttributeValue::S(PARKED.to_owned()))
            .expression_attribute_values(":due", number(epoch_millis(due)))
            .expression_attribute_values(":now", number(epoch_millis(now)))
            .expression_attribute_values(":one", number(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await;
        match update {
            Ok(updated) => Ok(Some(
                updated
                    .attributes()
                    .and_then(|new| new.get("sweep_failures"))
                    .and_then(|count| count.as_n().ok())
                    .and_then(|count| count.parse().ok())
                    .unwrap_or(1),
            )),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|service| service.is_conditional_check_failed_exception()) =>
            {
                Ok(None)
            }
            Err(err) => Err(OutboxError::request("UpdateItem", err)),
        }
    }

    /// Up to `limit` parked events, oldest first.
    ///
    /// # Errors
    /// As [`OutboxMarks::pending`].
    pub async fn parked(&self, limit: usize) -> Result<Found, OutboxError> {
        let mut found = Found::default();
        self.query(PARKED, None, limit, None, &HashSet::new(), &mut found)
            .await?;
        Ok(found)
    }

    /// When the oldest pending event was committed; `None` when nothing is pending. One
    /// single-item query per index partition (32: those of events no sweep has tried, and
    /// those of events a sweep failed to publish).
    ///
    /// # Errors
    /// As [`OutboxMarks::pending`].
    pub async fn oldest_pending(&self) -> Result<Option<SystemTime>, OutboxError> {
        let mut oldest: Option<SystemTime> = None;
        for shard in PENDING_SHARDS.into_iter().chain(RETRY_SHARDS) {
            // The partition's first item, whether this build reads it as an event or not (one
            // a later build wrote is pending too): its `created_at` is the index's sort key.
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(PENDING_INDEX)
                .key_condition_expression("pending = :p")
                .expression_attribute_values(":p", AttributeValue::S(shard.to_owned()))
                .scan_index_forward(true)
                .limit(1)
                .send()
                .await
                .map_err(|err| OutboxError::request("Query", err))?;
            let first = page.items().first().and_then(|item| item.get("created_at"));
            // A time past what `SystemTime` holds (an item another writer put there) is skipped.
            let at = first
                .and_then(|at| at.as_n().ok()?.parse::<u64>().ok())
                .and_then(|millis| UNIX_EPOCH.checked_add(Duration::from_millis(millis)));
            if let Some(at) = at {
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
            }
        }
        Ok(oldest)
    }

    /// Appends to `found` up to `limit` events of one index partition, oldest first (created
    /// before `before`, when given), counting but not appending those in `seen` (found by an
    /// earlier read). With `due` (a sweep's time and backoff), an event whose turn has not
    /// come is read past, and so is an unreadable item, up to [`READ_PAST`] times `limit`
    /// items.
    async fn query(
        &self,
        partition: &str,
        before: Option<SystemTime>,
        limit: usize,
        due: Option<(SystemTime, Duration)>,
        seen: &HashSet<String>,
        found: &mut Found,
    ) -> Result<(), OutboxError> {
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        let mut taken = 0;
        let mut read = 0;
        let budget = limit.saturating_mul(READ_PAST);
        // Each partition its share of the bytes, so that large events in one never leave the
        // others unread; the parked events, read alone, take them all.
        let byte_share = match partition {
            PARKED => MAX_FOUND_BYTES,
            _ => MAX_FOUND_BYTES / (PENDING_SHARDS.len() + RETRY_SHARDS.len()),
        };
        let mut bytes = 0;
        loop {
            let wanted = limit.saturating_sub(taken);
            if wanted == 0 || read >= budget || bytes >= byte_share {
                return Ok(());
            }
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(PENDING_INDEX)
                .scan_index_forward(true)
                // Reading past events whose turn has not come: whole pages.
                .limit(match due {
                    Some(_) => 100,
                    None => i32::try_from(wanted.clamp(1, 100)).unwrap_or(100),
                })
                .expression_attribute_values(":p", AttributeValue::S(partition.to_owned()))
                .set_exclusive_start_key(start.take());
            query = match before {
                Some(before) => query
                    .key_condition_expression("pending = :p AND created_at < :before")
                    .expression_attribute_values(":before", number(epoch_millis(before))),
                None => query.key_condition_expression("pending = :p"),
            };
            let page = query
                .send()
                .await
                .map_err(|err| OutboxError::request("Query", err))?;
            for item in page.items() {
                read += 1;
                if taken == limit || bytes >= byte_share {
                    break;
                }
                if due.is_some_and(|(now, backoff)| !is_due(item, now, backoff)) {
                    continue;
                }
                let seen_before = item
                    .get("pk")
                    .and_then(|pk| pk.as_s().ok())
                    .is_some_and(|id| seen.contains(id));
                match pending_event(item) {
                    // Found by an earlier read: counted in this partition's share, kept once.
                    Ok(event) if seen_before => {
                        taken += 1;
                        bytes += event.payload.len();
                    }
                    Err(_) if seen_before => {}
                    Ok(event) => {
                        taken += 1;
                        bytes += event.payload.len();
                        found.events.push(event);
                    }
                    Err(not_an_event) => {
                        warn!(error = %not_an_event, "an item of the outbox's pending index is not an outbox event: left as it is");
                        found.unreadable.push(
                            item.get("pk")
                                .and_then(|pk| pk.as_s().ok())
                                .cloned()
                                .unwrap_or_default(),
                        );
                    }
                }
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(()),
            }
        }
    }
}

/// About the most payload bytes one read of the pending index returns (a sweep's events, each
/// read whole, then each sent in an envelope): each of its partitions is read up to its equal
/// share, stopping at the event that reaches it (one event at least), so that a backlog of
/// events near their destination's 256 KiB is swept over several runs, every partition in
/// each, instead of exhausting the sweeper's memory at the same oldest events on every run.
pub const MAX_FOUND_BYTES: usize = 32 * 1024 * 1024;

/// The ids of the events (and unreadable items) `found` holds.
fn found_ids(found: &Found) -> HashSet<String> {
    (found.events.iter().map(|event| &event.id))
        .chain(&found.unreadable)
        .cloned()
        .collect()
}

/// How many items, per event wanted, a sweep reads past in one partition (events whose turn
/// has not come, unreadable items) before it leaves the rest to the next sweep.
const READ_PAST: usize = 20;

/// The longest a sweep waits to try again an event it failed to publish: its backoff doubled
/// six times.
pub(crate) const MAX_BACKOFF_DOUBLINGS: u32 = 6;

/// Whether a sweep at `now` tries the indexed `item`: no sweep failed to publish it, or the
/// last failed at least `backoff` × 2^(failures − 1) (at most 2^[`MAX_BACKOFF_DOUBLINGS`]) ago.
fn is_due(item: &HashMap<String, AttributeValue>, now: SystemTime, backoff: Duration) -> bool {
    let read = |name: &str| -> Option<u64> { item.get(name)?.as_n().ok()?.parse().ok() };
    let Some(failed_at) = read("sweep_failed_at") else {
        return true;
    };
    let failures = read("sweep_failures").unwrap_or(1).max(1);
    let doublings =
        u32::try_from(failures - 1).map_or(MAX_BACKOFF_DOUBLINGS, |n| n.min(MAX_BACKOFF_DOUBLINGS));
    let wait = backoff.saturating_mul(1 << doublings);
    UNIX_EPOCH
        .checked_add(Duration::from_millis(failed_at))
        .and_then(|failed_at| failed_at.checked_add(wait))
        .is_some_and(|turn| turn <= now)
}

fn number(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn bounded(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A conditional mark's answer: applied, or refused by its condition (published already, or
/// gone).
fn settled<T>(
    update: Result<
        T,
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
        >,
    >,
    operation: &'static str,
) -> Result<bool, OutboxError> {
    match update {
        Ok(_) => Ok(true),
        Err(err)
            if err
                .as_service_error()
                .is_some_and(|service| service.is_conditional_check_failed_exception()) =>
        {
            Ok(false)
        }
        Err(err) => Err(OutboxError::request(operation, err)),
    }
}

/// An indexed item as a pending (or parked) event.
fn pending_event(item: &HashMap<String, AttributeValue>) -> Result<OutboxRecord, OutboxError> {
    let id = item
        .get("pk")
        .and_then(|pk| pk.as_s().ok())
        .cloned()
        .unwrap_or_default();
    let not_an_event = |reason| OutboxError::NotAnEvent {
        id: id.clone(),
        reason,
    };
    let record = OutboxRecord::from_item(item).ok_or_else(|| not_an_event("a field is missing"))?;
    if record.created_at.is_none() {
        return Err(not_an_event("no created_at"));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::{Outbox, OutboxMarks, bounded};
    use crate::store::{ATTEMPT_TIMEOUT, OPERATION_TIMEOUT};

    #[test]
    fn a_mark_is_bounded_as_the_stores_requests_are() {
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .build(),
        );
        let marks = OutboxMarks::new(client, &Outbox::new("outbox"));
        let config = marks.client.config();
        let timeouts = config.timeout_config().expect("timeouts");
        assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
    }

    #[test]
    fn a_reason_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 2), "ab");
        assert_eq!(bounded("é", 1), "");
        assert_eq!(bounded("short", 1024), "short");
    }
}
