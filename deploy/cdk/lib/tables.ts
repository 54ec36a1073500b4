// The example stack's tables, protected as template.yaml's are: retained when the stack or the
// table goes, deletion protection, point-in-time recovery. Losing one would forget operations
// in flight (the idempotency table), identities for good (uniqueness), effects (the ledger) or
// events not yet published (the outbox).
import { CfnResource, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import { Construct } from 'constructs';

/** A table keyed by `pk` (S), with TTL on `ttl` when given. */
export function protectedTable(scope: Construct, id: string, ttl?: string): dynamodb.Table {
  return sameLogicalId(new dynamodb.Table(scope, id, {
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    // The AWS managed key (aws/dynamodb), as template.yaml's SSESpecification.
    encryption: dynamodb.TableEncryption.AWS_MANAGED,
    timeToLiveAttribute: ttl,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
    deletionProtection: true,
    removalPolicy: RemovalPolicy.RETAIN,
  }), id);
}

/** The checkout's outbox: events committed with the order, read from the stream (new images),
 * pending until marked published. The sparse `pending` index holds pending and parked events
 * only, so the sweeper's reads cost what is pending; TTL removes published events only. */
export function outboxTable(scope: Construct, id: string): dynamodb.Table {
  const table = new dynamodb.Table(scope, id, {
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    encryption: dynamodb.TableEncryption.AWS_MANAGED,
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
  return sameLogicalId(table, id);
}

/** Gives `construct`'s resource the logical id `id`, template.yaml's (not the CDK's hashed
 * one): the IAM check names resources by them, and a stack moved between the two keeps its
 * tables and queues. Not its functions' names: each deploy generates them from the stack and
 * the logical id, and a function's name is its keys' namespace, so a move (or a renamed
 * logical id) starts a new key space: pin the names first (`functionName`, `FunctionName`;
 * docs/guide/deploy.md, "The namespace is part of every key"). */
export function sameLogicalId<T extends Construct>(construct: T, id: string): T {
  (construct.node.defaultChild as CfnResource).overrideLogicalId(id);
  return construct;
}
