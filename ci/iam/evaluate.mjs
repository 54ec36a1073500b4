#!/usr/bin/env node
// Evaluates requests against the IAM policies template.yaml gives the functions that send them.
//
//   node evaluate.mjs [options] --expect allowed PATH...   every authorization must be allowed
//   node evaluate.mjs [options] --expect denied PATH...    every request must be refused
//   node evaluate.mjs [options] --deny-set deny.json       every entry must be refused (unless
//                                                         marked expected_today: "allowed")
// PATH: a *.jsonl file of recorded requests, or a directory holding them (recursively).
// Options: --template FILE (default: the repository's template.yaml), --python FILE (the
// interpreter with aws-sam-translator; default $IAM_PYTHON, else python3), --parameter
// Name=Value (a template parameter; repeatable), --summary FILE (the result as JSON).
//
// Exit status: 0 as expected, 1 a verdict not as expected, 2 an error (an input, a template or
// a request the check cannot evaluate faithfully).

import { writeFileSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

import { authorizationsOf } from './derive.mjs'
import { DeriveError } from './dynamodb.mjs'
import { ExpressionError } from './expressions.mjs'
import { InputError, namingHints, readDenySet, readRecordings } from './inputs.mjs'
import { conclude, printTable, printVerdicts, shortResource, VERDICTS } from './report.mjs'
import { SimulateError, simulate } from './simulate.mjs'
import { functionOf, resolveStacks, StackError } from './stack.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
export const DEFAULT_TEMPLATE = resolve(HERE, '..', '..', 'template.yaml')
const KNOWN_ERRORS = [DeriveError, ExpressionError, SimulateError, StackError]

/** One row per authorization of each item ({where, request}); a request it cannot derive is one ERROR row. */
export async function evaluateItems(stack, items) {
  const rows = []
  for (const item of items) {
    const { where, request } = item
    const base = { item, where, binary: request.binary, function: request.function_name }
    let fn
    let authorizations
    try {
      fn = functionOf(stack, request.binary)
      authorizations = authorizationsOf(stack, request)
      if (!authorizations.length) throw new DeriveError('the request asks for no authorization (nothing in it)')
    } catch (err) {
      if (!KNOWN_ERRORS.some((known) => err instanceof known)) throw err
      rows.push({ ...base, action: '?', resource: '?', verdict: 'ERROR', detail: err.message })
      continue
    }
    for (const authorization of authorizations) {
      const row = {
        ...base,
        action: authorization.action,
        resource: shortResource(authorization.resource),
        detail: authorization.detail + (authorization.leading ? ` key=${authorization.leading}` : '')
      }
      try {
        row.verdict = VERDICTS[await simulate(stack, fn, authorization)]
      } catch (err) {
        if (!(err instanceof SimulateError)) throw err
        Object.assign(row, { verdict: 'ERROR', detail: err.message })
      }
      rows.push(row)
    }
  }
  return rows
}

const isDenied = (row) => row.verdict.startsWith('DENIED')

/** Rows grouped by the item (request or deny entry) they came from. */
function byItem(rows) {
  const groups = new Map()
  for (const row of rows) groups.set(row.item, [...(groups.get(row.item) ?? []), row])
  return [...groups]
}

/** What is wrong under `mode`: {failures, errors}, each a list of {where, binary, action, message}. */
export function judge(mode, rows) {
  const errors = rows.filter((row) => row.verdict === 'ERROR').map((row) => ({ ...row, message: row.detail }))
  const failures = []
  if (mode === 'allowed') {
    for (const row of rows.filter((row) => isDenied(row))) {
      failures.push({ ...row, message: `${row.binary} is refused ${row.action} on ${row.resource}` })
    }
    return { failures, errors }
  }
  for (const [item, group] of byItem(rows)) {
    if (group.some((row) => row.verdict === 'ERROR')) continue
    const denied = group.some(isDenied)
    const knownGap = item.entry?.expected_today === 'allowed'
    if (!denied && !knownGap) {
      failures.push({ ...group[0], entry: item.entry?.name, message: `allowed, but must be refused: ${item.entry?.why ?? item.where}` })
    } else if (denied && knownGap) {
      failures.push({ ...group[0], entry: item.entry.name, message: 'now refused: drop its expected_today from deny.json' })
    }
  }
  return { failures, errors }
}

export function printDenySet(rows, out) {
  const entries = byItem(rows).map(([item, group]) => {
    const got = group.some((row) => row.verdict === 'ERROR') ? 'ERROR' : group.some(isDenied) ? 'denied' : 'ALLOWED'
    const expected = item.entry.expected_today === 'allowed' ? 'allowed today' : 'denied'
    const ok = (got === 'denied' && expected === 'denied') || (got === 'ALLOWED' && expected === 'allowed today')
    return { entry: item.entry.name, function: item.request.binary, expected, got, result: ok ? 'ok' : 'FAIL' }
  })
  out('')
  printTable(entries, [
    { key: 'result', title: 'RESULT' },
    { key: 'expected', title: 'EXPECTED' },
    { key: 'got', title: 'GOT' },
    { key: 'function', title: 'FUNCTION' },
    { key: 'entry', title: 'DENY-SET ENTRY' }
  ], out)
}

/** Runs one check; returns {exitCode, failures, errors, rows}. Input and template errors throw. */
export async function runCheck({ mode, template = DEFAULT_TEMPLATE, python, parameters = [], paths = [], denySet, out = console.log }) {
  const items =
    mode === 'deny-set'
      ? readDenySet(denySet).map((entry) => ({ where: entry.where, request: entry.request, entry }))
      : readRecordings(paths)
  // One stack per recording: each test deployed its own tables, under names of its own.
  const groups = new Map()
  for (const item of items) groups.set(item.group, [...(groups.get(item.group) ?? []), item])
  const hintsList = [...groups].map(([group, members]) => ({ label: group, ...namingHints(members) }))
  const stacks = resolveStacks({ python, template, parameters, hintsList })
  const rows = []
  for (const [index, members] of [...groups.values()].entries()) {
    for (const warning of stacks[index].warnings) out(`warning: ${hintsList[index].label}: ${warning}`)
    rows.push(...(await evaluateItems(stacks[index], members)))
  }
  printVerdicts(rows, out)
  if (mode === 'deny-set') printDenySet(rows, out)
  if (mode === 'allowed') {
    // What no request exercised was not checked: say so (a function the recordings never ran).
    const seen = new Set(items.map((item) => item.request.binary))
    const unseen = Object.entries(stacks[0].functions).filter(([, fn]) => !seen.has(fn.binary))
    out('')
    out(unseen.length ? `not covered by these requests: ${unseen.map(([logical, fn]) => `${logical} (${fn.binary})`).join(', ')}` : 'every function of the template is covered')
  }
  return conclude('iam-check', mode, rows, items.length, judge(mode === 'deny-set' ? 'denied' : mode, rows), out)
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      expect: { type: 'string' },
      'deny-set': { type: 'string' },
      template: { type: 'string', default: DEFAULT_TEMPLATE },
      python: { type: 'string', default: process.env.IAM_PYTHON || 'python3' },
      parameter: { type: 'string', multiple: true, default: [] },
      summary: { type: 'string' }
    }
  })
  const mode = values['deny-set'] ? 'deny-set' : values.expect
  if (!['allowed', 'denied', 'deny-set'].includes(mode) || (mode !== 'deny-set' && !positionals.length)) {
    console.error('usage: evaluate.mjs (--expect allowed|denied PATH... | --deny-set deny.json) [--template FILE] [--python FILE] [--parameter N=V]... [--summary FILE]')
    return 2
  }
  let result
  try {
    result = await runCheck({ mode, template: values.template, python: values.python, parameters: values.parameter, paths: positionals, denySet: values['deny-set'] })
  } catch (err) {
    if (!(err instanceof InputError || err instanceof StackError || err instanceof SyntaxError)) throw err
    console.error(`error: ${err.message}`)
    return 2
  }
  if (values.summary) {
    const brief = (problem) => ({ where: problem.where, binary: problem.binary, action: problem.action, entry: problem.entry, message: problem.message })
    writeFileSync(values.summary, JSON.stringify({ mode, exitCode: result.exitCode, failures: result.failures.map(brief), errors: result.errors.map(brief) }, null, 1))
  }
  return result.exitCode
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main()
}
