// The example stack's tables, protected as template.yaml's are: retained when the stack or the
// table goes, deletion protection, point-in-time recovery. Losing one would forget operations
// in flight (the idempotency table), identities for good (uniqueness), effects (the ledger) or
// events not yet published (the outbox).
import { RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import { Construct } from 'constructs';

/** A table keyed by `pk` (S), with TTL on `ttl` when given. */
export function protectedTable(scope: Construct, id: string, ttl?: string): dynamodb.Table {
  return new dynamodb.Table(scope, id, {
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    timeToLiveAttribute: ttl,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
    deletionProtection: true,
    removalPolicy: RemovalPolicy.RETAIN,
  });
}

/** The checkout's outbox: events committed with the order, read from the stream (new images),
 * pending until marked published. The sparse `pending` index holds pending and parked events
 * only, so the sweeper's reads cost what is pending; TTL removes published events only. */
export function outboxTable(scope: Construct, id: string): dynamodb.Table {
  const table = new dynamodb.Table(scope, id, {
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    timeToLiveAttribute: 'expires_at',
    stream: dynamodb.StreamViewType.NEW_IMAGE,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
    deletionProtection: true,
    removalPolicy: RemovalPolicy.RETAIN,
  });
  table.addGlobalSecondaryIndex({
    indexName: 'pending',
    partitionKey: { name: 'pending', type: dynamodb.AttributeType.STRING },
    sortKey: { name: 'created_at', type: dynamodb.AttributeType.NUMBER },
    projectionType: dynamodb.ProjectionType.ALL,
  });
  return table;
}
