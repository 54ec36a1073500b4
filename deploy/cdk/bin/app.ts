// The example stack's idempotency path in the AWS CDK: the tables, the quick start and the SQS
// order consumer (built by cargo-lambda-cdk's RustFunction from functions/), each with the
// least-privilege policies template.yaml gives it: item actions on the idempotency table only
// under the function's own namespace (`<function name>#`), DescribeTable for `prime`, the
// ledger's UpdateItem for the consumer. CI synthesises it (bundling skipped) and evaluates the
// synthesised template with the same IAM check as template.yaml (scripts/cdk-synth.sh).
import { App, CfnResource, DefaultStackSynthesizer, Duration, Fn, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';
import * as path from 'path';

const FUNCTIONS_CRATE = path.join(__dirname, '..', '..', '..', 'functions', 'Cargo.toml');

/** A table keyed by `pk` (S), protected as template.yaml's are. */
function protectedTable(scope: Construct, id: string, ttl?: string): dynamodb.Table {
  return new dynamodb.Table(scope, id, {
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    timeToLiveAttribute: ttl,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
    deletionProtection: true,
    removalPolicy: RemovalPolicy.RETAIN,
  });
}

class ExampleStack extends Stack {
  readonly idempotency: dynamodb.Table;
  readonly uniqueness: dynamodb.Table;
  readonly ledger: dynamodb.Table;

  constructor(scope: Construct, id: string) {
    super(scope, id, {
      // No bootstrap-version parameter or rule: the template stands alone.
      synthesizer: new DefaultStackSynthesizer({ generateBootstrapVersionRule: false }),
    });
    this.idempotency = protectedTable(this, 'IdempotencyTable', 'expires_at');
    this.uniqueness = protectedTable(this, 'UniquenessTable');
    this.ledger = protectedTable(this, 'LedgerTable');

    const quickstart = this.rustFunction('QuickstartFunction', 'quickstart',
      "The README's first function (invoke it with functions/events/direct.json).");

    const consumer = this.rustFunction('SqsOrdersFunction', 'sqs_orders',
      'SQS order consumer with partial batch failures.');
    consumer.addToRolePolicy(new iam.PolicyStatement({
      actions: ['dynamodb:UpdateItem'],
      resources: [this.ledger.tableArn],
    }));
    const deadLetters = new sqs.Queue(this, 'OrdersDeadLetterQueue', {
      retentionPeriod: Duration.days(14),
    });
    const orders = new sqs.Queue(this, 'OrdersQueue', {
      // At least six times the function timeout, as AWS recommends for SQS event sources.
      visibilityTimeout: Duration.seconds(180),
      retentionPeriod: Duration.days(4),
      deadLetterQueue: { queue: deadLetters, maxReceiveCount: 5 },
    });
    // The mapping waits for the own-keys policy: a first deploy that polled before the role
    // could claim would fail every message with AccessDenied.
    const ownKeys = this.ownKeysPolicy(consumer);
    consumer.addEventSource(new SqsEventSource(orders, { batchSize: 10, reportBatchItemFailures: true }));
    consumer.node.findAll()
      .filter((child) => child instanceof lambda.CfnEventSourceMapping)
      .forEach((mapping) => mapping.node.addDependency(ownKeys));
    this.ownKeysPolicy(quickstart);
  }

  /** A function of functions/, arm64, with the tables' names, JSON logs kept 30 days and
   * DescribeTable on the idempotency table (for `prime`). */
  private rustFunction(id: string, binary: string, description: string): RustFunction {
    const logGroup = new logs.LogGroup(this, `${id}LogGroup`, {
      retention: logs.RetentionDays.ONE_MONTH,
    });
    const fn = new RustFunction(this, id, {
      manifestPath: FUNCTIONS_CRATE,
      binaryName: binary,
      architecture: lambda.Architecture.ARM_64,
      memorySize: 256,
      timeout: Duration.seconds(30),
      description,
      environment: {
        IDEMPOTENCY_TABLE: this.idempotency.tableName,
        LEDGER_TABLE: this.ledger.tableName,
      },
      logGroup,
      loggingFormat: lambda.LoggingFormat.JSON,
      applicationLogLevelV2: lambda.ApplicationLogLevel.INFO,
      systemLogLevelV2: lambda.SystemLogLevel.WARN,
    });
    // Which binary the function runs, where SAM keeps it: the IAM check maps recordings by it.
    (fn.node.defaultChild as CfnResource).addMetadata('BuildProperties', { Binary: binary });
    fn.addToRolePolicy(new iam.PolicyStatement({
      actions: ['dynamodb:DescribeTable'],
      resources: [this.idempotency.tableArn],
    }));
    return fn;
  }

  /** Item actions on the idempotency table under the function's own namespace only: its
   * name, then `#`. `Null` keeps out a request without leading keys (a Scan), which
   * `ForAllValues` alone would let through. */
  private ownKeysPolicy(fn: lambda.Function): iam.Policy {
    return new iam.Policy(this, `${fn.node.id}OwnKeysPolicy`, {
      policyName: 'own-keys',
      roles: [fn.role!],
      statements: [new iam.PolicyStatement({
        actions: ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem'],
        resources: [this.idempotency.tableArn],
        conditions: {
          'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': [Fn.join('', [fn.functionName, '#*'])] },
          'Null': { 'dynamodb:LeadingKeys': 'false' },
        },
      })],
    });
  }
}

const app = new App({ analyticsReporting: false });
new ExampleStack(app, 'LambdaIdempotencyExample');
