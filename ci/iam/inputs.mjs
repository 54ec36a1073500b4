// Reading what is evaluated: recorded requests (JSON lines, one request each, in `*.jsonl`
// files or the directories that hold them), and the deny set (deny.json). Every line is
// checked against the recording format; a malformed one is an error, never skipped.

import { readdirSync, readFileSync, statSync } from 'node:fs'
import { isAbsolute, join, relative } from 'node:path'

export class InputError extends Error {}

// content_type is not read (the target or the form's Action says the protocol): it may be null.
const FIELDS = {
  binary: 'string',
  function_name: 'string',
  env: 'object',
  service: 'string',
  body: 'object'
}

/** Checks one raw request's shape; `where` names it in errors. */
export function checkRequest(request, where) {
  if (typeof request !== 'object' || request === null) throw new InputError(`${where}: not a JSON object`)
  for (const [field, type] of Object.entries(FIELDS)) {
    if (typeof request[field] !== type || request[field] === null) {
      throw new InputError(`${where}: "${field}" must be ${type === 'object' ? 'an object' : 'a string'}`)
    }
  }
  for (const field of ['target', 'content_type']) {
    if (request[field] !== null && typeof request[field] !== 'string') {
      throw new InputError(`${where}: "${field}" must be a string or null`)
    }
  }
  return request
}

/** `file` relative to the working directory when it is under it, else as given. */
function shown(file) {
  const near = relative(process.cwd(), file)
  return near.startsWith('..') || isAbsolute(near) ? file : near
}

function jsonlFiles(path) {
  const stat = statSync(path, { throwIfNoEntry: false })
  if (!stat) throw new InputError(`${path}: no such file or directory`)
  if (stat.isFile()) return [path]
  return readdirSync(path, { recursive: true })
    .filter((name) => name.endsWith('.jsonl'))
    .sort()
    .map((name) => join(path, name))
}

/** The recorded requests under `paths` (files or directories), each with where it was read. */
export function readRecordings(paths) {
  const requests = []
  for (const path of paths) {
    const files = jsonlFiles(path)
    if (!files.length) throw new InputError(`${path}: no *.jsonl file`)
    for (const file of files) {
      readFileSync(file, 'utf8')
        .split('\n')
        .forEach((line, index) => {
          if (!line.trim()) return
          const where = `${shown(file)}:${index + 1}`
          let request
          try {
            request = JSON.parse(line)
          } catch (err) {
            throw new InputError(`${where}: ${err.message}`)
          }
          // One file is one test's run: one deployment, names of its own.
          requests.push({ where, group: shown(file), request: checkRequest(request, where) })
        })
    }
  }
  if (!requests.length) throw new InputError(`no request in ${paths.join(', ')}`)
  return requests
}

/** The deny set: entries {name, why, request, expected_today?}. */
export function readDenySet(path) {
  const set = JSON.parse(readFileSync(path, 'utf8'))
  if (!Array.isArray(set.entries) || !set.entries.length) throw new InputError(`${path}: no "entries"`)
  const names = new Set()
  return set.entries.map((entry, index) => {
    const where = `${path} entries[${index}]`
    if (typeof entry.name !== 'string' || typeof entry.why !== 'string') {
      throw new InputError(`${where}: each entry needs a "name" and a "why"`)
    }
    if (names.has(entry.name)) throw new InputError(`${where}: the name ${JSON.stringify(entry.name)} is used twice`)
    names.add(entry.name)
    if (entry.expected_today !== undefined && entry.expected_today !== 'allowed') {
      throw new InputError(`${where}: expected_today can only be "allowed"`)
    }
    return { ...entry, where: `deny: ${entry.name}`, group: path, request: checkRequest(entry.request, where) }
  })
}

/** What one recording tells resolve.py about names: {functions: {binary: {function_name, env}}}. */
export function namingHints(requests) {
  const functions = {}
  for (const { where, request } of requests) {
    const known = functions[request.binary]
    if (known && known.function_name !== request.function_name) {
      throw new InputError(`${where}: ${request.binary} ran as ${request.function_name}, elsewhere as ${known.function_name}`)
    }
    const env = { ...(known?.env ?? {}) }
    for (const [name, value] of Object.entries(request.env)) {
      if (name in env && env[name] !== value) {
        throw new InputError(`${where}: ${request.binary} ran with ${name}=${value}, elsewhere with ${env[name]}`)
      }
      env[name] = value
    }
    functions[request.binary] = { function_name: request.function_name, env }
  }
  return { functions }
}
