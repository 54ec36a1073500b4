// From one raw recorded request to the authorizations IAM performs for it. The service and
// operation come from the X-Amz-Target header (JSON protocols: DynamoDB, DynamoDB Streams,
// SQS, EventBridge) or the form's Action (query protocol: SNS, SQS before its JSON protocol).
// A request whose service or operation this does not know is an error, never skipped.

import { DeriveError, dynamodbAuthorizations, streamsAuthorizations } from './dynamodb.mjs'
import { eventsAuthorizations, snsAuthorizations, sqsAuthorizations } from './messaging.mjs'

// X-Amz-Target prefixes, and the service (as the recording names it) each belongs to.
const TARGETS = {
  DynamoDB_20120810: { services: ['dynamodb'], derive: dynamodbAuthorizations },
  DynamoDBStreams_20120810: { services: ['dynamodb', 'streams.dynamodb', 'dynamodbstreams'], derive: streamsAuthorizations },
  AmazonSQS: { services: ['sqs'], derive: sqsAuthorizations },
  AWSEvents: { services: ['events', 'eventbridge'], derive: eventsAuthorizations }
}

// Query-protocol services: the operation is the form's Action.
const QUERY = { sqs: sqsAuthorizations, sns: snsAuthorizations }

/** The authorizations of `request` (one recorded line), in `stack`. */
export function authorizationsOf(stack, request) {
  const { service, target, body } = request
  if (target) {
    const [prefix, operation, extra] = target.split('.')
    const known = TARGETS[prefix]
    if (!known || !operation || extra !== undefined) {
      throw new DeriveError(`X-Amz-Target ${JSON.stringify(target)} is not understood by the IAM check`)
    }
    if (!known.services.includes(service)) {
      throw new DeriveError(`X-Amz-Target ${target} does not belong to service ${JSON.stringify(service)}`)
    }
    return known.derive(stack, operation, body)
  }
  const derive = QUERY[service]
  if (!derive || typeof body.Action !== 'string') {
    throw new DeriveError(`a ${JSON.stringify(service)} request without X-Amz-Target nor a query Action is not understood by the IAM check`)
  }
  return derive(stack, body.Action, body)
}
