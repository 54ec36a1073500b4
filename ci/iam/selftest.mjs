#!/usr/bin/env node
// The self-test: the check must FAIL on deliberately broken copies of the template. A copy
// with a policy narrowed must fail the allowed check on the requests (the narrowed permission
// is one they need); a copy with a policy widened must fail the deny set. Each case also names
// the failure it must produce, so that a copy failing for another reason proves nothing. The
// deploy page's example policy gets the same treatment (readme-mutate.mjs, readme-check.mjs).
//
//   node selftest.mjs --python PY [--template FILE] [--deny-set FILE] PATH...
// PATH: the recorded requests (as for evaluate.mjs --expect allowed). Exit 0 when every broken
// copy was caught, 1 otherwise.

import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

import { DEFAULT_TEMPLATE, runCheck } from './evaluate.mjs'
import { DEFAULT_README, runReadmeCheck } from './readme-check.mjs'
import { mutateReadme } from './readme-mutate.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))

const CASES = [
  {
    name: 'own-keys policy narrowed (QuickstartOwnKeysPolicy without dynamodb:UpdateItem)',
    mutation: ['drop-action', 'QuickstartOwnKeysPolicy', 'dynamodb:UpdateItem'],
    check: 'allowed',
    caught: (failure) => failure.binary === 'quickstart' && failure.action === 'dynamodb:UpdateItem'
  },
  {
    name: "SAM Policies narrowed (CheckoutFunction's statements without dynamodb:PutItem)",
    mutation: ['drop-action', 'CheckoutFunction', 'dynamodb:PutItem'],
    check: 'allowed',
    caught: (failure) => failure.binary === 'checkout' && failure.action === 'dynamodb:PutItem'
  },
  {
    name: 'own-keys policy widened (QuickstartOwnKeysPolicy with dynamodb:LeadingKeys "*")',
    mutation: ['widen-leading-keys', 'QuickstartOwnKeysPolicy'],
    check: 'deny-set',
    caught: (failure) => failure.entry === "quickstart reads another function's record"
  },
  {
    name: "example policy narrowed (without dynamodb:UpdateItem)",
    readme: 'drop-update-item',
    check: 'allowed',
    caught: (failure) => failure.action === 'dynamodb:UpdateItem'
  },
  {
    name: 'example policy without its Null guards',
    readme: 'drop-null-guard',
    check: 'deny-set',
    caught: (failure) => failure.entry === 'quickstart reads its own record without dynamodb:LeadingKeys'
  },
  {
    name: 'example policy widened (dynamodb:LeadingKeys "*")',
    readme: 'widen-leading-keys',
    check: 'deny-set',
    caught: (failure) => failure.entry === "quickstart reads another function's record"
  }
]

function mutate(python, template, mutation, into) {
  const run = spawnSync(python, [join(HERE, 'mutate.py'), '--template', template, ...mutation], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })
  if (run.status !== 0) throw new Error(`mutate.py ${mutation.join(' ')}: ${run.stderr.trim() || run.error?.message}`)
  writeFileSync(into, run.stdout)
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      python: { type: 'string', default: process.env.IAM_PYTHON || 'python3' },
      template: { type: 'string', default: DEFAULT_TEMPLATE },
      'deny-set': { type: 'string', default: join(HERE, 'deny.json') }
    }
  })
  if (!positionals.length) {
    console.error('usage: selftest.mjs [--python PY] [--template FILE] [--deny-set FILE] PATH...')
    return 2
  }
  const work = mkdtempSync(join(tmpdir(), 'iam-selftest-'))
  let missed = 0
  try {
    for (const [index, testCase] of CASES.entries()) {
      const broken = join(work, `broken-${index}.${testCase.readme ? 'md' : 'json'}`)
      const lines = []
      let verdict
      try {
        const common = { mode: testCase.check, python: values.python, paths: positionals, out: (line) => lines.push(line) }
        let result
        if (testCase.readme) {
          writeFileSync(broken, mutateReadme(readFileSync(DEFAULT_README, 'utf8'), testCase.readme))
          result = await runReadmeCheck({ ...common, readme: broken, template: values.template, denySet: join(HERE, 'readme-deny.json') })
        } else {
          mutate(values.python, values.template, testCase.mutation, broken)
          result = await runCheck({ ...common, template: broken, denySet: values['deny-set'] })
        }
        const expected = result.failures.filter(testCase.caught)
        verdict =
          result.exitCode === 1 && expected.length
            ? `caught: ${expected[0].where}: ${expected[0].message}${expected.length > 1 ? ` (and ${expected.length - 1} more)` : ''}`
            : undefined
        if (!verdict) lines.push(`the check exited ${result.exitCode} without the expected failure`)
      } catch (err) {
        lines.push(`error: ${err.message}`)
      }
      if (verdict) {
        console.log(`self-test ok: ${testCase.name}: ${verdict}`)
      } else {
        missed++
        console.log(`self-test FAILED: ${testCase.name} was not caught by the ${testCase.check} check:`)
        for (const line of lines) console.log(`  ${line}`)
      }
    }
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
  console.log(`self-test: ${CASES.length - missed} of ${CASES.length} broken copies caught`)
  return missed ? 1 : 0
}

process.exitCode = await main()
