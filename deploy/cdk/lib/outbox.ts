// The checkout and its outbox: the checkout commits each order with its event (one
// TransactWriteItems: the record's UpdateItem, the order's PutItem on the ledger, the event's
// PutItem on the outbox under the checkout's own namespace), the relay publishes every event
// from the stream and marks it, the sweeper republishes what the stream never delivered. The
// relay path only: template.yaml's EventBridge Pipe alternative (OutboxPublisher=pipe, with its
// marker function) is not in this app.
import { Duration } from 'aws-cdk-lib';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { DynamoEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';

import { ExampleTables, exampleFunction } from './functions';
import { allow, leadingKeys, outboxMarks, outboxMarksRead, ownKeysPolicy, ownNamespace } from './policies';
import { outboxTable, sameLogicalId } from './tables';

/** The outbox table, its queues, and the checkout, relay and sweeper functions, in `stack`;
 * returns the queue the checkout's events are published to. */
export function checkoutWithOutbox(stack: Construct, tables: ExampleTables): sqs.Queue {
  const outbox = outboxTable(stack, 'OutboxTable');
  const fourteenDays = Duration.days(14);
  // Outbox records that could not be published after their retries.
  const deadLetters = sameLogicalId(
    new sqs.Queue(stack, 'OutboxDeadLetterQueue', { retentionPeriod: fourteenDays }), 'OutboxDeadLetterQueue');
  // Where the checkout's order-placed events go.
  const orderEvents = sameLogicalId(
    new sqs.Queue(stack, 'OrderEventsQueue', { retentionPeriod: fourteenDays }), 'OrderEventsQueue');
  // The destinations the outbox may name: the relay and the sweeper are given the same list.
  const destinations = { OUTBOX_TABLE: outbox.tableName, OUTBOX_DESTINATIONS: orderEvents.queueUrl };

  const checkout = exampleFunction(stack, 'CheckoutFunction', tables, {
    binary: 'checkout',
    description: 'Checkout with steps, a transactional order write and its outbox event.',
    environment: { ...destinations, ORDER_EVENTS_QUEUE_URL: orderEvents.queueUrl },
    // A transaction DynamoDB answers ResourceNotFound names no table: each of its tables is
    // described to name the missing one.
    describes: [tables.idempotency, tables.ledger, outbox],
  });
  checkout.addToRolePolicy(allow(
    ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem'], [tables.ledger.tableArn]));
  // Outbox events start with the producer's namespace: the checkout writes its own only.
  ownKeysPolicy(stack, checkout, [tables.idempotency.tableArn], [
    allow(['dynamodb:PutItem'], [outbox.tableArn], leadingKeys([ownNamespace(checkout)])),
  ]);

  const relay = exampleFunction(stack, 'OutboxRelayFunction', tables, {
    binary: 'outbox_relay',
    description: 'Publishes every committed outbox event, once per event id, from the stream.',
    environment: destinations,
    describes: [],
  });
  relay.addToRolePolicy(outboxMarksRead(outbox.tableArn));
  relay.addToRolePolicy(outboxMarks(outbox.tableArn));
  // The event source's on-failure destination sends with the function's role: SendMessage
  // only (the CDK's SqsDlq would add GetQueueAttributes and GetQueueUrl).
  relay.addToRolePolicy(allow(['sqs:SendMessage'], [orderEvents.queueArn, deadLetters.queueArn]));
  // A failed publish is reported by sequence number and retried from it; one that keeps
  // failing goes to the dead-letter queue after its retries, never silently past. (The event
  // source grants the stream's reads.)
  relay.addEventSource(new DynamoEventSource(outbox, {
    startingPosition: lambda.StartingPosition.TRIM_HORIZON,
    batchSize: 100,
    reportBatchItemFailures: true,
    retryAttempts: 100,
    onFailure: { bind: () => ({ destination: deadLetters.queueArn }) },
    filters: [lambda.FilterCriteria.filter({ eventName: lambda.FilterRule.isEqual('INSERT') })],
  }));

  const sweeper = exampleFunction(stack, 'OutboxSweeperFunction', tables, {
    binary: 'outbox_sweeper',
    description: 'Republishes outbox events the stream never delivered; outbox gauges for the alarms.',
    timeout: Duration.seconds(300),
    // A failed run is not retried: the next one comes in five minutes.
    retryAttempts: 0,
    environment: {
      ...destinations,
      OUTBOX_SWEEP_MODE: 'publish',
      OUTBOX_SWEEP_AFTER_SECONDS: '600',
      OUTBOX_SWEEP_LIMIT: '1000',
    },
    describes: [],
  });
  sweeper.addToRolePolicy(allow(['dynamodb:Query'], [`${outbox.tableArn}/index/pending`]));
  sweeper.addToRolePolicy(outboxMarksRead(outbox.tableArn));
  sweeper.addToRolePolicy(outboxMarks(outbox.tableArn, true));
  sweeper.addToRolePolicy(allow(['sqs:SendMessage'], [orderEvents.queueArn]));
  everyFiveMinutes(stack, 'OutboxSweeperSchedule', sweeper);
  return orderEvents;
}

/** A rule that invokes `fn` every five minutes. */
export function everyFiveMinutes(scope: Construct, id: string, fn: lambda.IFunction): events.Rule {
  return new events.Rule(scope, id, {
    schedule: events.Schedule.rate(Duration.minutes(5)),
    targets: [new targets.LambdaFunction(fn)],
  });
}
