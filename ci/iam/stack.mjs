// The synthetic stacks: resolve.py (SAM's translator, then CloudFormation's intrinsics) run on
// the template, one stack per recording (each test deployed its own tables, under names of
// its own), with the names that recording shows.

import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const RESOLVE = join(dirname(fileURLToPath(import.meta.url)), 'resolve.py')

export class StackError extends Error {}

/** One stack of `template` under `parameters` (["Name=Value"]) per entry of `hintsList`. */
export function resolveStacks({ python, template, parameters = [], hintsList }) {
  const work = mkdtempSync(join(tmpdir(), 'iam-check-'))
  try {
    const hintsFile = join(work, 'hints.json')
    writeFileSync(hintsFile, JSON.stringify(hintsList))
    const args = [RESOLVE, '--template', template, '--hints', hintsFile, ...parameters.flatMap((p) => ['--parameter', p])]
    const run = spawnSync(python, args, { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 })
    if (run.error) throw new StackError(`cannot run ${python}: ${run.error.message}`)
    if (run.status !== 0) throw new StackError(run.stderr.trim() || `resolve.py exited ${run.status}`)
    return JSON.parse(run.stdout)
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
}

/** The stack's function built from `binary`. */
export function functionOf(stack, binary) {
  const found = Object.entries(stack.functions).find(([, fn]) => fn.binary === binary)
  if (!found) {
    const binaries = Object.values(stack.functions).map((fn) => fn.binary).join(', ')
    throw new StackError(`no function of the stack builds ${JSON.stringify(binary)} (deployed: ${binaries})`)
  }
  const [logical, fn] = found
  return { logical, ...fn }
}
