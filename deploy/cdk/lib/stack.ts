// The example stack (template.yaml's) in the CDK: the tables, the eight functions of the relay
// path with the same least-privilege policies, their event sources and schedules. What stays in
// template.yaml only: the EventBridge Pipe alternative and its marker function, the customer-
// managed KMS key option, the alarms and their topic, and the template's parameters (here the
// defaults are constants).
import { CfnOutput, DefaultStackSynthesizer, Duration, Stack } from 'aws-cdk-lib';
import * as apigwv2 from 'aws-cdk-lib/aws-apigatewayv2';
import { HttpIamAuthorizer } from 'aws-cdk-lib/aws-apigatewayv2-authorizers';
import { HttpLambdaIntegration } from 'aws-cdk-lib/aws-apigatewayv2-integrations';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { SqsDestination } from 'aws-cdk-lib/aws-lambda-destinations';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';

import { ExampleTables, exampleFunction } from './functions';
import { checkoutWithOutbox, everyFiveMinutes } from './outbox';
import { allow, leadingKeys, ownKeysPolicy, ownNamespace, recordSummaries } from './policies';
import { protectedTable, sameLogicalId } from './tables';

export class ExampleStack extends Stack {
  readonly tables: ExampleTables;
  readonly uniqueness: dynamodb.Table;

  constructor(scope: Construct, id: string) {
    super(scope, id, {
      // No bootstrap-version parameter or rule: the template stands alone.
      synthesizer: new DefaultStackSynthesizer({ generateBootstrapVersionRule: false }),
    });
    this.tables = {
      // Replayable records, deleted by TTL after the functions' retention.
      idempotency: protectedTable(this, 'IdempotencyTable', 'expires_at'),
      // The examples' business effects, and the checkout's transactional writes.
      ledger: protectedTable(this, 'LedgerTable'),
    };
    // Permanent evidence of business identities: no TTL.
    this.uniqueness = protectedTable(this, 'UniquenessTable');

    const quickstart = exampleFunction(this, 'QuickstartFunction', this.tables, {
      binary: 'quickstart',
      description: "The README's first function (invoke it with functions/events/direct.json).",
    });
    ownKeysPolicy(this, quickstart, [this.tables.idempotency.tableArn]);

    const orders = this.sqsOrders();
    const payments = this.payments();
    this.shipmentNotices();
    const orderEvents = checkoutWithOutbox(this, this.tables);
    this.stuckCheck();

    // template.yaml's outputs (but the alarms' topic, which this app has not).
    new CfnOutput(this, 'IdempotencyTableName', {
      description: 'IDEMPOTENCY_TABLE for the functions.',
      value: this.tables.idempotency.tableName,
    });
    new CfnOutput(this, 'UniquenessTableName', {
      description: 'UNIQUENESS_TABLE for the functions.',
      value: this.uniqueness.tableName,
    });
    new CfnOutput(this, 'OrdersQueueUrl', { description: 'Send orders here.', value: orders.queueUrl });
    new CfnOutput(this, 'OrderEventsQueueUrl', {
      description: "The checkout's order-placed events (published by the relay).",
      value: orderEvents.queueUrl,
    });
    new CfnOutput(this, 'PaymentsEndpoint', {
      description: 'POST /payments with an Idempotency-Key header, signed with SigV4 (service execute-api) '
        + 'by an IAM principal allowed execute-api:Invoke on it.',
      value: `${payments.apiEndpoint}/payments`,
    });
  }

  /** The SQS order consumer: partial batch failures, a dead-letter queue after five receives. */
  private sqsOrders(): sqs.Queue {
    const consumer = exampleFunction(this, 'SqsOrdersFunction', this.tables, {
      binary: 'sqs_orders',
      description: 'SQS order consumer with partial batch failures.',
    });
    consumer.addToRolePolicy(allow(['dynamodb:UpdateItem'], [this.tables.ledger.tableArn]));
    const deadLetters = sameLogicalId(
      new sqs.Queue(this, 'OrdersDeadLetterQueue', { retentionPeriod: Duration.days(14) }), 'OrdersDeadLetterQueue');
    const orders = sameLogicalId(new sqs.Queue(this, 'OrdersQueue', {
      // At least six times the function timeout, as AWS recommends for SQS event sources.
      visibilityTimeout: Duration.seconds(180),
      retentionPeriod: Duration.days(4),
      deadLetterQueue: { queue: deadLetters, maxReceiveCount: 5 },
    }), 'OrdersQueue');
    // The mapping waits for the own-keys policy: a first deploy that polled before the role
    // could claim would fail every message with AccessDenied.
    const ownKeys = ownKeysPolicy(this, consumer, [this.tables.idempotency.tableArn]);
    consumer.addEventSource(new SqsEventSource(orders, { batchSize: 10, reportBatchItemFailures: true }));
    consumer.node.findAll()
      .filter((child) => child instanceof lambda.CfnEventSourceMapping)
      .forEach((mapping) => mapping.node.addDependency(ownKeys));
    return orders;
  }

  /** The payments endpoint: POST /payments on an HTTP API whose every route is signed (SigV4,
   * so that each IAM caller's Idempotency-Key is its own), throttled across callers. */
  private payments(): apigwv2.HttpApi {
    const payments = exampleFunction(this, 'ApiPaymentsFunction', this.tables, {
      binary: 'api_payments',
      description: 'Idempotent payment endpoint (Idempotency-Key header).',
    });
    payments.addToRolePolicy(allow(['dynamodb:UpdateItem'], [this.tables.ledger.tableArn]));
    ownKeysPolicy(this, payments, [this.tables.idempotency.tableArn]);
    const api = new apigwv2.HttpApi(this, 'PaymentsApi', {
      defaultAuthorizer: new HttpIamAuthorizer(),
      createDefaultStage: false,
    });
    new apigwv2.HttpStage(this, 'PaymentsApiDefaultStage', {
      httpApi: api,
      stageName: '$default',
      autoDeploy: true,
      throttle: { rateLimit: 10, burstLimit: 20 },
    });
    api.addRoutes({
      path: '/payments',
      methods: [apigwv2.HttpMethod.POST],
      integration: new HttpLambdaIntegration('Pay', payments),
    });
    return api;
  }

  /** OrderShipped notices, once per order, ever: each claim declares a business identity
   * (`shipment-notice:<order>`) whose evidence lives in the uniqueness table. */
  private shipmentNotices(): void {
    const notices = exampleFunction(this, 'EventBridgeFunction', this.tables, {
      binary: 'eventbridge_handler',
      description: 'OrderShipped notices, once per order, ever (permanent evidence).',
      environment: { UNIQUENESS_TABLE: this.uniqueness.tableName },
      describes: [this.tables.idempotency, this.uniqueness],
    });
    notices.addToRolePolicy(allow(['dynamodb:UpdateItem'], [this.tables.ledger.tableArn]));
    // The claim also checks the identity's evidence in its other forms (under another identity
    // scope: `#g#shipment-notice:<order>` for an order id holding `#`; before 0.2: the bare
    // identity): a ConditionCheck on those keys and its own only.
    ownKeysPolicy(this, notices, [this.tables.idempotency.tableArn, this.uniqueness.tableArn], [
      allow(['dynamodb:ConditionCheckItem'], [this.uniqueness.tableArn],
        leadingKeys([ownNamespace(notices), 'shipment-notice:*', '#g#shipment-notice:*'])),
    ]);
    new events.Rule(this, 'ShipmentNoticesRule', {
      eventPattern: { source: ['shop.fulfilment'], detailType: ['OrderShipped'] },
      targets: [new targets.LambdaFunction(notices)],
    });
    // EventBridge invokes it asynchronously: a notice that fails Lambda's two retries is kept
    // in a queue (Lambda's invocation record, the event inside), not discarded.
    const failed = sameLogicalId(new sqs.Queue(this, 'ShipmentNoticesFailedQueue', {
      retentionPeriod: Duration.days(14),
    }), 'ShipmentNoticesFailedQueue');
    notices.configureAsyncInvoke({ retryAttempts: 2, onFailure: new SqsDestination(failed) });
  }

  /** Every five minutes, what waits for a takeover or an operator, as EMF gauges. Bounded
   * reads of records' summaries and the unsettled evidence. */
  private stuckCheck(): void {
    const check = exampleFunction(this, 'StuckCheckFunction', this.tables, {
      binary: 'stuck_check',
      description: 'Counts stuck IN_PROGRESS, INDETERMINATE and orphaned work for the alarms.',
      // Up to 100 sequential 1 MB pages: more time and CPU than the request functions need.
      timeout: Duration.seconds(300),
      memorySize: 512,
      // A failed run is not retried (the next one comes in five minutes).
      retryAttempts: 0,
      environment: {
        UNIQUENESS_TABLE: this.uniqueness.tableName,
        STUCK_OLDER_THAN_SECONDS: '300',
        STUCK_MAX_PAGES: '100',
      },
      describes: [this.tables.idempotency, this.uniqueness],
    });
    // The unsettled evidence (evidence carries no outcome).
    check.addToRolePolicy(allow(['dynamodb:Scan'], [this.uniqueness.tableArn]));
    check.addToRolePolicy(recordSummaries(this.tables.idempotency.tableArn));
    everyFiveMinutes(this, 'StuckCheckSchedule', check);
  }
}
