// The verdict table: one row per authorization (or per deny-set entry), aligned columns.

/** The part of an ARN after its account (`table/name`, `orders-queue`), or the whole string. */
export function shortResource(resource) {
  const parts = resource.split(':')
  return parts.length >= 6 ? parts.slice(5).join(':') : resource
}

function shorten(text, width) {
  return text.length > width ? `${text.slice(0, width - 1)}…` : text
}

/** Prints `rows` (objects) under `columns` ([{key, title, width?}]). */
export function printTable(rows, columns, out = console.log) {
  const cells = rows.map((row) => columns.map((column) => shorten(String(row[column.key] ?? ''), column.width ?? 200)))
  const widths = columns.map((column, index) => Math.max(column.title.length, ...cells.map((cell) => cell[index].length)))
  const line = (values) => values.map((value, index) => value.padEnd(widths[index])).join('  ').trimEnd()
  out(line(columns.map((column) => column.title)))
  out(line(widths.map((width) => '-'.repeat(width))))
  for (const cell of cells) out(line(cell))
}

/**
 * Prints the problems and the summary line of a run (`label`: which check, `mode`: allowed,
 * denied or deny-set) and returns its exit code and findings: 2 on an error, 1 on a verdict
 * not as expected, else 0.
 */
export function conclude(label, mode, rows, requests, { failures, errors }, out = console.log) {
  const count = (test) => rows.filter(test).length
  out('')
  for (const problem of [...errors, ...failures]) out(`${problem.verdict === 'ERROR' ? 'error' : 'FAIL'}: ${problem.where}: ${problem.message}`)
  out(
    `${label} ${mode}: ${rows.length} authorizations of ${requests} requests: ${count((row) => row.verdict === 'allowed')} allowed, ` +
      `${count((row) => row.verdict.startsWith('DENIED'))} denied, ${errors.length} errors; ${failures.length} not as expected`
  )
  return { exitCode: errors.length ? 2 : failures.length ? 1 : 0, failures, errors, rows }
}

/** Prints one row per authorization: its verdict, function, action, resource, request, origin. */
export function printVerdicts(rows, out = console.log) {
  printTable(rows, [
    { key: 'verdict', title: 'VERDICT' },
    { key: 'function', title: 'FUNCTION' },
    { key: 'action', title: 'ACTION' },
    { key: 'resource', title: 'RESOURCE', width: 48 },
    { key: 'detail', title: 'REQUEST', width: 96 },
    { key: 'where', title: 'FROM', width: 60 }
  ], out)
}

export const VERDICTS = {
  Allowed: 'allowed',
  ImplicitlyDenied: 'DENIED',
  ExplicitlyDenied: 'DENIED (explicit)'
}
