// What IAM authorizes for the outbox relay's publishes: SQS SendMessage (the queue ARN its
// QueueUrl names), SNS Publish (the TopicArn), EventBridge PutEvents (the bus each entry names,
// the default bus when none, with events:source and events:detail-type). A recorded URL or ARN
// carries the local endpoint's host, account and Region: only its queue, topic or bus name is
// kept, and it must be one of the stack's (else the request is an error, not a denial).

import { DeriveError } from './dynamodb.mjs'

function queueOf(stack, url) {
  if (typeof url !== 'string') throw new DeriveError('the request names no QueueUrl')
  let name
  try {
    name = new URL(url).pathname.replace(/\/+$/, '').split('/').pop()
  } catch {
    throw new DeriveError(`QueueUrl ${JSON.stringify(url)} is no URL`)
  }
  const queue = stack.queues[name]
  if (!queue) {
    throw new DeriveError(`queue ${JSON.stringify(name)} (${url}) is not one of the stack's queues (${Object.keys(stack.queues).join(', ')})`)
  }
  return queue.arn
}

function topicOf(stack, arn) {
  if (typeof arn !== 'string') throw new DeriveError('the request names no TopicArn (a phone number or target is not modelled)')
  const name = arn.split(':').pop()
  const topic = stack.topics[name]
  if (!topic) throw new DeriveError(`topic ${JSON.stringify(name)} is not one of the stack's topics`)
  return topic.arn
}

function busOf(stack, nameOrArn) {
  const name = (nameOrArn ?? 'default').split(':event-bus/').pop()
  const bus = stack.buses[name]
  if (!bus) throw new DeriveError(`event bus ${JSON.stringify(name)} is not one of the stack's buses`)
  return bus.arn
}

// SQS operations and the action each is authorized as.
const SQS = {
  SendMessage: 'sqs:SendMessage',
  SendMessageBatch: 'sqs:SendMessage',
  ReceiveMessage: 'sqs:ReceiveMessage',
  DeleteMessage: 'sqs:DeleteMessage',
  DeleteMessageBatch: 'sqs:DeleteMessage',
  ChangeMessageVisibility: 'sqs:ChangeMessageVisibility',
  ChangeMessageVisibilityBatch: 'sqs:ChangeMessageVisibility',
  GetQueueAttributes: 'sqs:GetQueueAttributes'
}

export function sqsAuthorizations(stack, operation, body) {
  const action = SQS[operation]
  if (!action) throw new DeriveError(`SQS operation ${operation} is not understood by the IAM check`)
  return [{ action, resource: queueOf(stack, body.QueueUrl), context: {}, detail: operation }]
}

export function snsAuthorizations(stack, operation, body) {
  if (operation !== 'Publish' && operation !== 'PublishBatch') {
    throw new DeriveError(`SNS operation ${operation} is not understood by the IAM check`)
  }
  return [{ action: 'sns:Publish', resource: topicOf(stack, body.TopicArn ?? body.TargetArn), context: {}, detail: operation }]
}

export function eventsAuthorizations(stack, operation, body) {
  if (operation !== 'PutEvents') throw new DeriveError(`EventBridge operation ${operation} is not understood by the IAM check`)
  const entries = body.Entries ?? []
  if (!entries.length) throw new DeriveError('PutEvents has no Entries')
  // One authorization per bus the entries name, with the sources and detail types sent to it.
  const byBus = new Map()
  for (const entry of entries) {
    const arn = busOf(stack, entry.EventBusName)
    const seen = byBus.get(arn) ?? { sources: new Set(), types: new Set() }
    if (entry.Source) seen.sources.add(entry.Source)
    if (entry.DetailType) seen.types.add(entry.DetailType)
    byBus.set(arn, seen)
  }
  return [...byBus].map(([resource, seen]) => {
    const context = {}
    // An empty list is no key at all: ForAllValues over it would hold vacuously.
    if (seen.sources.size) context['events:source'] = [...seen.sources]
    if (seen.types.size) context['events:detail-type'] = [...seen.types]
    return { action: 'events:PutEvents', resource, context, detail: 'PutEvents' }
  })
}
