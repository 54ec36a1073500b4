// The example identity policy of the guide's deploy page (docs/guide/deploy.md, the crate docs'
// `guide::deploy`; it was in README.md until the README was shortened, hence the files' readme-
// names): the ```json block right after the paragraph "Scope the item actions to the
// function's own keys", and that policy for one function of one stack (its placeholders
// replaced). Anything unexpected is an error.

import { readFileSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

import { STORE_TABLES } from './readme-scope.mjs'

export class ReadmeError extends Error {}

/** Where the example policy lives: the guide's deploy page. */
export const POLICY_PAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', 'docs', 'guide', 'deploy.md')

const ANCHOR = "Scope the item actions to the function's own keys"
const PLACEHOLDERS = /\b(REGION|ACCOUNT|FUNCTION_NAME|IDENTITY_PREFIX)\b/

/** {policy, start, end}: the parsed block, and where its JSON text lies in `text`. */
export function extractReadmePolicy(text, where = 'docs/guide/deploy.md') {
  // The anchor's words, however the paragraph is wrapped.
  const anchor = new RegExp(ANCHOR.split(' ').map((word) => word.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('\\s+'), 'g')
  const found = [...text.matchAll(anchor)]
  if (found.length !== 1) throw new ReadmeError(`${where}: ${found.length} paragraphs say "${ANCHOR}" (need exactly one)`)
  // The paragraph ends at the first blank line; the next thing must be the ```json fence.
  const after = text.slice(found[0].index)
  const fence = /\n[ \t]*\n```json[ \t]*\n/.exec(after)
  const paragraphEnd = /\n[ \t]*\n/.exec(after)
  if (!fence || fence.index !== paragraphEnd.index) {
    throw new ReadmeError(`${where}: no \`\`\`json block right after the paragraph "${ANCHOR}"`)
  }
  const start = found[0].index + fence.index + fence[0].length
  const end = text.indexOf('\n```', start - 1)
  if (end < 0) throw new ReadmeError(`${where}: the \`\`\`json block after "${ANCHOR}" is not closed`)
  let policy
  try {
    policy = JSON.parse(text.slice(start, end))
  } catch (err) {
    throw new ReadmeError(`${where}: the \`\`\`json block after "${ANCHOR}" does not parse: ${err.message}`)
  }
  if (!Array.isArray(policy?.Statement) || !policy.Statement.length) {
    throw new ReadmeError(`${where}: the \`\`\`json block after "${ANCHOR}" has no Statement list`)
  }
  return { policy, start, end }
}

export function readReadmePolicy(path) {
  return extractReadmePolicy(readFileSync(path, 'utf8'), path).policy
}

/** `text` with the example policy block replaced by `policy` (for the self-test's copies). */
export function replaceReadmePolicy(text, policy) {
  const { start, end } = extractReadmePolicy(text)
  return text.slice(0, start) + JSON.stringify(policy, null, 2) + text.slice(end)
}

const list = (value) => (Array.isArray(value) ? value : [value])
const KNOWN_KEYS = ['Sid', 'Effect', 'Action', 'Resource', 'Condition']

/**
 * The policy for one function: `tables` maps STORE_TABLES' logical ids to the stack's table
 * ARNs (which carry its region and account); `identityPrefix` undefined drops the
 * IDENTITY_PREFIX* patterns (a function without business identities).
 */
export function policyFor(policy, { region, account, tables, functionName, identityPrefix }) {
  const arns = Object.fromEntries(Object.entries(STORE_TABLES).map(([logical, placeholder]) => [placeholder, tables[logical]]))
  // One value becomes a list of values: a pattern naming IDENTITY_PREFIX may become none.
  const substitute = (value, where) => {
    if (typeof value === 'string') {
      if (value.includes('IDENTITY_PREFIX') && identityPrefix === undefined) return []
      return [value.replace(/\bREGION\b/g, region).replace(/\bACCOUNT\b/g, account)
        .replace(/\bFUNCTION_NAME\b/g, functionName).replace(/\bIDENTITY_PREFIX\b/g, identityPrefix)]
    }
    if (Array.isArray(value)) {
      const kept = value.flatMap((inner) => substitute(inner, where))
      if (value.length && !kept.length) throw new ReadmeError(`example policy ${where}: no value left without IDENTITY_PREFIX`)
      return [kept]
    }
    if (value && typeof value === 'object') {
      return [Object.fromEntries(Object.entries(value).map(([key, inner]) => [key, substitute(inner, `${where}.${key}`)[0]]))]
    }
    return [value]
  }
  const statements = policy.Statement.map((statement, index) => {
    const where = `Statement[${index}]`
    const unknown = Object.keys(statement).filter((key) => !KNOWN_KEYS.includes(key))
    if (unknown.length) throw new ReadmeError(`example policy ${where}: ${unknown.join(', ')} is not modelled here`)
    for (const resource of list(statement.Resource)) {
      if (!(resource in arns)) throw new ReadmeError(`example policy ${where}: Resource ${resource} is neither of ${Object.keys(arns).join(', ')}`)
      if (!arns[resource]) throw new ReadmeError(`example policy ${where}: the stack has no table for ${resource}`)
    }
    const resource = Array.isArray(statement.Resource) ? statement.Resource.map((arn) => arns[arn]) : arns[statement.Resource]
    const [rest] = substitute({ ...statement, Resource: undefined }, where)
    return { ...rest, Resource: resource }
  })
  const result = { ...policy, Statement: statements }
  const left = JSON.stringify(result).match(PLACEHOLDERS)
  if (left) throw new ReadmeError(`example policy: the placeholder ${left[1]} is left after substitution`)
  return result
}
