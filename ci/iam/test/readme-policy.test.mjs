import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'

import { DEFAULT_README } from '../readme-check.mjs'
import { extractReadmePolicy, policyFor, ReadmeError } from '../readme-policy.mjs'

const tables = { IdempotencyTable: 'arn:aws:dynamodb:us-east-1:123456789012:table/i', UniquenessTable: 'arn:aws:dynamodb:us-east-1:123456789012:table/u' }
const stack = { region: 'us-east-1', account: '123456789012', tables }

test("the deploy page's policy block is found and parses", () => {
  const { policy } = extractReadmePolicy(readFileSync(DEFAULT_README, 'utf8'))
  assert.ok(policy.Statement.length > 0)
})

test('a page without the paragraph, or with a block that does not parse, is an error', () => {
  assert.throws(() => extractReadmePolicy('# nothing here\n'), ReadmeError)
  const paragraph = "Scope the item actions to the function's\nown keys.\n\n"
  assert.throws(() => extractReadmePolicy(`${paragraph}Another paragraph.\n\n\`\`\`json\n{}\n\`\`\`\n`), ReadmeError)
  assert.throws(() => extractReadmePolicy(`${paragraph}\`\`\`json\n{"Statement": [\n\`\`\`\n`), ReadmeError)
})

test('placeholders are replaced; IDENTITY_PREFIX* is dropped for a function without one', () => {
  const { policy } = extractReadmePolicy(readFileSync(DEFAULT_README, 'utf8'))
  const withPrefix = JSON.stringify(policyFor(policy, { ...stack, functionName: 'shipments', identityPrefix: 'shipment-notice:' }))
  assert.match(withPrefix, /"shipments#\*"/)
  assert.match(withPrefix, /"shipment-notice:\*"/)
  assert.match(withPrefix, /table\/u"/)
  const without = JSON.stringify(policyFor(policy, { ...stack, functionName: 'quickstart' }))
  assert.doesNotMatch(without, /IDENTITY_PREFIX|REGION|ACCOUNT|FUNCTION_NAME|shipment-notice/)
})

test('a Resource that is neither store table is an error', () => {
  const policy = { Statement: [{ Effect: 'Allow', Action: 'dynamodb:GetItem', Resource: 'arn:aws:dynamodb:REGION:ACCOUNT:table/other' }] }
  assert.throws(() => policyFor(policy, { ...stack, functionName: 'f' }), ReadmeError)
})
