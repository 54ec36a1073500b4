// Deliberately broken copies of the example policy (docs/guide/deploy.md), for the self-test (as
// mutate.py for the template): the page's text with its policy block changed. A mutation that finds
// nothing to change is an error: the self-test would prove nothing.

import { extractReadmePolicy, replaceReadmePolicy } from './readme-policy.mjs'

const list = (value) => (Array.isArray(value) ? value : [value])

const MUTATIONS = {
  /** Every statement without its Null condition (the guard on absent leading keys). */
  'drop-null-guard': (statement) => {
    if (!statement.Condition?.Null) return false
    delete statement.Condition.Null
    return true
  },
  /** Every dynamodb:LeadingKeys string comparison against "*". */
  'widen-leading-keys': (statement) => {
    let changed = false
    for (const [operator, keys] of Object.entries(statement.Condition ?? {})) {
      if (operator.includes('String') && 'dynamodb:LeadingKeys' in keys) {
        keys['dynamodb:LeadingKeys'] = ['*']
        changed = true
      }
    }
    return changed
  },
  /** Every statement without dynamodb:UpdateItem. */
  'drop-update-item': (statement) => {
    const actions = list(statement.Action)
    if (!actions.includes('dynamodb:UpdateItem')) return false
    statement.Action = actions.filter((action) => action !== 'dynamodb:UpdateItem')
    return true
  }
}

/** The policy page's `text` with `mutation` applied to its policy. */
export function mutateReadme(text, mutation) {
  const { policy } = extractReadmePolicy(text)
  const changed = policy.Statement.filter((statement) => MUTATIONS[mutation](statement)).length
  if (!changed) throw new Error(`readme-mutate: ${mutation} changed nothing in the example policy`)
  return replaceReadmePolicy(text, policy)
}
