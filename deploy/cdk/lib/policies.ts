// The least-privilege statements template.yaml gives the functions, for the CDK app.
import { Fn } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';

/** `<function name>#*`: every key a function writes starts with its namespace, its name. */
export function ownNamespace(fn: lambda.IFunction): string {
  return Fn.join('', [fn.functionName, '#*']);
}

/** The item actions on `tables` under the function's own namespace only (plus `extra` leading
 * keys), as a policy of its own: the function's name inside its role's default policy would be
 * a circular reference. `Null` keeps out a request without leading keys (a Scan), which
 * `ForAllValues` alone would let through. */
export function ownKeysPolicy(
  scope: Construct,
  fn: lambda.Function,
  tables: string[],
  more: iam.PolicyStatement[] = [],
): iam.Policy {
  return new iam.Policy(scope, `${fn.node.id}OwnKeysPolicy`, {
    policyName: 'own-keys',
    roles: [fn.role!],
    statements: [
      new iam.PolicyStatement({
        actions: ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem'],
        resources: tables,
        conditions: leadingKeys([ownNamespace(fn)]),
      }),
      ...more,
    ],
  });
}

/** `dynamodb:LeadingKeys` limited to `patterns`, and present. */
export function leadingKeys(patterns: string[]): Record<string, unknown> {
  return {
    'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': patterns },
    'Null': { 'dynamodb:LeadingKeys': 'false' },
  };
}

/** The outbox marks' attributes: an event published, parked or redriven. Never its payload. */
const MARKS = [
  'pk', 'pending', 'published_at', 'published_by', 'expires_at',
  'parked_at', 'parked_reason', 'redriven_at', 'redrives',
];

/** What a sweep writes besides: that it failed to publish an event, how often and when. */
const SWEEP_FAILURES = ['sweep_failures', 'sweep_failed_at'];

/** UpdateItem on the outbox of the marks' attributes only (and naming them: `Null`); with
 * `sweeper`, the sweep's failures too. */
export function outboxMarks(outboxArn: string, sweeper = false): iam.PolicyStatement {
  return new iam.PolicyStatement({
    actions: ['dynamodb:UpdateItem'],
    resources: [outboxArn],
    conditions: {
      'ForAllValues:StringEquals': {
        'dynamodb:Attributes': sweeper ? [...MARKS, ...SWEEP_FAILURES] : MARKS,
      },
      'Null': { 'dynamodb:Attributes': 'false' },
    },
  });
}

/** A batch's marks read before the relay (or the sweeper) publishes it: never an event's
 * payload. */
export function outboxMarksRead(outboxArn: string): iam.PolicyStatement {
  return new iam.PolicyStatement({
    actions: ['dynamodb:BatchGetItem'],
    resources: [outboxArn],
    conditions: {
      'ForAllValues:StringEquals': { 'dynamodb:Attributes': ['pk', 'published_at', 'pending'] },
      'StringEquals': { 'dynamodb:Select': 'SPECIFIC_ATTRIBUTES' },
    },
  });
}

/** The stuck check's reads of the idempotency table: records' summaries, never an outcome,
 * steps or audit (AttributeNames' defaults). A request naming no attributes reads them all. */
export function recordSummaries(idempotencyArn: string): iam.PolicyStatement {
  return new iam.PolicyStatement({
    actions: ['dynamodb:Scan', 'dynamodb:GetItem'],
    resources: [idempotencyArn],
    conditions: {
      'ForAllValues:StringEquals': {
        'dynamodb:Attributes': [
          'pk', 'status', 'fingerprint', 'key_rule', 'lease_token', 'attempt',
          'lease_expires_at_ms', 'expires_at', 'created_at', 'completed_at',
        ],
      },
      'StringEqualsIfExists': { 'dynamodb:Select': 'SPECIFIC_ATTRIBUTES' },
      'Null': { 'dynamodb:Attributes': 'false' },
    },
  });
}

/** `actions` on `resources`, under `conditions` when given. */
export function allow(
  actions: string[],
  resources: string[],
  conditions?: Record<string, unknown>,
): iam.PolicyStatement {
  return new iam.PolicyStatement({ actions, resources, conditions });
}
