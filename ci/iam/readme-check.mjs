#!/usr/bin/env node
// Evaluates requests against the example policy of the guide's deploy page (docs/guide/deploy.md,
// "Scope the item actions to the function's own keys"), as each function's single identity
// policy, its placeholders replaced per recording (readme-policy.mjs, readme-scope.mjs).
//
//   node readme-check.mjs [options] --expect allowed PATH...   the store's requests are allowed
//   node readme-check.mjs [options] --deny-set readme-deny.json  every entry is refused
// Options: --readme FILE (the page holding the policy; default: docs/guide/deploy.md), --template
// FILE, --python FILE
// (as evaluate.mjs).
//
// Only authorizations on the idempotency and uniqueness tables are evaluated, by the functions
// the policy is for; the rest is counted per file as out of scope. A file with requests on those
// tables of which none is evaluated, or a deny entry out of scope, is an error.
// Exit status: 0 as expected, 1 a verdict not as expected, 2 an error.

import { resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

import { authorizationsOf } from './derive.mjs'
import { DeriveError } from './dynamodb.mjs'
import { DEFAULT_TEMPLATE, judge, printDenySet } from './evaluate.mjs'
import { ExpressionError } from './expressions.mjs'
import { InputError, namingHints, readDenySet, readRecordings } from './inputs.mjs'
import { POLICY_PAGE, policyFor, ReadmeError, readReadmePolicy } from './readme-policy.mjs'
import { IDENTITY_PREFIXES, OTHER_POLICIES, STORE_TABLES } from './readme-scope.mjs'
import { conclude, printVerdicts, shortResource, VERDICTS } from './report.mjs'
import { SimulateError, simulate } from './simulate.mjs'
import { functionOf, resolveStacks, StackError } from './stack.mjs'

/** The page whose example policy is checked (docs/guide/deploy.md; the name is from when it was README.md). */
export const DEFAULT_README = POLICY_PAGE
const KNOWN_ERRORS = [DeriveError, ExpressionError, SimulateError, StackError, ReadmeError]

/** The stack's store tables: {IdempotencyTable: arn, UniquenessTable: arn}. */
function storeTables(stack) {
  const tables = {}
  for (const table of Object.values(stack.tables)) if (table.logical in STORE_TABLES) tables[table.logical] = table.arn
  const missing = Object.keys(STORE_TABLES).filter((logical) => !tables[logical])
  if (missing.length) throw new StackError(`the template has no table ${missing.join(', ')} (readme-scope.mjs STORE_TABLES)`)
  return tables
}

/** The tables the recording's environment names as the store's: a cross-check of the filter. */
const envTables = (request) => ['IDEMPOTENCY_TABLE', 'UNIQUENESS_TABLE'].map((name) => request.env[name]).filter(Boolean)
const namesTable = (names) => (authorization) => names.some((name) => authorization.resource.split(':').at(-1).split('/')[1] === name)

const onTable = (arns) => (authorization) => arns.some((arn) => authorization.resource === arn || authorization.resource.startsWith(`${arn}/`))

/** Rows for one recording's items, and its counts {evaluated, partly, otherTables, otherPolicies, store}. */
async function evaluateGroup(stack, members, readmePolicy) {
  const tables = storeTables(stack)
  const inScope = onTable(Object.values(tables))
  const rows = []
  const counts = { evaluated: 0, partly: 0, otherTables: 0, otherPolicies: 0, store: 0 }
  for (const item of members) {
    const { where, request } = item
    const base = { item, where, binary: request.binary, function: request.function_name }
    let authorizations
    let fn
    try {
      authorizations = authorizationsOf(stack, request)
      fn = functionOf(stack, request.binary)
    } catch (err) {
      if (!KNOWN_ERRORS.some((known) => err instanceof known)) throw err
      rows.push({ ...base, action: '?', resource: '?', verdict: 'ERROR', detail: err.message })
      continue
    }
    if (request.binary in OTHER_POLICIES) {
      counts.otherPolicies++
      continue
    }
    const store = authorizations.filter(inScope)
    if (authorizations.some(namesTable(envTables(request)))) counts.store++
    if (!store.length) {
      counts.otherTables++
      continue
    }
    counts.evaluated++
    if (store.length < authorizations.length) counts.partly++
    let readmeFn
    try {
      const document = policyFor(readmePolicy, {
        region: stack.region,
        account: stack.account,
        tables,
        functionName: request.function_name,
        identityPrefix: IDENTITY_PREFIXES[request.binary]
      })
      readmeFn = { ...fn, policies: [{ name: 'guide-deploy.md', document }], permission_boundaries: [] }
    } catch (err) {
      if (!(err instanceof ReadmeError)) throw err
      rows.push({ ...base, action: '?', resource: '?', verdict: 'ERROR', detail: err.message })
      continue
    }
    for (const authorization of store) {
      // A deny entry may probe a guard with a key left out (readme-deny.json says why).
      const context = { ...authorization.context }
      for (const key of item.entry?.without_context ?? []) delete context[key]
      const row = {
        ...base,
        action: authorization.action,
        resource: shortResource(authorization.resource),
        detail:
          authorization.detail +
          (authorization.leading ? ` key=${authorization.leading}` : '') +
          (item.entry?.without_context ? ` without ${item.entry.without_context.join(', ')}` : '')
      }
      try {
        row.verdict = VERDICTS[await simulate(stack, readmeFn, { ...authorization, context })]
      } catch (err) {
        if (!(err instanceof SimulateError)) throw err
        Object.assign(row, { verdict: 'ERROR', detail: err.message })
      }
      rows.push(row)
    }
  }
  return { rows, counts }
}

/** Runs one check; returns {exitCode, failures, errors, rows}. Input, policy page and template errors throw. */
export async function runReadmeCheck({ mode, readme = DEFAULT_README, template = DEFAULT_TEMPLATE, python, paths = [], denySet, out = console.log }) {
  const readmePolicy = readReadmePolicy(readme)
  const items =
    mode === 'deny-set'
      ? readDenySet(denySet).map((entry) => ({ where: entry.where, request: entry.request, entry, group: entry.group }))
      : readRecordings(paths)
  const groups = new Map()
  for (const item of items) groups.set(item.group, [...(groups.get(item.group) ?? []), item])
  const hintsList = [...groups].map(([group, members]) => ({ label: group, ...namingHints(members) }))
  const stacks = resolveStacks({ python, template, hintsList })
  const rows = []
  const scopeErrors = []
  const lines = []
  for (const [index, [group, members]] of [...groups].entries()) {
    const { rows: groupRows, counts } = await evaluateGroup(stacks[index], members, readmePolicy)
    rows.push(...groupRows)
    lines.push(
      `${group}: ${counts.evaluated} of ${members.length} requests evaluated` +
        (counts.partly ? ` (${counts.partly} only for their items on the store's tables)` : '') +
        `; out of scope: ${counts.otherTables} on other tables only, ${counts.otherPolicies} by ${Object.keys(OTHER_POLICIES).join(', ')}`
    )
    if (counts.store && !counts.evaluated) scopeErrors.push({ where: group, verdict: 'ERROR', message: `${counts.store} requests on the store's tables, none evaluated` })
    if (mode === 'deny-set' && counts.evaluated !== members.length) {
      scopeErrors.push({ where: group, verdict: 'ERROR', message: `${members.length - counts.evaluated} deny entries are out of the example policy's scope (they prove nothing)` })
    }
  }
  printVerdicts(rows, out)
  if (mode === 'deny-set') printDenySet(rows, out)
  out('')
  for (const line of lines) out(line)
  for (const [binary, reason] of Object.entries(OTHER_POLICIES)) {
    if (items.some((item) => item.request.binary === binary)) out(`${binary} is out of scope: ${reason}`)
  }
  const { failures, errors: rowErrors } = judge(mode === 'deny-set' ? 'denied' : mode, rows)
  return conclude('readme-check', mode, rows, items.length, { failures, errors: [...scopeErrors, ...rowErrors] }, out)
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      expect: { type: 'string' },
      'deny-set': { type: 'string' },
      readme: { type: 'string', default: DEFAULT_README },
      template: { type: 'string', default: DEFAULT_TEMPLATE },
      python: { type: 'string', default: process.env.IAM_PYTHON || 'python3' }
    }
  })
  const mode = values['deny-set'] ? 'deny-set' : values.expect
  if (!['allowed', 'deny-set'].includes(mode) || (mode === 'allowed' && !positionals.length)) {
    console.error('usage: readme-check.mjs (--expect allowed PATH... | --deny-set readme-deny.json) [--readme FILE] [--template FILE] [--python FILE]')
    return 2
  }
  try {
    const result = await runReadmeCheck({ mode, readme: values.readme, template: values.template, python: values.python, paths: positionals, denySet: values['deny-set'] })
    return result.exitCode
  } catch (err) {
    if (!(err instanceof InputError || err instanceof StackError || err instanceof ReadmeError || err instanceof SyntaxError)) throw err
    console.error(`error: ${err.message}`)
    return 2
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main()
}
