// What the example policy (docs/guide/deploy.md, "Scope the item actions to the function's own
// keys") is for, in the example stack: the one place readme-check.mjs reads it from.

// The tables the policy covers, by logical id in template.yaml (the policy's
// `table/idempotency` and `table/idempotency-uniqueness`). An authorization on any other
// table (the ledger, the outbox), queue or bus is outside the policy: counted, not evaluated.
export const STORE_TABLES = {
  IdempotencyTable: 'arn:aws:dynamodb:REGION:ACCOUNT:table/idempotency',
  UniquenessTable: 'arn:aws:dynamodb:REGION:ACCOUNT:table/idempotency-uniqueness'
}

// IDENTITY_PREFIX: what each function's business identities start with (by binary). Only the
// pre-0.2 evidence check reads those keys (ConditionCheckItem on the uniqueness table). A
// function that has none gets the statement without the IDENTITY_PREFIX* pattern: its
// namespace only.
export const IDENTITY_PREFIXES = {
  eventbridge_handler: 'shipment-notice:'
}

// Functions the policy is not for, by binary, with the reason (printed with the counts).
export const OTHER_POLICIES = {
  stuck_check: "an operator's check (like `idemctl stuck`): it scans both tables and reads every namespace"
}
