//! Reading the whole idempotency table (and the uniqueness table's unsettled evidence) page by
//! page: for operators (`idemctl stuck`, `stats`), never on an execution's path.

use super::DynamoDbStore;
use super::error::map_sdk_error;
use super::item::Item;
use crate::error::StoreError;
use crate::record::{Evidence, Record, Status};
use aws_sdk_dynamodb::types::{AttributeValue, Select};

impl DynamoDbStore {
    /// One page of the idempotency table's records (a `Scan`, eventually consistent) from
    /// `start` (`None`: the first page), and where the next page starts (DynamoDB's
    /// `LastEvaluatedKey`; `None` after the last page). A record that does not decode is skipped and counted. Outcome
    /// part items are left out, and not read: a record whose outcome is kept in parts or
    /// compressed comes back with `outcome: None` (read it with
    /// [`StoreExt::get`](crate::store::StoreExt::get)); its steps are decoded (within their bounds).
    /// To count or list records, [`Self::scan_summary_page`] reads far less.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// let mut start = None;
    /// loop {
    ///     let (records, _skipped, next) = store.scan_page(start).await?;
    ///     println!("{} records", records.len());
    ///     start = next;
    ///     if start.is_none() { break; }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn scan_page(
        &self,
        start: Option<Item>,
    ) -> Result<(Vec<Record>, usize, Option<Item>), StoreError> {
        self.scan_records(start, false).await
    }

    /// One page of the records' summaries only: key, status, fingerprint, lease and times
    /// (a `Scan` with a `ProjectionExpression`, `Select` `SPECIFIC_ATTRIBUTES`): no outcome,
    /// manifest, steps, audit, request id or identity is read, let alone decompressed, so a
    /// page costs what its summaries take whatever the records hold. What `idemctl stats`
    /// and the stuck check read ([`Self::find_stuck`]); all the stuck check's role may read.
    /// Attributes a server returns beyond the projection are dropped before decoding.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// let (summaries, _skipped, next) = store.scan_summary_page(None).await?;
    /// assert!(summaries.iter().all(|record| record.outcome.is_none() && record.steps.is_empty()));
    /// # let _ = next; Ok(()) }
    /// ```
    pub async fn scan_summary_page(
        &self,
        start: Option<Item>,
    ) -> Result<(Vec<Record>, usize, Option<Item>), StoreError> {
        self.scan_records(start, true).await
    }

    /// One page of records, all their attributes or (`summaries`) only their summaries'.
    async fn scan_records(
        &self,
        start: Option<Item>,
        summaries: bool,
    ) -> Result<(Vec<Record>, usize, Option<Item>), StoreError> {
        let mut scan = self
            .client
            .scan()
            .table_name(&self.table)
            .set_exclusive_start_key(start);
        if summaries {
            let (projection, names) = self.names.summary_projection();
            scan = scan
                .select(Select::SpecificAttributes)
                .projection_expression(projection);
            for (placeholder, name) in names {
                scan = scan.expression_attribute_names(placeholder, name);
            }
        }
        // Records only: outcome parts have no status.
        scan = scan
            .filter_expression("attribute_exists(#status)")
            .expression_attribute_names("#status", &self.names.status);
        if let Some(sort) = &self.names.sort_key {
            // A shared table: only this store's records.
            scan = scan
                .filter_expression("attribute_exists(#status) AND #kind = :kind")
                .expression_attribute_names("#kind", &sort.attribute)
                .expression_attribute_values(":kind", AttributeValue::S(sort.value.clone()));
        }
        let output = scan
            .send()
            .await
            .map_err(|err| map_sdk_error("scan", &self.table, err))?;
        let mut records = Vec::new();
        let mut skipped = 0;
        let summary = summaries.then(|| self.names.summary());
        let next = output.last_evaluated_key;
        for mut item in output.items.unwrap_or_default() {
            // A summary is decoded from the summary's attributes alone, whatever a server
            // returned beside them: nothing else is read, no outcome or step is decompressed.
            if let Some(summary) = &summary {
                item.retain(|name, _| summary.contains(&name.as_str()));
            }
            let decoded = self.names.decode(item);
            match decoded {
                Ok((record, _parts)) => records.push(record),
                Err(_) => skipped += 1,
            }
        }
        Ok((records, skipped, next))
    }
}

impl DynamoDbStore {
    /// One page of the uniqueness table's evidence that is not settled (IN_PROGRESS or
    /// INDETERMINATE: a `Scan` with a filter, eventually consistent) from `start`, and where the
    /// next page starts (as for [`Self::scan_page`]): what an operator looks at for evidence whose record may be gone
    /// (`idemctl stuck`). Evidence that does not decode is skipped and counted.
    pub async fn scan_unsettled_evidence(
        &self,
        start: Option<Item>,
    ) -> Result<(Vec<Evidence>, usize, Option<Item>), StoreError> {
        let table = self.uniqueness()?;
        let output = self
            .client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .filter_expression("#status IN (:in_progress, :indeterminate)")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(
                ":in_progress",
                AttributeValue::S(Status::InProgress.as_str().into()),
            )
            .expression_attribute_values(
                ":indeterminate",
                AttributeValue::S(Status::Indeterminate.as_str().into()),
            )
            .send()
            .await
            .map_err(|err| match map_sdk_error("scan", table, err) {
                StoreError::TableNotFound { .. } => self.not_found(table),
                other => other,
            })?;
        let mut found = Vec::new();
        let mut skipped = 0;
        for item in output.items() {
            match super::evidence::decode(item) {
                Ok(evidence) => found.push(evidence),
                Err(_) => skipped += 1,
            }
        }
        Ok((found, skipped, output.last_evaluated_key))
    }
}
