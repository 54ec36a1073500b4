// From raw requests to IAM's authorizations: actions, resources and condition keys as AWS
// documents them (see the comment at the top of dynamodb.mjs).

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { authorizationsOf } from '../derive.mjs'
import { DeriveError } from '../dynamodb.mjs'

const arn = (name) => `arn:aws:dynamodb:us-east-1:123456789012:table/${name}`
const stack = {
  tables: {
    idem: { arn: arn('idem'), partition_key: 'pk', sort_key: null, indexes: ['by-status', 'pending'], index_partition_keys: { 'by-status': 'pk', pending: 'pending' }, stream_arn: null },
    evidence: { arn: arn('evidence'), partition_key: 'pk', sort_key: null, indexes: [], stream_arn: null }
  },
  queues: { events: { arn: 'arn:aws:sqs:us-east-1:123456789012:events' } },
  topics: {},
  buses: { default: { arn: 'arn:aws:events:us-east-1:123456789012:event-bus/default' } }
}
const ddb = (operation, body) => ({ service: 'dynamodb', target: `DynamoDB_20120810.${operation}`, body })

test('a projected GetItem: its leading key, the projected and key attributes, SPECIFIC_ATTRIBUTES', () => {
  const [get] = authorizationsOf(stack, ddb('GetItem', {
    TableName: 'idem', Key: { pk: { S: 'fn#lambda-idempotency#prime' } }, ProjectionExpression: '#pk', ExpressionAttributeNames: { '#pk': 'pk' }
  }))
  assert.equal(get.action, 'dynamodb:GetItem')
  assert.equal(get.resource, arn('idem'))
  assert.deepEqual(get.context, {
    'dynamodb:LeadingKeys': ['fn#lambda-idempotency#prime'],
    'dynamodb:Attributes': ['pk'],
    'dynamodb:Select': 'SPECIFIC_ATTRIBUTES'
  })
})

test('an unprojected GetItem reads ALL_ATTRIBUTES', () => {
  const [get] = authorizationsOf(stack, ddb('GetItem', { TableName: 'idem', Key: { pk: { S: 'fn#k' } }, ConsistentRead: true }))
  assert.equal(get.context['dynamodb:Select'], 'ALL_ATTRIBUTES')
})

test("a PutItem carries its item's attribute names and the condition's, ReturnValues NONE by default", () => {
  const [put] = authorizationsOf(stack, ddb('PutItem', {
    TableName: 'idem', Item: { pk: { S: 'fn#k' }, status: { S: 'IN_PROGRESS' } },
    ConditionExpression: 'attribute_not_exists(#pk) OR #expires_at < :now', ExpressionAttributeNames: { '#pk': 'pk', '#expires_at': 'expires_at' },
    ReturnConsumedCapacity: 'TOTAL'
  }))
  assert.deepEqual(put.context, {
    'dynamodb:ReturnConsumedCapacity': 'TOTAL',
    'dynamodb:LeadingKeys': ['fn#k'],
    'dynamodb:Attributes': ['expires_at', 'pk', 'status'],
    'dynamodb:ReturnValues': 'NONE'
  })
})

test('each item of a transaction is its own action, with EnclosingOperation', () => {
  const authorizations = authorizationsOf(stack, ddb('TransactWriteItems', { TransactItems: [
    { Put: { TableName: 'idem', Item: { pk: { S: 'fn#k' } } } },
    { Update: { TableName: 'idem', Key: { pk: { S: 'fn#k2' } }, UpdateExpression: 'SET a = :a' } },
    { Delete: { TableName: 'evidence', Key: { pk: { S: 'fn#id=x' } } } },
    { ConditionCheck: { TableName: 'evidence', Key: { pk: { S: 'x' } }, ConditionExpression: 'attribute_not_exists(pk)' } }
  ] }))
  assert.deepEqual(authorizations.map((a) => [a.action, a.resource, a.context['dynamodb:LeadingKeys'][0]]), [
    ['dynamodb:PutItem', arn('idem'), 'fn#k'],
    ['dynamodb:UpdateItem', arn('idem'), 'fn#k2'],
    ['dynamodb:DeleteItem', arn('evidence'), 'fn#id=x'],
    ['dynamodb:ConditionCheckItem', arn('evidence'), 'x']
  ])
  for (const a of authorizations) assert.equal(a.context['dynamodb:EnclosingOperation'], 'TransactWriteItems')
})

test('a batch is authorized once per table, with every leading key', () => {
  const [batch] = authorizationsOf(stack, ddb('BatchWriteItem', { RequestItems: { idem: [
    { PutRequest: { Item: { pk: { S: 'a#1' }, v: { N: '1' } } } }, { DeleteRequest: { Key: { pk: { S: 'b#2' } } } }
  ] } }))
  assert.equal(batch.action, 'dynamodb:BatchWriteItem')
  assert.deepEqual(batch.context['dynamodb:LeadingKeys'], ['a#1', 'b#2'])
})

test('a query on an index: the index ARN, ALL_PROJECTED_ATTRIBUTES by default', () => {
  const [query] = authorizationsOf(stack, ddb('Query', {
    TableName: 'idem', IndexName: 'by-status', KeyConditionExpression: 'pk = :v', ExpressionAttributeValues: { ':v': { S: 'fn#x' } }
  }))
  assert.equal(query.resource, `${arn('idem')}/index/by-status`)
  assert.equal(query.context['dynamodb:Select'], 'ALL_PROJECTED_ATTRIBUTES')
  assert.deepEqual(query.context['dynamodb:LeadingKeys'], ['fn#x'])
})

test("a query on an index keyed otherwise: the index's partition key is the leading key", () => {
  const [query] = authorizationsOf(stack, ddb('Query', {
    TableName: 'idem', IndexName: 'pending', KeyConditionExpression: 'pending = :p AND created_at < :t',
    ExpressionAttributeValues: { ':p': { S: 'p0' }, ':t': { N: '1' } }
  }))
  assert.equal(query.resource, `${arn('idem')}/index/pending`)
  assert.deepEqual(query.context['dynamodb:LeadingKeys'], ['p0'])
  assert.throws(() => authorizationsOf(stack, ddb('Query', {
    TableName: 'idem', IndexName: 'pending', KeyConditionExpression: 'pk = :v', ExpressionAttributeValues: { ':v': { S: 'x' } }
  })), /fixes no partition key/)
})

test("a Scan has no leading keys at all (not an empty list, which ForAllValues would pass)", () => {
  const [scan] = authorizationsOf(stack, ddb('Scan', { TableName: 'idem' }))
  assert.equal('dynamodb:LeadingKeys' in scan.context, false)
  assert.equal('dynamodb:Attributes' in scan.context, false)
})

test("SendMessage: the queue's ARN in the stack, whatever endpoint its URL names", () => {
  const [send] = authorizationsOf(stack, { service: 'sqs', target: 'AmazonSQS.SendMessage', body: { QueueUrl: 'http://127.0.0.1:9/000000000000/events' } })
  assert.deepEqual([send.action, send.resource], ['sqs:SendMessage', 'arn:aws:sqs:us-east-1:123456789012:events'])
})

test('an unknown operation, service or table is an error, never skipped', () => {
  assert.throws(() => authorizationsOf(stack, ddb('ExecuteStatement', { Statement: 'SELECT' })), DeriveError)
  assert.throws(() => authorizationsOf(stack, { service: 'unknown', target: null, body: {} }), DeriveError)
  assert.throws(() => authorizationsOf(stack, { service: 'dynamodb', target: 'Other.GetItem', body: {} }), DeriveError)
  assert.throws(() => authorizationsOf(stack, ddb('GetItem', { TableName: 'other', Key: { pk: { S: 'k' } } })), DeriveError)
})
