// The attribute names dynamodb:Attributes carries, read from DynamoDB expressions.

import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ExpressionError, partitionKeyCondition, topLevelAttributes } from '../expressions.mjs'

const names = { '#pk': 'pk', '#status': 'status', '#steps': 'steps', '#step_name': 'name', '#expires_at': 'expires_at' }
const sorted = (set) => [...set].sort()

test('a condition names its attributes, not its functions, keywords or values', () => {
  const condition = 'attribute_not_exists(#pk) OR (#expires_at < :now_s AND #status IN (:completed, :failed))'
  assert.deepEqual(sorted(topLevelAttributes(condition, names)), ['expires_at', 'pk', 'status'])
})

test('a document path counts as its top-level attribute only', () => {
  const condition = '#status = :s AND NOT (#steps[0].#step_name = :n AND #steps[0].attempt = :a)'
  assert.deepEqual(sorted(topLevelAttributes(condition, names)), ['status', 'steps'])
})

test('an update names every attribute it sets, adds or removes, bare or aliased', () => {
  const update = 'SET #status = :s, #steps = if_not_exists(#steps, :e) ADD applied :one REMOVE outcome_format'
  assert.deepEqual(sorted(topLevelAttributes(update, names)), ['applied', 'outcome_format', 'status', 'steps'])
})

test('an alias without a name, or an unreadable expression, is an error', () => {
  assert.throws(() => topLevelAttributes('#missing = :v', names), ExpressionError)
  assert.throws(() => topLevelAttributes('a = :v ; DROP', names), ExpressionError)
})

test('a key condition fixes the partition key from either side', () => {
  const values = { ':v': { S: 'fn#op' }, ':s': { S: 'x' } }
  assert.deepEqual(partitionKeyCondition('#pk = :v AND begins_with(sk, :s)', 'pk', names, values), { S: 'fn#op' })
  assert.deepEqual(partitionKeyCondition(':v = pk', 'pk', names, values), { S: 'fn#op' })
  assert.equal(partitionKeyCondition('sk = :s', 'pk', names, values), undefined)
})
