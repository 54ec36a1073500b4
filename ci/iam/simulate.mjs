// One authorization evaluated by @cloud-copilot/iam-simulate against a function's policies:
// its identity policies (and permissions boundaries), same account, no organization policies
// (the stack's account is not assumed to be in an organization). Strict mode: the request is
// evaluated exactly as derived.

import { runSimulation } from '@cloud-copilot/iam-simulate'

export class SimulateError extends Error {}

// Condition keys the Service Authorization Reference does not list for an action although
// AWS documents them for it, which the simulator therefore drops: ConditionCheckItem only
// exists inside a transaction, whose items all carry dynamodb:EnclosingOperation
// (transaction-apis-iam.html), but the reference lists that key for the other item actions
// only. Any other dropped key is an error: a condition would be evaluated without it.
const UNLISTED = {
  'dynamodb:ConditionCheckItem': ['dynamodb:EnclosingOperation']
}

/** 'Allowed', 'ImplicitlyDenied' or 'ExplicitlyDenied'. */
export async function simulate(stack, fn, authorization) {
  const { action, resource, context } = authorization
  const simulation = {
    request: {
      principal: fn.principal,
      action,
      resource: { resource, accountId: stack.account },
      // The global keys every request of the function carries.
      contextVariables: {
        'aws:PrincipalArn': fn.role.arn,
        'aws:PrincipalAccount': stack.account,
        'aws:RequestedRegion': stack.region,
        'aws:SecureTransport': 'true',
        ...context
      }
    },
    identityPolicies: fn.policies.map((policy) => ({ name: policy.name, policy: policy.document })),
    permissionBoundaryPolicies: fn.permission_boundaries.length
      ? fn.permission_boundaries.map((policy) => ({ name: policy.name, policy: policy.document }))
      : undefined,
    serviceControlPolicies: [],
    resourceControlPolicies: []
  }
  const response = await runSimulation(simulation, { simulationMode: 'Strict' })
  if (response.resultType === 'error') {
    throw new SimulateError(`${action} on ${resource}: ${JSON.stringify(response.errors)}`)
  }
  const results = response.resultType === 'single' ? [response.result] : response.results
  const ignored = new Set(results.flatMap((result) => result.ignoredContextKeys ?? []))
  const unexpected = [...ignored].filter((key) => !(UNLISTED[action] ?? []).includes(key))
  if (unexpected.length) {
    throw new SimulateError(`${action} on ${resource}: the simulator dropped the condition keys ${unexpected.join(', ')}`)
  }
  return response.overallResult
}
