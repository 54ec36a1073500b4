// What IAM authorizes for one DynamoDB request: the action(s), the table or index ARN, and the
// DynamoDB condition keys, as AWS documents them:
//
// - Condition keys (LeadingKeys, Attributes, Select, ReturnValues, ReturnConsumedCapacity):
//   https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/specifying-conditions.html
//   * LeadingKeys: the partition key values of the items the request names.
//   * Attributes: the attribute names "read, written, or evaluated in a conditional write or
//     scan filter": projections, an item's attributes, an update's, a condition's, a filter's;
//     and the key attributes, which a policy using Attributes "must specify ... Otherwise,
//     DynamoDB can't use these key attributes to perform the requested action".
//   * Select: "always has a value (ALL_ATTRIBUTES, unless otherwise specified)" on reads; a
//     projection makes it SPECIFIC_ATTRIBUTES (an index query defaults to
//     ALL_PROJECTED_ATTRIBUTES, per the Query API reference).
//   * ReturnValues: "always has a value (NONE unless otherwise specified)" on writes.
//   * ReturnConsumedCapacity: set when the request sets it.
// - Transactions: "Permissions for Put, Update, Delete, and Get actions are governed by the
//   permissions used for the underlying PutItem, UpdateItem, DeleteItem, and GetItem
//   operations. For the ConditionCheck action, you can use the dynamodb:ConditionCheckItem
//   permission", each with dynamodb:EnclosingOperation set to the transaction's operation:
//   https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis-iam.html
//   (there is no dynamodb:TransactWriteItems action to grant).
// - Batches: BatchGetItem and BatchWriteItem are authorized once per table they name.

import { partitionKeyCondition, topLevelAttributes } from './expressions.mjs'

export class DeriveError extends Error {}

/** The table the request's TableName (a name or an ARN) names, in the stack. */
function tableOf(stack, tableName) {
  if (typeof tableName !== 'string') throw new DeriveError('the request names no TableName')
  const name = tableName.startsWith('arn:') ? tableName.split(':table/')[1]?.split('/')[0] : tableName
  const table = stack.tables[name]
  if (!table) {
    const known = Object.keys(stack.tables).join(', ')
    throw new DeriveError(`table ${JSON.stringify(name)} is not one of the stack's tables (${known})`)
  }
  return { name, ...table }
}

function resourceOf(table, indexName) {
  if (indexName === undefined) return table.arn
  if (!table.indexes.includes(indexName)) {
    throw new DeriveError(`table ${table.name} has no index ${indexName}`)
  }
  return `${table.arn}/index/${indexName}`
}

/** The partition key value of an item or key, as IAM compares it (a string). */
function partitionValue(table, item, what) {
  const value = item?.[table.partition_key]
  if (value === undefined) {
    throw new DeriveError(`${what} has no partition key ${table.partition_key} (table ${table.name})`)
  }
  return scalar(value, what)
}

function scalar(value, what) {
  for (const type of ['S', 'N', 'B']) {
    if (typeof value?.[type] === 'string') return value[type]
  }
  throw new DeriveError(`${what}: a key value must be S, N or B, not ${JSON.stringify(value)}`)
}

/** Attribute names of a request part: its expressions, and the legacy parameters' keys. */
function attributesOf(part, extra = []) {
  const names = part.ExpressionAttributeNames
  const found = new Set(extra)
  for (const field of ['ProjectionExpression', 'ConditionExpression', 'UpdateExpression', 'FilterExpression', 'KeyConditionExpression']) {
    for (const name of topLevelAttributes(part[field], names)) found.add(name)
  }
  for (const name of part.AttributesToGet ?? []) found.add(name)
  for (const field of ['Expected', 'AttributeUpdates', 'QueryFilter', 'ScanFilter', 'KeyConditions']) {
    for (const name of Object.keys(part[field] ?? {})) found.add(name)
  }
  return [...found].sort()
}

function projects(part) {
  return Boolean(part.ProjectionExpression || part.AttributesToGet?.length)
}

/** The context common to every request: what it sets of ReturnConsumedCapacity. */
function capacity(body) {
  return body.ReturnConsumedCapacity ? { 'dynamodb:ReturnConsumedCapacity': body.ReturnConsumedCapacity } : {}
}

function withAttributes(context, attributes) {
  // An empty list is no key at all: ForAllValues over it would hold vacuously.
  return attributes.length ? { ...context, 'dynamodb:Attributes': attributes } : context
}

/** One single-item authorization (GetItem, PutItem, UpdateItem, DeleteItem, ConditionCheckItem). */
function itemAuthorization(stack, action, part, common, detail) {
  const table = tableOf(stack, part.TableName)
  const keyed = action === 'PutItem' ? part.Item : part.Key
  const leading = partitionValue(table, keyed, `${detail} ${action === 'PutItem' ? 'Item' : 'Key'}`)
  let context = { ...common, 'dynamodb:LeadingKeys': [leading] }
  context = withAttributes(context, attributesOf(part, Object.keys(keyed)))
  if (action === 'GetItem') {
    context['dynamodb:Select'] = projects(part) ? 'SPECIFIC_ATTRIBUTES' : 'ALL_ATTRIBUTES'
  } else {
    context['dynamodb:ReturnValues'] = part.ReturnValues ?? 'NONE'
  }
  return { action: `dynamodb:${action}`, resource: table.arn, context, detail, leading }
}

function readSelect(part, onIndex) {
  if (part.Select) return part.Select
  if (projects(part)) return 'SPECIFIC_ATTRIBUTES'
  return onIndex ? 'ALL_PROJECTED_ATTRIBUTES' : 'ALL_ATTRIBUTES'
}

function query(stack, body) {
  const table = tableOf(stack, body.TableName)
  // On an index, the partition key the condition fixes is the index's.
  const partitionKey = body.IndexName === undefined
    ? table.partition_key
    : table.index_partition_keys?.[body.IndexName]
  if (partitionKey === undefined) {
    throw new DeriveError(`table ${table.name} has no index ${body.IndexName}`)
  }
  let value
  if (body.KeyConditionExpression) {
    value = partitionKeyCondition(body.KeyConditionExpression, partitionKey, body.ExpressionAttributeNames, body.ExpressionAttributeValues)
  } else {
    value = body.KeyConditions?.[partitionKey]?.AttributeValueList?.[0]
  }
  if (value === undefined) throw new DeriveError(`Query on ${table.name} fixes no partition key`)
  const context = withAttributes(
    { ...capacity(body), 'dynamodb:LeadingKeys': [scalar(value, 'Query')], 'dynamodb:Select': readSelect(body, body.IndexName !== undefined) },
    attributesOf(body)
  )
  return [{ action: 'dynamodb:Query', resource: resourceOf(table, body.IndexName), context, detail: 'Query' }]
}

function scan(stack, body) {
  const table = tableOf(stack, body.TableName)
  const context = withAttributes({ ...capacity(body), 'dynamodb:Select': readSelect(body, body.IndexName !== undefined) }, attributesOf(body))
  return [{ action: 'dynamodb:Scan', resource: resourceOf(table, body.IndexName), context, detail: 'Scan' }]
}

const TRANSACT_WRITE = { Put: 'PutItem', Update: 'UpdateItem', Delete: 'DeleteItem', ConditionCheck: 'ConditionCheckItem' }

function transactWrite(stack, body) {
  const common = { ...capacity(body), 'dynamodb:EnclosingOperation': 'TransactWriteItems' }
  return (body.TransactItems ?? []).map((item, index) => {
    const kinds = Object.keys(item)
    if (kinds.length !== 1 || !(kinds[0] in TRANSACT_WRITE)) {
      throw new DeriveError(`TransactItems[${index}] is not one of Put, Update, Delete, ConditionCheck: ${kinds}`)
    }
    return itemAuthorization(stack, TRANSACT_WRITE[kinds[0]], item[kinds[0]], common, `TransactWriteItems[${index}] ${kinds[0]}`)
  })
}

function transactGet(stack, body) {
  const common = { ...capacity(body), 'dynamodb:EnclosingOperation': 'TransactGetItems' }
  return (body.TransactItems ?? []).map((item, index) => {
    if (!item.Get) throw new DeriveError(`TransactItems[${index}] of TransactGetItems is no Get`)
    return itemAuthorization(stack, 'GetItem', item.Get, common, `TransactGetItems[${index}] Get`)
  })
}

function batchGet(stack, body) {
  return Object.entries(body.RequestItems ?? {}).map(([tableName, request]) => {
    const table = tableOf(stack, tableName)
    const keys = request.Keys ?? []
    const leading = keys.map((key, index) => partitionValue(table, key, `BatchGetItem ${tableName} Keys[${index}]`))
    const keyNames = keys.flatMap((key) => Object.keys(key))
    const context = withAttributes(
      { ...capacity(body), 'dynamodb:LeadingKeys': [...new Set(leading)], 'dynamodb:Select': readSelect(request, false) },
      attributesOf(request, keyNames)
    )
    return { action: 'dynamodb:BatchGetItem', resource: table.arn, context, detail: `BatchGetItem ${tableName}`, leading: leading[0] }
  })
}

function batchWrite(stack, body) {
  return Object.entries(body.RequestItems ?? {}).map(([tableName, requests]) => {
    const table = tableOf(stack, tableName)
    const leading = []
    const attributes = new Set()
    requests.forEach((request, index) => {
      const item = request.PutRequest?.Item ?? request.DeleteRequest?.Key
      if (!item) throw new DeriveError(`BatchWriteItem ${tableName}[${index}] is neither PutRequest nor DeleteRequest`)
      leading.push(partitionValue(table, item, `BatchWriteItem ${tableName}[${index}]`))
      for (const name of Object.keys(item)) attributes.add(name)
    })
    const context = withAttributes({ ...capacity(body), 'dynamodb:LeadingKeys': [...new Set(leading)] }, [...attributes].sort())
    return { action: 'dynamodb:BatchWriteItem', resource: table.arn, context, detail: `BatchWriteItem ${tableName}`, leading: leading[0] }
  })
}

/** Table-level operations: the table's ARN, no item condition keys. */
function tableLevel(operation) {
  return (stack, body) => [{ action: `dynamodb:${operation}`, resource: tableOf(stack, body.TableName).arn, context: {}, detail: operation }]
}

const OPERATIONS = {
  GetItem: (stack, body) => [itemAuthorization(stack, 'GetItem', body, capacity(body), 'GetItem')],
  PutItem: (stack, body) => [itemAuthorization(stack, 'PutItem', body, capacity(body), 'PutItem')],
  UpdateItem: (stack, body) => [itemAuthorization(stack, 'UpdateItem', body, capacity(body), 'UpdateItem')],
  DeleteItem: (stack, body) => [itemAuthorization(stack, 'DeleteItem', body, capacity(body), 'DeleteItem')],
  Query: query,
  Scan: scan,
  TransactWriteItems: transactWrite,
  TransactGetItems: transactGet,
  BatchGetItem: batchGet,
  BatchWriteItem: batchWrite,
  DescribeTable: tableLevel('DescribeTable'),
  DescribeTimeToLive: tableLevel('DescribeTimeToLive'),
  DescribeContinuousBackups: tableLevel('DescribeContinuousBackups'),
  ListTables: () => [{ action: 'dynamodb:ListTables', resource: '*', context: {}, detail: 'ListTables' }]
}

/** The authorizations of one DynamoDB request (`operation` from its X-Amz-Target). */
export function dynamodbAuthorizations(stack, operation, body) {
  const derive = OPERATIONS[operation]
  if (!derive) throw new DeriveError(`DynamoDB operation ${operation} is not understood by the IAM check`)
  return derive(stack, body)
}

/** The authorizations of one DynamoDB Streams request: the stream's ARN in the stack. */
export function streamsAuthorizations(stack, operation, body) {
  if (operation === 'ListStreams') {
    return [{ action: 'dynamodb:ListStreams', resource: '*', context: {}, detail: 'ListStreams' }]
  }
  if (!['DescribeStream', 'GetShardIterator'].includes(operation)) {
    // GetRecords names only an opaque shard iterator: its stream cannot be read from it.
    throw new DeriveError(`DynamoDB Streams operation ${operation} is not understood by the IAM check`)
  }
  const tableName = body.StreamArn?.split(':table/')[1]?.split('/')[0]
  const table = tableOf(stack, tableName)
  if (!table.stream_arn) throw new DeriveError(`table ${table.name} has no stream in the template`)
  return [{ action: `dynamodb:${operation}`, resource: table.stream_arn, context: {}, detail: operation }]
}
